//! KServe v2 sequences over REST through HAProxy: a request a pulse, the
//! sequence id also in `x-stream-id` (the proxy keeps a sequence on its
//! replica). A 503 (`restarting: resume elsewhere`, or the proxy with no
//! replica) is sent again; a refusal naming `sequence_start` starts the
//! sequence again at pulse 0 (under a fresh id: the old one may live on
//! where it was).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::super::stream::{pace, Answer, Ended, Interrupted, Plan, Run, WAIT};
use super::super::Ctx;

/// Sequences one after another on slot `slot` until the soak stops.
pub async fn slot(ctx: Arc<Ctx>, slot: usize) {
    let mut k = 0;
    while ctx.open() {
        let plan = ctx.plan("rest", slot, k);
        ctx.finish(sequence(&ctx, plan).await);
        k += 1;
    }
}

/// Whether a refusal says to start the sequence again.
pub fn says_restart(why: &str) -> bool {
    why.contains("sequence_start") || why.contains("never started")
}

/// One sequence, pulse by pulse, started again where it is told to.
async fn sequence(ctx: &Ctx, plan: Plan) -> Run {
    let model = &ctx.models[plan.model];
    let mut run = Run::new("rest", plan);
    let (mut next, mut last, mut interrupted, mut restarts) = (0, None, Interrupted::default(), 0);
    while next < run.plan.pulses.len() {
        if interrupted.given_up() {
            run.ended = Ended::Lost {
                told: interrupted.told.take(),
            };
            return run;
        }
        pace(last, ctx.period).await;
        let id = format!("{}.{restarts}", run.plan.id);
        let mut inputs = vec![];
        let mut at = 0;
        let pulse = &run.plan.pulses[next];
        for p in &model.interface.inputs {
            assert_eq!(p.dtype, "f32", "the soak's models take f32");
            let data: Vec<f32> = pulse[at..at + 4 * p.len()]
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            at += 4 * p.len();
            inputs.push(serde_json::json!({ "name": p.name, "datatype": "FP32", "shape": p.shape, "data": data }));
        }
        let body = serde_json::json!({
            "parameters": {
                "sequence_id": id,
                "sequence_start": next == 0,
                "sequence_end": next + 1 == run.plan.pulses.len(),
            },
            "inputs": inputs,
        });
        let sent = Instant::now();
        last = Some(sent);
        let path = format!("/v2/models/{}/infer", model.name);
        match post(&ctx.proxy, &path, &id, body.to_string().as_bytes()).await {
            Ok((200, answer)) => {
                let mut bytes = vec![];
                for o in answer["outputs"].as_array().cloned().unwrap_or_default() {
                    for v in o["data"].as_array().cloned().unwrap_or_default() {
                        bytes.extend((v.as_f64().unwrap_or(f64::NAN) as f32).to_le_bytes());
                    }
                }
                run.answers.push(Answer {
                    pulse: next,
                    bytes,
                    sent,
                    got: Instant::now(),
                });
                next += 1;
                interrupted.clear();
            }
            Ok((status, answer)) => {
                let why = answer["error"].as_str().unwrap_or_default().to_string();
                if status == 400 && says_restart(&why) && next > 0 {
                    next = run.resume_at(0, next, || format!("rest: 400 {why}"));
                    restarts += 1;
                    interrupted.clear();
                } else {
                    interrupted.add(Some(format!("{status} {why}")));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(()) => {
                interrupted.add(None);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    run.ended = Ended::Done;
    run
}

/// One HTTP/1.1 POST to `addr` (`Connection: close`), within [`WAIT`]:
/// the status and the body's JSON (`null` where it is none).
async fn post(addr: &str, path: &str, id: &str, body: &[u8]) -> Result<(u16, serde_json::Value), ()> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.map_err(drop)?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-stream-id: {id}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.map_err(drop)?;
        s.write_all(body).await.map_err(drop)?;
        let mut said = vec![];
        s.read_to_end(&mut said).await.map_err(drop)?;
        let said = String::from_utf8_lossy(&said).into_owned();
        let status = said.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or(())?;
        let body = said.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        Ok((status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null)))
    };
    tokio::time::timeout(WAIT, exchange).await.map_err(drop)?
}
