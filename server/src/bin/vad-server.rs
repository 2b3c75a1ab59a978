//! Silero VAD over WebSocket on one laned runner: `GET /v1/vad` (one
//! connection, one stream), `/ready`, `/live`, `/metrics`; SIGTERM drains.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use laned_runner::Mode;
use laned_server::{install_prometheus, load_plan, model_file, start, Settings};

/// Silero VAD over WebSocket, served through one laned runner.
#[derive(Debug, Parser)]
#[command(name = "vad-server")]
struct Args {
    /// A TOML file of settings (flags and environment override it).
    #[arg(long, env = "VAD_CONFIG")]
    config: Option<PathBuf>,
    /// Where to listen [default: 127.0.0.1:8080].
    #[arg(long, env = "VAD_LISTEN")]
    listen: Option<SocketAddr>,
    /// The Silero ONNX file [default: fetched from PyPI with pip].
    #[arg(long, env = "VAD_MODEL")]
    model: Option<PathBuf>,
    /// Lanes per shard [default: 32].
    #[arg(long, env = "VAD_LANES")]
    lanes: Option<usize>,
    /// Shards [default: 1].
    #[arg(long, env = "VAD_SHARDS")]
    shards: Option<usize>,
    /// `combining` or `worker` [default: combining].
    #[arg(long, env = "VAD_MODE")]
    mode: Option<String>,
    /// `immediate`, `linger:<us>`, `budget:<us>` or `tick:<us>` [default: immediate].
    #[arg(long, env = "VAD_POLICY")]
    policy: Option<String>,
    /// Milliseconds live streams may go on after SIGTERM [default: 10000].
    #[arg(long, env = "VAD_DRAIN_DEADLINE_MS")]
    drain_deadline_ms: Option<u64>,
    /// Milliseconds a new connection waits for a lane [default: 1000].
    #[arg(long, env = "VAD_ADMISSION_WAIT_MS")]
    admission_wait_ms: Option<u64>,
    /// The largest binary frame, in bytes [default: 1048576].
    #[arg(long, env = "VAD_MAX_FRAME_BYTES")]
    max_frame_bytes: Option<usize>,
    /// Milliseconds a connection may send no audio or leave a reply
    /// untaken before it is closed (1008) [default: 30000].
    #[arg(long, env = "VAD_IDLE_MS")]
    idle_ms: Option<u64>,
    /// Connections served at once, past which only probes are answered
    /// [default: lanes × shards + 64].
    #[arg(long, env = "VAD_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Milliseconds a new connection may take to send its request head
    /// [default: 5000].
    #[arg(long, env = "VAD_HEADER_TIMEOUT_MS")]
    header_timeout_ms: Option<u64>,
    /// A second address answering only the probes (`/live`, `/ready`,
    /// `/metrics`), whatever floods the main one [default: none].
    #[arg(long, env = "VAD_PROBE_LISTEN")]
    probe_listen: Option<std::net::SocketAddr>,
    /// The hand-over store, a Redis URL (`redis://127.0.0.1:6379/`) or a
    /// Redis Cluster's nodes (`redis+cluster://host:port,host:port,...`)
    /// [default: none, no hand-over].
    #[arg(long, env = "VAD_STORE")]
    store: Option<String>,
    /// Seconds a stream's record lives in the store [default: 600].
    #[arg(long, env = "VAD_HANDOVER_TTL_S")]
    handover_ttl_s: Option<u64>,
    /// A checkpoint of each stream every this many chunks; 0: none
    /// [default: 0].
    #[arg(long, env = "VAD_CHECKPOINT_EVERY")]
    checkpoint_every: Option<u64>,
    /// Milliseconds one store operation may take [default: 500].
    #[arg(long, env = "VAD_STORE_TIMEOUT_MS")]
    store_timeout_ms: Option<u64>,
    /// Where a fetched model is cached [default: LANED_CACHE_DIR, else the
    /// user's cache directory].
    #[arg(long, env = "VAD_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// The SHA-256 the `--model` file must have.
    #[arg(long, env = "VAD_MODEL_SHA256")]
    model_sha256: Option<String>,
    /// Fetch (or check) the model, print its path and exit: for an image's
    /// build, so that a pod starts without pip.
    #[arg(long)]
    fetch_model: bool,
}

fn settings(args: &Args) -> Result<Settings, String> {
    let mut s = match &args.config {
        Some(path) => Settings::from_toml_file(path)?,
        None => Settings::default(),
    };
    if let Some(v) = args.listen {
        s.limits.listen = v;
    }
    if let Some(v) = args.model.clone() {
        s.model = Some(v);
    }
    if let Some(v) = args.lanes {
        s.lanes = v;
    }
    if let Some(v) = args.shards {
        s.shards = v;
    }
    if let Some(v) = args.mode.clone() {
        s.mode = match v.as_str() {
            "worker" => Mode::Worker,
            "combining" => Mode::Combining,
            _ => return Err(format!("unknown mode {v:?}: worker or combining")),
        };
    }
    if let Some(v) = args.policy.clone() {
        s.policy = v;
    }
    if let Some(v) = args.drain_deadline_ms {
        s.limits.drain_deadline_ms = v;
    }
    if let Some(v) = args.admission_wait_ms {
        s.limits.admission_wait_ms = v;
    }
    if let Some(v) = args.max_frame_bytes {
        s.limits.max_frame_bytes = v;
    }
    if let Some(v) = args.idle_ms {
        s.limits.idle_ms = v;
    }
    if let Some(v) = args.max_connections {
        s.limits.max_connections = Some(v);
    }
    if let Some(v) = args.header_timeout_ms {
        s.limits.header_timeout_ms = v;
    }
    if let Some(v) = args.probe_listen {
        s.limits.probe_listen = Some(v);
    }
    if let Some(v) = args.store.clone() {
        s.limits.store = Some(v);
    }
    if let Some(v) = args.handover_ttl_s {
        s.limits.handover_ttl_s = v;
    }
    if let Some(v) = args.checkpoint_every {
        s.limits.checkpoint_every = v;
    }
    if let Some(v) = args.store_timeout_ms {
        s.limits.store_timeout_ms = v;
    }
    if let Some(v) = args.cache_dir.clone() {
        s.cache_dir = Some(v);
    }
    if let Some(v) = args.model_sha256.clone() {
        s.model_sha256 = Some(v);
    }
    s.validate()?;
    Ok(s)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(why) => {
            eprintln!("vad-server: {why}");
            std::process::exit(2);
        }
    };
    if args.fetch_model {
        match model_file(&settings) {
            Ok(path) => {
                println!("{}", path.display());
                return;
            }
            Err(why) => {
                eprintln!("vad-server: the Silero model is unavailable: {why}");
                std::process::exit(1);
            }
        }
    }
    // Before the runner: it binds its metrics handles when built.
    let prometheus = install_prometheus("vad-server");
    match &settings.model {
        Some(path) => eprintln!("vad-server: loading {}", path.display()),
        None => eprintln!("vad-server: fetching the Silero model (checked, cached after the first time)"),
    }
    let plan = match model_file(&settings).and_then(|path| load_plan(Some(&path))) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("vad-server: the Silero model is unavailable: {why}");
            std::process::exit(1);
        }
    };
    println!("vad-server settings:\n{settings}");
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    let server = match start(plan, settings, prometheus).await {
        Ok(s) => s,
        Err(why) => {
            eprintln!("vad-server: {why}");
            std::process::exit(1);
        }
    };
    println!("vad-server listening on {}", server.addr);
    if let Some(probes) = server.probe_addr {
        println!("vad-server answering probes on {probes}");
    }
    server.run_until_signal(term).await;
}
