//! The multiplexed front's clients (`/v1/models/NAME/mux`): a gateway's
//! connection carrying many streams. Its streams share the connection's
//! clock, as a media server's calls share its mixing tick: every pulse due
//! goes in one message, several records in it; each stream waits for its
//! answer before its next pulse, as a single-stream client does, and a late
//! answer delays only its own stream. The records are the server's
//! (`laned_wire::mux`).

use std::time::Instant;

use futures_util::{SinkExt, StreamExt};
use laned_wire::mux::{self, ANSWER, CLOSED, OPEN, OPENED, PULSE};
use tokio_tungstenite::tungstenite::Message;
use tract_core::internal::*;

use crate::pace::Pace;
use crate::{Ws, ANSWER_TIMEOUT};

/// Connects to `url` and opens `streams` streams (tags 0.., no ids: no
/// hand-over in a bench), waiting until every one is open.
pub(crate) async fn open(url: &str, streams: usize) -> TractResult<Ws> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    let mut out = Vec::new();
    for tag in 0..streams {
        mux::put(&mut out, OPEN, tag as u32, &[]);
    }
    ws.send(Message::Binary(out.into())).await?;
    let mut opened = 0;
    while opened < streams {
        match next(&mut ws).await? {
            Message::Binary(m) => {
                for r in mux::records(&m).map_err(|e| format_err!("the server's message: {e}"))? {
                    match r.kind {
                        OPENED => opened += 1,
                        CLOSED => bail!("stream {} closed while opening: {}", r.tag, closed(r.payload)),
                        other => bail!("a record of kind {other:#x} before every stream was open"),
                    }
                }
            }
            // The hello, pings.
            _ => continue,
        }
    }
    Ok(ws)
}

/// A closed record's code and reason.
fn closed(payload: &[u8]) -> String {
    let code = payload.get(..2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let reason = String::from_utf8_lossy(payload.get(2..).unwrap_or_default());
    format!("{code:?} {reason}")
}

async fn next(ws: &mut Ws) -> TractResult<Message> {
    match tokio::time::timeout(ANSWER_TIMEOUT, ws.next()).await {
        Err(_) => bail!("no message within {ANSWER_TIMEOUT:?}: the server is wedged"),
        Ok(None) => bail!("the server closed the connection"),
        Ok(Some(m)) => Ok(m?),
    }
}

/// The connection's streams from `first` to `end`, stream `s` feeding
/// `frames[s]`. Latencies in microseconds, from the send of the message
/// carrying the pulse to its answer's arrival, of the pulses sent from
/// `counted` on.
pub(crate) async fn run(
    mut ws: Ws,
    frames: Vec<Vec<u8>>,
    first: Instant,
    counted: Instant,
    end: Instant,
) -> TractResult<Vec<u64>> {
    let k = frames.len();
    let mut pace = Pace::new(k, (first, counted, end));
    loop {
        let mut out = Vec::new();
        for s in pace.take_due(Instant::now()) {
            mux::put(&mut out, PULSE, s as u32, &[&frames[s]]);
        }
        if !out.is_empty() {
            ws.send(Message::Binary(out.into())).await?;
        }
        if pace.done() {
            break;
        }
        let message = match pace.next_due() {
            Some(at) => tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => continue,
                m = next(&mut ws) => m?,
            },
            None => next(&mut ws).await?,
        };
        let Message::Binary(m) = message else { continue };
        for r in mux::records(&m).map_err(|e| format_err!("the server's message: {e}"))? {
            let s = r.tag as usize;
            match r.kind {
                ANSWER if s < k => pace.answered(s),
                CLOSED => bail!("stream {s} closed: {}", closed(r.payload)),
                other => bail!("a record of kind {other:#x} for stream {s}"),
            }
        }
    }
    let _ = ws.close(None).await;
    Ok(pace.latencies())
}
