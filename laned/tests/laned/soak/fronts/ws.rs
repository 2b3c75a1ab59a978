//! The single-stream WebSocket front through HAProxy: a stream id in
//! `x-stream-id`; after a close or a drop, the same id again with the
//! generation the last hello said (`x-resume-generation`), resent from
//! the hello's `resume`.

use std::sync::Arc;
use std::time::Instant;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use super::super::stream::{pace, Answer, Ended, Interrupted, Plan, Run, WAIT};
use super::super::Ctx;
use super::close_said;

/// Streams one after another on slot `slot` until the soak stops.
pub async fn slot(ctx: Arc<Ctx>, slot: usize) {
    let mut k = 0;
    while ctx.open() {
        let plan = ctx.plan("ws", slot, k);
        ctx.finish(stream(&ctx, slot, plan).await);
        k += 1;
    }
}

/// What ended a session early: what was said, if anything.
struct Interruption(Option<String>);

/// One stream, across as many sessions as its interruptions take.
async fn stream(ctx: &Ctx, slot: usize, plan: Plan) -> Run {
    let url = format!("ws://{}/v1/models/{}/stream", ctx.proxy, ctx.models[plan.model].name);
    let mut run = Run::new("ws", plan);
    let mut next = 0;
    let mut interrupted = Interrupted::default();
    let mut generation = None;
    loop {
        if interrupted.given_up() {
            run.ended = Ended::Lost {
                told: interrupted.told.take(),
            };
            return run;
        }
        if interrupted.active() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let at = Place {
            next: &mut next,
            generation: &mut generation,
            interrupted: &mut interrupted,
        };
        match session(ctx, slot, &url, &mut run, at).await {
            Ok(()) => {
                run.ended = Ended::Done;
                return run;
            }
            Err(Interruption(said)) => interrupted.add(said),
        }
    }
}

/// Where a stream stands between its sessions.
struct Place<'a> {
    /// The next pulse to send.
    next: &'a mut usize,
    /// The generation the last hello said.
    generation: &'a mut Option<u64>,
    interrupted: &'a mut Interrupted,
}

/// One connection of the stream: from the hello's `resume` to the end, or
/// to an interruption.
async fn session(ctx: &Ctx, slot: usize, url: &str, run: &mut Run, at: Place<'_>) -> Result<(), Interruption> {
    let Place {
        next,
        generation,
        interrupted,
    } = at;
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("x-stream-id", run.plan.id.parse().unwrap());
    if let Some(g) = generation {
        request
            .headers_mut()
            .insert("x-resume-generation", g.to_string().parse().unwrap());
    }
    let (mut ws, _) = match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request)).await {
        Ok(Ok(c)) => c,
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(r))) => {
            return Err(Interruption(Some(format!("upgrade answered {}", r.status()))))
        }
        _ => return Err(Interruption(None)),
    };
    let hello: serde_json::Value = match tokio::time::timeout(WAIT, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str(&t).unwrap(),
        Ok(Some(Ok(Message::Close(f)))) => return Err(Interruption(close_said(f))),
        _ => return Err(Interruption(None)),
    };
    let resume = hello["resume"].as_u64().expect("a hello's resume") as usize;
    let told = hello.get("restarted").and_then(|r| r.as_str()).map(String::from);
    if let Some(g) = hello.get("generation").and_then(|g| g.as_u64()) {
        *generation = Some(g);
    }
    *next = run.resume_at(resume, *next, || {
        told.unwrap_or_else(|| "ws: the hello said resume 0 (no record of the stream)".into())
    });
    let mut last = None;
    while *next < run.plan.pulses.len() {
        pace(last, ctx.period).await;
        let sent = Instant::now();
        last = Some(sent);
        let pulse = run.plan.pulses[*next].clone();
        if ws.send(Message::Binary(pulse.into())).await.is_err() {
            return Err(Interruption(None));
        }
        if ctx.take_drop(slot) {
            // Dropped between the pulse and its answer: no close frame.
            return Err(Interruption(Some("the client dropped its connection".into())));
        }
        loop {
            match tokio::time::timeout(WAIT, ws.next()).await {
                Ok(Some(Ok(Message::Binary(b)))) => {
                    run.answers.push(Answer {
                        pulse: *next,
                        bytes: b.to_vec(),
                        sent,
                        got: Instant::now(),
                    });
                    *next += 1;
                    interrupted.clear();
                    break;
                }
                Ok(Some(Ok(Message::Close(f)))) => return Err(Interruption(close_said(f))),
                Ok(Some(Ok(_))) => continue,
                _ => return Err(Interruption(None)),
            }
        }
    }
    let _ = ws.close(None).await;
    Ok(())
}
