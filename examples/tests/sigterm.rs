//! vad-server as a child process: SIGTERM with live clients. /ready goes
//! 503 from the signal on; the clients keep getting answers until the drain
//! deadline, then a 1001 close; the process exits 0.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use laned_examples::close;
use laned_testkit::silero::CHUNK;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

#[test]
fn silero_sigterm_drains_then_closes_with_1001_and_exits_0() {
    let Some(model) = model_path() else { return };
    bounded(120, async {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_vad-server"))
            .args(["--listen", "127.0.0.1:0", "--lanes", "4", "--drain-deadline-ms", "1500"])
            .arg("--model")
            .arg(&model)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr: std::net::SocketAddr = loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("vad-server exited before listening");
            eprintln!("server: {line}");
            if let Some(a) = line.strip_prefix("vad-server listening on ") {
                break a.parse().unwrap();
            }
        };
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("server: {line}");
            }
        });
        wait_status(addr, "/ready", 200, Duration::from_secs(5)).await;

        // Two clients, a chunk every 20 ms until closed.
        let clients: Vec<_> = (0..2)
            .map(|c| {
                let a = audio(c, 400);
                tokio::spawn(async move {
                    let ws = connect(addr, "").await;
                    let (mut tx, mut rx) = ws.split();
                    let sender = tokio::spawn(async move {
                        for chunk in a.chunks_exact(CHUNK) {
                            if tx.send(Message::Binary(encode(chunk, false).into())).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    });
                    let mut answers = Vec::new();
                    let close = loop {
                        match rx.next().await {
                            Some(Ok(Message::Text(t))) if !t.contains("event") => {
                                answers.push(tokio::time::Instant::now())
                            }
                            Some(Ok(Message::Close(Some(f)))) => break (u16::from(f.code), f.reason.to_string()),
                            Some(Ok(_)) => {}
                            other => break (0, format!("{other:?}")),
                        }
                    };
                    sender.abort();
                    (answers, close)
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The runner's metrics, through the recorder installed before it.
        let (code, body) = http_get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("tract_autobatch_turns_total"), "{body}");
        assert!(body.contains("laned_lanes_free"), "{body}");

        let term_at = tokio::time::Instant::now();
        let pid = child.id().unwrap();
        assert!(std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success());
        wait_status(addr, "/ready", 503, Duration::from_millis(500)).await;
        // A new connection now is turned away.
        let mut late = connect(addr, "").await;
        let (code, reason) = expect_close(&mut late).await;
        assert_eq!(code, close::GOING_AWAY, "{reason}");

        for (c, t) in clients.into_iter().enumerate() {
            let (answers, (code, reason)) = t.await.unwrap();
            assert_eq!(code, close::GOING_AWAY, "client {c}: {reason}");
            assert!(!reason.is_empty());
            let after = answers
                .iter()
                .filter(|t| **t > term_at + Duration::from_millis(1000))
                .count();
            assert!(after > 0, "client {c} got answers until the deadline");
            let last = *answers.last().unwrap();
            assert!(
                last < term_at + Duration::from_millis(3000),
                "client {c}: answers past the deadline"
            );
        }
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("vad-server exits after the drain")
            .unwrap();
        assert_eq!(status.code(), Some(0));
    });
}
