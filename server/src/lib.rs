//! Silero VAD served over WebSocket through one laned runner: the logic of
//! the `vad-server` binary, in a library so that tests can start it
//! in-process on `127.0.0.1:0`.
//!
//! One WebSocket connection (`GET /v1/vad`) is one laned stream. Binary
//! frames carry 16 kHz mono PCM (little-endian `f32`, or `i16` with
//! `?format=i16`) of any length; the server cuts it into 512-sample chunks
//! (keeping the model's 64-sample context) and answers each chunk with
//! `{"chunk": n, "probability": p}`, plus `{"event": "speech_start" |
//! "speech_end", "chunk": n}` with hysteresis.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use laned_models::silero::{self, Context, CHUNK};
use laned_runner::{LanedRunner, LanedStateHandle, Mode, RunnerConfig, StatePair, StateSpec, TurnPolicy};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use tokio::sync::watch;
use tract_core::internal::*;

mod accept;
pub mod handover;
pub use accept::{open_files_limit, PROBE_RESERVE};
use handover::{Record, Store};

/// Close codes the server uses (RFC 6455).
pub mod close {
    /// The server is going away (SIGTERM, past the drain deadline).
    pub const GOING_AWAY: u16 = 1001;
    /// The server restarts: the stream's state is handed over, reconnect
    /// with the same stream id (to any replica) and resend from the chunk
    /// the reason names.
    pub const RESTART: u16 = 1012;
    /// A text frame, an odd `i16` byte count, an unknown format.
    pub const UNSUPPORTED: u16 = 1003;
    /// A frame over the maximum size.
    pub const TOO_BIG: u16 = 1009;
    /// No lane freed up within the admission wait: try again later.
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// The runner failed the stream.
    pub const INTERNAL: u16 = 1011;
    /// The client sent no audio (pings, pongs and empty frames do not
    /// count), or took no reply, for `idle_ms` (silent, stalled or gone
    /// without a word): its lane goes to others.
    pub const IDLE: u16 = 1008;
}

/// The longest close reason a control frame carries (125 bytes less the
/// code's two).
const MAX_REASON: usize = 123;

/// Frames without audio a closing session discards at most while it waits
/// (a second at most) for the client's close reply; audio, and the rest of
/// an oversized message, are discarded for the whole second.
const LINGER_FRAMES: usize = 256;

/// Bytes a connection's writes gather before they go out.
const WRITE_BUFFER: usize = 64 * 1024;

/// Bytes a connection's unsent writes may hold at most: past it the client
/// (which is not reading) is dropped.
const MAX_WRITE_BUFFER: usize = 256 * 1024;

/// Bytes of frames read ahead while a call is in flight: the reading
/// waits once this much is held (so at most this plus one frame).
pub const READ_AHEAD_BYTES: usize = 64 * 1024;

/// Connections beyond the lanes the default cap allows.
pub const CONNECTION_MARGIN: usize = 64;

/// Speech starts at a probability at or above this.
pub const START_THRESHOLD: f32 = 0.5;
/// Speech may end below this.
pub const END_THRESHOLD: f32 = 0.35;
/// Speech ends after this much audio below [`END_THRESHOLD`].
pub const MIN_SILENCE_MS: u64 = 100;

/// The server's settings, from a TOML file, the environment and flags
/// (flags and environment over the file, the file over the defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The Silero ONNX file; `None`: fetched (`laned_models::silero::fetch`).
    pub model: Option<PathBuf>,
    /// Lanes per shard.
    pub lanes: usize,
    /// Shards.
    pub shards: usize,
    /// `worker` or `combining`.
    pub mode: Mode,
    /// `immediate`, `linger:<us>`, `budget:<us>` or `tick:<us>`.
    pub policy: String,
    /// How long live streams may go on after SIGTERM, in milliseconds.
    pub drain_deadline_ms: u64,
    /// How long a new connection waits for a lane, in milliseconds.
    pub admission_wait_ms: u64,
    /// The largest binary frame accepted, in bytes.
    pub max_frame_bytes: usize,
    /// How long a connection may send no audio (pings, pongs, empty
    /// frames do not count), or leave a reply untaken, before it is closed (1008) and its lane freed, in
    /// milliseconds: a client silent, stalled mid-frame, not reading, or
    /// gone without a FIN holds a lane no longer.
    pub idle_ms: u64,
    /// Connections served at once (those reading their request and the
    /// live sessions); `None`: [`Settings::connection_cap`]'s default, the
    /// lanes plus a margin. Past it only probes are answered.
    pub max_connections: Option<usize>,
    /// How long a new connection may take to send its request head, in
    /// milliseconds: idle TCP and slowloris requests are closed then.
    pub header_timeout_ms: u64,
    /// A second address answering only the probes (`/live`, `/ready`,
    /// `/metrics`), with places of its own ([`PROBE_PLACES`]): what an
    /// orchestrator's probes should ask, so that no flood of the main
    /// address can fail them. `None`: none (the main address's reserve
    /// answers them).
    pub probe_listen: Option<SocketAddr>,
    /// The hand-over store, a Redis URL (`redis://127.0.0.1:6379/`);
    /// `None`: no hand-over (a drained stream is closed 1001, a stream
    /// always starts fresh). See [`handover`].
    pub store: Option<String>,
    /// How long a stream's record lives in the store, in seconds.
    pub handover_ttl_s: u64,
    /// A checkpoint of each stream (with an id) every this many chunks, so
    /// that a replica killed outright loses at most that many; 0: none.
    pub checkpoint_every: u64,
    /// How long one store operation may take (connecting included), in
    /// milliseconds: past it, it is given up (a log line, a counter).
    pub store_timeout_ms: u64,
    /// Where a fetched model is cached; `None`: `LANED_CACHE_DIR`, else the
    /// user's cache directory (laned-models' rule), read at run time.
    pub cache_dir: Option<PathBuf>,
    /// The SHA-256 the file at `model` must have (lowercase hex); `None`:
    /// the file is read as it is. (A fetched model is always checked
    /// against laned-models' pin.)
    pub model_sha256: Option<String>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            listen: "127.0.0.1:8080".parse().unwrap(),
            model: None,
            lanes: 32,
            shards: 1,
            mode: Mode::Worker,
            policy: "immediate".into(),
            drain_deadline_ms: 10_000,
            admission_wait_ms: 1_000,
            max_frame_bytes: 1 << 20,
            idle_ms: 30_000,
            max_connections: None,
            header_timeout_ms: 5_000,
            probe_listen: None,
            store: None,
            handover_ttl_s: 600,
            checkpoint_every: 0,
            store_timeout_ms: 500,
            cache_dir: None,
            model_sha256: None,
        }
    }
}

impl Settings {
    /// Reads a TOML file (fields left out keep their defaults).
    pub fn from_toml_file(path: &Path) -> Result<Settings, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))
    }

    /// Refuse settings the server cannot serve with, naming the setting,
    /// the value and what it takes: checked before the model is loaded
    /// (by `vad-server`) and again by [`start`].
    pub fn validate(&self) -> Result<(), String> {
        if self.lanes == 0 {
            return Err("lanes is 0: no stream could be served (at least 1)".into());
        }
        if self.shards == 0 {
            return Err("shards is 0: there would be no state to serve on (at least 1)".into());
        }
        if self.max_frame_bytes < 4 {
            return Err(format!(
                "max_frame_bytes is {}: no frame could carry a sample (at least 4)",
                self.max_frame_bytes
            ));
        }
        if self.idle_ms == 0 {
            return Err("idle_ms is 0: every connection would be closed at once (at least 1)".into());
        }
        if self.header_timeout_ms == 0 {
            return Err("header_timeout_ms is 0: no request could be read (at least 1)".into());
        }
        if self.max_connections == Some(0) {
            return Err("max_connections is 0: no client could connect (at least 1)".into());
        }
        if let Some(url) = &self.store {
            redis::Client::open(url.as_str()).map_err(|e| format!("store {url:?} is not a Redis URL: {e}"))?;
        }
        if self.handover_ttl_s == 0 {
            return Err("handover_ttl_s is 0: every record would expire at once (at least 1)".into());
        }
        if self.store_timeout_ms == 0 {
            return Err("store_timeout_ms is 0: no store operation could finish (at least 1)".into());
        }
        if let Some(sha) = &self.model_sha256 {
            if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(format!("model_sha256 {sha:?} is not 64 lowercase hex digits"));
            }
        }
        self.turn_policy().map(|_| ())
    }

    /// Connections served at once: `max_connections`, else every lane
    /// (lanes × shards) plus [`CONNECTION_MARGIN`] (clients waiting for a
    /// lane, probes, scrapes).
    pub fn connection_cap(&self) -> usize {
        self.max_connections
            .unwrap_or(self.lanes.saturating_mul(self.shards).saturating_add(CONNECTION_MARGIN))
    }

    /// The turn policy `policy` names.
    pub fn turn_policy(&self) -> Result<TurnPolicy, String> {
        parse_policy(&self.policy)
    }

    /// The runner configuration these settings describe.
    pub fn runner_config(&self) -> Result<RunnerConfig, String> {
        Ok(RunnerConfig::builder()
            .state(StateSpec::Pairs(vec![StatePair::new("state", 1)]))
            .max_lanes(self.lanes)
            .shards(self.shards)
            .mode(self.mode)
            .policy(self.turn_policy()?)
            .build())
    }
}

impl std::fmt::Display for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let model = match (&self.model, &self.cache_dir) {
            (Some(p), _) => match &self.model_sha256 {
                Some(sha) => format!("{} (checked: sha256 {sha})", p.display()),
                None => p.display().to_string(),
            },
            (None, Some(dir)) => format!("fetched (silero-vad from PyPI, checked, cached in {})", dir.display()),
            (None, None) => {
                "fetched (silero-vad from PyPI, checked, cached in LANED_CACHE_DIR or the user's cache)".into()
            }
        };
        write!(
            f,
            "listen {}\nmodel {model}\nlanes {} per shard\nshards {}\nmode {:?}\npolicy {}\n\
             drain deadline {} ms\nadmission wait {} ms\nmax frame {} bytes\nidle {} ms\n\
             connections {} at most\nheader timeout {} ms\nstore {}\ncheckpoint every {} chunks\n\
             handover ttl {} s\nstore timeout {} ms",
            self.listen,
            self.lanes,
            self.shards,
            self.mode,
            self.policy,
            self.drain_deadline_ms,
            self.admission_wait_ms,
            self.max_frame_bytes,
            self.idle_ms,
            self.connection_cap(),
            self.header_timeout_ms,
            self.store.as_deref().unwrap_or("none (no hand-over)"),
            self.checkpoint_every,
            self.handover_ttl_s,
            self.store_timeout_ms
        )
    }
}

/// `immediate`, `linger:<us>`, `budget:<us>`, `tick:<us>`: the runner's
/// one policy syntax ([`TurnPolicy`]'s `FromStr`).
pub fn parse_policy(s: &str) -> Result<TurnPolicy, String> {
    s.parse().map_err(|e: laned_runner::ParsePolicyError| e.to_string())
}

/// The model file the settings name: `model` (checked against
/// `model_sha256` when given), else fetched and checked into `cache_dir`
/// (else `LANED_CACHE_DIR`, else the user's cache directory). `Err` says
/// why it is unavailable.
pub fn model_file(settings: &Settings) -> Result<PathBuf, String> {
    match (&settings.model, &settings.cache_dir) {
        (Some(path), _) => {
            if let Some(want) = &settings.model_sha256 {
                let got = laned_models::fetch::sha256_of(path).map_err(|e| e.to_string())?;
                if &got != want {
                    return Err(format!("{} has sha256 {got}, model_sha256 says {want}", path.display()));
                }
            }
            Ok(path.clone())
        }
        (None, Some(dir)) => silero::fetch_in(dir).map_err(|e| e.to_string()),
        (None, None) => silero::fetch().map_err(|e| e.to_string()),
    }
}

/// The model prepared for tract's default runtime: from `model`, else
/// fetched. `Err` says why it is unavailable.
pub fn load_plan(model: Option<&Path>) -> Result<Arc<dyn Runnable>, String> {
    let path = match model {
        Some(p) => p.to_path_buf(),
        None => silero::fetch().map_err(|e| e.to_string())?,
    };
    let typed = silero::load(&path).map_err(|e| format!("{e:?}"))?;
    let plan = DefaultRuntime.prepare(typed).map_err(|e| format!("{e:?}"))?;
    Ok(plan.into())
}

/// The sample format of a connection's binary frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Little-endian `f32`.
    F32,
    /// Little-endian `i16`, scaled by 1/32768.
    I16,
}

impl Format {
    fn parse(s: Option<&str>) -> Result<Format, String> {
        match s {
            None | Some("f32") | Some("f32le") => Ok(Format::F32),
            Some("i16") | Some("s16le") | Some("i16le") => Ok(Format::I16),
            Some(other) => Err(format!("unknown format {other:?}: f32 or i16")),
        }
    }

    fn width(self) -> usize {
        match self {
            Format::F32 => 4,
            Format::I16 => 2,
        }
    }

    fn decode(self, bytes: &[u8], out: &mut Vec<f32>) {
        match self {
            Format::F32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            Format::I16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0),
            ),
        }
    }
}

/// Speech start / end with hysteresis, over per-chunk probabilities.
#[derive(Debug, Clone, Default)]
pub struct Hysteresis {
    pub(crate) speaking: bool,
    pub(crate) silence_from: Option<u64>,
}

/// A speech event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Speech started at this chunk.
    Start(u64),
    /// Speech ended: silence started at this chunk (and lasted long enough).
    End(u64),
}

impl Hysteresis {
    /// Feeds chunk `n`'s probability; the event it triggers, if any.
    pub fn feed(&mut self, n: u64, p: f32) -> Option<Event> {
        let min_silence_chunks = (MIN_SILENCE_MS * 16).div_ceil(CHUNK as u64);
        if p >= START_THRESHOLD {
            self.silence_from = None;
            if !self.speaking {
                self.speaking = true;
                return Some(Event::Start(n));
            }
        } else if self.speaking && p < END_THRESHOLD {
            let from = *self.silence_from.get_or_insert(n);
            if n + 1 - from >= min_silence_chunks {
                self.speaking = false;
                self.silence_from = None;
                return Some(Event::End(from));
            }
        }
        None
    }
}

/// What every connection shares.
struct Shared {
    runner: LanedRunner,
    settings: Settings,
    prometheus: Option<PrometheusHandle>,
    closing: watch::Receiver<bool>,
    /// Live WebSocket sessions (the accept loop's cap counts them).
    live: Arc<AtomicUsize>,
    /// Connections reading their request (not yet sessions).
    reading: Arc<AtomicUsize>,
    /// The hand-over store, if one is configured.
    store: Option<Arc<Store>>,
    /// Set when the drain starts: streams with an id hand over.
    handing_over: watch::Receiver<bool>,
    /// The drain's hand-overs.
    tally: std::sync::Mutex<handover::Tally>,
    /// Checkpoint failures, logged once a second at most.
    checkpoint_said: accept::Said,
    /// The stream ids live in a session now: one session per id.
    live_ids: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// Connections the probe address serves at once; past it, a new one
/// takes the place of the oldest.
pub const PROBE_PLACES: usize = 64;

/// A running server.
pub struct Server {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The address answering only the probes, if one was asked for.
    pub probe_addr: Option<SocketAddr>,
    probe_task: Option<tokio::task::JoinHandle<()>>,
    shared: Arc<Shared>,
    closing: watch::Sender<bool>,
    handing_over: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Builds the runner and serves on `settings.listen` (port 0: any).
/// Install the Prometheus recorder before calling this: the runner binds
/// its metrics handles when it is built.
pub async fn start(
    plan: Arc<dyn Runnable>,
    settings: Settings,
    prometheus: Option<PrometheusHandle>,
) -> Result<Server, String> {
    settings.validate()?;
    let runner = LanedRunner::new(plan, settings.runner_config()?).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| format!("binding {}: {e}", settings.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (closing, closing_rx) = watch::channel(false);
    let (handing_over, handing_over_rx) = watch::channel(false);
    let timeout = Duration::from_millis(settings.store_timeout_ms);
    let store = match &settings.store {
        Some(url) => {
            let store = Store::open(url, timeout, settings.handover_ttl_s)?;
            // Said at start, not fatal: the store may come up later.
            if let Err(e) = store.get("-").await {
                eprintln!("vad-server: the store at {url} does not answer ({e}): streams start fresh and hand-overs are skipped until it does");
            }
            Some(Arc::new(store))
        }
        None => None,
    };
    let shared = Arc::new(Shared {
        runner,
        settings,
        prometheus,
        closing: closing_rx,
        live: Arc::new(AtomicUsize::new(0)),
        reading: Arc::new(AtomicUsize::new(0)),
        store,
        handing_over: handing_over_rx,
        tally: std::sync::Mutex::new(handover::Tally::default()),
        checkpoint_said: accept::Said::new(),
        live_ids: std::sync::Mutex::new(std::collections::HashSet::new()),
    });
    let probes = Router::new()
        .route("/ready", get(ready))
        .route("/live", get(|| async { "live\n" }))
        .route("/metrics", get(metrics));
    let app = probes.clone().route("/v1/vad", get(vad)).with_state(shared.clone());
    // Past the cap: the probes, and 503 for anything else.
    let probes = probes
        .fallback(|| async {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the server's connection cap is reached: retry later\n",
            )
        })
        .with_state(shared.clone());
    let limits = accept::Limits {
        max_connections: shared.settings.connection_cap(),
        header_timeout: Duration::from_millis(shared.settings.header_timeout_ms),
    };
    if let Some(files) = open_files_limit() {
        let wanted = limits.max_connections + PROBE_RESERVE + 64;
        if files < wanted {
            eprintln!(
                "vad-server: the open-files limit ({files}) is under the connection cap ({}) plus the probes' \
                 reserve and the server's own files ({wanted} in all): raise it (ulimit -n) or lower max_connections",
                limits.max_connections
            );
        }
    }
    let (probe_addr, probe_task) = match shared.settings.probe_listen {
        Some(at) => {
            let listener = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| format!("binding the probe address {at}: {e}"))?;
            let probe_addr = listener.local_addr().map_err(|e| e.to_string())?;
            let only = accept::Limits {
                max_connections: PROBE_PLACES,
                ..limits
            };
            let (none, reading) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let task = tokio::spawn(accept::serve(
                listener,
                probes.clone(),
                probes.clone(),
                only,
                none,
                reading,
            ));
            (Some(probe_addr), Some(task))
        }
        None => (None, None),
    };
    let task = tokio::spawn(accept::serve(
        listener,
        app,
        probes,
        limits,
        shared.live.clone(),
        shared.reading.clone(),
    ));
    Ok(Server {
        addr,
        probe_addr,
        probe_task,
        shared,
        closing,
        handing_over,
        task,
    })
}

impl Server {
    /// The runner (capacity, metrics).
    pub fn runner(&self) -> &LanedRunner {
        &self.shared.runner
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// The graceful shutdown: stop admitting (`/ready` answers 503 at
    /// once), let live connections go on until they end or the drain
    /// deadline passes, close those left with 1001, stop serving. Returns
    /// the streams still live at the deadline.
    pub async fn shutdown(self) -> usize {
        self.shutdown_or(std::future::pending()).await
    }

    /// [`Server::shutdown`], cut short when `now` completes (a second
    /// SIGTERM, say): the drain ends then, the streams still live are
    /// closed with 1001 as at the deadline.
    pub async fn shutdown_or(self, now: impl std::future::Future<Output = ()>) -> usize {
        let runner = self.shared.runner.clone();
        runner.stop_admitting();
        // Streams with an id hand over (each after its call in flight) and
        // close 1012; the others drain as before.
        let _ = self.handing_over.send(self.shared.store.is_some());
        let mut deadline = Instant::now() + Duration::from_millis(self.shared.settings.drain_deadline_ms);
        let mut now = std::pin::pin!(now);
        // The drain's wait, here where a second signal can cut it: until no
        // lane is held, the deadline, or `now`.
        loop {
            let capacity = runner.capacity();
            if capacity.lanes_free == capacity.lanes || Instant::now() >= deadline {
                break;
            }
            tokio::select! {
                _ = &mut now => {
                    eprintln!("vad-server: told again: ending the drain now");
                    deadline = Instant::now();
                    break;
                }
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        let drained = tokio::task::spawn_blocking(move || runner.drain(deadline))
            .await
            .map(|d| d.stragglers)
            .unwrap_or(0);
        let _ = self.closing.send(true);
        // No new connection from here (a proxy retries it elsewhere): one
        // accepted now would be cut by the exit without a close frame.
        self.task.abort();
        if let Some(probes) = &self.probe_task {
            probes.abort();
        }
        // The close frames out, bounded: every session ended, and every
        // connection still reading its request answered (it becomes a
        // session that closes at once); checked twice, 50 ms apart, for a
        // connection between the two counts.
        let until = Instant::now() + Duration::from_secs(3);
        let busy = |s: &Shared| s.live.load(Ordering::Acquire) + s.reading.load(Ordering::Acquire) > 0;
        while Instant::now() < until {
            if !busy(&self.shared) {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if !busy(&self.shared) {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if self.shared.store.is_some() {
            let tally = self.shared.tally.lock().unwrap_or_else(|e| e.into_inner());
            println!("vad-server: {}", tally.summary());
        }
        drained
    }
}

async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    let capacity = shared.runner.capacity();
    let body = format!(
        "accepting {} lanes_free {} spawners_waiting {}\n",
        capacity.accepting, capacity.lanes_free, capacity.spawners_waiting
    );
    if capacity.is_ready() {
        (StatusCode::OK, body).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match &shared.prometheus {
        // Prometheus' text exposition format, as scrapers negotiate it.
        Some(h) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            h.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no Prometheus recorder installed\n").into_response(),
    }
}

/// The sample format a query string asks for (`format=`), refused when it
/// names one twice, so that every bad query is a 1003 close after the
/// upgrade rather than a bare HTTP 400.
fn format_of_query(query: Option<&str>) -> Result<Format, String> {
    let mut formats = query
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter(|(key, _)| *key == "format")
        .map(|(_, value)| value);
    let first = formats.next();
    if formats.next().is_some() {
        return Err("format given more than once: give it once, f32 or i16".into());
    }
    Format::parse(first)
}

/// The stream id a connection gives: its `x-stream-id` header, else its
/// `stream` URL parameter (browsers cannot set a WebSocket's headers);
/// `Err` for one that is not an id ([`handover::check_id`]).
fn stream_id_of(headers: &axum::http::HeaderMap, query: Option<&str>) -> Result<Option<String>, String> {
    let id = match headers.get("x-stream-id") {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| "the x-stream-id header is not ASCII".to_string())?
                .to_string(),
        ),
        None => query
            .unwrap_or("")
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(key, _)| *key == "stream")
            .map(|(_, value)| value.to_string()),
    };
    match id {
        Some(id) => handover::check_id(&id).map(|()| Some(id)),
        None => Ok(None),
    }
}

/// The generation a record refused at parse says it has, if it says one.
fn generation_in(bytes: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()?
        .get("generation")?
        .as_u64()
}

/// What a connection resumes from: `None` without a store or an id.
enum Resume {
    None,
    /// Chunk 0, nothing held (or nothing usable); the generation of a
    /// record refused, if one was read (the new session's is above it).
    Fresh(Option<u64>),
    From(Box<Record>),
}

impl Resume {
    /// The generation of the record this session found, if any.
    fn found_generation(&self) -> Option<u64> {
        match self {
            Resume::None => None,
            Resume::Fresh(generation) => *generation,
            Resume::From(record) => Some(record.generation),
        }
    }
}

/// The record under `id`, if it is one this server may continue: every
/// other outcome starts the stream fresh, with a log line where something
/// was wrong (the store failing, a record too large, unreadable, out of
/// range, of another model or refused by the runner's checks). Decided
/// here, before the upgrade, so that where the client is told to resume
/// from is where the stream resumes.
async fn look_up(shared: &Shared, store: &Store, id: &str) -> Resume {
    let bytes = match store.get(id).await {
        Ok(handover::Found::Bytes(b)) => b,
        Ok(handover::Found::Nothing) => {
            handover::count("laned_resume_total", "fresh");
            return Resume::Fresh(None);
        }
        Ok(handover::Found::TooBig(n)) => {
            eprintln!(
                "vad-server: stream {id}: the record held for it is refused ({n} bytes, over the {}-byte limit; left unread): it starts fresh",
                handover::MAX_RECORD_BYTES
            );
            handover::count("laned_resume_total", "refused");
            return Resume::Fresh(None);
        }
        Err(e) => {
            eprintln!("vad-server: stream {id}: no record read ({e}): it starts fresh");
            handover::count("laned_resume_total", "failed");
            return Resume::Fresh(None);
        }
    };
    let refused = |why: String, generation: Option<u64>| {
        eprintln!("vad-server: stream {id}: the record held for it is refused ({why}): it starts fresh");
        handover::count("laned_resume_total", "refused");
        Resume::Fresh(generation)
    };
    match Record::from_bytes(&bytes) {
        // The runner's own check: its format, its model's identity (naming
        // both), each tensor's type and shape.
        Ok(r) => match shared.runner.check_state(&r.state) {
            Ok(()) => Resume::From(Box::new(r)),
            Err(e) => refused(format!("its state: {e}"), Some(r.generation)),
        },
        // Superseded by this session's records where its generation can
        // still be read.
        Err(why) => refused(format!("{} bytes, {why}", bytes.len()), generation_in(&bytes)),
    }
}

async fn vad(
    ws: WebSocketUpgrade,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    State(shared): State<Arc<Shared>>,
) -> Response {
    let format = format_of_query(query.as_deref());
    let id = stream_id_of(&headers, query.as_deref());
    let resume = match (&shared.store, &id) {
        (Some(store), Ok(Some(id))) => look_up(&shared, store, id).await,
        _ => Resume::None,
    };
    let resume_chunk = match &resume {
        Resume::None => None,
        Resume::Fresh(_) => Some(0),
        Resume::From(r) => Some(r.chunk),
    };
    let opening = Opening { format, id, resume };
    // Oversized frames are refused by the session with 1009: the transport
    // itself takes frames up to twice the limit.
    let cap = shared.settings.max_frame_bytes.saturating_mul(2).max(1 << 16);
    // The write buffer is bounded: a client that does not read (pongs to a
    // ping flood, replies it never takes) fills it and is dropped, rather
    // than growing the server's memory without end.
    let mut response = ws
        .max_message_size(cap)
        .max_frame_size(cap)
        .write_buffer_size(WRITE_BUFFER)
        .max_write_buffer_size(MAX_WRITE_BUFFER)
        .on_upgrade(move |socket| session(socket, shared, opening));
    // Where the client resends from, before any frame: a client reads it
    // off the upgrade (the first message says it too, for browsers).
    if let Some(chunk) = resume_chunk {
        response
            .headers_mut()
            .insert("x-resume-chunk", axum::http::HeaderValue::from(chunk));
    }
    response
}

/// What the upgrade learnt of a connection.
struct Opening {
    format: Result<Format, String>,
    id: Result<Option<String>, String>,
    resume: Resume,
}

/// The stream's record as it stands (its state exported from the runner),
/// and how long the export took.
async fn record_of(stream: &Stream) -> Result<(Record, Duration), String> {
    let started = Instant::now();
    let state = stream
        .handle
        .export_state_async()
        .await
        .map_err(|e| format!("exporting the state: {e}"))?;
    let record = Record::of(stream.chunk, &stream.context, &stream.hysteresis, state, &stream.writer);
    Ok((record, started.elapsed()))
}

/// A stream's state to the store, after any checkpoint in flight (so a
/// later position is never overwritten by an earlier one): `Ok` with its
/// bytes and the times the export (from the runner) and the write (to the
/// store) took.
async fn hand_over(store: &Store, id: &str, stream: &Stream) -> Result<(usize, Duration, Duration), String> {
    let (record, export) = record_of(stream).await?;
    let written = stream.written.clone().lock_owned().await;
    let started = Instant::now();
    let bytes = put_after(store, id, &record, written).await?;
    Ok((bytes, export, started.elapsed()))
}

/// Writes `record` unless the stream's last write was at a later position
/// (`written`: the last position written, held for the write); the bytes
/// written (0: none).
async fn put_after(
    store: &Store,
    id: &str,
    record: &Record,
    mut written: tokio::sync::OwnedMutexGuard<Option<u64>>,
) -> Result<usize, String> {
    if written.is_some_and(|at| at > record.chunk) {
        return Ok(0);
    }
    let bytes = store.put(id, record).await.map_err(|e| e.to_string())?;
    *written = Some(record.chunk);
    Ok(bytes)
}

/// A checkpoint, off the answer path: the record is taken now, written by
/// a task of its own. At most one is in flight per stream: one due while
/// the last is still being written is dropped (counted `dropped`), so a
/// slow or hung store costs the stream no wait and no memory.
async fn checkpoint(shared: &Arc<Shared>, store: &Arc<Store>, id: &str, stream: &Stream) {
    let Ok(written) = stream.written.clone().try_lock_owned() else {
        handover::count("laned_checkpoint_total", "dropped");
        return;
    };
    let record = match record_of(stream).await {
        Ok((record, _)) => record,
        Err(why) => {
            handover::count("laned_checkpoint_total", "failed");
            shared
                .checkpoint_said
                .say(|| format!("stream {id}: a checkpoint skipped ({why})"));
            return;
        }
    };
    let (shared, store, id) = (shared.clone(), store.clone(), id.to_string());
    tokio::spawn(async move {
        match put_after(&store, &id, &record, written).await {
            Ok(_) => handover::count("laned_checkpoint_total", "ok"),
            Err(why) => {
                handover::count("laned_checkpoint_total", "failed");
                shared
                    .checkpoint_said
                    .say(|| format!("stream {id}: a checkpoint skipped ({why})"));
            }
        }
    });
}

/// Hands the stream over and closes it 1012 (`true`: the session ends), or
/// says why it could not (`false`: it drains as without a store).
async fn try_hand_over(
    socket: &mut WebSocket,
    shared: &Shared,
    store: &Store,
    (id, live_id): (&str, &mut Option<LiveId<'_>>),
    stream: &Stream,
) -> bool {
    match hand_over(store, id, stream).await {
        Ok((bytes, export, write)) => {
            shared
                .tally
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(bytes, export, write);
            handover::count("laned_handover_total", "ok");
            let why = format!("restarting: resume at chunk {}", stream.chunk);
            // Handed over: the id is free for the client's reconnect (here
            // or elsewhere) while the close waits for its reply.
            drop(live_id.take());
            close_with(socket, close::RESTART, &why).await;
            true
        }
        Err(why) => {
            shared.tally.lock().unwrap_or_else(|e| e.into_inner()).failed += 1;
            handover::count("laned_handover_total", "failed");
            eprintln!("vad-server: stream {id}: hand-over skipped ({why}): it drains as without a store");
            false
        }
    }
}

struct LiveGuard(Arc<Shared>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A read that failed: a frame or message past what the transport takes
/// (twice `max`; a fragmented message counts whole) is refused with 1009
/// and a reason, as a frame over `max` is; any other failure (the
/// connection gone, a protocol error) just ends the session.
async fn refuse_transport_error(socket: &mut WebSocket, error: axum::Error, max: usize) {
    let too_big = error
        .into_inner()
        .downcast::<tokio_tungstenite::tungstenite::Error>()
        .is_ok_and(|e| matches!(*e, tokio_tungstenite::tungstenite::Error::Capacity(_)));
    if too_big {
        let why = format!("a frame or message far over the {max}-byte limit");
        close_with(socket, close::TOO_BIG, &why).await;
    }
}

/// The client closed: flush the close reply tungstenite queued, and drop
/// the stream's record if it is still this session's (a later stream of
/// the same id starts fresh; a newer session's record stays).
async fn closed_by_client(
    socket: &mut WebSocket,
    handing: Option<(&Arc<Store>, &str)>,
    writer: &handover::Writer,
    written: &Arc<tokio::sync::Mutex<Option<u64>>>,
) {
    let _ = futures_util::SinkExt::close(socket).await;
    if let Some((store, id)) = handing {
        // After any checkpoint in flight, which would write it back.
        let _written = written.clone().lock_owned().await;
        let _ = store.remove_own(id, writer).await;
    }
}

async fn close_with(socket: &mut WebSocket, code: u16, reason: &str) {
    // A control frame holds 125 bytes: a longer reason (one quoting the
    // client's own input, say) is cut at a character boundary, or the
    // close itself would be a protocol error.
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    // Bounded: a client that reads nothing must not hold the session.
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        socket.send(Message::Close(Some(CloseFrame {
            code,
            reason: reason[..end].into(),
        }))),
    )
    .await;
    // Linger: read and discard until the client's close reply (or the
    // end of the connection), up to a second, so that the frame reaches a
    // client still sending (a socket closed with bytes unread would be
    // reset, the close frame lost). A read that fails on the client's
    // input (the rest of an oversized message) is discarded too.
    // Frames without audio count against a budget too, so that a flood
    // of them is not read for the whole second (the close frame was sent
    // first: a client reading gets it long before).
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut control = 0;
        while control < LINGER_FRAMES {
            match socket.recv().await {
                None | Some(Ok(Message::Close(_))) => break,
                Some(Ok(Message::Binary(b))) if !b.is_empty() => (),
                Some(Ok(_)) => control += 1,
                Some(Err(e)) => {
                    if connection_gone(e) {
                        break;
                    }
                    tokio::task::yield_now().await
                }
            }
        }
    })
    .await;
}

/// Whether a failed read means the connection is gone (nothing more to
/// read), not only that the client's input was refused.
fn connection_gone(error: axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error;
    match error.into_inner().downcast::<Error>() {
        Ok(e) => matches!(*e, Error::ConnectionClosed | Error::AlreadyClosed | Error::Io(_)),
        Err(_) => true,
    }
}

/// What a message read ahead holds: its payload and its place in the
/// queue (so a flood of empty or control frames is bounded too).
fn message_bytes(m: &Message) -> usize {
    let payload = match m {
        Message::Binary(b) => b.len(),
        Message::Text(t) => t.len(),
        Message::Ping(p) | Message::Pong(p) => p.len(),
        Message::Close(_) => 0,
    };
    payload + std::mem::size_of::<Message>()
}

/// Until the flag is set (or its sender is gone).
async fn closed(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|c| *c).await;
}

/// Non-audio frames (pings, pongs, empty binary frames) a connection may
/// send in a burst; past it, [`CONTROL_PER_SEC`] a second. A connection
/// over it is closed 1008: a flood of frames that carry no audio costs the
/// server at most this many frames' reading (each at most 125 bytes of
/// control payload), whether or not the client reads its pongs.
pub const CONTROL_BURST: u32 = 64;
/// See [`CONTROL_BURST`].
pub const CONTROL_PER_SEC: u32 = 32;

/// A connection's budget of non-audio frames (a token bucket).
struct ControlBudget {
    tokens: f64,
    at: tokio::time::Instant,
}

impl ControlBudget {
    fn new() -> ControlBudget {
        ControlBudget {
            tokens: CONTROL_BURST as f64,
            at: tokio::time::Instant::now(),
        }
    }

    /// Spend one frame's token; `false` when none is left.
    fn spend(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        let earned = (now - self.at).as_secs_f64() * CONTROL_PER_SEC as f64;
        self.tokens = (self.tokens + earned).min(CONTROL_BURST as f64);
        self.at = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

/// Whether the client takes its replies: the server pings after replying
/// (at most every quarter of `idle`), and a ping not answered (pong) within
/// `idle` means the client has read nothing since (every WebSocket client
/// answers a ping when it reads): the session is closed 1008 and its lane
/// freed, however much the kernel's buffers could still hold.
struct Taken {
    idle: Duration,
    /// The ping waiting for its pong, sent then.
    outstanding: Option<tokio::time::Instant>,
    /// The last ping sent.
    last: Option<tokio::time::Instant>,
}

impl Taken {
    /// Past when the client has not taken its replies.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.outstanding.map(|at| at + self.idle)
    }

    /// Whether a ping should follow the replies just sent.
    fn ping_due(&self, now: tokio::time::Instant) -> bool {
        self.outstanding.is_none() && self.last.is_none_or(|at| now >= at + self.idle / 4)
    }
}

/// Frees a stream id when its session ends.
struct LiveId<'a>(&'a Shared, String);

impl Drop for LiveId<'_> {
    fn drop(&mut self) {
        self.0
            .live_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

async fn session(mut socket: WebSocket, shared: Arc<Shared>, opening: Opening) {
    shared.live.fetch_add(1, Ordering::AcqRel);
    let _guard = LiveGuard(shared.clone());
    let format = match opening.format {
        Ok(f) => f,
        Err(why) => return close_with(&mut socket, close::UNSUPPORTED, &why).await,
    };
    // An id is only read with a store (without one, today's behaviour:
    // any header is let through unread).
    let id = match opening.id {
        Ok(id) => id,
        Err(why) if shared.store.is_some() => return close_with(&mut socket, close::IDLE, &why).await,
        Err(_) => None,
    };
    // The store and the id, where this stream hands over and checkpoints.
    let handing = match (&shared.store, &id) {
        (Some(store), Some(id)) => Some((store, id.as_str())),
        _ => None,
    };
    // Draining already: a stream with an id is told to go elsewhere with
    // its record untouched.
    if handing.is_some() && *shared.handing_over.borrow() {
        return close_with(&mut socket, close::RESTART, "restarting: resume elsewhere").await;
    }
    // One live session per id: a second is refused while the first lives,
    // so that nobody continues (or overwrites) another's stream.
    let mut live_id = match handing {
        Some((_, id)) => {
            if !shared
                .live_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id.to_string())
            {
                let why = format!("stream id {id:?} is live in another session");
                return close_with(&mut socket, close::IDLE, &why).await;
            }
            Some(LiveId(&shared, id.to_string()))
        }
        None => None,
    };
    let wait = Duration::from_millis(shared.settings.admission_wait_ms);
    let spawned = tokio::select! {
        r = tokio::time::timeout(wait, shared.runner.spawn_async()) => r,
        _ = closed(shared.closing.clone()) => {
            return close_with(&mut socket, close::GOING_AWAY, "the server is shutting down").await;
        }
    };
    let handle = match spawned {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            let code = match e {
                laned_runner::SpawnError::Draining | laned_runner::SpawnError::Closed if handing.is_some() => {
                    close::RESTART
                }
                laned_runner::SpawnError::Draining | laned_runner::SpawnError::Closed => close::GOING_AWAY,
                _ => close::TRY_AGAIN_LATER,
            };
            return close_with(&mut socket, code, &format!("no lane: {e}")).await;
        }
        Err(_) => {
            return close_with(
                &mut socket,
                close::TRY_AGAIN_LATER,
                &format!("no lane freed up within {wait:?}: try again later"),
            )
            .await
        }
    };
    let mut stream = Stream {
        handle,
        context: Context::default(),
        pending: Vec::new(),
        chunk: 0,
        hysteresis: Hysteresis::default(),
        writer: handover::Writer::after(opening.resume.found_generation()),
        written: Arc::new(tokio::sync::Mutex::new(None)),
    };
    if let (Resume::From(record), Some((_, id))) = (&opening.resume, handing) {
        // The record was checked before the upgrade (the runner's checks
        // included); an import can only fail now for the runner's end.
        if let Err(e) = stream.handle.import_state_async(&record.state).await {
            let code = if e.end_reason().is_some() {
                close::GOING_AWAY
            } else {
                close::INTERNAL
            };
            return close_with(&mut socket, code, &format!("stream {id}: resuming: {e}")).await;
        }
        stream.chunk = record.chunk;
        stream.context = record.context();
        stream.hysteresis = record.hysteresis();
        handover::count("laned_resume_total", "resumed");
    }
    if handing.is_some() {
        let hello = format!("{{\"resume\":{}}}", stream.chunk);
        if socket.send(Message::Text(hello.into())).await.is_err() {
            return;
        }
    }
    let checkpoint_every = shared.settings.checkpoint_every;
    // A hand-over that failed is not tried again: the stream drains.
    let mut hand_over_failed = false;
    let max = shared.settings.max_frame_bytes;
    let idle = Duration::from_millis(shared.settings.idle_ms);
    // Frames read while a call was in flight, handled in order after it.
    let mut backlog: VecDeque<Message> = VecDeque::new();
    // Their bytes, bounded by `READ_AHEAD_BYTES`.
    let mut backlog_bytes = 0;
    // Only audio moves this on: pings, pongs and empty frames keep no lane.
    let mut idle_until = tokio::time::Instant::now() + idle;
    let mut budget = ControlBudget::new();
    let mut taken = Taken {
        idle,
        outstanding: None,
        last: None,
    };
    let untaken = format!("replies untaken for {idle:?}: the lane goes to others");
    loop {
        if let Some((store, id)) = handing {
            if !hand_over_failed && *shared.handing_over.borrow() {
                if try_hand_over(&mut socket, &shared, store, (id, &mut live_id), &stream).await {
                    return;
                }
                hand_over_failed = true;
            }
        }
        // Checked here too, not only by the read's timeout: a timeout
        // looks at its clock only when the read is pending, and a flood of
        // pings keeps the read ready.
        let now = tokio::time::Instant::now();
        // The lane goes back before the close waits for the client's
        // reply (a client that does not read may never send one).
        if now >= idle_until {
            let why = format!("no audio for {idle:?}: the lane goes to others");
            drop(stream);
            return close_with(&mut socket, close::IDLE, &why).await;
        }
        if taken.deadline().is_some_and(|d| now >= d) {
            drop(stream);
            return close_with(&mut socket, close::IDLE, &untaken).await;
        }
        let read_until = taken.deadline().map_or(idle_until, |d| d.min(idle_until));
        let msg = match backlog.pop_front() {
            Some(m) => {
                backlog_bytes -= message_bytes(&m);
                Some(Ok(m))
            }
            None => tokio::select! {
                m = tokio::time::timeout_at(read_until, socket.recv()) => match m {
                    Ok(m) => m,
                    // The loop's top says which clock ran out.
                    Err(_) => continue,
                },
                _ = closed(shared.closing.clone()) => {
                    return close_with(&mut socket, close::GOING_AWAY, "the server is shutting down").await;
                }
                // Handed over at the loop's top (a flag dropped unset, the
                // server gone, is not waited on again).
                _ = closed(shared.handing_over.clone()), if handing.is_some() && !hand_over_failed => {
                    hand_over_failed |= !*shared.handing_over.borrow();
                    continue;
                }
            },
        };
        let bytes = match msg {
            // Gone: dropping the handle frees the lane.
            None => return,
            Some(Err(e)) => return refuse_transport_error(&mut socket, e, max).await,
            Some(Ok(Message::Close(_))) => {
                return closed_by_client(&mut socket, handing, &stream.writer, &stream.written).await
            }
            Some(Ok(m @ (Message::Ping(_) | Message::Pong(_)))) => {
                if matches!(m, Message::Pong(_)) {
                    taken.outstanding = None;
                }
                if !budget.spend() {
                    return close_with(&mut socket, close::IDLE, &too_many_frames()).await;
                }
                continue;
            }
            Some(Ok(Message::Text(_))) => {
                return close_with(
                    &mut socket,
                    close::UNSUPPORTED,
                    "text frames are not audio: send binary PCM",
                )
                .await
            }
            Some(Ok(Message::Binary(b))) => b,
        };
        if bytes.len() > max {
            let why = format!("frame of {} bytes over the {max}-byte limit", bytes.len());
            return close_with(&mut socket, close::TOO_BIG, &why).await;
        }
        if bytes.len() % format.width() != 0 {
            let why = format!("{} bytes is not a whole number of {format:?} samples", bytes.len());
            return close_with(&mut socket, close::UNSUPPORTED, &why).await;
        }
        if bytes.is_empty() {
            if !budget.spend() {
                return close_with(&mut socket, close::IDLE, &too_many_frames()).await;
            }
        } else {
            idle_until = tokio::time::Instant::now() + idle;
        }
        format.decode(&bytes, &mut stream.pending);
        while stream.pending.len() >= CHUNK {
            // Between calls: a drain hands over here (the client resends
            // what is left from the chunk the close names).
            if let Some((store, id)) = handing {
                if !hand_over_failed && *shared.handing_over.borrow() {
                    if try_hand_over(&mut socket, &shared, store, (id, &mut live_id), &stream).await {
                        return;
                    }
                    hand_over_failed = true;
                }
            }
            if taken.deadline().is_some_and(|d| tokio::time::Instant::now() >= d) {
                drop(stream);
                return close_with(&mut socket, close::IDLE, &untaken).await;
            }
            let chunk: Vec<f32> = stream.pending.drain(..CHUNK).collect();
            let inputs = stream.context.inputs(&chunk);
            // The socket is read while the call is in flight: a client gone
            // meanwhile drops the call (cancelled) and frees its lane at once.
            let out = {
                let call = stream.handle.call_async(inputs);
                tokio::pin!(call);
                loop {
                    tokio::select! {
                        r = &mut call => break r,
                        m = socket.recv(), if backlog_bytes < READ_AHEAD_BYTES => match m {
                            None => return,
                            Some(Err(e)) => return refuse_transport_error(&mut socket, e, max).await,
                            Some(Ok(Message::Close(_))) => return closed_by_client(&mut socket, handing, &stream.writer, &stream.written).await,
                            Some(Ok(m)) => {
                                backlog_bytes += message_bytes(&m);
                                backlog.push_back(m);
                            }
                        },
                        _ = closed(shared.closing.clone()) => {
                            return close_with(&mut socket, close::GOING_AWAY, "the server is shutting down").await;
                        }
                    }
                }
            };
            let out = match out {
                Ok(out) => out,
                Err(e) => {
                    let code = if e.end_reason().is_some() {
                        close::GOING_AWAY
                    } else {
                        close::INTERNAL
                    };
                    return close_with(&mut socket, code, &format!("stream ended: {e}")).await;
                }
            };
            let p = out[0]
                .to_plain_array_view::<f32>()
                .ok()
                .and_then(|a| a.iter().next().copied())
                .unwrap_or(f32::NAN);
            let n = stream.chunk;
            stream.chunk += 1;
            let mut replies = vec![Message::Text(format!("{{\"chunk\":{n},\"probability\":{p}}}").into())];
            match stream.hysteresis.feed(n, p) {
                Some(Event::Start(c)) => replies.push(Message::Text(
                    format!("{{\"event\":\"speech_start\",\"chunk\":{c}}}").into(),
                )),
                Some(Event::End(c)) => replies.push(Message::Text(
                    format!("{{\"event\":\"speech_end\",\"chunk\":{c}}}").into(),
                )),
                None => {}
            }
            let now = tokio::time::Instant::now();
            if taken.ping_due(now) {
                replies.push(Message::Ping(n.to_le_bytes().to_vec().into()));
                taken.outstanding = Some(now);
                taken.last = Some(now);
            }
            for r in replies {
                // A client not taking its replies stalls the send once the
                // buffers fill: past `idle`, it is dropped (no close frame
                // could reach it either).
                match tokio::time::timeout(idle, socket.send(r)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => return,
                }
            }
            if let Some((store, id)) = handing {
                if checkpoint_every > 0 && stream.chunk.is_multiple_of(checkpoint_every) {
                    checkpoint(&shared, store, id, &stream).await;
                }
            }
        }
    }
}

/// The reason a connection flooding non-audio frames is closed with.
fn too_many_frames() -> String {
    format!("too many frames without audio: {CONTROL_BURST} at once, {CONTROL_PER_SEC} a second at most")
}

struct Stream {
    handle: LanedStateHandle,
    context: Context,
    pending: Vec<f32>,
    chunk: u64,
    hysteresis: Hysteresis,
    /// This session's generation and owner token, on every record it writes.
    writer: handover::Writer,
    /// The last position this session wrote to the store, held while a
    /// write is in flight (a checkpoint's task, a hand-over, a removal):
    /// one write at a time, never an earlier position after a later one.
    written: Arc<tokio::sync::Mutex<Option<u64>>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `format=` read from a raw query: absent, given once, unknown,
    /// repeated.
    #[test]
    fn the_format_comes_from_the_query_once() {
        assert_eq!(format_of_query(None), Ok(Format::F32));
        assert_eq!(format_of_query(Some("format=i16")), Ok(Format::I16));
        assert_eq!(format_of_query(Some("x=1&format=i16&y")), Ok(Format::I16));
        assert!(format_of_query(Some("format=u8"))
            .unwrap_err()
            .contains("unknown format"));
        let twice = format_of_query(Some("format=i16&format=i16")).unwrap_err();
        assert!(twice.contains("more than once"), "{twice}");
    }

    #[test]
    fn hysteresis_starts_at_half_and_ends_after_100ms_below_035() {
        let mut h = Hysteresis::default();
        let ps = [0.1, 0.6, 0.4, 0.3, 0.3, 0.45, 0.3, 0.2, 0.1, 0.1, 0.9];
        let events: Vec<Event> = ps
            .iter()
            .enumerate()
            .filter_map(|(n, p)| h.feed(n as u64, *p))
            .collect();
        // 0.45 (between the thresholds) does not reset the silence: it
        // started at chunk 3, and 4 chunks (128 ms >= 100 ms) end it at 6.
        assert_eq!(events, vec![Event::Start(1), Event::End(3), Event::Start(10)]);
    }

    #[test]
    fn policies_parse() {
        assert_eq!(parse_policy("immediate"), Ok(TurnPolicy::Immediate));
        assert_eq!(parse_policy("linger:500"), Ok(TurnPolicy::Linger { us: 500 }));
        assert_eq!(parse_policy("budget:2000"), Ok(TurnPolicy::LatencyBudget { us: 2000 }));
        assert_eq!(parse_policy("tick:32000"), Ok(TurnPolicy::Tick { period_us: 32000 }));
        assert!(parse_policy("linger").is_err());
        assert!(parse_policy("soon").is_err());
    }

    #[test]
    fn settings_read_from_toml_keep_defaults_for_the_rest() {
        let s: Settings = toml::from_str("lanes = 8\nmode = \"combining\"\npolicy = \"linger:300\"\n").unwrap();
        assert_eq!(s.lanes, 8);
        assert_eq!(s.mode, Mode::Combining);
        assert_eq!(s.shards, Settings::default().shards);
        s.runner_config().unwrap();
        assert!(toml::from_str::<Settings>("lanez = 8").is_err());
        let probes: Settings = toml::from_str("probe_listen = \"0.0.0.0:9001\"\n").unwrap();
        assert_eq!(probes.probe_listen, Some("0.0.0.0:9001".parse().unwrap()));
    }

    #[test]
    fn formats() {
        assert_eq!(Format::parse(None), Ok(Format::F32));
        assert_eq!(Format::parse(Some("i16")), Ok(Format::I16));
        assert!(Format::parse(Some("mp3")).is_err());
        let mut out = Vec::new();
        Format::I16.decode(&[0, 0x80, 0, 0x40], &mut out);
        assert_eq!(out, vec![-1.0, 0.5]);
    }
}
