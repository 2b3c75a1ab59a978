//! vad-server in-process, real WebSocket clients on 127.0.0.1: exact
//! answers for many concurrent streams, admission (1013, /ready),
//! malformed frames (1003, 1009), lanes freed by disconnects.

use crate::common;

use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use laned_models::silero::CHUNK;
use laned_runner::Mode;
use laned_wire::close;
use tokio_tungstenite::tungstenite::Message;

/// 64 concurrent clients (32 lanes on each of 2 shards), in both modes, each with its own
/// generated audio, half as f32 and half as i16, sent in frames of random
/// sizes: every probability equals the stream's solo run.
#[test]
fn silero_concurrent_clients_get_their_solo_probabilities() {
    let Some(plan) = plan() else { return };
    const CLIENTS: usize = 64;
    let inputs: Vec<(Vec<f32>, bool)> = (0..CLIENTS)
        .map(|c| {
            let i16_format = c % 2 == 1;
            (audio(c, 6 + c % 7), i16_format)
        })
        .collect();
    let want: Vec<Vec<f32>> = inputs
        .iter()
        .map(|(a, i16_format)| {
            if *i16_format {
                solo(&plan, &through_i16(a))
            } else {
                solo(&plan, a)
            }
        })
        .collect();
    bounded(300, async {
        for mode in [Mode::Worker, Mode::Combining] {
            let server = server_in(&plan, 32, 2, 60_000, mode).await;
            let addr = server.addr;
            let tasks: Vec<_> = inputs
                .iter()
                .cloned()
                .enumerate()
                .map(|(c, (a, i16_format))| tokio::spawn(async move { stream(addr, &a, i16_format, c as u64).await }))
                .collect();
            for (c, t) in tasks.into_iter().enumerate() {
                let got = t.await.unwrap();
                assert_eq!(got, want[c], "{mode:?}: client {c}");
            }
            let m = server.runner().metrics();
            eprintln!("{mode:?}: {} chunks in {} turns", m.seats, m.turns);
            server.shutdown().await;
        }
    });
    assert_ne!(want[0], want[1]);
}

/// Connections that upgrade and never send hold no lane: with two lanes
/// and ten such connections open, two streams are served at once, each
/// exactly (a lane is taken at a stream's first chunk).
#[test]
fn silero_connections_that_never_send_hold_no_lane() {
    let Some(plan) = plan() else { return };
    bounded(60, async {
        let server = server(&plan, 2, 1, 300).await;
        let addr = server.addr;
        let mut silent = Vec::new();
        for _ in 0..10 {
            silent.push(connect(addr, "").await);
        }
        assert_eq!(
            server.runner().capacity().lanes_free,
            2,
            "a silent connection took a lane"
        );
        streams_get_their_solo(addr, &plan, &[20, 21], 6).await;
        drop(silent);
        server.shutdown().await;
    });
}

/// Two lanes, two clients holding them: a third waits (/ready 503 while it
/// does), then is closed with 1013 past the admission wait; /ready is 200
/// again after, and a lane freed by a leaving client serves a new one.
#[test]
fn silero_clients_past_the_lanes_are_refused_with_1013() {
    let Some(plan) = plan() else { return };
    let a = audio(0, 2);
    bounded(60, async {
        let server = server(&plan, 2, 1, 1_500).await;
        let addr = server.addr;
        wait_status(addr, "/ready", 200, Duration::from_secs(5)).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(connect_holding(addr, &a[..CHUNK]).await);
        }
        assert_eq!(server.runner().capacity().lanes_free, 0);
        // Free lanes 0, nobody waiting: still ready.
        assert_eq!(http_status(addr, "/ready").await, 200);
        let mut third = connect(addr, "").await;
        // Its first chunk asks for a lane (a connection that never sends
        // holds none).
        third
            .send(Message::Binary(encode(&a[..CHUNK], false).into()))
            .await
            .unwrap();
        // While it waits (for up to the 1.5 s admission wait), unready.
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while server.runner().capacity().spawners_waiting == 0 {
            assert!(tokio::time::Instant::now() < until, "the third client never waited");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(
            http_status(addr, "/ready").await,
            503,
            "a spawner waits, no lane is free"
        );
        let (code, reason) = expect_close(&mut third).await;
        assert_eq!(code, close::TRY_AGAIN_LATER, "{reason}");
        assert!(!reason.is_empty());
        wait_status(addr, "/ready", 200, Duration::from_secs(10)).await;
        assert_eq!(http_status(addr, "/live").await, 200);
        // One leaves: a new client gets its lane.
        let mut gone = held.pop().unwrap();
        gone.close(None).await.unwrap();
        let got = stream(addr, &a, false, 9).await;
        assert_eq!(got, solo(&plan, &a));
        drop(held);
        server.shutdown().await;
    });
}

/// One lane, held: three clients connect one after another and wait (each
/// counted waiting before the next connects); as the lane frees, they are
/// served in the order they arrived, each answered exactly.
#[test]
fn silero_waiting_clients_are_served_in_arrival_order() {
    let Some(plan) = plan() else { return };
    let a = audio(5, 2);
    let want = solo(&plan, &a[..2 * CHUNK]);
    bounded(60, async {
        let server = server(&plan, 1, 1, 30_000).await;
        let addr = server.addr;
        let mut holder = connect_holding(addr, &a[..CHUNK]).await;
        let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiting = Vec::new();
        for c in 0..3usize {
            let mut ws = connect(addr, "").await;
            // Its audio is read only once it has a lane.
            ws.send(Message::Binary(encode(&a[..2 * CHUNK], false).into()))
                .await
                .unwrap();
            let until = tokio::time::Instant::now() + Duration::from_secs(10);
            while server.runner().capacity().spawners_waiting < c + 1 {
                assert!(tokio::time::Instant::now() < until, "client {c} never waited");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let order_tx = order_tx.clone();
            waiting.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for k in 0..2 {
                    match next_reply(&mut ws).await {
                        Reply::Probability(n, p) => {
                            assert_eq!(n, k);
                            got.push(p);
                        }
                        other => panic!("client {c}: {other:?}"),
                    }
                }
                order_tx.send(c).unwrap();
                // Leaving frees the lane for the next in line.
                ws.close(None).await.unwrap();
                got
            }));
        }
        assert_eq!(server.runner().capacity().spawners_waiting, 3);
        // Only the clients' senders left: a client that panics ends the
        // channel, and the panic shows at its join below.
        drop(order_tx);
        holder.close(None).await.unwrap();
        let mut order = Vec::new();
        while let Some(c) = order_rx.recv().await {
            order.push(c);
        }
        for (c, t) in waiting.into_iter().enumerate() {
            assert_eq!(t.await.unwrap(), want, "client {c}");
        }
        assert_eq!(order, [0, 1, 2], "served out of arrival order");
        server.shutdown().await;
    });
}

/// A text frame, an odd i16 byte count, an oversized frame and an unknown
/// format (a long one too) are each closed with their code and a reason
/// that fits a close frame, while two other
/// clients stream throughout and get their exact answers.
#[test]
fn silero_malformed_frames_close_only_their_connection() {
    let Some(plan) = plan() else { return };
    let good: Vec<Vec<f32>> = (0..2).map(|c| audio(c + 10, 40)).collect();
    let want: Vec<Vec<f32>> = good.iter().map(|a| solo(&plan, a)).collect();
    bounded(120, async {
        let server = server(&plan, 8, 1, 5_000).await;
        let addr = server.addr;
        let streams: Vec<_> = good
            .into_iter()
            .enumerate()
            .map(|(c, a)| tokio::spawn(async move { stream(addr, &a, false, 100 + c as u64).await }))
            .collect();

        let mut ws = connect(addr, "").await;
        ws.send(Message::Text("hello".into())).await.unwrap();
        let (code, reason) = expect_close(&mut ws).await;
        assert_eq!(code, close::UNSUPPORTED, "text: {reason}");
        assert!(reason.contains("text"), "{reason}");

        let mut ws = connect(addr, "?format=i16").await;
        ws.send(Message::Binary(vec![1u8, 2, 3].into())).await.unwrap();
        let (code, reason) = expect_close(&mut ws).await;
        assert_eq!(code, close::UNSUPPORTED, "odd i16: {reason}");
        assert!(reason.contains("3 bytes"), "{reason}");

        let mut ws = connect(addr, "").await;
        ws.send(Message::Binary(vec![0u8; 100 * 1024].into())).await.unwrap();
        let (code, reason) = expect_close(&mut ws).await;
        assert_eq!(code, close::TOO_BIG, "oversized: {reason}");
        assert!(reason.contains("limit"), "{reason}");

        let mut ws = connect(addr, "?format=mp3").await;
        let (code, reason) = expect_close(&mut ws).await;
        assert_eq!(code, close::UNSUPPORTED, "unknown format: {reason}");
        assert!(reason.contains("mp3"), "{reason}");

        // A reason quoting a long input is cut to what a close frame holds
        // (123 bytes), not sent whole as a protocol error.
        let mut ws = connect(addr, &format!("?format={}", "x".repeat(200))).await;
        let (code, reason) = expect_close(&mut ws).await;
        assert_eq!(code, close::UNSUPPORTED, "long format: {reason}");
        assert!(reason.len() <= 123 && reason.contains("xxx"), "{reason}");

        for (c, t) in streams.into_iter().enumerate() {
            assert_eq!(t.await.unwrap(), want[c], "good client {c}");
        }
        server.shutdown().await;
    });
}

/// Clients leaving mid-stream (closing, or dropping the connection with
/// calls queued) free their lanes: 1,000 cycles on 2 lanes leak none.
#[test]
fn silero_disconnects_free_their_lanes() {
    let Some(plan) = plan() else { return };
    let a = audio(3, 30);
    bounded(300, async {
        let server = server(&plan, 2, 1, 10_000).await;
        let addr = server.addr;
        for cycle in 0..1_000 {
            let mut ws = connect_holding(addr, &a[..CHUNK]).await;
            match cycle % 3 {
                0 => ws.close(None).await.unwrap(),
                1 => {
                    // Many chunks queued, then gone without a close.
                    ws.send(Message::Binary(encode(&a, false).into())).await.unwrap();
                    drop(ws);
                }
                _ => drop(ws),
            }
        }
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let c = server.runner().capacity();
            if c.lanes_free == c.lanes && server.connections() == 0 {
                break;
            }
            assert!(tokio::time::Instant::now() < until, "lanes leaked: {c:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        wait_status(addr, "/ready", 200, Duration::from_secs(10)).await;
        server.shutdown().await;
    });
}

/// A client gone while its call waits for a turn (a 60 s linger, the other
/// stream holding a lane idle) has its call cancelled and its lane freed at
/// once, long before the turn would have run; the other stream goes on.
#[test]
fn silero_a_client_gone_mid_call_frees_its_lane_at_once() {
    let Some(plan) = plan() else { return };
    let a = audio(4, 3);
    bounded(60, async {
        let settings = laned_server::Settings {
            lanes: 2,
            policy: "linger:60000000".into(),
            limits: laned_server::Limits {
                admission_wait_ms: 5_000,
                drain_deadline_ms: 500,
                ..laned_server::Limits::default()
            },
            ..laned_server::Settings::default()
        };
        let server = server_with(&plan, settings).await;
        let addr = server.addr;
        // A lane is taken at a stream's first chunk: the idle stream's is
        // answered while it is alone, then it sends nothing more.
        let mut idle = connect_holding(addr, &a[..CHUNK]).await;
        let mut leaving = connect(addr, "").await;
        leaving
            .send(Message::Binary(encode(&a[..CHUNK], false).into()))
            .await
            .unwrap();
        // The call is queued, its turn lingering for the idle stream.
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while server.runner().capacity().seats_queued == 0 {
            assert!(tokio::time::Instant::now() < until, "the call was never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(leaving);
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let c = server.runner().capacity();
            if c.lanes_free == 1 && c.seats_queued == 0 {
                break;
            }
            assert!(tokio::time::Instant::now() < until, "the lane was not freed: {c:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Alone now, the idle stream is served at once (every held lane queued).
        idle.send(Message::Binary(encode(&a[CHUNK..2 * CHUNK], false).into()))
            .await
            .unwrap();
        match next_reply(&mut idle).await {
            Reply::Probability(1, p) => assert_eq!(p, solo(&plan, &a[..2 * CHUNK])[1]),
            other => panic!("{other:?}"),
        }
        idle.close(None).await.unwrap();
        server.shutdown().await;
    });
}

/// A client that holds its lane and then sends nothing (silent, or gone
/// without a FIN) is closed with 1008 after `idle_ms`, and a client waiting
/// for that lane gets it and its exact answers.
#[test]
fn silero_a_silent_client_loses_its_lane_after_the_idle_time() {
    let Some(plan) = plan() else { return };
    let a = audio(6, 4);
    let want = solo(&plan, &a);
    bounded(60, async {
        let settings = laned_server::Settings {
            lanes: 1,
            limits: laned_server::Limits {
                admission_wait_ms: 20_000,
                idle_ms: 1_000,
                ..laned_server::Limits::default()
            },
            ..laned_server::Settings::default()
        };
        let server = server_with(&plan, settings).await;
        let addr = server.addr;
        let mut silent = connect_holding(addr, &audio(7, 1)).await;
        assert_eq!(server.runner().capacity().lanes_free, 0);
        // Waits for the only lane, which the silent client holds.
        let waiting = tokio::spawn(async move { stream(addr, &a, false, 7).await });
        let (code, reason) = expect_close(&mut silent).await;
        assert_eq!(code, close::IDLE, "{reason}");
        assert!(reason.contains("1s"), "{reason}");
        assert_eq!(waiting.await.unwrap(), want);
        server.shutdown().await;
    });
}

/// Only audio counts as activity: a client sending pings, or empty binary
/// frames, every 150 ms and no audio is closed with 1008 at `idle_ms`
/// (500 ms) all the same, its lane freed.
#[test]
fn silero_pings_and_empty_frames_keep_no_lane() {
    let Some(plan) = plan() else { return };
    bounded(60, async {
        let settings = laned_server::Settings {
            lanes: 2,
            limits: laned_server::Limits {
                idle_ms: 500,
                ..laned_server::Limits::default()
            },
            ..laned_server::Settings::default()
        };
        let server = server_with(&plan, settings).await;
        let addr = server.addr;
        for empty_frames in [false, true] {
            let mut ws = connect_holding(addr, &audio(8, 1)).await;
            let started = tokio::time::Instant::now();
            let (code, reason) = loop {
                let keepalive = if empty_frames {
                    Message::Binary(Vec::new().into())
                } else {
                    Message::Ping(b"hi".to_vec().into())
                };
                if ws.send(keepalive).await.is_err() {
                    break expect_close(&mut ws).await;
                }
                // Replies (pongs) and the close, whichever comes, for 150 ms
                // (a keepalive every 150 ms, not one per pong: that would be
                // a flood, closed by the frame budget).
                let next = tokio::time::Instant::now() + Duration::from_millis(150);
                let closed = loop {
                    match tokio::time::timeout_at(next, ws.next()).await {
                        Ok(Some(Ok(Message::Close(Some(f))))) => break Some((u16::from(f.code), f.reason.to_string())),
                        Ok(None) | Ok(Some(Err(_))) => panic!("dropped without a close frame"),
                        Ok(Some(Ok(_))) => continue,
                        Err(_) => break None,
                    }
                };
                if let Some(closed) = closed {
                    break closed;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "kept open by {}",
                    if empty_frames { "empty frames" } else { "pings" }
                );
            };
            assert_eq!(code, close::IDLE, "{reason}");
            assert!(reason.contains("no audio"), "{reason}");
        }
        // Both lanes freed (the release lands just after the close).
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while server.runner().capacity().lanes_free != 2 {
            assert!(
                tokio::time::Instant::now() < until,
                "a keepalive client's lane was never freed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server.shutdown().await;
    });
}

/// What the transport itself refuses gets a close frame too: a binary frame
/// past twice the frame limit, a text frame as large, and a fragmented
/// message whose frames are each under the limit but not their sum, are
/// each closed with 1009 and a reason (not dropped, a client seeing 1006).
#[test]
fn silero_frames_past_the_transport_limit_are_closed_with_1009() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    let Some(plan) = plan() else { return };
    bounded(60, async {
        // The test server takes 64 KiB frames, its transport 128 KiB.
        let server = server(&plan, 2, 1, 1_000).await;
        let addr = server.addr;
        let limit = 64 * 1024;
        let attacks: Vec<(&str, Vec<Message>)> = vec![
            ("binary", vec![Message::Binary(vec![0u8; 2 * limit + 4].into())]),
            ("text", vec![Message::Text("a".repeat(2 * limit + 4).into())]),
            (
                "fragmented",
                vec![
                    Message::Frame(Frame::message(vec![0u8; 60 * 1024], OpCode::Data(Data::Binary), false)),
                    Message::Frame(Frame::message(
                        vec![0u8; 60 * 1024],
                        OpCode::Data(Data::Continue),
                        false,
                    )),
                    Message::Frame(Frame::message(vec![0u8; 60 * 1024], OpCode::Data(Data::Continue), true)),
                ],
            ),
        ];
        for (what, frames) in attacks {
            let mut ws = connect(addr, "").await;
            for frame in frames {
                if ws.send(frame).await.is_err() {
                    break;
                }
            }
            let (code, reason) = expect_close(&mut ws).await;
            assert_eq!(code, close::TOO_BIG, "{what}: {reason}");
            assert!(!reason.is_empty(), "{what}");
        }
        // A good client beside them is served exactly.
        let a = audio(3, 4);
        assert_eq!(stream(addr, &a, false, 3).await, solo(&plan, &a));
        server.shutdown().await;
    });
}

/// A repeated `?format=` is refused as every bad format is, with 1003 and
/// a reason after the upgrade (it was a bare HTTP 400); a single one works.
#[test]
fn silero_a_repeated_format_is_closed_with_1003() {
    let Some(plan) = plan() else { return };
    bounded(30, async {
        let server = server(&plan, 2, 1, 1_000).await;
        let mut ws = connect(server.addr, "?format=i16&format=f32").await;
        let (code, reason) = expect_close(&mut ws).await;
        assert_eq!(code, close::UNSUPPORTED, "{reason}");
        assert!(reason.contains("more than once"), "{reason}");
        let a = audio(4, 3);
        assert_eq!(stream(server.addr, &a, true, 4).await, solo(&plan, &through_i16(&a)));
        server.shutdown().await;
    });
}
