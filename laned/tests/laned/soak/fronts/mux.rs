//! The multiplexed front through HAProxy: one connection (pinned by its
//! own `x-stream-id`) carrying [`STREAMS`] streams at once, each opened
//! with its id; a stream closed (1012 on a drain) is opened again by id
//! and resent from the opened record's position, on this connection while
//! it lives, else on the next.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use super::super::super::mux::record;
use super::super::stream::{Answer, Ended, Interrupted, Run, WAIT};
use super::super::Ctx;
use super::close_said;

/// Streams at once on a connection.
pub const STREAMS: usize = 4;

const OPEN: u8 = 1;
const PULSE: u8 = 2;
const END: u8 = 3;
const OPENED: u8 = 0x81;
const ANSWER: u8 = 0x82;
const CLOSED: u8 = 0x83;

/// The records of one server message: kind, tag, payload.
fn records(mut message: &[u8]) -> Vec<(u8, u32, Vec<u8>)> {
    let mut out = vec![];
    while message.len() >= 9 {
        let tag = u32::from_le_bytes(message[1..5].try_into().unwrap());
        let len = u32::from_le_bytes(message[5..9].try_into().unwrap()) as usize;
        out.push((message[0], tag, message[9..9 + len].to_vec()));
        message = &message[9 + len..];
    }
    out
}

/// Where one of the connection's streams is.
enum Phase {
    /// To be opened (again) on the connection at this moment.
    Closed(Instant),
    /// Opened under this tag at this moment, its `opened` not yet come.
    Opening(u32, Instant),
    /// Streaming under this tag: its pulse in flight (number, sent), if
    /// one is.
    Live(u32, Option<(usize, Instant)>),
    /// Every pulse answered, its end sent under this tag at this moment.
    Ending(u32, Instant),
}

/// One of the connection's streams.
struct Slot {
    run: Run,
    next: usize,
    last: Option<Instant>,
    phase: Phase,
    interrupted: Interrupted,
}

/// `STREAMS` streams at once, one after another in each place, until the
/// soak stops starting them.
pub async fn slot(ctx: Arc<Ctx>, slot: usize) {
    let mut k = 0;
    let mut fresh = |ctx: &Ctx| {
        // A connection carries one model's streams.
        let plan = ctx.plan_of("mux", slot, k, slot % ctx.models.len());
        k += 1;
        Slot {
            run: Run::new("mux", plan),
            next: 0,
            last: None,
            phase: Phase::Closed(Instant::now()),
            interrupted: Interrupted::default(),
        }
    };
    let mut places: Vec<Option<Slot>> = (0..STREAMS).map(|_| Some(fresh(&ctx))).collect();
    let mut tags = 0u32;
    while places.iter().any(Option::is_some) {
        let said = connection(&ctx, slot, &mut places, &mut tags, &mut fresh).await;
        // The connection is gone: every stream on it opens again on the
        // next, after a moment.
        for s in places.iter_mut().flatten() {
            s.phase = Phase::Closed(Instant::now() + Duration::from_millis(100));
            s.interrupted.add(said.clone());
        }
        give_up(&mut places, &ctx, &mut fresh);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Streams given up leave their place (to a fresh one while streams
/// start).
fn give_up(places: &mut [Option<Slot>], ctx: &Ctx, fresh: &mut impl FnMut(&Ctx) -> Slot) {
    for place in places.iter_mut() {
        if place.as_ref().is_some_and(|s| s.interrupted.given_up()) {
            let mut s = place.take().unwrap();
            s.run.ended = Ended::Lost {
                told: s.interrupted.told.take(),
            };
            ctx.finish(s.run);
            *place = ctx.open().then(|| fresh(ctx));
        }
    }
}

/// One connection: its streams opened, paced, answered, ended, until it
/// closes or every stream is done; what its close said.
async fn connection(
    ctx: &Ctx,
    slot: usize,
    places: &mut [Option<Slot>],
    tags: &mut u32,
    fresh: &mut impl FnMut(&Ctx) -> Slot,
) -> Option<String> {
    let model = ctx.models[slot % ctx.models.len()].name;
    let mut request = format!("ws://{}/v1/models/{model}/mux", ctx.proxy)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("x-stream-id", format!("soak-{}-mux-{slot}", ctx.seed).parse().unwrap());
    let (mut ws, _) = match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request)).await {
        Ok(Ok(c)) => c,
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(r))) => {
            return Some(format!("upgrade answered {}", r.status()))
        }
        _ => return None,
    };
    match tokio::time::timeout(WAIT, ws.next()).await {
        Ok(Some(Ok(Message::Text(_)))) => {}
        Ok(Some(Ok(Message::Close(f)))) => return close_said(f),
        _ => return None,
    }
    loop {
        give_up(places, ctx, fresh);
        if places.iter().all(Option::is_none) {
            let _ = ws.close(None).await;
            return None;
        }
        // What is due now: opens, and pulses paced a period apart.
        let now = Instant::now();
        let mut message = vec![];
        let mut wake = now + WAIT;
        for s in places.iter_mut().flatten() {
            match s.phase {
                Phase::Closed(at) if at <= now => {
                    *tags += 1;
                    message.extend(record(OPEN, *tags, s.run.plan.id.as_bytes()));
                    s.phase = Phase::Opening(*tags, now);
                }
                Phase::Closed(at) => wake = wake.min(at),
                Phase::Live(tag, None) if s.next == s.run.plan.pulses.len() => {
                    message.extend(record(END, tag, b""));
                    s.phase = Phase::Ending(tag, now);
                }
                Phase::Live(tag, None) => {
                    let due = s.last.map_or(now, |l| l + ctx.period);
                    if due <= now {
                        message.extend(record(PULSE, tag, &s.run.plan.pulses[s.next]));
                        s.phase = Phase::Live(tag, Some((s.next, now)));
                        s.last = Some(now);
                    } else {
                        wake = wake.min(due);
                    }
                }
                Phase::Opening(_, sent) | Phase::Live(_, Some((_, sent))) | Phase::Ending(_, sent) => {
                    wake = wake.min(sent + WAIT)
                }
            }
        }
        if !message.is_empty() {
            if ws.send(Message::Binary(message.into())).await.is_err() {
                return None;
            }
            if ctx.take_drop(slot) {
                return Some("the client dropped its connection".into());
            }
        }
        let got = match tokio::time::timeout_at(wake.into(), ws.next()).await {
            Err(_) => {
                // Nothing came by the wake: an open, a pulse or an end
                // unanswered for WAIT is a connection gone.
                let stuck = places.iter().flatten().any(|s| match s.phase {
                    Phase::Opening(_, sent) | Phase::Live(_, Some((_, sent))) | Phase::Ending(_, sent) => {
                        sent.elapsed() >= WAIT
                    }
                    _ => false,
                });
                if stuck {
                    return None;
                }
                continue;
            }
            Ok(Some(Ok(Message::Binary(b)))) => b,
            Ok(Some(Ok(Message::Close(f)))) => return close_said(f),
            Ok(Some(Ok(_))) => continue,
            Ok(_) => return None,
        };
        for (kind, tag, payload) in records(&got) {
            let Some(place) = places.iter_mut().find(|p| {
                p.as_ref().is_some_and(
                    |s| matches!(s.phase, Phase::Opening(t, _) | Phase::Live(t, _) | Phase::Ending(t, _) if t == tag),
                )
            }) else {
                continue;
            };
            let s = place.as_mut().unwrap();
            match kind {
                OPENED => {
                    let at = u64::from_le_bytes(payload[..8].try_into().unwrap()) as usize;
                    s.next = s
                        .run
                        .resume_at(at, s.next, || "mux: opened at 0 (no record of the stream)".into());
                    s.phase = Phase::Live(tag, None);
                    s.last = None;
                }
                ANSWER => {
                    let n = u64::from_le_bytes(payload[..8].try_into().unwrap()) as usize;
                    let Phase::Live(_, Some((pulse, sent))) = s.phase else {
                        s.run
                            .broken
                            .push(format!("an answer numbered {n} with no pulse in flight"));
                        continue;
                    };
                    if n != pulse {
                        s.run
                            .broken
                            .push(format!("an answer numbered {n} where pulse {pulse} was due"));
                    }
                    s.run.answers.push(Answer {
                        pulse,
                        bytes: payload[8..].to_vec(),
                        sent,
                        got: Instant::now(),
                    });
                    s.next = pulse + 1;
                    s.interrupted.clear();
                    s.phase = Phase::Live(tag, None);
                }
                CLOSED => {
                    let code = u16::from_le_bytes([payload[0], payload[1]]);
                    let why = String::from_utf8_lossy(&payload[2..]).into_owned();
                    if matches!(s.phase, Phase::Ending(..)) && code == 1000 {
                        let mut s = place.take().unwrap();
                        s.run.ended = Ended::Done;
                        ctx.finish(s.run);
                        *place = ctx.open().then(|| fresh(ctx));
                    } else {
                        s.interrupted.add(Some(format!("{code} {why}")));
                        s.phase = Phase::Closed(Instant::now() + Duration::from_millis(200));
                    }
                }
                other => s.run.broken.push(format!("a server record of kind {other}")),
            }
        }
    }
}
