//! vad-server as a child process: SIGTERM with 16 live clients. /ready goes
//! 503 from the signal on; the clients keep getting every answer, in order,
//! until the drain deadline, then a 1001 close while they still have audio
//! to send; the process exits 0. A second SIGTERM ends the drain at once.

use crate::common;

use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use laned_models::silero::CHUNK;
use laned_wire::close;
use tokio_tungstenite::tungstenite::Message;

/// SIGTERM with 16 live clients: 503 from the signal, answers without a gap
/// after it, 1001 at the deadline (before their audio ran out), exit 0.
#[test]
fn silero_sigterm_drains_then_closes_with_1001_and_exits_0() {
    let Some(model) = model_path() else { return };
    bounded(120, async {
        let (mut child, addr) = child_server(&model, &["--lanes", "16", "--drain-deadline-ms", "1500"]).await;
        wait_status(addr, "/ready", 200, Duration::from_secs(5)).await;

        // 16 clients, a chunk every 20 ms (8 s of audio) until closed.
        let (signalled_tx, signalled) = tokio::sync::watch::channel(false);
        let clients: Vec<_> = (0..16)
            .map(|c| {
                let a = audio(c, 400);
                let signalled = signalled.clone();
                tokio::spawn(async move {
                    let ws = connect(addr, "").await;
                    let (mut tx, mut rx) = ws.split();
                    // Whether it sent all its audio (false: a send failed,
                    // the server having closed).
                    let sender = tokio::spawn(async move {
                        for chunk in a.chunks_exact(CHUNK) {
                            if tx.send(Message::Binary(encode(chunk, false).into())).await.is_err() {
                                return false;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        true
                    });
                    // Chunk numbers answered, and how many after /ready
                    // went 503.
                    let (mut answered, mut after_signal) = (Vec::new(), 0);
                    let close = loop {
                        match rx.next().await {
                            Some(Ok(Message::Text(t))) if !t.contains("event") => {
                                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                                answered.push(v["chunk"].as_u64().unwrap());
                                if *signalled.borrow() {
                                    after_signal += 1;
                                }
                            }
                            Some(Ok(Message::Close(Some(f)))) => break (u16::from(f.code), f.reason.to_string()),
                            Some(Ok(_)) => {}
                            other => break (0, format!("{other:?}")),
                        }
                    };
                    let audio_left = if sender.is_finished() {
                        !sender.await.unwrap()
                    } else {
                        sender.abort();
                        true
                    };
                    (answered, after_signal, audio_left, close)
                })
            })
            .collect();
        // Every client streaming before the signal.
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (_, body) = http_get(addr, "/metrics").await;
            if body
                .lines()
                .any(|l| l.starts_with("laned_lanes_free") && l.ends_with(" 0"))
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < until,
                "16 clients never held the 16 lanes: {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The runner's metrics, through the recorder installed before it.
        let (code, body) = http_get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("tract_autobatch_turns_total"), "{body}");

        let pid = child.id().unwrap();
        sigterm(pid);
        // A bound on the wait, not a claim on the latency: the checks that
        // follow are ordered after the 503.
        wait_status(addr, "/ready", 503, Duration::from_secs(10)).await;
        signalled_tx.send(true).unwrap();
        // A new connection now is turned away.
        let mut late = connect(addr, "").await;
        let (code, reason) = expect_close(&mut late).await;
        assert_eq!(code, close::GOING_AWAY, "{reason}");

        for (c, t) in clients.into_iter().enumerate() {
            let (answered, after_signal, audio_left, (code, reason)) = t.await.unwrap();
            assert_eq!(code, close::GOING_AWAY, "client {c}: {reason}");
            assert!(!reason.is_empty());
            let want: Vec<u64> = (0..answered.len() as u64).collect();
            assert_eq!(answered, want, "client {c}: every chunk answered, in order, none lost");
            // 1.5 s of drain at a chunk every 20 ms: dozens of answers.
            assert!(
                after_signal >= 10,
                "client {c}: {after_signal} answers after the signal"
            );
            assert!(
                audio_left,
                "client {c}: closed by the deadline, not by running out of audio"
            );
        }
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("vad-server exits after the drain")
            .unwrap();
        assert_eq!(status.code(), Some(0));
    });
}

/// A second SIGTERM during a drain ends it at once: with a 60 s drain
/// deadline and a client holding its lane, the process exits 0 within
/// seconds of the second signal, the client closed with 1001.
#[test]
fn silero_a_second_sigterm_ends_the_drain_now() {
    let Some(model) = model_path() else { return };
    let a = audio(0, 2);
    bounded(60, async {
        let (mut child, addr) = child_server(&model, &["--lanes", "2", "--drain-deadline-ms", "60000"]).await;
        wait_status(addr, "/ready", 200, Duration::from_secs(5)).await;
        let mut held = connect_holding(addr, &a[..CHUNK]).await;
        let pid = child.id().unwrap();
        sigterm(pid);
        wait_status(addr, "/ready", 503, Duration::from_secs(10)).await;
        // Draining now, for up to 60 s: the held client keeps its lane.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(child.try_wait().unwrap().is_none(), "the drain ended on its own");
        sigterm(pid);
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("vad-server exits soon after the second SIGTERM")
            .unwrap();
        assert_eq!(status.code(), Some(0));
        let (code, reason) = expect_close(&mut held).await;
        assert_eq!(code, close::GOING_AWAY, "{reason}");
    });
}
