//! Helpers shared by the vad-server tests: the model (or a visible skip),
//! solo reference runs, a server in-process, WebSocket and HTTP clients.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use laned_models::silero::{self, Context, CHUNK};
use laned_runner::Mode;
use laned_server::{start, Server, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tract_core::internal::*;

pub type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The prepared model, or `None` after printing `SKIPPED: why` (where the
/// model cannot be fetched here; a wrong file fails the test).
pub fn plan() -> Option<Arc<dyn Runnable>> {
    let path = model_path()?;
    Some(laned_server::load_plan(Some(&path)).unwrap())
}

/// The model's path (for the child-process test), or `None` after a skip.
pub fn model_path() -> Option<std::path::PathBuf> {
    laned_models::fetch::or_skip("Silero VAD", silero::fetch())
}

/// The probabilities of `samples`' whole chunks, run alone with tract.
pub fn solo(plan: &Arc<dyn Runnable>, samples: &[f32]) -> Vec<f32> {
    let mut state = plan.spawn().unwrap();
    let mut context = Context::default();
    let mut h = Tensor::zero::<f32>(&[2, 1, 128]).unwrap();
    samples
        .chunks_exact(CHUNK)
        .map(|chunk| {
            let mut inputs = context.inputs(chunk);
            inputs.push(h.clone().into_tvalue());
            let out = state.run(inputs).unwrap();
            h = out[1].clone().into_tensor();
            out[0]
                .to_plain_array_view::<f32>()
                .unwrap()
                .iter()
                .next()
                .copied()
                .unwrap()
        })
        .collect()
}

/// A server in-process on 127.0.0.1:0 (worker mode).
pub async fn server(plan: &Arc<dyn Runnable>, lanes: usize, shards: usize, admission_wait_ms: u64) -> Server {
    server_in(plan, lanes, shards, admission_wait_ms, Mode::Worker).await
}

/// A server in-process on 127.0.0.1:0, in `mode`.
pub async fn server_in(
    plan: &Arc<dyn Runnable>,
    lanes: usize,
    shards: usize,
    admission_wait_ms: u64,
    mode: Mode,
) -> Server {
    let settings = Settings {
        mode,
        lanes,
        shards,
        limits: laned_server::Limits {
            listen: "127.0.0.1:0".parse().unwrap(),
            admission_wait_ms,
            max_frame_bytes: 64 * 1024,
            drain_deadline_ms: 1_000,
            ..laned_server::Limits::default()
        },
        ..Settings::default()
    };
    start(plan.clone(), settings, None).await.unwrap()
}

/// A server in-process with these settings (on 127.0.0.1:0).
pub async fn server_with(plan: &Arc<dyn Runnable>, settings: Settings) -> Server {
    let mut settings = settings;
    settings.limits.listen = "127.0.0.1:0".parse().unwrap();
    start(plan.clone(), settings, None).await.unwrap()
}

pub async fn connect(addr: SocketAddr, query: &str) -> Ws {
    let url = format!("ws://{addr}/v1/vad{query}");
    tokio_tungstenite::connect_async(url.as_str()).await.unwrap().0
}

/// [`connect`], as a client does it beside a flood of idle connections:
/// a connection the server accepted but had not read yet can lose its
/// place to the flood before its handshake (the server closes the oldest
/// such connection to make room), and the client, having sent nothing,
/// connects again. Up to 50 tries, 20 ms apart; the last error fails.
pub async fn connect_through(addr: SocketAddr, query: &str) -> Ws {
    let url = format!("ws://{addr}/v1/vad{query}");
    let mut tries = 0;
    loop {
        match tokio_tungstenite::connect_async(url.as_str()).await {
            Ok((ws, _)) => return ws,
            Err(e) if tries < 50 => {
                tries += 1;
                eprintln!("connecting to {url}: {e}; again");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("connecting to {url}: {e}, 51 times"),
        }
    }
}

/// A connection holding a lane: connected, its first chunk (`chunk`,
/// f32) sent and answered.
pub async fn connect_holding(addr: SocketAddr, chunk: &[f32]) -> Ws {
    let mut ws = connect(addr, "").await;
    ws.send(Message::Binary(encode(chunk, false).into())).await.unwrap();
    match next_reply(&mut ws).await {
        Reply::Probability(0, _) => ws,
        other => panic!("the first chunk was answered {other:?}"),
    }
}

/// The status code of `GET path`.
pub async fn http_status(addr: SocketAddr, path: &str) -> u16 {
    http_get(addr, path).await.0
}

/// The status code and body of `GET path`.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    try_http_get(addr, path)
        .await
        .unwrap_or_else(|| panic!("GET {path}: no answer"))
}

/// [`http_get`], `None` when the connection is refused, dropped without
/// an answer, or silent for 2 s (a server under attack may do any).
pub async fn try_http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// Polls `GET path` until it answers `want` (panics after `within`).
pub async fn wait_status(addr: SocketAddr, path: &str, want: u16, within: Duration) {
    let until = tokio::time::Instant::now() + within;
    loop {
        let got = http_status(addr, path).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{path} answers {got}, not {want}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Encodes samples as little-endian f32 or i16 bytes.
pub fn encode(samples: &[f32], i16_format: bool) -> Vec<u8> {
    if i16_format {
        samples
            .iter()
            .flat_map(|s| ((s * 32768.0).round().clamp(-32768.0, 32767.0) as i16).to_le_bytes())
            .collect()
    } else {
        samples.iter().flat_map(|s| s.to_le_bytes()).collect()
    }
}

/// What the server hears of `samples` sent as i16.
pub fn through_i16(samples: &[f32]) -> Vec<f32> {
    encode(samples, true)
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0)
        .collect()
}

/// A message from the server, parsed.
#[derive(Debug)]
pub enum Reply {
    Probability(u64, f32),
    Event(String, u64),
    Closed(u16, String),
}

pub async fn next_reply(ws: &mut Ws) -> Reply {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                let chunk = v["chunk"].as_u64().unwrap();
                return match v.get("event") {
                    Some(e) => Reply::Event(e.as_str().unwrap().to_string(), chunk),
                    None => Reply::Probability(chunk, v["probability"].as_f64().unwrap() as f32),
                };
            }
            Some(Ok(Message::Close(Some(f)))) => return Reply::Closed(u16::from(f.code), f.reason.to_string()),
            Some(Ok(Message::Close(None))) | None => return Reply::Closed(1005, String::new()),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Reply::Closed(1006, e.to_string()),
        }
    }
}

/// Reads until the server closes; its code and reason.
pub async fn expect_close(ws: &mut Ws) -> (u16, String) {
    loop {
        if let Reply::Closed(code, reason) = next_reply(ws).await {
            return (code, reason);
        }
    }
}

/// Streams `samples` in frames of random sizes (seeded) and returns the
/// probabilities of every whole chunk, checking their numbering; closes.
pub async fn stream(addr: SocketAddr, samples: &[f32], i16_format: bool, seed: u64) -> Vec<f32> {
    let mut ws = connect_through(addr, if i16_format { "?format=i16" } else { "" }).await;
    let bytes = encode(samples, i16_format);
    let width = if i16_format { 2 } else { 4 };
    let want = samples.len() / CHUNK;
    let (mut tx, mut rx) = ws.split();
    let mut rng = fastrand::Rng::with_seed(seed);
    let sender = async {
        let mut at = 0;
        while at < bytes.len() {
            let n = (rng.usize(1..=1500) * width).min(bytes.len() - at);
            tx.send(Message::Binary(bytes[at..at + n].to_vec().into()))
                .await
                .unwrap();
            at += n;
        }
        tx
    };
    let receiver = async {
        let mut got = Vec::new();
        while got.len() < want {
            match rx.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                    if v.get("event").is_none() {
                        assert_eq!(v["chunk"].as_u64().unwrap(), got.len() as u64);
                        got.push(v["probability"].as_f64().unwrap() as f32);
                    }
                }
                Some(Ok(Message::Close(f))) => panic!("closed early: {f:?}"),
                Some(Ok(_)) => {}
                other => panic!("stream ended early: {other:?}"),
            }
        }
        (got, rx)
    };
    let (tx, (got, rx)) = tokio::join!(sender, receiver);
    ws = tx.reunite(rx).unwrap();
    let _ = ws.close(None).await;
    got
}

/// Streams on `addr` at once, stream `s` (client seed `s`) sending
/// `chunks` chunks of `audio(sounds[s], chunks)`: each gets its solo
/// probabilities.
pub async fn streams_get_their_solo(addr: SocketAddr, plan: &Arc<dyn Runnable>, sounds: &[usize], chunks: usize) {
    let streams: Vec<_> = sounds
        .iter()
        .enumerate()
        .map(|(s, &sound)| {
            let samples = audio(sound, chunks);
            let want = solo(plan, &samples);
            tokio::spawn(async move { (stream(addr, &samples, false, s as u64).await, want) })
        })
        .collect();
    for s in streams {
        let (got, want) = s.await.unwrap();
        assert_eq!(got, want);
    }
}

/// `chunks` chunks of generated audio, plus a few samples of a partial chunk.
pub fn audio(s: usize, chunks: usize) -> Vec<f32> {
    use laned_models::silero::Sound;
    let sounds = [
        Sound::Buzz,
        Sound::Tone(440),
        Sound::Noise,
        Sound::Silence,
        Sound::Tone(1800),
        Sound::NoisyBuzz,
        Sound::Tone(220),
    ];
    laned_models::sound::samples(sounds[s % sounds.len()], 500 + s as u64, chunks * CHUNK + 100)
}

/// Runs `f` on a multi-thread runtime, bounded by `secs`.
pub fn bounded<F: std::future::Future<Output = ()>>(secs: u64, f: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(secs), f)
                .await
                .expect("the test ran past its timeout")
        })
}

/// `vad-server`, the binary, as a child process on 127.0.0.1:0 with the
/// model at `model` and `args`: the child (killed when dropped) and the
/// address it listens on, once it says so. Its later output is echoed to
/// stderr, prefixed `server:`.
pub async fn child_server(model: &std::path::Path, args: &[&str]) -> (tokio::process::Child, SocketAddr) {
    child_server_with_files(model, args, None).await
}

/// [`child_server`] under an open-files limit of `files` (`ulimit -n`).
pub async fn child_server_with_files(
    model: &std::path::Path,
    args: &[&str],
    files: Option<u32>,
) -> (tokio::process::Child, SocketAddr) {
    use tokio::io::AsyncBufReadExt;
    let mut command = match files {
        None => tokio::process::Command::new(env!("CARGO_BIN_EXE_vad-server")),
        Some(n) => {
            let mut sh = tokio::process::Command::new("sh");
            sh.args([
                "-c",
                &format!("ulimit -n {n} && exec \"$0\" \"$@\""),
                env!("CARGO_BIN_EXE_vad-server"),
            ]);
            sh
        }
    };
    let mut child = command
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .arg("--model")
        .arg(model)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
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
    (child, addr)
}

pub use laned_server::testing::sigterm;

/// The resident set of process `pid`, in bytes.
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// A raw WebSocket connection on `addr`, upgraded, its receive buffer small.
pub async fn raw_upgraded(addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut tcp = socket.connect(addr).await.unwrap();
    tcp.write_all(
        b"GET /v1/vad HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        tcp.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    tcp
}
