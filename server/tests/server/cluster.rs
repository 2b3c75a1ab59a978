//! The hand-over store on a real Redis Cluster (three masters with a
//! replica each on loopback, [`RedisCluster`]) under vad-server children:
//! records spread over every master by key slot, `ASK` and `MOVED`
//! followed while a slot moves, a drain's hand-over exact, and a master
//! SIGKILLed mid-stream (its replica promoted) then a replica killed: every
//! stream resumes exactly or restarts at 0 told why, never a wrong answer.

use crate::common::*;
use crate::handover::{counter, voice, Replica};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use laned_models::silero::CHUNK;
use laned_server::handover::{KEY_PREFIX, RESTARTED};
use laned_server::testing::{free_port, RedisCluster};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// What a reconnecting client saw of its stream.
#[derive(Debug, Default)]
struct Seen {
    /// Each chunk's probability, as last answered.
    answers: Vec<Option<f32>>,
    /// The chunk each connection resumed from (`x-resume-chunk`).
    resumed_from: Vec<u64>,
    /// The chunks answered (in a row from 0) before each connection.
    answered_before: Vec<usize>,
    /// Each connection's hello's `restarted`, where it said one.
    restarted: Vec<String>,
    /// How each connection but the last ended: a close code, 1006 for a
    /// connection dropped without one.
    closes: Vec<u16>,
    /// Their reasons.
    reasons: Vec<String>,
    /// A chunk answered twice differently, a resume past the answers, a
    /// hello disagreeing with the upgrade.
    wrong: Vec<String>,
}

impl Seen {
    /// What it saw but the answers, for a failure's message.
    fn brief(&self) -> String {
        format!(
            "closes {:?} ({:?}), resumed from {:?} with {:?} answered, restarted {:?}, wrong {:?}",
            self.closes, self.reasons, self.resumed_from, self.answered_before, self.restarted, self.wrong
        )
    }
}

/// Streams `samples` as stream `id` at `pace` a chunk to the first of
/// `replicas` that takes it, reconnecting (to the next, in turn) on any
/// close or drop with its id and the generation its last hello said
/// (`x-resume-generation`), resending from the chunk the server names,
/// until every chunk is answered (then it closes), or `within` passes.
async fn following(replicas: Vec<SocketAddr>, id: String, samples: Arc<Vec<f32>>, pace: Duration) -> Seen {
    let within = Duration::from_secs(150);
    let n = samples.len() / CHUNK;
    let mut seen = Seen {
        answers: vec![None; n],
        ..Seen::default()
    };
    let (until, mut turn, mut generation) = (Instant::now() + within, 0, None::<u64>);
    loop {
        assert!(
            Instant::now() < until,
            "{id}: not every chunk answered within {within:?}: {}",
            seen.brief()
        );
        let to = replicas[turn % replicas.len()];
        let mut request = format!("ws://{to}/v1/vad").into_client_request().unwrap();
        request.headers_mut().insert("x-stream-id", id.parse().unwrap());
        if let Some(g) = generation {
            request.headers_mut().insert("x-resume-generation", g.into());
        }
        let Ok((ws, response)) = tokio_tungstenite::connect_async(request).await else {
            turn += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let header = |name: &str| -> u64 {
            let v = response.headers().get(name);
            let v = v.unwrap_or_else(|| panic!("{id}: no {name} on the upgrade"));
            v.to_str().unwrap().parse().unwrap()
        };
        let from = header("x-resume-chunk");
        let answered = seen.answers.iter().take_while(|a| a.is_some()).count();
        if !seen.resumed_from.is_empty() && from as usize > answered {
            seen.wrong
                .push(format!("resumed from chunk {from}, only {answered} answered"));
        }
        seen.answered_before.push(answered);
        seen.resumed_from.push(from);
        let (mut tx, mut rx) = ws.split();
        let audio = samples.clone();
        let sender = tokio::spawn(async move {
            for chunk in audio[from as usize * CHUNK..n * CHUNK].chunks(CHUNK) {
                if tx.send(Message::Binary(encode(chunk, false).into())).await.is_err() {
                    return tx;
                }
                tokio::time::sleep(pace).await;
            }
            tx
        });
        let mut hello = false;
        let ended = loop {
            match rx.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                    if let Some(r) = v.get("resume") {
                        if hello || r.as_u64() != Some(from) {
                            seen.wrong.push(format!("a hello {v} after x-resume-chunk {from}"));
                        }
                        if v["generation"].as_u64() != Some(header("x-resume-generation")) {
                            seen.wrong
                                .push(format!("a hello {v} disagreeing with x-resume-generation"));
                        }
                        generation = v["generation"].as_u64();
                        if let Some(why) = v["restarted"].as_str() {
                            seen.restarted.push(why.to_string());
                        }
                        hello = true;
                        continue;
                    }
                    if v.get("event").is_some() {
                        continue;
                    }
                    let c = v["chunk"].as_u64().unwrap() as usize;
                    let p = v["probability"].as_f64().unwrap() as f32;
                    if let Some(old) = seen.answers[c] {
                        if old.to_bits() != p.to_bits() {
                            seen.wrong.push(format!("chunk {c} answered {old} then {p}"));
                        }
                    }
                    seen.answers[c] = Some(p);
                    if c + 1 == n {
                        break None;
                    }
                }
                Some(Ok(Message::Close(f))) => {
                    seen.reasons
                        .push(f.as_ref().map(|f| f.reason.to_string()).unwrap_or_default());
                    break Some(f.map(|f| u16::from(f.code)).unwrap_or(1005));
                }
                Some(Ok(_)) => {}
                other => {
                    seen.reasons.push(format!("{other:?}"));
                    break Some(1006);
                }
            }
        };
        match ended {
            None => {
                let tx = sender.await.unwrap();
                let mut ws = tx.reunite(rx).unwrap();
                let _ = ws.close(None).await;
                return seen;
            }
            Some(code) => {
                sender.abort();
                seen.closes.push(code);
                turn += 1;
            }
        }
    }
}

/// Every answer the solo run's, bit for bit, and nothing said wrong.
fn exact(id: &str, seen: &Seen, solo: &[f32]) {
    assert!(seen.wrong.is_empty(), "{id}: {:?}", seen.wrong);
    for (c, want) in solo.iter().enumerate() {
        let got = seen.answers[c]
            .unwrap_or_else(|| panic!("{id}: chunk {c} never answered (resumed from {:?})", seen.resumed_from));
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{id}: chunk {c}: {got} where the solo run says {want}"
        );
    }
}

/// `streams` streams' audio, their solo runs (on blocking threads) and
/// their clients following `replicas`, ids `{prefix}-{s}`.
#[allow(clippy::type_complexity)]
fn streams(
    plan: &Arc<dyn tract_core::internal::Runnable>,
    replicas: &[SocketAddr],
    (prefix, streams, chunks): (&str, usize, usize),
    pace: Duration,
) -> Vec<(String, tokio::task::JoinHandle<Vec<f32>>, tokio::task::JoinHandle<Seen>)> {
    (0..streams)
        .map(|s| {
            let samples = Arc::new(voice(s + 300, chunks));
            let id = format!("{prefix}-{s}");
            let (plan, audio) = (plan.clone(), samples.clone());
            let solo = tokio::task::spawn_blocking(move || solo(&plan, &audio));
            let client = tokio::spawn(following(replicas.to_vec(), id.clone(), samples, pace));
            (id, solo, client)
        })
        .collect()
}

/// Waits (30 s at most) until every master holds at least one record and
/// `want` in all.
async fn records_on_every_master(cluster: &RedisCluster, want: u64) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let keys = cluster.keys_per_master();
        if keys.iter().all(|(_, n)| *n > 0) && keys.iter().map(|(_, n)| n).sum::<u64>() >= want {
            eprintln!("records per master: {keys:?}");
            return;
        }
        assert!(Instant::now() < until, "records per master: {keys:?}, {want} wanted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (60 s at most) until `replicas` hold `streams` lanes between them.
async fn all_live(replicas: &[SocketAddr], streams: usize) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let mut taken = 0.0;
        for r in replicas {
            taken += lanes(*r).await;
        }
        if taken == streams as f64 {
            return;
        }
        assert!(Instant::now() < until, "{taken} streams live of {streams}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Streams holding a lane on `addr`.
async fn lanes(addr: SocketAddr) -> f64 {
    counter(addr, "tract_autobatch_lanes_taken", "").await.max(0.0)
}

/// Records are routed by key slot (every master holds some), and a slot
/// moved under the store's connection is followed: a stream whose record
/// was moved resumes from it through `ASK` (mid-move) and then `MOVED`
/// (moved), its checkpoints landing on the new master, every answer the
/// solo run's. Without the redirections followed, the lookups fail and the
/// streams restart at 0.
#[test]
fn silero_cluster_records_spread_by_slot_and_moves_are_followed() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(180, async move {
        let Some(cluster) = RedisCluster::start() else { return };
        let url = cluster.url();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let args = [
            "--lanes",
            "24",
            "--checkpoint-every",
            "4",
            "--store-timeout-ms",
            "1500",
            "--store",
            &url,
        ];
        let server = Replica::start(&model, "replica", listen, &args).await;
        let addr = server.addr;
        let samples = voice(400, 24);
        let want = solo(&plan, &samples);
        let s = |from: usize, to: usize| &samples[from * CHUNK..to * CHUNK];
        // 24 streams of 8 chunks each, dropped: their records stay.
        let mut generation = 0;
        for k in 0..24 {
            let (mut ws, hello) = connect_claiming(addr, &format!("spread-{k}"), None).await;
            assert_eq!(hello["resume"], 0, "{hello}");
            generation = hello["generation"].as_u64().unwrap();
            assert_eq!(answered(&mut ws, s(0, 8), 0).await, want[..8]);
            // The last checkpoint written before the drop.
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(ws);
        }
        records_on_every_master(&cluster, 24).await;
        let id = "spread-0";
        let key = format!("{KEY_PREFIX}{id}");

        // Mid-move: the record is on the new master, its slot still the old
        // one's, which answers ASK.
        let (from, to) = cluster.start_moving_slot_of(&key);
        let (mut ws, hello) = connect_claiming(addr, id, Some(generation)).await;
        assert_eq!(hello["resume"], 8, "the record moved is found (ASK followed): {hello}");
        assert!(hello.get("restarted").is_none(), "{hello}");
        generation = hello["generation"].as_u64().unwrap();
        assert_eq!(answered(&mut ws, s(8, 16), 8).await, want[8..16]);
        // The checkpoint at 16 lands on the new master, through ASK (the
        // importing node answers a key of the slot only after `ASKING`).
        let slot = cluster.slot_of(&key).to_string();
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let mut c = cluster.node(to).unwrap();
            redis::cmd("ASKING").query::<()>(&mut c).unwrap();
            let held: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query(&mut c).unwrap();
            let held: Option<serde_json::Value> = held.map(|b| serde_json::from_slice(&b).unwrap());
            if held.is_some_and(|r| r["chunk"] == 16) {
                break;
            }
            assert!(Instant::now() < until, "no checkpoint at 16 on the new master");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let in_slot = |port: u16| -> u64 {
            let mut c = cluster.node(port).unwrap();
            redis::cmd("CLUSTER")
                .arg("COUNTKEYSINSLOT")
                .arg(&slot)
                .query(&mut c)
                .unwrap()
        };
        assert_eq!(in_slot(from), 0, "nothing written back on the old master");
        drop(ws);

        // Moved: the store's map is stale, the old master answers MOVED.
        cluster.finish_moving(&key, to);
        let (mut ws, hello) = connect_claiming(addr, id, Some(generation)).await;
        assert_eq!(hello["resume"], 16, "the record is found (MOVED followed): {hello}");
        assert_eq!(answered(&mut ws, s(16, 24), 16).await, want[16..24]);
        drop(ws);
        // Every other stream resumes from its record too, wherever it is.
        for k in 1..24 {
            let (ws, hello) = connect_claiming(addr, &format!("spread-{k}"), Some(1)).await;
            assert_eq!(hello["resume"], 8, "spread-{k}: {hello}");
            drop(ws);
        }
        assert_eq!(counter(addr, "laned_resume_total", "outcome=\"failed\"").await, 0.0);
        drop(server);
    });
}

/// A connection as stream `id`, claiming `generation`: the socket and its
/// hello.
async fn connect_claiming(addr: SocketAddr, id: &str, generation: Option<u64>) -> (Ws, serde_json::Value) {
    let mut request = format!("ws://{addr}/v1/vad").into_client_request().unwrap();
    request.headers_mut().insert("x-stream-id", id.parse().unwrap());
    if let Some(g) = generation {
        request.headers_mut().insert("x-resume-generation", g.into());
    }
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let hello = match ws.next().await {
        Some(Ok(Message::Text(t))) => serde_json::from_str(&t).unwrap(),
        other => panic!("{id}: {other:?} where the hello was due"),
    };
    (ws, hello)
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

/// Two replicas on the cluster, 24 streams on A: SIGTERM A hands every
/// stream over through the cluster (records on every master), and each
/// resumes on B exactly where it was told, every answer the solo run's.
#[test]
fn silero_cluster_drain_hands_every_stream_over_exactly() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(180, async move {
        let Some(cluster) = RedisCluster::start() else { return };
        let url = cluster.url();
        let args = ["--lanes", "30", "--store-timeout-ms", "1500", "--store", &url];
        let listen = [free_port(), free_port()].map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
        let a = Replica::start(&model, "replica-a", listen[0], &args).await;
        let b = Replica::start(&model, "replica-b", listen[1], &args).await;
        let n = 16;
        let runs = streams(&plan, &[a.addr, b.addr], ("drain", n, 500), Duration::from_millis(10));
        all_live(&[a.addr, b.addr], n).await;
        let on_a = lanes(a.addr).await;
        assert!(on_a > 0.0, "no stream on A to hand over");
        tokio::time::sleep(Duration::from_millis(500)).await;
        laned_server::testing::sigterm(a.pid());
        let mut handed = 0;
        for (id, solo, client) in runs {
            let (seen, solo) = (client.await.unwrap(), solo.await.unwrap());
            exact(&id, &seen, &solo);
            assert!(seen.restarted.is_empty(), "{id}: {:?}", seen.restarted);
            // A stream on B from the start is never interrupted; one on A
            // is handed over once.
            let Some(k) = seen.closes.iter().position(|c| *c == 1012) else {
                continue;
            };
            assert!(seen.resumed_from[k + 1] > 0, "{id}: resumed from 0: {}", seen.brief());
            assert_eq!(
                seen.resumed_from[k + 1] as usize,
                seen.answered_before[k + 1],
                "{id}: resumed where its answers stopped: {}",
                seen.brief()
            );
            handed += 1;
        }
        eprintln!("a drain through the cluster: {handed} streams handed over");
        assert!(handed as f64 >= on_a, "{handed} handed over, {on_a} were on A");
        assert_eq!(b.said("is refused").len(), 0);
        drop(b);
    });
}

/// Two replicas on the cluster, checkpoints every 4 chunks, 8 streams:
/// SIGTERM A (its streams handed over to B, generation 2 there), a master
/// SIGKILLed at once (its replica promoted: records written just before
/// may be lost), then B SIGKILLed: every stream either resumes exactly
/// from a record no older than it knew, or restarts at 0 told why (one of
/// the documented reasons); every answer is the solo run's; each restart
/// and resume is counted on the replica that took it.
#[test]
fn silero_cluster_a_master_killed_mid_stream_loses_no_answer_and_changes_none() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(240, async move {
        let Some(mut cluster) = RedisCluster::start() else {
            return;
        };
        let url = cluster.url();
        let args = [
            "--lanes",
            "30",
            "--checkpoint-every",
            "4",
            "--store-timeout-ms",
            "1500",
            "--store",
            &url,
        ];
        let listen = [free_port(), free_port()].map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
        let a = Replica::start(&model, "replica-a", listen[0], &args).await;
        let mut b = Replica::start(&model, "replica-b", listen[1], &args).await;
        let n = 8;
        let runs = streams(
            &plan,
            &[a.addr, b.addr],
            ("failover", n, 1000),
            Duration::from_millis(20),
        );
        all_live(&[a.addr, b.addr], n).await;
        // Every stream checkpointed.
        let until = Instant::now() + Duration::from_secs(60);
        while cluster.keys_per_master().iter().map(|(_, k)| k).sum::<u64>() < n as u64 {
            assert!(Instant::now() < until, "not every stream checkpointed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        laned_server::testing::sigterm(a.pid());
        let until = Instant::now() + Duration::from_secs(60);
        while lanes(b.addr).await != n as f64 {
            assert!(Instant::now() < until, "not every stream handed over to B");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(a);
        // A master dies while B's streams write their first checkpoints.
        let killed = cluster.kill_master_of(&format!("{KEY_PREFIX}failover-0"));
        eprintln!("master {killed} killed, its replica promoted");
        let a = Replica::start(&model, "replica-a2", listen[0], &args).await;
        // Checkpoints on the promoted master too (the circuit closed
        // again), then B dies outright.
        let ok = |addr| counter(addr, "laned_checkpoint_total", "outcome=\"ok\"");
        let (since, until) = (ok(b.addr).await, Instant::now() + Duration::from_secs(60));
        while ok(b.addr).await < since + 2.0 * n as f64 {
            assert!(Instant::now() < until, "B wrote no checkpoints after the failover");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(lanes(b.addr).await, n as f64, "every stream still live on B");
        b.kill().await;
        let (mut restarted, mut resumed) = (0, 0);
        for (id, solo, client) in runs {
            let (seen, solo) = (client.await.unwrap(), solo.await.unwrap());
            exact(&id, &seen, &solo);
            for why in &seen.restarted {
                assert!(RESTARTED.contains(&why.as_str()), "{id}: restarted {why:?}");
            }
            // The connection after B's kill: resumed, or restarted told.
            let last = seen.resumed_from.len() - 1;
            if seen.resumed_from[last] == 0 {
                assert_eq!(seen.restarted.len(), 1, "{id}: restarted at 0 untold: {}", seen.brief());
                restarted += 1;
            } else {
                assert!(
                    seen.restarted.is_empty(),
                    "{id}: resumed, yet told restarted: {}",
                    seen.brief()
                );
                resumed += 1;
            }
        }
        eprintln!("after the failover and the kill: {resumed} streams resumed, {restarted} restarted at 0, told");
        let counted = ["stale", "lost", "refused", "failed"];
        let mut told = 0.0;
        for outcome in counted {
            told += counter(a.addr, "laned_resume_total", &format!("outcome=\"{outcome}\"")).await;
        }
        assert_eq!(told, restarted as f64, "every restart counted");
        assert_eq!(
            counter(a.addr, "laned_resume_total", "outcome=\"resumed\"").await,
            resumed as f64
        );
        drop(a);
    });
}
