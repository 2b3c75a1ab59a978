//! Two vad-server replicas (the binary, as child processes) behind a real
//! HAProxy (Debian's package) on 127.0.0.1, configured by the shipped
//! `deploy/haproxy/haproxy.cfg` with only its addresses rewritten: streams
//! pinned by `x-stream-id`, answers exact, a reconnecting stream back on its
//! replica, and a SIGTERM'd replica taken out of new-stream routing through
//! its `/ready` while its live streams finish.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use laned_models::silero::CHUNK;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// A replica: the child and where it listens.
struct Replica {
    child: Child,
    addr: SocketAddr,
}

async fn replica(model: &std::path::Path, name: &'static str) -> Replica {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vad-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--lanes",
            "40",
            "--drain-deadline-ms",
            "2500",
        ])
        .arg("--model")
        .arg(model)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr: SocketAddr = loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("vad-server exited before listening");
        if let Some(a) = line.strip_prefix("vad-server listening on ") {
            break a.parse().unwrap();
        }
    };
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{name}: {line}");
        }
    });
    Replica { child, addr }
}

/// Streams holding a lane on the replica at `addr`, from its `/metrics`;
/// 0 once it is gone (a drained replica exits).
async fn lanes_taken(addr: SocketAddr) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return 0.0;
    };
    let ask = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let mut body = vec![];
    if s.write_all(ask.as_bytes()).await.is_err() || s.read_to_end(&mut body).await.is_err() {
        return 0.0;
    }
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with("tract_autobatch_lanes_taken"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A WebSocket through the proxy, carrying `id` as its `x-stream-id`.
async fn connect_as(proxy: SocketAddr, id: &str) -> Ws {
    let mut request = format!("ws://{proxy}/v1/vad").into_client_request().unwrap();
    request.headers_mut().insert("x-stream-id", id.parse().unwrap());
    tokio_tungstenite::connect_async(request).await.unwrap().0
}

/// Connects `id`, sends its first chunk (a lane is taken at a stream's
/// first chunk) and says which replica took the stream (the one whose
/// lanes taken went up), `0` or `1`.
async fn connect_and_locate(proxy: SocketAddr, replicas: [SocketAddr; 2], id: &str, first: &[f32]) -> (Ws, usize) {
    let before = [lanes_taken(replicas[0]).await, lanes_taken(replicas[1]).await];
    let mut ws = connect_as(proxy, id).await;
    ws.send(Message::Binary(encode(first, false).into())).await.unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        for (ix, addr) in replicas.iter().enumerate() {
            if lanes_taken(*addr).await > before[ix] {
                return (ws, ix);
            }
        }
        assert!(tokio::time::Instant::now() < until, "{id}: no replica took the stream");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends `samples` at `pace` a chunk and reads their probabilities, after
/// the `sent` answers due for chunks sent before; returns them with how
/// the stream ended (`None` if it is still open).
async fn talk(ws: Ws, samples: Vec<f32>, pace: Duration, sent: usize) -> (Vec<f32>, Option<u16>) {
    let want = samples.len() / CHUNK + sent;
    let (mut tx, mut rx) = ws.split();
    let sender = tokio::spawn(async move {
        for chunk in samples.chunks(CHUNK) {
            if tx.send(Message::Binary(encode(chunk, false).into())).await.is_err() {
                return;
            }
            tokio::time::sleep(pace).await;
        }
    });
    let mut got = vec![];
    let mut closed = None;
    while got.len() < want {
        match rx.next().await {
            Some(Ok(Message::Text(t))) => {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                if v.get("event").is_none() {
                    got.push(v["probability"].as_f64().unwrap() as f32);
                }
            }
            Some(Ok(Message::Close(f))) => {
                closed = Some(f.map(|f| u16::from(f.code)).unwrap_or(1005));
                break;
            }
            Some(Ok(_)) => {}
            _ => {
                closed = Some(1006);
                break;
            }
        }
    }
    sender.abort();
    (got, closed)
}

#[test]
fn silero_replicas_behind_haproxy_stay_sticky_and_drain_without_losing_a_call() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    if std::process::Command::new("haproxy").arg("-v").output().is_err() {
        eprintln!("SKIPPED: haproxy is not installed (Debian's `haproxy`; .ci/run installs it)");
        return;
    }
    bounded(180, async move {
        let mut a = replica(&model, "replica-a").await;
        let b = replica(&model, "replica-b").await;
        let replicas = [a.addr, b.addr];
        // The shipped configuration, its addresses pointed at this test's.
        let front = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let shipped =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/haproxy/haproxy.cfg")).unwrap();
        assert!(shipped.contains("127.0.0.1:9001") && shipped.contains("127.0.0.1:8000"));
        let cfg = shipped
            .replace("127.0.0.1:8000", &front.to_string())
            .replace("127.0.0.1:9001", &a.addr.to_string())
            .replace("127.0.0.1:9002", &b.addr.to_string());
        let dir = std::env::temp_dir().join(format!("laned-haproxy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("haproxy.cfg"), cfg).unwrap();
        let _proxy = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(dir.join("haproxy.cfg"))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // HAProxy up and forwarding (refused until it listens).
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(front).await.is_err() {
            assert!(tokio::time::Instant::now() < until, "haproxy never listened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        wait_status(front, "/live", 200, Duration::from_secs(10)).await;

        // 32 streams, each with its id; each lands on one replica.
        let mut located = vec![];
        for s in 0..32 {
            let id = format!("call-{s}");
            let (ws, at) = connect_and_locate(front, replicas, &id, &audio(s, 1)[..CHUNK]).await;
            located.push((id, ws, at));
        }
        let on = |r: usize| located.iter().filter(|(_, _, at)| *at == r).count();
        assert!(
            on(0) > 0 && on(1) > 0,
            "the hash spread no stream to a replica: {} / {}",
            on(0),
            on(1)
        );
        let home: HashMap<String, usize> = located.iter().map(|(id, _, at)| (id.clone(), *at)).collect();

        // Every stream's probabilities equal its solo run.
        let talks: Vec<_> = located
            .into_iter()
            .enumerate()
            .map(|(s, (id, ws, at))| {
                let plan = plan.clone();
                tokio::spawn(async move {
                    // Its first chunk went with the locating; the rest
                    // now (the first answer is read first).
                    let samples = audio(s, 6);
                    let (got, closed) = talk(ws, samples[CHUNK..].to_vec(), Duration::ZERO, 1).await;
                    assert_eq!(closed, None, "{id}");
                    assert_eq!(got, solo(&plan, &samples)[..got.len()], "{id} on replica {at}");
                    assert_eq!(got.len(), 6, "{id}");
                })
            })
            .collect();
        for t in talks {
            t.await.unwrap();
        }

        // A stream reconnecting with its id lands on its replica again.
        for s in [0, 5, 17] {
            let id = format!("call-{s}");
            wait_until_lanes(replicas, 0.0).await;
            let (ws, at) = connect_and_locate(front, replicas, &id, &audio(s, 1)[..CHUNK]).await;
            assert_eq!(at, home[&id], "{id} came back elsewhere");
            drop(ws);
        }

        // Live streams on replica A when it is told to drain: they keep
        // getting answers (a chunk every 20 ms) until they end or the
        // deadline passes.
        wait_until_lanes(replicas, 0.0).await;
        let ids_on_a: Vec<String> = home
            .iter()
            .filter(|(_, r)| **r == 0)
            .map(|(id, _)| id.clone())
            .collect();
        let mut live = vec![];
        for id in ids_on_a.iter().take(4) {
            let samples = audio(3, 30);
            let (ws, at) = connect_and_locate(front, replicas, id, &samples[..CHUNK]).await;
            assert_eq!(at, 0);
            live.push(tokio::spawn(talk(
                ws,
                samples[CHUNK..].to_vec(),
                Duration::from_millis(20),
                1,
            )));
        }
        let pid = a.child.id().unwrap();
        laned_server::testing::sigterm(pid);
        wait_status(a.addr, "/ready", 503, Duration::from_secs(10)).await;
        // Until HAProxy's check (every second) has seen A's 503, a new
        // stream of A's ids still reaches A, which turns it away (1001);
        // the first one answered was served by B, A admitting no one. (Once
        // A's last live stream ends it exits, and a stream routed to it
        // then fails to connect at all.)
        let until = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let mut request = format!("ws://{front}/v1/vad").into_client_request().unwrap();
            request
                .headers_mut()
                .insert("x-stream-id", ids_on_a[4].parse().unwrap());
            let served = match tokio_tungstenite::connect_async(request).await {
                Ok((mut ws, _)) => {
                    let _ = ws
                        .send(Message::Binary(encode(&audio(3, 1)[..CHUNK], false).into()))
                        .await;
                    matches!(ws.next().await, Some(Ok(Message::Text(_))))
                }
                Err(_) => false,
            };
            if served {
                break;
            }
            assert!(
                tokio::time::Instant::now() < until,
                "HAProxy kept routing to the draining replica"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while lanes_taken(b.addr).await != 0.0 {
            assert!(tokio::time::Instant::now() < until, "the probe's lane stayed taken");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // From then on, every new stream of A's ids lands on B.
        for id in ids_on_a.iter().skip(4).take(4) {
            let (ws, at) = connect_and_locate(front, replicas, id, &audio(3, 1)[..CHUNK]).await;
            assert_eq!(at, 1, "{id}: routed to the draining replica");
            drop(ws);
            // Its lane back before the next look, or the next stream's
            // lane would only replace this one in B's count.
            let until = tokio::time::Instant::now() + Duration::from_secs(5);
            while lanes_taken(b.addr).await != 0.0 {
                assert!(tokio::time::Instant::now() < until, "{id}: its lane stayed taken");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        // 30 chunks at 20 ms: 0.6 s, well within the 2.5 s drain deadline.
        for t in live {
            let (got, closed) = t.await.unwrap();
            assert_eq!(
                got.len(),
                30,
                "a live stream lost answers to the drain (closed {closed:?})"
            );
        }
        let status = tokio::time::timeout(Duration::from_secs(10), a.child.wait())
            .await
            .expect("the drained replica exits")
            .unwrap();
        assert_eq!(status.code(), Some(0));
        drop(b);
    });
}

/// Waits until the replicas hold `streams` streams in all.
async fn wait_until_lanes(replicas: [SocketAddr; 2], streams: f64) {
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while lanes_taken(replicas[0]).await + lanes_taken(replicas[1]).await != streams {
        assert!(tokio::time::Instant::now() < until, "lanes still taken");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
