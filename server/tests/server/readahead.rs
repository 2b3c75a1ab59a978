//! vad-server as a child process against 32 connections that each keep
//! a long run of calls in flight and send frames just under what the
//! transport takes (twice the frame limit) meanwhile: what the server
//! reads ahead is bounded in bytes, so its memory stays under the stated
//! per-connection bound times the connections; a good client beside them
//! is answered exactly.

use crate::common::*;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

/// One hostile connection, for `secs`: a frame of a full `max` bytes (512
/// chunks, so calls stay in flight a while), then frames of twice `max`
/// less 4 bytes (refused, but only once read), reconnecting whenever it is
/// closed; replies are read and dropped.
async fn hostile(addr: std::net::SocketAddr, max: usize, secs: u64) {
    let until = tokio::time::Instant::now() + Duration::from_secs(secs);
    let good = vec![0u8; max];
    let big = vec![0u8; 2 * max - 4];
    while tokio::time::Instant::now() < until {
        let Ok((ws, _)) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/vad")).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let (mut tx, mut rx) = ws.split();
        let reader = tokio::spawn(async move { while let Some(Ok(_)) = rx.next().await {} });
        let _ = tokio::time::timeout_at(until, async {
            if tx.send(Message::Binary(good.clone().into())).await.is_err() {
                return;
            }
            while tx.send(Message::Binary(big.clone().into())).await.is_ok() {}
        })
        .await;
        reader.abort();
    }
}

/// 32 hostile connections for 6 s against the default 1 MiB frame limit:
/// the server grows by less than 32 times the stated per-connection bound
/// (8 frame limits plus 512 KiB) and 64 MiB (it read eight frames ahead, up
/// to 2 MiB each, and grew about 21 MiB per connection before); a good
/// client streaming meanwhile gets its solo run's answers.
#[test]
fn silero_read_ahead_stays_within_the_per_connection_bound() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(120, async {
        let (child, addr) = child_server(&model, &["--lanes", "40", "--idle-ms", "10000"]).await;
        wait_status(addr, "/ready", 200, Duration::from_secs(5)).await;
        let pid = child.id().unwrap();
        let samples = audio(3, 60);
        let want = solo(&plan, &samples);
        // Warm: the first streams allocate the turn buffers.
        assert_eq!(stream(addr, &samples, false, 1).await, want);
        let before = rss(pid);

        let max = 1 << 20;
        let attack: Vec<_> = (0..32).map(|_| tokio::spawn(hostile(addr, max, 6))).collect();
        let sampler = tokio::spawn(async move {
            let mut peak = 0;
            for _ in 0..140 {
                peak = peak.max(rss(pid));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            stream(addr, &samples, false, 2).await,
            want,
            "a good client under the attack"
        );
        for a in attack {
            a.await.unwrap();
        }
        let peak = sampler.await.unwrap();
        let grew = peak.saturating_sub(before);
        let per_connection = (8 * max + 512 * 1024) as u64;
        let bound = 32 * per_connection + (64 << 20);
        eprintln!(
            "32 hostile connections: the server grew by {} MiB at its peak ({} MiB per connection); bound {} MiB",
            grew >> 20,
            (grew / 32) >> 20,
            bound >> 20
        );
        assert!(
            grew < bound,
            "grew by {} MiB, over the bound of {} MiB",
            grew >> 20,
            bound >> 20
        );
        drop(child);
    });
}
