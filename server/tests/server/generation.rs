//! The generation check on resume, against a vad-server child and a real
//! Redis: a client reconnecting tells the generation its last hello
//! said (`x-resume-generation`, or `?generation=`); a record of a lower
//! generation (an older record that survived a store's failover, the newer
//! one lost) is never resumed from, and neither a claim finding no record:
//! the stream restarts at 0 and its hello says why (`restarted`).

use crate::common::*;
use crate::handover::{counter, Replica};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use laned_models::silero::CHUNK;
use laned_server::handover::{KEY_PREFIX, LOST, STALE};
use laned_server::testing::{free_port, Redis};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// A connection as stream `id`, claiming `generation` (as a header, or as
/// the URL parameter where `in_query`): the socket, the upgrade's
/// `x-resume-chunk` and `x-resume-generation`.
async fn connect_claiming(
    addr: SocketAddr,
    id: &str,
    generation: Option<&str>,
    in_query: bool,
) -> (Ws, Option<u64>, Option<u64>) {
    let query = match generation {
        Some(g) if in_query => format!("?generation={g}"),
        _ => String::new(),
    };
    let mut request = format!("ws://{addr}/v1/vad{query}").into_client_request().unwrap();
    request.headers_mut().insert("x-stream-id", id.parse().unwrap());
    if let Some(g) = generation.filter(|_| !in_query) {
        request.headers_mut().insert("x-resume-generation", g.parse().unwrap());
    }
    let (ws, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()?.parse().ok());
    (ws, header("x-resume-chunk"), header("x-resume-generation"))
}

/// The hello (`{"resume", "generation", "restarted"?}`).
async fn hello(ws: &mut Ws) -> serde_json::Value {
    match ws.next().await {
        Some(Ok(Message::Text(t))) => serde_json::from_str(&t).unwrap(),
        other => panic!("{other:?} where the hello was due"),
    }
}

/// Sends `samples`' chunks one at a time from chunk `first`, each after
/// the last was answered: their probabilities.
async fn answered(ws: &mut Ws, samples: &[f32], first: u64) -> Vec<f32> {
    let mut got = vec![];
    for (k, chunk) in samples.chunks_exact(CHUNK).enumerate() {
        ws.send(Message::Binary(encode(chunk, false).into())).await.unwrap();
        loop {
            match next_reply(ws).await {
                Reply::Probability(n, p) => {
                    assert_eq!(n, first + k as u64);
                    got.push(p);
                    break;
                }
                Reply::Event(_, _) => {}
                Reply::Closed(code, why) => panic!("closed {code} {why} at chunk {k}"),
            }
        }
    }
    got
}

/// The bytes under stream `id`, once its record is at `chunk` (5 s at most).
async fn record_at(redis: &Redis, id: &str, chunk: u64) -> Vec<u8> {
    let mut c = redis.connection().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let bytes: Option<Vec<u8>> = redis::cmd("GET")
            .arg(format!("{KEY_PREFIX}{id}"))
            .query(&mut c)
            .unwrap();
        if let Some(b) = bytes {
            let r: serde_json::Value = serde_json::from_slice(&b).unwrap();
            if r["chunk"] == chunk {
                return b;
            }
        }
        assert!(Instant::now() < until, "no record of {id} at chunk {chunk}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A reconnect claiming the generation its last hello said resumes from a
/// record of that generation; one finding only an older record (written
/// back by hand, as a failover leaves it) or none restarts at 0, its hello
/// saying why, and every answer from 0 is the solo run's; a claim that is
/// no number is refused 1008 by name; `laned_resume_total` counts `stale`
/// and `lost`.
#[test]
fn silero_a_reconnect_claiming_a_newer_generation_than_the_record_restarts_at_0_told() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(120, async move {
        let Some(redis) = Redis::start() else { return };
        let url = redis.url();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let args = ["--lanes", "4", "--checkpoint-every", "4", "--store", &url];
        let server = Replica::start(&model, "replica", listen, &args).await;
        let addr = server.addr;
        let samples = audio(30, 24);
        let want = solo(&plan, &samples);
        let s = |from: usize, to: usize| &samples[from * CHUNK..to * CHUNK];

        // Generation 1, fresh: its checkpoint at chunk 8, then dropped.
        let (mut ws, from, generation) = connect_claiming(addr, "gen", None, false).await;
        assert_eq!((from, generation), (Some(0), Some(1)));
        let h = hello(&mut ws).await;
        assert_eq!(
            (h["resume"].as_u64(), h["generation"].as_u64()),
            (Some(0), Some(1)),
            "{h}"
        );
        assert!(h.get("restarted").is_none(), "{h}");
        assert_eq!(answered(&mut ws, s(0, 8), 0).await, want[..8]);
        let older = record_at(&redis, "gen", 8).await;
        drop(ws);

        // Generation 2 resumes it (the claim is 1), checkpoints at 16.
        let (mut ws, from, generation) = connect_claiming(addr, "gen", Some("1"), false).await;
        assert_eq!((from, generation), (Some(8), Some(2)));
        let h = hello(&mut ws).await;
        assert_eq!(
            (h["resume"].as_u64(), h["generation"].as_u64()),
            (Some(8), Some(2)),
            "{h}"
        );
        assert_eq!(answered(&mut ws, s(8, 16), 8).await, want[8..16]);
        record_at(&redis, "gen", 16).await;
        drop(ws);

        // The store fails over and loses generation 2's record: the older
        // one is back.
        let mut c = redis.connection().unwrap();
        redis::cmd("SET")
            .arg(format!("{KEY_PREFIX}gen"))
            .arg(&older)
            .query::<()>(&mut c)
            .unwrap();
        let (mut ws, from, generation) = connect_claiming(addr, "gen", Some("2"), false).await;
        assert_eq!(from, Some(0), "a record older than the claim is never resumed from");
        assert_eq!(generation, Some(3), "above both the record and the claim");
        let h = hello(&mut ws).await;
        assert_eq!(h["resume"].as_u64(), Some(0), "{h}");
        assert_eq!(h["restarted"].as_str(), Some(STALE), "{h}");
        assert_eq!(answered(&mut ws, s(0, 12), 0).await, want[..12], "exact from 0");
        record_at(&redis, "gen", 12).await;
        drop(ws);

        // No record at all (the store restarted empty): the claim, by URL
        // parameter here, restarts it at 0 too.
        redis::cmd("DEL")
            .arg(format!("{KEY_PREFIX}gen"))
            .query::<()>(&mut c)
            .unwrap();
        let (mut ws, from, generation) = connect_claiming(addr, "gen", Some("3"), true).await;
        assert_eq!((from, generation), (Some(0), Some(4)));
        let h = hello(&mut ws).await;
        assert_eq!(h["restarted"].as_str(), Some(LOST), "{h}");
        assert_eq!(answered(&mut ws, s(0, 4), 0).await, want[..4]);
        drop(ws);

        // A claim that is no generation is refused by name.
        let (mut ws, _, _) = connect_claiming(addr, "gen-bad", Some("soon"), false).await;
        let (code, why) = expect_close(&mut ws).await;
        assert_eq!(code, 1008, "{why}");
        assert!(why.contains("resume generation") && why.contains("soon"), "{why}");

        let stale = counter(addr, "laned_resume_total", "outcome=\"stale\"").await;
        let lost = counter(addr, "laned_resume_total", "outcome=\"lost\"").await;
        assert_eq!((stale, lost), (1.0, 1.0));
        assert_eq!(
            server.said("older than generation 2").len(),
            1,
            "the stale record is said"
        );
    });
}
