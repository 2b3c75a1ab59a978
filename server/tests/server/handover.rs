//! The hand-over through a real Redis (Debian's `redis-server`, on a
//! private port and directory): replicas of the vad-server binary behind
//! the shipped HAProxy config, real WebSocket clients that reconnect with
//! their `x-stream-id` on 1012 or a dropped connection and resend from the
//! chunk the server names. A rolling restart (SIGTERM A, restart it, SIGTERM
//! B) and a kill -9 with checkpoints lose no answer and change none; Redis
//! stopped then killed mid-drain costs no drain its deadline; a record
//! unreadable or of another model starts its stream fresh, nobody else
//! touched.

use crate::common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use laned_models::silero::CHUNK;
use laned_server::testing::{free_port, Redis};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// A vad-server child on `listen`, its stdout and stderr lines kept (and
/// echoed, prefixed `name`).
pub(crate) struct Replica {
    child: Child,
    pub(crate) addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Replica {
    pub(crate) async fn start(
        model: &std::path::Path,
        name: &'static str,
        listen: SocketAddr,
        args: &[&str],
    ) -> Replica {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vad-server"))
            .arg("--listen")
            .arg(listen.to_string())
            .args(args)
            .arg("--model")
            .arg(model)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut listening) = tokio::sync::mpsc::unbounded_channel();
        let out = BufReader::new(child.stdout.take().unwrap()).lines();
        let err = BufReader::new(child.stderr.take().unwrap()).lines();
        for mut reader in [Box::new(out) as Box<dyn LineSource>, Box::new(err)] {
            let (lines, tx) = (lines.clone(), tx.clone());
            tokio::spawn(async move {
                while let Some(line) = reader.next().await {
                    eprintln!("{name}: {line}");
                    if let Some(a) = line.strip_prefix("vad-server listening on ") {
                        let _ = tx.send(a.parse::<SocketAddr>().unwrap());
                    }
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let addr = tokio::time::timeout(Duration::from_secs(60), listening.recv())
            .await
            .expect("vad-server never listened")
            .expect("vad-server exited before listening");
        Replica { child, addr, lines }
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("a live vad-server")
    }

    /// SIGKILLs it and waits for its end.
    pub(crate) async fn kill(&mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }

    pub(crate) fn said(&self, part: &str) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(part))
            .cloned()
            .collect()
    }

    /// Waits for the exit (within `within`): its status code.
    async fn exit(&mut self, within: Duration) -> Option<i32> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .expect("vad-server did not exit in time")
            .unwrap()
            .code()
    }
}

/// Lines of a child's output, boxed so stdout and stderr share a loop.
trait LineSource: Send {
    fn next(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + '_>>;
}

impl<R: tokio::io::AsyncBufRead + Unpin + Send> LineSource for tokio::io::Lines<R> {
    fn next(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + '_>> {
        Box::pin(async move { self.next_line().await.ok().flatten() })
    }
}

/// HAProxy on `front` running the shipped config, its two servers pointed
/// at `replicas`; up and answering `/live` through them.
async fn haproxy(front: SocketAddr, replicas: [SocketAddr; 2]) -> Option<(Child, tempfile::TempDir)> {
    if std::process::Command::new("haproxy").arg("-v").output().is_err() {
        eprintln!("SKIPPED: haproxy is not installed (Debian's `haproxy`; .ci/run installs it)");
        return None;
    }
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/haproxy/haproxy.cfg")).unwrap();
    let cfg = shipped
        .replace("127.0.0.1:8000", &front.to_string())
        .replace("127.0.0.1:9001", &replicas[0].to_string())
        .replace("127.0.0.1:9002", &replicas[1].to_string());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("haproxy.cfg"), cfg).unwrap();
    let proxy = Command::new("haproxy")
        .arg("-db")
        .arg("-f")
        .arg(dir.path().join("haproxy.cfg"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(front).await.is_err() {
        assert!(Instant::now() < until, "haproxy never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_status(front, "/live", 200, Duration::from_secs(10)).await;
    Some((proxy, dir))
}

/// Audio with speech in it where espeak-ng speaks (else generated sound
/// only): `chunks` whole chunks and a few samples more, seeded by `s`.
pub(crate) fn voice(s: usize, chunks: usize) -> Vec<f32> {
    let mut samples =
        laned_models::sound::speak(&format!("stream {s} says hello, then it keeps talking")).unwrap_or_default();
    samples.truncate(chunks * CHUNK / 2);
    let rest = chunks * CHUNK + 100 - samples.len();
    let filler = audio(s, rest / CHUNK + 1);
    samples.extend_from_slice(&filler[..rest]);
    samples
}

/// What a reconnecting client saw of its stream.
#[derive(Debug, Default)]
struct Seen {
    /// Each chunk's probability, as last answered.
    answers: Vec<Option<f32>>,
    /// The chunk each connection resumed from (x-resume-chunk).
    resumed_from: Vec<u64>,
    /// The chunks answered before each reconnect.
    answered_before: Vec<usize>,
    /// How each connection but the last ended: a close code, 1006 for a
    /// connection dropped without one.
    closes: Vec<u16>,
    /// Connects refused or answered without an upgrade (retried).
    connect_failures: usize,
    /// A chunk answered twice differently, or a resume past the answers.
    wrong: Vec<String>,
}

/// Streams `samples` as stream `id` through `front` at `pace` a chunk:
/// on 1012, another close or a dropped connection it reconnects with its
/// id and resends from the chunk the server names, until every chunk is
/// answered (then it closes normally), or `within` passes.
async fn reconnecting(front: SocketAddr, id: String, samples: Vec<f32>, pace: Duration, within: Duration) -> Seen {
    let n = samples.len() / CHUNK;
    let mut seen = Seen {
        answers: vec![None; n],
        ..Seen::default()
    };
    let samples = Arc::new(samples);
    let until = Instant::now() + within;
    loop {
        assert!(
            Instant::now() < until,
            "{id}: not every chunk answered within {within:?}: closes {:?}, resumed from {:?}, {} connect failures",
            seen.closes,
            seen.resumed_from,
            seen.connect_failures
        );
        let mut request = format!("ws://{front}/v1/vad").into_client_request().unwrap();
        request.headers_mut().insert("x-stream-id", id.parse().unwrap());
        let (ws, response) = match tokio_tungstenite::connect_async(request).await {
            Ok(c) => c,
            Err(_) => {
                seen.connect_failures += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let from: u64 = response
            .headers()
            .get("x-resume-chunk")
            .unwrap_or_else(|| panic!("{id}: no x-resume-chunk on the upgrade"))
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let answered = seen.answers.iter().take_while(|a| a.is_some()).count();
        // A first connection may resume a record from an earlier client
        // of the id; a reconnect never past what it got answered.
        if !seen.resumed_from.is_empty() && from as usize > answered {
            seen.wrong
                .push(format!("resumed from chunk {from}, only {answered} answered"));
        }
        if !seen.resumed_from.is_empty() || from > 0 {
            seen.answered_before.push(answered);
        }
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
                        assert!(!hello, "{id}: two resume messages");
                        assert_eq!(
                            r.as_u64(),
                            Some(from),
                            "{id}: the resume message disagrees with the header"
                        );
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
                Some(Ok(Message::Close(f))) => break Some(f.map(|f| u16::from(f.code)).unwrap_or(1005)),
                Some(Ok(_)) => {}
                _ => break Some(1006),
            }
        };
        match ended {
            None => {
                let tx = sender.await.unwrap();
                let mut ws = tx.reunite(rx).unwrap();
                let _ = ws.close(None).await;
                if !hello {
                    seen.wrong.push("no resume message".into());
                }
                return seen;
            }
            Some(code) => {
                sender.abort();
                seen.closes.push(code);
            }
        }
    }
}

/// The sum of a counter's series with `label` on `addr`'s `/metrics`.
pub(crate) async fn counter(addr: SocketAddr, name: &str, label: &str) -> f64 {
    let Some((_, body)) = try_http_get(addr, "/metrics").await else {
        return f64::NAN;
    };
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Answers equal to the solo run's, bit for bit, from chunk `from` on.
fn check_from(id: &str, seen: &Seen, solo: &[f32], from: usize) {
    assert!(seen.wrong.is_empty(), "{id}: {:?}", seen.wrong);
    for (c, want) in solo.iter().enumerate().skip(from) {
        let got = seen.answers[c]
            .unwrap_or_else(|| panic!("{id}: chunk {c} never answered (resumed from {:?})", seen.resumed_from));
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{id}: chunk {c}: {got} where the solo run says {want}"
        );
    }
}

/// Two replicas behind HAProxy and one Redis, 32 live streams: SIGTERM A,
/// then (once it exited) A again, then SIGTERM B. Every stream is handed
/// over once or twice, and every client's whole answer sequence equals its
/// solo run bit for bit; no client sees a close other than 1012 nor a
/// dropped connection.
#[test]
fn silero_handover_a_rolling_restart_of_two_replicas_loses_no_stream() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(240, async move {
        let Some(redis) = Redis::start() else { return };
        let url = redis.url();
        let args = ["--lanes", "40", "--drain-deadline-ms", "10000", "--store", &url];
        let listen = [free_port(), free_port()].map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
        let mut a = Replica::start(&model, "replica-a", listen[0], &args).await;
        let mut b = Replica::start(&model, "replica-b", listen[1], &args).await;
        let front = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let Some(_proxy) = haproxy(front, listen).await else {
            return;
        };

        let (streams, chunks, pace) = (32, 400, Duration::from_millis(12));
        let samples: Vec<Vec<f32>> = (0..streams).map(|s| voice(s, chunks)).collect();
        let (solos, clients) = solos_and_clients(&plan, front, "roll", &samples, pace, Duration::from_secs(150));
        // Every stream live before the first signal.
        all_live([a.addr, b.addr], streams).await;
        let on_a = lanes(a.addr).await;
        assert!(
            on_a > 0.0 && on_a < streams as f64,
            "the hash put {on_a} of {streams} on A"
        );
        let started = Instant::now();
        sigterm(a.child.id().unwrap());
        assert_eq!(a.exit(Duration::from_secs(15)).await, Some(0));
        let a_exited = started.elapsed();
        let a_summary = a.said("handed over");
        a = Replica::start(&model, "replica-a", listen[0], &args).await;
        wait_status(a.addr, "/ready", 200, Duration::from_secs(10)).await;
        let a_back = started.elapsed();
        // HAProxy sees A up after two checks a second apart.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let on_b = lanes(b.addr).await;
        assert!(on_b > 0.0, "no stream left on B to hand over");
        sigterm(b.child.id().unwrap());
        assert_eq!(b.exit(Duration::from_secs(15)).await, Some(0));
        let b_exited = started.elapsed();
        let b_summary = b.said("handed over");

        let mut handed = 0;
        for (s, (client, solo)) in clients.into_iter().zip(solos).enumerate() {
            let (seen, solo) = (client.await.unwrap(), solo.await.unwrap());
            let id = format!("roll-{s}");
            assert!(
                seen.closes.iter().all(|c| *c == 1012),
                "{id}: closes {:?}, only 1012 expected",
                seen.closes
            );
            assert_eq!(seen.answered_before.len(), seen.closes.len(), "{id}");
            check_from(&id, &seen, &solo, 0);
            handed += seen.closes.len();
        }
        let rolled = started.elapsed();
        eprintln!(
            "rolling restart with {streams} live streams: A drained and exited {a_exited:?} after its SIGTERM, \
             back and ready at {a_back:?}, B drained and exited at {b_exited:?}; every stream done at {rolled:?}; \
             {handed} hand-overs (1012 closes) in all; A: {a_summary:?}; B: {b_summary:?}"
        );
        assert!(handed >= streams, "{handed} hand-overs for {streams} streams");
        drop(redis);
    });
}

/// Streams holding a lane on `addr` (0 once it is gone).
/// Each stream's solo run (on blocking threads) and its reconnecting
/// client through `front`, ids `{prefix}-{s}`.
#[allow(clippy::type_complexity)]
fn solos_and_clients(
    plan: &Arc<dyn tract_core::internal::Runnable>,
    front: SocketAddr,
    prefix: &str,
    samples: &[Vec<f32>],
    pace: Duration,
    within: Duration,
) -> (
    Vec<tokio::task::JoinHandle<Vec<f32>>>,
    Vec<tokio::task::JoinHandle<Seen>>,
) {
    let solos = samples
        .iter()
        .map(|s| {
            let (plan, s) = (plan.clone(), s.clone());
            tokio::task::spawn_blocking(move || solo(&plan, &s))
        })
        .collect();
    let clients = samples
        .iter()
        .enumerate()
        .map(|(s, samples)| {
            tokio::spawn(reconnecting(
                front,
                format!("{prefix}-{s}"),
                samples.clone(),
                pace,
                within,
            ))
        })
        .collect();
    (solos, clients)
}

/// Wait (30 s at most) until the replicas hold `streams` lanes between them.
async fn all_live(replicas: [SocketAddr; 2], streams: usize) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let taken = lanes(replicas[0]).await + lanes(replicas[1]).await;
        if taken == streams as f64 {
            return;
        }
        assert!(Instant::now() < until, "{taken} streams live of {streams}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn lanes(addr: SocketAddr) -> f64 {
    counter(addr, "tract_autobatch_lanes_taken", "").await.max(0.0)
}

/// kill -9 of a replica with a checkpoint every 8 chunks: its streams
/// reconnect (through HAProxy, to the other replica), are told the chunk
/// of their last checkpoint, resend from there, and every answer from that
/// chunk on equals the solo run's (those before it too, as answered).
#[test]
fn silero_handover_after_kill_9_resumes_from_the_last_checkpoint() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(180, async move {
        let Some(redis) = Redis::start() else { return };
        let url = redis.url();
        let args = ["--lanes", "40", "--checkpoint-every", "8", "--store", &url];
        let listen = [free_port(), free_port()].map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
        let mut a = Replica::start(&model, "replica-a", listen[0], &args).await;
        let b = Replica::start(&model, "replica-b", listen[1], &args).await;
        let front = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let Some(_proxy) = haproxy(front, listen).await else {
            return;
        };

        let (streams, chunks, pace) = (32, 300, Duration::from_millis(10));
        let samples: Vec<Vec<f32>> = (0..streams).map(|s| voice(s + 100, chunks)).collect();
        let (solos, clients) = solos_and_clients(&plan, front, "crash", &samples, pace, Duration::from_secs(120));
        all_live([a.addr, b.addr], streams).await;
        // Far enough in that every stream has a checkpoint behind it (its
        // key in Redis), and a few chunks past it.
        let mut c = redis.connection().unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}crash-*", laned_server::handover::KEY_PREFIX))
                .query(&mut c)
                .unwrap();
            if keys.len() == streams {
                break;
            }
            assert!(
                Instant::now() < until,
                "{} of {streams} streams checkpointed",
                keys.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let on_a = lanes(a.addr).await;
        assert!(on_a > 0.0, "no stream on A to kill");
        a.child.start_kill().unwrap();
        a.child.wait().await.unwrap();
        let mut resumed = 0;
        for (s, (client, solo)) in clients.into_iter().zip(solos).enumerate() {
            let (seen, solo) = (client.await.unwrap(), solo.await.unwrap());
            let id = format!("crash-{s}");
            if seen.closes.is_empty() {
                check_from(&id, &seen, &solo, 0);
                continue;
            }
            assert!(seen.closes.iter().all(|c| *c == 1006), "{id}: closes {:?}", seen.closes);
            let from = seen.resumed_from[1] as usize;
            let before = seen.answered_before[0];
            assert!(from > 0, "{id}: resumed from 0, no checkpoint found");
            // The last checkpoint is at most 8 chunks behind the server's
            // last answer (answers in flight at the kill never arrived).
            assert!(
                before < from + 8 + 8,
                "{id}: {before} answered, resumed from {from}: the checkpoint lagged"
            );
            check_from(&id, &seen, &solo, from);
            // What was answered before the crash was right too.
            for (c, want) in solo.iter().enumerate().take(before) {
                assert_eq!(
                    seen.answers[c].map(f32::to_bits),
                    Some(want.to_bits()),
                    "{id}: chunk {c}"
                );
            }
            resumed += 1;
        }
        assert_eq!(resumed as f64, on_a, "every stream of the killed replica resumed");
        eprintln!("kill -9: {resumed} streams resumed from their checkpoints");
        drop(b);
        drop(redis);
    });
}

/// Redis stopped (SIGSTOP: every operation hangs) before the drain and
/// killed during it: each hand-over gives up at the store timeout, is
/// counted `failed`, and its stream drains as without a store (every
/// answer, then 1001 at the deadline); the server exits 0 by the deadline.
#[test]
fn silero_handover_with_redis_killed_mid_drain_still_ends_by_the_deadline() {
    let Some(model) = model_path() else { return };
    bounded(120, async move {
        let Some(redis) = Redis::start() else { return };
        let url = redis.url();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let deadline_ms = 2500;
        let mut server = Replica::start(
            &model,
            "replica",
            listen,
            &[
                "--lanes",
                "8",
                "--drain-deadline-ms",
                &deadline_ms.to_string(),
                "--store-timeout-ms",
                "300",
                "--checkpoint-every",
                "4",
                "--store",
                &url,
            ],
        )
        .await;
        let addr = server.addr;
        let clients: Vec<_> = (0..8)
            .map(|s| {
                let samples = voice(s + 200, 400);
                tokio::spawn(async move {
                    let mut request = format!("ws://{addr}/v1/vad").into_client_request().unwrap();
                    request
                        .headers_mut()
                        .insert("x-stream-id", format!("drain-{s}").parse().unwrap());
                    let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
                    let (mut tx, mut rx) = ws.split();
                    let audio = samples.clone();
                    let sender = tokio::spawn(async move {
                        for chunk in audio.chunks_exact(CHUNK) {
                            if tx.send(Message::Binary(encode(chunk, false).into())).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    });
                    let mut answers = vec![];
                    let code = loop {
                        match rx.next().await {
                            Some(Ok(Message::Text(t))) => {
                                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                                if let Some(p) = v.get("probability") {
                                    assert_eq!(v["chunk"].as_u64(), Some(answers.len() as u64));
                                    answers.push(p.as_f64().unwrap() as f32);
                                }
                            }
                            Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)).unwrap_or(1005),
                            Some(Ok(_)) => {}
                            _ => break 1006,
                        }
                    };
                    sender.abort();
                    (samples, answers, code)
                })
            })
            .collect();
        let until = Instant::now() + Duration::from_secs(20);
        while lanes(addr).await != 8.0 {
            assert!(Instant::now() < until, "not every stream live");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.signal("-STOP");
        let signalled = Instant::now();
        sigterm(server.child.id().unwrap());
        // Each hand-over waits out the 300 ms store timeout, then counts.
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let failed = counter(addr, "laned_handover_total", "outcome=\"failed\"").await;
            if failed == 8.0 {
                break;
            }
            assert!(
                Instant::now() < until,
                "{failed} hand-over failures counted, 8 expected"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(counter(addr, "laned_handover_total", "outcome=\"ok\"").await, 0.0);
        redis.signal("-KILL");
        assert_eq!(server.exit(Duration::from_secs(10)).await, Some(0));
        let took = signalled.elapsed();
        // The deadline, the close frames (bounded by 1.5 s), a margin.
        assert!(
            took < Duration::from_millis(deadline_ms + 2000),
            "the drain took {took:?} past a {deadline_ms} ms deadline"
        );
        assert_eq!(server.said("hand-over skipped").len(), 8);
        assert!(!server.said("handed over 0 streams (8 failed)").is_empty());
        let plan = plan().unwrap();
        for (s, c) in clients.into_iter().enumerate() {
            let (samples, answers, code) = c.await.unwrap();
            assert_eq!(code, laned_wire::close::GOING_AWAY, "stream {s}");
            assert_eq!(answers, solo(&plan, &samples)[..answers.len()], "stream {s}");
        }
        eprintln!("redis stopped then killed mid-drain: the drain ended {took:?} after SIGTERM");
    });
}

/// Under a stream's key, corrupt bytes, or a record of another model (its
/// weights' digest changed): that stream starts fresh (chunk 0, answers
/// equal its solo run) with a log line; a stream with a good record
/// resumes from it and one without starts fresh, untouched.
#[test]
fn silero_handover_refuses_corrupt_and_foreign_records_and_starts_fresh() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(120, async move {
        let Some(redis) = Redis::start() else { return };
        let url = redis.url();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let server = Replica::start(
            &model,
            "replica",
            listen,
            &["--lanes", "8", "--checkpoint-every", "4", "--store", &url],
        )
        .await;
        let addr = server.addr;
        // The donor: 8 chunks answered, then gone without a close (its
        // checkpoint at chunk 8 stays).
        let donor = voice(300, 40);
        {
            let mut request = format!("ws://{addr}/v1/vad").into_client_request().unwrap();
            request.headers_mut().insert("x-stream-id", "donor".parse().unwrap());
            let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
            ws.send(Message::Binary(encode(&donor[..8 * CHUNK], false).into()))
                .await
                .unwrap();
            let mut answered = 0;
            while answered < 8 {
                if let Some(Ok(Message::Text(t))) = ws.next().await {
                    answered += usize::from(t.contains("probability"));
                }
            }
            // The checkpoint is written after the 8th answer is sent: waited
            // for (a busy machine writes it late), the connection open.
            let mut c = redis.connection().unwrap();
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                let held: Option<Vec<u8>> = redis::cmd("GET")
                    .arg(format!("{}donor", laned_server::handover::KEY_PREFIX))
                    .query(&mut c)
                    .unwrap();
                let at = held
                    .and_then(|b| laned_server::handover::Record::from_bytes(&b).ok())
                    .map(|r| r.chunk);
                if at == Some(8) || Instant::now() > until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            drop(ws);
        }
        let mut c = redis.connection().unwrap();
        let key = |id: &str| format!("{}{id}", laned_server::handover::KEY_PREFIX);
        let good: Vec<u8> = redis::cmd("GET").arg(key("donor")).query(&mut c).unwrap();
        let record = laned_server::handover::Record::from_bytes(&good).unwrap();
        assert_eq!(record.chunk, 8, "the checkpoint after 8 chunks");
        let mut foreign = record.clone();
        let (head, digest) = foreign.state.model.rsplit_once("graph ").unwrap();
        let other = u64::from_str_radix(digest, 16).unwrap() ^ 1;
        foreign.state.model = format!("{head}graph {other:016x}");
        redis::cmd("SET")
            .arg(key("foreign"))
            .arg(foreign.to_bytes())
            .query::<()>(&mut c)
            .unwrap();
        redis::cmd("SET")
            .arg(key("corrupt"))
            .arg(&b"\x00\xffnot a record"[..])
            .query::<()>(&mut c)
            .unwrap();

        let ids = ["corrupt", "foreign", "donor", "newcomer"];
        let streams: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(s, id)| {
                let samples = if *id == "donor" {
                    donor.clone()
                } else {
                    voice(310 + s, 40)
                };
                let id = id.to_string();
                tokio::spawn(async move {
                    let seen = reconnecting(addr, id, samples.clone(), Duration::ZERO, Duration::from_secs(30)).await;
                    (samples, seen)
                })
            })
            .collect();
        for (id, s) in ids.iter().zip(streams) {
            let (samples, seen) = s.await.unwrap();
            assert!(seen.closes.is_empty(), "{id}: {:?}", seen.closes);
            let from = if *id == "donor" { 8 } else { 0 };
            assert_eq!(seen.resumed_from, vec![from], "{id}");
            check_from(id, &seen, &solo(&plan, &samples), from as usize);
        }
        for id in ["corrupt", "foreign"] {
            let said = server.said(&format!("stream {id}: the record held for it is refused"));
            assert_eq!(said.len(), 1, "{id}: {said:?}");
        }
        assert!(server.said("stream foreign")[0].contains("is of model"));
        assert!(server.said("stream donor").is_empty() && server.said("stream newcomer").is_empty());
        assert_eq!(counter(addr, "laned_resume_total", "outcome=\"refused\"").await, 2.0);
        assert_eq!(counter(addr, "laned_resume_total", "outcome=\"resumed\"").await, 1.0);
    });
}

/// `samples` as a plain 16 kHz mono 16-bit PCM WAV.
fn wav(samples: &[f32]) -> Vec<u8> {
    let data = encode(samples, true);
    let mut w = b"RIFF".to_vec();
    w.extend(((4 + 8 + 16 + 8 + data.len()) as u32).to_le_bytes());
    w.extend(b"WAVEfmt ");
    w.extend(16u32.to_le_bytes());
    w.extend(1u16.to_le_bytes()); // PCM
    w.extend(1u16.to_le_bytes()); // mono
    w.extend(16_000u32.to_le_bytes());
    w.extend(32_000u32.to_le_bytes());
    w.extend(2u16.to_le_bytes());
    w.extend(16u16.to_le_bytes());
    w.extend(b"data");
    w.extend((data.len() as u32).to_le_bytes());
    w.extend(data);
    w
}

/// `vad-client`, the binary, in real time through a restart: SIGTERM its
/// replica mid-stream (1012), a new replica on the same address a moment
/// later; the client reconnects with its `--stream-id`, resends from the
/// chunk named, and prints every probability once, equal to the solo
/// run's; it exits 0 saying it resumed.
#[test]
fn silero_handover_vad_client_resumes_through_a_restart() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(120, async move {
        let Some(redis) = Redis::start() else { return };
        let url = redis.url();
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let args = ["--lanes", "4", "--store", &url];
        let mut a = Replica::start(&model, "replica-a", listen, &args).await;
        let samples = voice(400, 100);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("speech.wav");
        std::fs::write(&file, wav(&samples)).unwrap();
        let client = Command::new(env!("CARGO_BIN_EXE_vad-client"))
            .args(["--verbose", "--frame", "800", "--stream-id", "client-7", "--url"])
            .arg(format!("ws://{listen}/v1/vad"))
            .arg(&file)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // A second of the 3.2 s in, the replica restarts.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        sigterm(a.child.id().unwrap());
        assert_eq!(a.exit(Duration::from_secs(10)).await, Some(0));
        let _b = Replica::start(&model, "replica-b", listen, &args).await;
        let out = tokio::time::timeout(Duration::from_secs(30), client.wait_with_output())
            .await
            .expect("vad-client ended")
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert!(stderr.contains("resumed 1 times"), "{stderr}");
        let got: Vec<f32> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("probability"))
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["probability"].as_f64().unwrap() as f32
            })
            .collect();
        let want = solo(&plan, &through_i16(&samples));
        assert_eq!(got.len(), want.len(), "{stderr}");
        for (c, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "chunk {c}: {g} where the solo run says {w}");
        }
    });
}

/// A store configured but down from the start: the server starts and
/// says so, a stream with an id is served from chunk 0 (its answers its
/// solo run's), every checkpoint skipped and counted, nothing waits past
/// the store timeout; an id that is not one is refused (1008).
#[test]
fn silero_handover_with_the_store_down_serves_as_without_one() {
    let Some(model) = model_path() else { return };
    let Some(plan) = plan() else { return };
    bounded(60, async move {
        let dead = format!("redis://127.0.0.1:{}/", free_port());
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let server = Replica::start(
            &model,
            "replica",
            listen,
            &[
                "--lanes",
                "2",
                "--checkpoint-every",
                "4",
                "--store-timeout-ms",
                "200",
                "--store",
                &dead,
            ],
        )
        .await;
        assert_eq!(server.said("does not answer").len(), 1);
        let samples = voice(500, 40);
        let started = Instant::now();
        let seen = reconnecting(
            server.addr,
            "alone".into(),
            samples.clone(),
            Duration::ZERO,
            Duration::from_secs(20),
        )
        .await;
        assert!(seen.closes.is_empty(), "{:?}", seen.closes);
        assert_eq!(seen.resumed_from, vec![0]);
        check_from("alone", &seen, &solo(&plan, &samples), 0);
        // Ten checkpoints due, each refused at once (nothing listens) or,
        // one due while the last is still being written, dropped: none
        // waited out, none written.
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        // The last write may still be on its way: read until all ten are
        // counted, for a second at most.
        let (mut failed, mut dropped) = (0.0, 0.0);
        for _ in 0..20 {
            failed = counter(server.addr, "laned_checkpoint_total", "outcome=\"failed\"").await;
            dropped = counter(server.addr, "laned_checkpoint_total", "outcome=\"dropped\"").await;
            if failed + dropped >= 10.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(failed >= 1.0, "{failed} failed, {dropped} dropped");
        assert_eq!(failed + dropped, 10.0, "{failed} failed, {dropped} dropped");
        assert_eq!(
            counter(server.addr, "laned_resume_total", "outcome=\"failed\"").await,
            1.0
        );
        // An id that is not one is refused, naming why.
        let mut request = format!("ws://{}/v1/vad", server.addr).into_client_request().unwrap();
        request
            .headers_mut()
            .insert("x-stream-id", "not an id!".parse().unwrap());
        let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        let (code, reason) = expect_close(&mut ws).await;
        assert_eq!(code, laned_wire::close::IDLE, "{reason}");
        assert!(reason.contains("stream id"), "{reason}");
    });
}
