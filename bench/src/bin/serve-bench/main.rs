//! `cargo xtask bench --scenario serve`: what the network front costs.
//! The `vad-server` binary (Silero VAD over WebSocket) is started as a
//! child process, pinned to the server's cores, and driven by `n` real
//! WebSocket clients (tokio-tungstenite, on 127.0.0.1) in this process,
//! pinned by xtask to the other cores. Each client sends a 512-sample chunk
//! (32 ms of 16 kHz audio) every 32 ms and waits for its probability;
//! latency counts from the send to the answer's arrival.
//!
//! Against it, the same model in-process: this binary run again on the
//! server's cores (`--in-process`), streams as tokio tasks calling the
//! runner directly (`laned_load::tasks::real_time`), with the server's
//! runner settings (worker mode, one shard, a lane per stream, no linger).
//!
//! With `--gru`, the model is one the bench writes (a GRU of 40 features
//! and 64 hidden, its state an input/output pair, as issue 50 describes a
//! user's), served by `laned serve` (`--server` is then the `laned`
//! binary) in the tensor protocol: a pulse every 32 ms per stream, one
//! binary answer each; in-process, the same spec's runner.
//!
//! `laned serve`'s other fronts beside them, on the same model (for
//! Silero, given `--laned PATH`, the built-in `silero` served by `laned
//! serve`, its single-stream front too): the multiplexed front
//! (`/v1/models/NAME/mux`, [`mux`]) and KServe v2 gRPC (one
//! `ModelStreamInfer` stream a connection, Triton's sequences, [`grpc`]),
//! `--per-connection` streams a connection (default 64). A connection's
//! streams share its clock, as a gateway's calls share its tick: every
//! pulse due goes out at once (one message of several records on the
//! multiplexed front, a request each on the gRPC stream); the connections
//! spread over the period.
//!
//! The transport's floor beside them (`--echo-server`, this binary run
//! again on the server's cores): a minimal tokio-tungstenite server that
//! answers each binary frame with one of the served model's answer size
//! (256 bytes for the GRU, `--answer-bytes` to change), no model, no
//! session; driven by the same clients with the same frames; and again
//! reading 4 KiB at most a read, as `laned serve` does (tungstenite zeroes
//! its read buffer's free space before each read, 128 KiB by default). At fixed
//! stream counts (`--streams`, default 64, 256 and 512), rounds
//! interleaved (echo, the server, in-process), the three side by side:
//! server CPU per answer and the ratios, the issue 60 table.
//!
//! Both report capacity, the most streams whose p99 stays within 50 ms
//! (`laned_bench::laned_load::search_capacity`), and CPU per chunk: the server
//! process's own CPU (from `/proc/<pid>/stat`), and for the in-process run
//! the whole process's, its load generator included (so the difference
//! understates what the front costs), and both at the largest stream count
//! both searches probed, since a chunk's cost depends on how full the
//! turns are. Every probe's streams
//! run half a second before it counts (the runner's first turns at each
//! occupancy prepare kernels).

mod grpc;
mod mux;
mod pace;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use laned_bench::cli;
use laned_load::tasks::{self, TaskSystem};
use laned_models::silero::{self, Context, CHUNK};
use laned_runner::{LanedRunner, Mode, RunnerConfig, StatePair, StateSpec};
use tokio_tungstenite::tungstenite::Message;
use tract_core::internal::*;

const HELP: &str = "\
serve-bench --server PATH [--server-cpus LIST] [--seconds 2] [--max 2048] [--quick] [--gru]
            [--streams 64,256,512] [--rounds 3] [--answer-bytes N] [--echo-read-buffer 4096]
            [--baseline PATH] [--no-search] [--no-fixed] [--laned PATH]
            [--fronts stream,mux,grpc] [--per-connection 64]
serve-bench --in-process [--seconds 2] [--max 2048] [--gru] [--probe N] [--group K]
serve-bench --echo-server [--answer-bytes N] [--read-buffer N]

Real time, Silero VAD: a 512-sample chunk every 32 ms per stream; capacity is
the most streams with end-to-end p99 latency within 50 ms. With --server,
starts the vad-server binary at PATH for each probe (pinned with taskset to
LIST, default 0), drives it with WebSocket clients from this process, and
runs this binary again with --in-process on the same CPUs for the in-process
figure. Each probe lasts 1.5 x --seconds (at least 1 s). With --gru, a GRU the
bench writes (40 in, 64 hidden, its state a pair), served by `laned serve` (PATH
the laned binary), a pulse every 32 ms per stream.

Before the searches, at each of --streams (fixed counts), --rounds rounds
interleaved: the echo floor (this binary with --echo-server, pinned as the
server is: each binary frame answered with --answer-bytes, default the served
model's answer size), the echo again reading --echo-read-buffer bytes at most
(tungstenite zeroes its read buffer before each read; laned serve reads 4 KiB;
0: no second echo), the server (and --baseline, another build of it, beside
it), laned serve's fronts (--fronts, default all: its single-stream front for
Silero, the multiplexed one and gRPC, --per-connection streams a connection;
for Silero only with --laned PATH, the laned binary serving the built-in
silero), and in-process (--probe N): server CPU per answer side by side, and
the ratios. Then a capacity search for each. --no-search skips the capacity
searches, --no-fixed the fixed counts.
";

const PERIOD: Duration = Duration::from_millis(32);
const BUDGET: Duration = Duration::from_millis(50);
/// Streams run this long before a probe counts: a fresh runner's first
/// turns at each new occupancy prepare their kernels (the memo's misses),
/// which is no steady cost.
const WARM_UP: Duration = Duration::from_millis(500);
/// An answer later than this fails the run: no probe waits forever on a
/// wedged server (a probe over budget is answered within a second).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

struct Args {
    server: Option<PathBuf>,
    /// Another server binary measured beside it at the fixed counts (the
    /// same kind: a `laned` of another commit, say).
    baseline: Option<PathBuf>,
    server_cpus: String,
    in_process: bool,
    seconds: f64,
    max: usize,
    gru: bool,
    /// Run as the echo server (the transport's floor).
    echo_server: bool,
    /// The echo's answer size; by default the served model's.
    answer_bytes: Option<usize>,
    /// The echo server's read buffer (`--echo-server`); tungstenite's
    /// default (128 KiB) if `None`.
    read_buffer: Option<usize>,
    /// The second echo's read buffer at the fixed counts (0: none).
    echo_read_buffer: usize,
    /// The fixed stream counts measured side by side.
    streams: Vec<usize>,
    /// Rounds at the fixed counts.
    rounds: usize,
    search: bool,
    fixed: bool,
    /// In-process, one probe at this count instead of the search.
    probe: Option<usize>,
    /// `laned` (for Silero: its fronts beside `vad-server`'s; with
    /// `--gru`, `--server` is this binary).
    laned: Option<PathBuf>,
    /// Streams a connection on the multiplexed and gRPC fronts.
    per_connection: usize,
    /// In-process, streams in groups of this many share a phase.
    group: usize,
    /// `laned serve`'s fronts measured.
    via: Vec<Via>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        server: None,
        baseline: None,
        server_cpus: "0".into(),
        in_process: false,
        seconds: 2.0,
        max: 2048,
        gru: false,
        echo_server: false,
        answer_bytes: None,
        read_buffer: None,
        echo_read_buffer: 4096,
        streams: vec![64, 256, 512],
        rounds: 3,
        search: true,
        fixed: true,
        probe: None,
        laned: None,
        per_connection: 64,
        group: 1,
        via: vec![Via::Stream, Via::Mux, Via::Grpc],
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--server" => a.server = Some(value("--server")?.into()),
            "--baseline" => a.baseline = Some(value("--baseline")?.into()),
            "--server-cpus" => a.server_cpus = value("--server-cpus")?,
            "--in-process" => a.in_process = true,
            "--seconds" => a.seconds = cli::number(&value("--seconds")?, "--seconds")?,
            "--max" => a.max = cli::number(&value("--max")?, "--max")?,
            "--quick" => {
                a.seconds = 0.7;
                a.rounds = 1;
            }
            "--gru" => a.gru = true,
            "--echo-server" => a.echo_server = true,
            "--answer-bytes" => a.answer_bytes = Some(cli::number(&value("--answer-bytes")?, "--answer-bytes")?),
            "--read-buffer" => a.read_buffer = Some(cli::number(&value("--read-buffer")?, "--read-buffer")?),
            "--echo-read-buffer" => {
                a.echo_read_buffer = cli::number(&value("--echo-read-buffer")?, "--echo-read-buffer")?
            }
            "--streams" => {
                a.streams = value("--streams")?
                    .split(',')
                    .map(|n| cli::number(n.trim(), "--streams"))
                    .collect::<Result<_, _>>()?
            }
            "--rounds" => a.rounds = cli::number(&value("--rounds")?, "--rounds")?,
            "--no-search" => a.search = false,
            "--no-fixed" => a.fixed = false,
            "--probe" => a.probe = Some(cli::number(&value("--probe")?, "--probe")?),
            "--laned" => a.laned = Some(value("--laned")?.into()),
            "--group" => a.group = cli::number(&value("--group")?, "--group")?,
            "--per-connection" => a.per_connection = cli::number(&value("--per-connection")?, "--per-connection")?,
            "--fronts" => {
                a.via = value("--fronts")?
                    .split(',')
                    .map(|f| match f.trim() {
                        "stream" => Ok(Via::Stream),
                        "mux" => Ok(Via::Mux),
                        "grpc" => Ok(Via::Grpc),
                        other => Err(format!("--fronts: {other:?} is not stream, mux or grpc")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n\n{HELP}")),
        }
    }
    if a.server.is_none() && !a.in_process && !a.echo_server {
        return Err(format!(
            "--server PATH, --in-process or --echo-server is required\n\n{HELP}"
        ));
    }
    Ok(a)
}

/// What is served: Silero by `vad-server` (and, where the bench has a
/// `laned` binary, by `laned serve` as the built-in `silero`), or the
/// bench's GRU by `laned serve`.
enum Served {
    Vad(PathBuf, Option<Box<Tensor>>),
    Gru(Box<Tensor>),
}

impl Served {
    /// The model as `laned serve` serves it, where it does.
    fn tensor(&self) -> Option<&Tensor> {
        match self {
            Served::Vad(_, tensor) => tensor.as_deref(),
            Served::Gru(gru) => Some(gru),
        }
    }
}

/// A model as `laned serve` serves it in the tensor protocol: its name,
/// its spec (a file per lane count, in its folder), loaded, and what a
/// stream feeds.
struct Tensor {
    name: &'static str,
    dir: PathBuf,
    model: laned_models::spec::ModelSpec,
    /// The runner's settings but the lanes (one shard, worker mode, no
    /// linger: the server's).
    config: fn(usize) -> RunnerConfig,
    loaded: laned_models::spec::Loaded,
    interface: laned_models::spec::Interface,
}

/// Features and hidden size of the bench's GRU.
const GRU: (usize, usize) = (40, 64);

impl Tensor {
    /// The bench's GRU, written (the same bytes each time) and loaded.
    fn gru() -> TractResult<Tensor> {
        let dir = std::env::temp_dir().join(format!("laned-serve-bench-gru-{}x{}", GRU.0, GRU.1));
        std::fs::create_dir_all(&dir)?;
        let model = laned_testkit::fixtures::gru_cell(GRU.0, GRU.1)?.model;
        tract_pulse::internal::tract_nnef::nnef()
            .write_to_tar(&model, std::fs::File::create(dir.join("gru.nnef.tar"))?)?;
        let model = laned_models::spec::ModelSpec::file(dir.join("gru.nnef.tar"));
        Tensor::new("gru", dir, model, |lanes| {
            server_config(lanes, Some(StateSpec::Pairs(vec![StatePair::new(1, 1)])))
        })
    }

    /// Silero VAD as `laned serve`'s built-in `silero`.
    fn silero() -> TractResult<Tensor> {
        let dir = std::env::temp_dir().join("laned-serve-bench-silero");
        std::fs::create_dir_all(&dir)?;
        let model = laned_models::spec::ModelSpec {
            builtin: Some(laned_models::spec::Builtin::Silero),
            ..laned_models::spec::ModelSpec::default()
        };
        Tensor::new("silero", dir, model, |lanes| server_config(lanes, None))
    }

    fn new(
        name: &'static str,
        dir: PathBuf,
        model: laned_models::spec::ModelSpec,
        config: fn(usize) -> RunnerConfig,
    ) -> TractResult<Tensor> {
        let loaded = model.load().map_err(|e| format_err!("{e}"))?;
        let runner = LanedRunner::new(loaded.plan.clone(), loaded.runner_config(&config(2)))?;
        let interface =
            laned_models::spec::Interface::of(&loaded, &runner.explicit_state()).map_err(|e| format_err!("{e}"))?;
        Ok(Tensor {
            name,
            dir,
            model,
            config,
            loaded,
            interface,
        })
    }

    /// Its spec file for `lanes` lanes.
    fn spec_file(&self, lanes: usize) -> TractResult<PathBuf> {
        let path = self.dir.join(format!("{}-{lanes}.toml", self.name));
        let spec = laned_models::spec::Spec {
            model: self.model.clone(),
            runner: (self.config)(lanes),
        };
        std::fs::write(&path, spec.to_toml().map_err(|e| format_err!("{e}"))?)?;
        Ok(path)
    }

    /// Stream `s`'s pulse as bytes: noise (the model's cost does not
    /// depend on it).
    fn pulse(&self, s: usize) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(s as u64);
        (0..self.interface.pulse_bytes() / 4)
            .flat_map(|_| (0.1 * (rng.f32() * 2.0 - 1.0)).to_le_bytes())
            .collect()
    }
}

/// The server's runner settings with `lanes` lanes: one shard, worker
/// mode, no linger, the state pairs where the spec names them.
fn server_config(lanes: usize, state: Option<StateSpec>) -> RunnerConfig {
    let b = RunnerConfig::builder()
        .max_lanes(lanes)
        .shards(1)
        .mode(Mode::Worker)
        .linger(Duration::ZERO);
    match state {
        Some(state) => b.state(state).build(),
        None => b.build(),
    }
}

/// One probe: its stream count, p99 latency and CPU per chunk.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Probe {
    streams: usize,
    p99_us: u64,
    chunks: u64,
    /// CPU per chunk, in nanoseconds: the server process's, or the whole
    /// process's in-process.
    cpu_ns_per_chunk: Option<u64>,
    /// The client process's CPU per chunk (served over the network only).
    client_cpu_ns_per_chunk: Option<u64>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Search {
    capacity: usize,
    disputed: Vec<laned_load::Disputed>,
    probes: Vec<Probe>,
}

/// Stream `s`'s chunk: noise (the model's cost does not depend on the
/// sound).
fn chunk(s: usize) -> Vec<f32> {
    let mut rng = fastrand::Rng::with_seed(s as u64);
    (0..CHUNK).map(|_| 0.1 * (rng.f32() * 2.0 - 1.0)).collect()
}

fn per_chunk(cpu: Option<Duration>, chunks: u64) -> Option<u64> {
    cpu.map(|c| (c.as_nanos() / chunks.max(1) as u128) as u64)
}

fn search(max: usize, mut probe: impl FnMut(usize) -> TractResult<Probe>) -> TractResult<Search> {
    let mut probes = vec![];
    let capacity = laned_load::search_capacity(4, max, 8, |n| {
        let p = probe(n)?;
        eprintln!(
            "  {n} streams: p99 {:.1} ms, {} chunks, CPU/chunk {:?} ns",
            p.p99_us as f64 / 1e3,
            p.chunks,
            p.cpu_ns_per_chunk
        );
        probes.push(p);
        Ok(p.p99_us as u128 <= BUDGET.as_micros())
    })?;
    Ok(Search {
        capacity: capacity.streams,
        disputed: capacity.disputed,
        probes,
    })
}

/// The in-process figure: streams as tasks on a runtime of a worker per
/// CPU this process may use, calling the runner the server would build.
struct InProcess {
    rt: tokio::runtime::Runtime,
    silero_plan: Option<Arc<dyn Runnable>>,
    probe_for: Duration,
}

impl InProcess {
    fn new(served: &Served, args: &Args) -> TractResult<InProcess> {
        let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores)
            .enable_time()
            .build()?;
        let silero_plan: Option<Arc<dyn Runnable>> = match served {
            Served::Vad(model, _) => Some(DefaultRuntime.prepare(silero::load(model)?)?.into()),
            Served::Gru(_) => None,
        };
        Ok(InProcess {
            rt,
            silero_plan,
            probe_for: probe_duration(args),
        })
    }

    /// One probe of `n` streams, a fresh runner of `n` lanes.
    /// Streams in groups of `group` share a phase (1: each its own), as
    /// the streams of a connection of the multiplexed and gRPC fronts do.
    fn probe(&self, served: &Served, n: usize, group: usize) -> TractResult<Probe> {
        let (system, inputs): (TaskSystem, Box<dyn Fn(usize) -> TVec<TValue> + Sync>) = match served {
            Served::Vad(..) => {
                let config = RunnerConfig::builder()
                    .state(StateSpec::Pairs(vec![StatePair::new("state", 1)]))
                    .max_lanes(n)
                    .mode(Mode::Worker)
                    .linger(Duration::ZERO)
                    .build();
                let plan = self.silero_plan.clone().expect("loaded in new()");
                let runner = LanedRunner::new(plan, config)?;
                (
                    TaskSystem::Ours(runner),
                    Box::new(|s| Context::default().inputs(&chunk(s))),
                )
            }
            Served::Gru(gru) => {
                let runner = LanedRunner::new(gru.loaded.plan.clone(), gru.loaded.runner_config(&(gru.config)(n)))?;
                let pulses: Vec<TVec<TValue>> = (0..n)
                    .map(|s| gru.interface.call_inputs(&gru.pulse(s)).map_err(|e| format_err!("{e}")))
                    .collect::<TractResult<_>>()?;
                (TaskSystem::Ours(runner), Box::new(move |s| pulses[s % n].clone()))
            }
        };
        let rt = &self.rt;
        let group = group.max(1);
        let phase = |s: usize| laned_load::phase(n.div_ceil(group) as u64, s / group, PERIOD);
        tasks::real_time_phased(rt, &system, (n, PERIOD, WARM_UP), phase, &inputs)?;
        let before = laned_load::process_cpu_time();
        let lat = tasks::real_time_phased(rt, &system, (n, PERIOD, self.probe_for), phase, &inputs)?;
        let cpu = before
            .zip(laned_load::process_cpu_time())
            .map(|(a, b)| b.saturating_sub(a));
        Ok(Probe {
            streams: n,
            p99_us: lat.quantile_us(0.99),
            chunks: lat.pulses(),
            cpu_ns_per_chunk: per_chunk(cpu, lat.pulses()),
            client_cpu_ns_per_chunk: None,
        })
    }
}

fn probe_duration(args: &Args) -> Duration {
    Duration::from_secs_f64((args.seconds * 1.5).max(1.0))
}

/// What answers the clients: a server under test, or the echo floor.
#[derive(Clone, Copy)]
enum Front<'a> {
    /// `vad-server` at this path: Silero's audio protocol at `/v1/vad`.
    Vad(&'a PathBuf),
    /// `laned serve` at this path, the served model's tensor protocol,
    /// through this front.
    Laned(&'a PathBuf, Via),
    /// This binary with `--echo-server`, answering this many bytes, its
    /// read buffer this size (tungstenite's default if `None`).
    Echo(usize, Option<usize>),
}

/// Which of `laned serve`'s fronts the clients use.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Via {
    /// A WebSocket a stream (`/v1/models/NAME/stream`).
    Stream,
    /// The multiplexed front: `--per-connection` streams a WebSocket
    /// (`/v1/models/NAME/mux`).
    Mux,
    /// KServe v2 gRPC: `--per-connection` sequences on one
    /// `ModelStreamInfer` stream a connection.
    Grpc,
}

/// A server child process (`vad-server`, `laned serve` or the echo),
/// killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    /// The gRPC listener's, for [`Via::Grpc`].
    grpc: Option<SocketAddr>,
    /// How its clients talk to it: `None` for the audio protocol or the
    /// echo (a WebSocket a stream, the served model's frames).
    via: Option<Via>,
}

/// What `laned serve` prints once its gRPC listener is up, its address
/// after.
const GRPC_LISTENING: &str = "laned serve answering gRPC on ";

impl Server {
    fn start(front: Front<'_>, cpus: &str, served: &Served, lanes: usize) -> TractResult<Server> {
        let mut command = Command::new("taskset");
        command.args(["-c", cpus]);
        let (listening, via) = match front {
            Front::Echo(answer, read_buffer) => {
                command
                    .arg(std::env::current_exe()?)
                    .arg("--echo-server")
                    .args(["--answer-bytes", &answer.to_string()]);
                if let Some(bytes) = read_buffer {
                    command.args(["--read-buffer", &bytes.to_string()]);
                }
                (ECHO_LISTENING, None)
            }
            Front::Vad(binary) => {
                let Served::Vad(model, _) = served else {
                    bail!("vad-server serves Silero only")
                };
                command
                    .arg(binary)
                    .args([
                        "--listen",
                        "127.0.0.1:0",
                        "--lanes",
                        &lanes.to_string(),
                        "--shards",
                        "1",
                    ])
                    .args(["--mode", "worker", "--policy", "immediate"])
                    .arg("--model")
                    .arg(model)
                    .args(["--admission-wait-ms", "10000"]);
                ("vad-server listening on ", None)
            }
            Front::Laned(binary, via) => {
                let tensor = served
                    .tensor()
                    .ok_or_else(|| format_err!("no laned binary for this model (--laned)"))?;
                let spec = tensor.spec_file(lanes)?;
                command
                    .arg(binary)
                    .arg("serve")
                    .arg(format!("{}={}", tensor.name, spec.display()))
                    .args(["--listen", "127.0.0.1:0"])
                    .args(["--admission-wait-ms", "10000"]);
                if via == Via::Grpc {
                    command.args(["--grpc-listen", "127.0.0.1:0"]);
                }
                ("laned serve listening on ", Some(via))
            }
        };
        command.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = command.spawn().with_context(|| format!("starting {command:?}"))?;
        let stdout = child.stdout.take();
        // Read on a thread, which keeps reading so the server never blocks
        // on a full pipe; the addresses come back through a channel, so a
        // server that never listens fails the probe instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let Some(stdout) = stdout else { return };
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                for (grpc, prefix) in [(false, listening), (true, GRPC_LISTENING)] {
                    if let Some(addr) = line.strip_prefix(prefix) {
                        let _ = tx.send((grpc, addr.trim().to_string()));
                    }
                }
            }
        });
        let mut server = Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            grpc: None,
            via,
        };
        let mut main = None;
        while main.is_none() || (via == Some(Via::Grpc) && server.grpc.is_none()) {
            let (grpc, addr) = match rx.recv_timeout(Duration::from_secs(120)) {
                Ok(line) => line,
                Err(_) => bail!("the server did not listen within 120 s (its stderr is above)"),
            };
            let addr: SocketAddr = addr.parse().with_context(|| format!("the server's address {addr:?}"))?;
            match grpc {
                true => server.grpc = Some(addr),
                false => main = Some(addr),
            }
        }
        server.addr = main.expect("the loop waits for it");
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the echo server prints once it listens, its address after.
const ECHO_LISTENING: &str = "serve-bench echo listening on ";

/// The transport's floor: a minimal tokio-tungstenite server, on the
/// runtime `laned serve` builds (multi-threaded, a worker per CPU it may
/// use), its sockets tuned as the server's are (no Nagle), answering each
/// binary frame with `answer` bytes (sent and flushed, as a minimal server
/// does) and nothing else: no model, no session, no limits. With
/// `read_buffer`, tungstenite reads that much at most a read (it zeroes the
/// buffer's free space before each read: its default, 128 KiB, costs).
fn echo_server(answer: usize, read_buffer: Option<usize>) -> TractResult<()> {
    let mut config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
    if let Some(bytes) = read_buffer {
        config = config.read_buffer_size(bytes);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("{ECHO_LISTENING}{}", listener.local_addr()?);
        std::io::Write::flush(&mut std::io::stdout())?;
        let answer = tokio_tungstenite::tungstenite::Bytes::from(vec![0u8; answer]);
        loop {
            let (tcp, _) = listener.accept().await?;
            tcp.set_nodelay(true)?;
            let answer = answer.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async_with_config(tcp, Some(config)).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    match m {
                        Message::Binary(_) if ws.send(Message::Binary(answer.clone())).await.is_err() => return,
                        Message::Close(_) => return,
                        _ => (),
                    }
                }
            });
        }
    })
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One probe over the network: `n` streams connected (a WebSocket each,
/// or `per_connection` a connection on the multiplexed and gRPC fronts),
/// then each sending a chunk every period from a random phase (a
/// connection's streams share its phase), waiting for its answer.
fn over_network(
    rt: &tokio::runtime::Runtime,
    (server, served): (&Server, &Served),
    (n, per_connection): (usize, usize),
    duration: Duration,
) -> TractResult<Probe> {
    let pid = server.child.id();
    let addr = server.addr;
    let tensor = served.tensor();
    let (path, frames): (String, Vec<Vec<u8>>) = match (server.via, served, tensor) {
        (Some(via), _, Some(t)) => (
            format!(
                "/v1/models/{}/{}",
                t.name,
                if via == Via::Mux { "mux" } else { "stream" }
            ),
            (0..n).map(|s| t.pulse(s)).collect(),
        ),
        (_, Served::Vad(..), _) => (
            "/v1/vad".into(),
            (0..n)
                .map(|s| chunk(s).iter().flat_map(|x| x.to_le_bytes()).collect())
                .collect(),
        ),
        (_, Served::Gru(gru), _) => ("/v1/models/gru/stream".into(), (0..n).map(|s| gru.pulse(s)).collect()),
    };
    let url = format!("ws://{addr}{path}");
    let per_connection = per_connection.max(1);
    let connections = n.div_ceil(per_connection);
    let interface = tensor.map(|t| (t.name, Arc::new(t.interface.clone())));
    let grpc = server.grpc;
    rt.block_on(async move {
        type Task = tokio::task::JoinHandle<TractResult<Vec<u64>>>;
        let warm = |t: Instant| t + Duration::from_millis(100);
        let mut frames = frames.into_iter();
        let (tasks, t0): (Vec<Task>, Instant) = match server.via {
            None | Some(Via::Stream) => {
                let mut sockets = Vec::with_capacity(n);
                for _ in 0..n {
                    let (ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.with_context(|| {
                        format!(
                            "connecting stream {} of {n} to {url} (many streams need a high open-files limit: `ulimit -n`)",
                            sockets.len() + 1
                        )
                    })?;
                    sockets.push(ws);
                }
                let warm = warm(Instant::now());
                let t0 = warm + WARM_UP;
                let tasks = sockets
                    .into_iter()
                    .enumerate()
                    .zip(frames)
                    .map(|((s, ws), frame)| {
                        let offset = laned_load::phase(n as u64, s, PERIOD);
                        tokio::spawn(client(ws, frame, warm + offset, t0, t0 + duration))
                    })
                    .collect();
                (tasks, t0)
            }
            Some(Via::Mux) => {
                let mut sockets = Vec::with_capacity(connections);
                for c in 0..connections {
                    let k = per_connection.min(n - c * per_connection);
                    sockets.push((mux::open(&url, k).await?, frames.by_ref().take(k).collect::<Vec<_>>()));
                }
                let warm = warm(Instant::now());
                let t0 = warm + WARM_UP;
                let tasks = sockets
                    .into_iter()
                    .enumerate()
                    .map(|(c, (ws, frames))| {
                        let offset = laned_load::phase(connections as u64, c, PERIOD);
                        tokio::spawn(mux::run(ws, frames, warm + offset, t0, t0 + duration))
                    })
                    .collect();
                (tasks, t0)
            }
            Some(Via::Grpc) => {
                let grpc = grpc.ok_or_else(|| format_err!("the server named no gRPC address"))?;
                let (name, interface) = interface.ok_or_else(|| format_err!("gRPC serves tensor models"))?;
                let mut streams = Vec::with_capacity(connections);
                for c in 0..connections {
                    let k = per_connection.min(n - c * per_connection);
                    streams.push((grpc::open(grpc).await?, frames.by_ref().take(k).collect::<Vec<_>>()));
                }
                let warm = warm(Instant::now());
                let t0 = warm + WARM_UP;
                let tasks = streams
                    .into_iter()
                    .enumerate()
                    .map(|(c, (stream, frames))| {
                        let offset = laned_load::phase(connections as u64, c, PERIOD);
                        let interface = interface.clone();
                        let first_id = (c * per_connection + 1) as i64;
                        let times = (warm + offset, t0, t0 + duration);
                        tokio::spawn(async move { grpc::run(stream, (name, &interface), first_id, frames, times).await })
                    })
                    .collect();
                (tasks, t0)
            }
        };
        tokio::time::sleep_until(t0.into()).await;
        let (server_before, client_before) = (laned_load::cpu_time_of(pid), laned_load::process_cpu_time());
        let mut all = vec![];
        for t in tasks {
            all.extend(t.await??);
        }
        let server_cpu = server_before
            .zip(laned_load::cpu_time_of(pid))
            .map(|(a, b)| b.saturating_sub(a));
        let client_cpu = client_before
            .zip(laned_load::process_cpu_time())
            .map(|(a, b)| b.saturating_sub(a));
        let lat = laned_load::Latencies::new(all);
        Ok(Probe {
            streams: n,
            p99_us: lat.quantile_us(0.99),
            chunks: lat.pulses(),
            cpu_ns_per_chunk: per_chunk(server_cpu, lat.pulses()),
            client_cpu_ns_per_chunk: per_chunk(client_cpu, lat.pulses()),
        })
    })
}

/// A client from `first` to `end`: a chunk due every period; a late answer
/// delays the next chunk. Latencies in microseconds, from the send, of the
/// chunks sent from `counted` on.
async fn client(mut ws: Ws, frame: Vec<u8>, first: Instant, counted: Instant, end: Instant) -> TractResult<Vec<u64>> {
    let mut latencies = vec![];
    let mut due = first;
    while due < end {
        tokio::time::sleep_until(due.into()).await;
        // From the send, as the in-process tasks count: tokio's timer
        // wakes up to a millisecond late, in both.
        let sent = Instant::now().max(due);
        ws.send(Message::Binary(frame.clone().into())).await?;
        loop {
            let next = tokio::time::timeout(ANSWER_TIMEOUT, ws.next())
                .await
                .map_err(|_| format_err!("no answer within {ANSWER_TIMEOUT:?}: the server is wedged"))?;
            match next {
                // vad-server's answer, or laned serve's.
                Some(Ok(Message::Text(t))) if t.contains("probability") => break,
                Some(Ok(Message::Binary(_))) => break,
                // Speech events, laned serve's hello, pings.
                Some(Ok(Message::Text(_) | Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(other)) => bail!("the server answered {other:?}"),
                Some(Err(e)) => return Err(e.into()),
                None => bail!("the server closed the connection"),
            }
        }
        if sent >= counted {
            latencies.push(sent.elapsed().as_micros() as u64);
        }
        due += PERIOD;
    }
    let _ = ws.close(None).await;
    Ok(latencies)
}

fn table_row(label: &str, search: &Search) -> String {
    let at = search
        .probes
        .iter()
        .filter(|p| p.streams == search.capacity)
        .map(|p| p.cpu_ns_per_chunk)
        .next_back()
        .flatten();
    let probes: Vec<String> = search
        .probes
        .iter()
        .map(|p| format!("{}: {:.1}", p.streams, p.p99_us as f64 / 1e3))
        .collect();
    let disputed: Vec<String> = search
        .disputed
        .iter()
        .map(|d| format!("{} ({}/{})", d.streams, d.passed, d.probes))
        .collect();
    format!(
        "| {label} | {} | {} | {} | {} |",
        search.capacity,
        at.map(|ns| format!("{:.1}", ns as f64 / 1e3)).unwrap_or("-".into()),
        if disputed.is_empty() {
            "-".into()
        } else {
            disputed.join(", ")
        },
        probes.join(", ")
    )
}

/// `serve-bench` run again on the server's CPUs with `--in-process` and
/// `extra`: its JSON answer.
fn in_process_child(args: &Args, extra: &[String]) -> TractResult<Vec<u8>> {
    let out = Command::new("taskset")
        .args(["-c", &args.server_cpus])
        .arg(std::env::current_exe()?)
        .args([
            "--in-process",
            "--seconds",
            &args.seconds.to_string(),
            "--max",
            &args.max.to_string(),
        ])
        .args(args.gru.then_some("--gru"))
        .args(extra)
        .stderr(Stdio::inherit())
        .output()
        .context("running the in-process run under taskset")?;
    ensure!(out.status.success(), "the in-process run failed: {}", out.status);
    Ok(out.stdout)
}

/// One fixed stream count's probes, a probe a round each, by front: the
/// echo (tungstenite's defaults), the echo reading `--echo-read-buffer`
/// bytes at most (if any), the server, in-process.
struct Fixed {
    streams: usize,
    probes: Vec<Vec<Probe>>,
}

/// The median of a figure over probes, in thousandths (µs for ns, ms for
/// µs; `NaN` for none).
fn median_us(probes: &[Probe], figure: impl Fn(&Probe) -> Option<u64>) -> f64 {
    let v: Vec<f64> = probes.iter().filter_map(&figure).map(|ns| ns as f64 / 1e3).collect();
    laned_load::median(&v)
}

/// `laned serve`'s fronts beside the server under test, named: for the
/// GRU (`server` is `laned`) the multiplexed and gRPC fronts, for Silero
/// (with `--laned`) the single-stream one too.
fn laned_fronts<'a>(args: &'a Args, served: &Served, server: &'a PathBuf) -> Vec<(String, Front<'a>)> {
    let laned = match served {
        Served::Gru(_) => server,
        Served::Vad(_, None) => return vec![],
        Served::Vad(..) => match &args.laned {
            Some(laned) => laned,
            None => return vec![],
        },
    };
    let per = args.per_connection;
    args.via
        .iter()
        .filter(|via| !(matches!(served, Served::Gru(_)) && **via == Via::Stream))
        .map(|&via| {
            let name = match via {
                Via::Stream => "laned serve".to_string(),
                Via::Mux => format!("mux ({per} a connection)"),
                Via::Grpc => format!("gRPC ({per} a stream)"),
            };
            (name, Front::Laned(laned, via))
        })
        .collect()
}

/// The echo floor, the server and in-process at each fixed count, rounds
/// interleaved (each front at each count, then the next round), so that a
/// slow minute of the machine falls on all of them alike.
fn fixed_counts(
    args: &Args,
    (served, server, label): (&Served, &PathBuf, &str),
    rt: &tokio::runtime::Runtime,
) -> TractResult<()> {
    let answer = args.answer_bytes.unwrap_or(match served {
        Served::Gru(gru) => gru.interface.answer_len(),
        Served::Vad(..) => 8,
    });
    let duration = probe_duration(args);
    // A front over the network, or in-process with streams in groups of
    // this many on one phase (`None`).
    let mut fronts: Vec<(String, Result<Front<'_>, usize>)> = vec![("echo".into(), Ok(Front::Echo(answer, None)))];
    if args.echo_read_buffer > 0 {
        fronts.push((
            format!("echo ({} B reads)", args.echo_read_buffer),
            Ok(Front::Echo(answer, Some(args.echo_read_buffer))),
        ));
    }
    let floors: Vec<usize> = (0..fronts.len()).collect();
    let native = |binary| match served {
        Served::Vad(..) => Front::Vad(binary),
        Served::Gru(_) => Front::Laned(binary, Via::Stream),
    };
    if let Some(baseline) = &args.baseline {
        fronts.push((format!("{label} (baseline)"), Ok(native(baseline))));
    }
    let server_ix = fronts.len();
    fronts.push((label.to_string(), Ok(native(server))));
    let multiplexed = laned_fronts(args, served, server);
    let grouped = multiplexed
        .iter()
        .any(|(_, f)| matches!(f, Front::Laned(_, Via::Mux | Via::Grpc)));
    for (name, front) in multiplexed {
        fronts.push((name, Ok(front)));
    }
    let servers: Vec<usize> = (floors.len()..fronts.len()).collect();
    // In-process: a child of its own on the server's CPUs; again with the
    // streams of a connection on one phase, as the multiplexed fronts' are.
    let local_ix = fronts.len();
    fronts.push(("in-process".into(), Err(1)));
    let local_grouped_ix = grouped.then(|| {
        fronts.push((
            format!("in-process ({} a phase)", args.per_connection),
            Err(args.per_connection),
        ));
        fronts.len() - 1
    });
    let names: Vec<&str> = fronts.iter().map(|(name, _)| name.as_str()).collect();
    eprintln!(
        "fixed counts {:?}, {} round(s), the echo answering {answer} bytes: {}",
        args.streams,
        args.rounds,
        names.join(", ")
    );
    let mut rows: Vec<Fixed> = args
        .streams
        .iter()
        .map(|&streams| Fixed {
            streams,
            probes: vec![vec![]; fronts.len()],
        })
        .collect();
    let us = |p: &Probe| p.cpu_ns_per_chunk.map_or(f64::NAN, |ns| ns as f64 / 1e3);
    for round in 1..=args.rounds {
        for row in &mut rows {
            let n = row.streams;
            let mut line = vec![];
            for (i, (name, front)) in fronts.iter().enumerate() {
                let probe: Probe = match front {
                    Ok(front) => {
                        let started = Server::start(*front, &args.server_cpus, served, n)?;
                        over_network(rt, (&started, served), (n, args.per_connection), duration)?
                    }
                    Err(group) => serde_json::from_slice(&in_process_child(
                        args,
                        &["--probe".into(), n.to_string(), "--group".into(), group.to_string()],
                    )?)
                    .context("reading the in-process probe")?,
                };
                line.push(format!(
                    "{name} {:.1} µs (p99 {:.1} ms)",
                    us(&probe),
                    probe.p99_us as f64 / 1e3
                ));
                row.probes[i].push(probe);
            }
            eprintln!("  round {round}, {n} streams, CPU per answer: {}", line.join(", "));
        }
    }
    // Columns: each front's median, then each server (the baseline, if
    // any, the server, laned serve's fronts) against each echo and
    // in-process (the multiplexed fronts against in-process with their
    // phases too), and the server against the baseline.
    println!(
        "\nserver CPU per answer at fixed counts (µs; medians of {} round(s), interleaved), the echo answering \
         {answer} bytes to each frame; in-process counts its load generator too",
        args.rounds
    );
    let mut head = format!("\n| streams | {} |", names.join(" | "));
    let mut ratios = vec![];
    for &s in &servers {
        ratios.extend(floors.iter().chain([&local_ix]).map(|&f| (s, f)));
        if let (Some(g), Ok(Front::Laned(_, Via::Mux | Via::Grpc))) = (local_grouped_ix, &fronts[s].1) {
            ratios.push((s, g));
        }
    }
    if args.baseline.is_some() {
        ratios.push((server_ix, servers[0]));
    }
    for &(s, f) in &ratios {
        head += &format!(" {} / {} |", names[s], names[f]);
    }
    head += &format!(
        " p99 ms ({}) | clients' CPU per answer ({}) | rounds ({}) |",
        names.join(", "),
        names[..local_ix].join(", "),
        names.join(" / ")
    );
    println!("{head}");
    println!(
        "|---:|{}{}---|---|---|",
        "---:|".repeat(fronts.len()),
        "---:|".repeat(ratios.len())
    );
    let cpu = |p: &Probe| p.cpu_ns_per_chunk;
    for row in &rows {
        let medians: Vec<f64> = row.probes.iter().map(|v| median_us(v, cpu)).collect();
        let mut line = format!("| {} |", row.streams);
        for m in &medians {
            line += &format!(" {m:.1} |");
        }
        for &(s, f) in &ratios {
            line += &format!(" {:.2}x |", medians[s] / medians[f]);
        }
        // In ms (`median_us` takes a thousandth: µs in, ms out).
        let p99: Vec<String> = row
            .probes
            .iter()
            .map(|v| format!("{:.1}", median_us(v, |p| Some(p.p99_us))))
            .collect();
        let clients: Vec<String> = row.probes[..local_ix]
            .iter()
            .map(|v| format!("{:.1}", median_us(v, |p| p.client_cpu_ns_per_chunk)))
            .collect();
        let rounds: Vec<String> = (0..row.probes[0].len())
            .map(|r| {
                row.probes
                    .iter()
                    .map(|v| format!("{:.1}", us(&v[r])))
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
            .collect();
        line += &format!(" {} | {} | {} |", p99.join(", "), clients.join(", "), rounds.join("; "));
        println!("{line}");
    }
    Ok(())
}

fn main() -> TractResult<()> {
    let args = cli::or_exit(args());
    if args.echo_server {
        return echo_server(args.answer_bytes.unwrap_or(8), args.read_buffer);
    }
    let served = if args.gru {
        Served::Gru(Box::new(Tensor::gru()?))
    } else {
        let model = cli::model_or_exit(silero::fetch(), "Silero VAD");
        let tensor = match (&args.laned, args.in_process) {
            (Some(_), false) => Some(Box::new(Tensor::silero()?)),
            _ => None,
        };
        Served::Vad(model, tensor)
    };
    if args.in_process {
        let local = InProcess::new(&served, &args)?;
        match args.probe {
            Some(n) => println!("{}", serde_json::to_string(&local.probe(&served, n, args.group)?)?),
            None => println!(
                "{}",
                serde_json::to_string(&search(args.max, |n| local.probe(&served, n, args.group))?)?
            ),
        }
        return Ok(());
    }
    let server = args.server.clone().expect("checked in args()");
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    let (what, label) = match &served {
        Served::Vad(model, _) => (format!("Silero VAD ({}) by vad-server", model.display()), "vad-server"),
        Served::Gru(gru) => (
            format!(
                "a GRU the bench wrote ({} in, {} hidden, its state a pair; {}) by laned serve",
                GRU.0,
                GRU.1,
                gru.dir.display()
            ),
            "laned serve",
        ),
    };
    println!(
        "{what} ({}): a pulse every 32 ms per stream, capacity = most streams with p99 <= 50 ms; \
         server (and the in-process run, and the echo) on CPUs {}, clients on {cores} CPU(s)",
        server.display(),
        args.server_cpus
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .enable_all()
        .build()?;
    if args.fixed {
        fixed_counts(&args, (&served, &server, label), &rt)?;
    }
    if !args.search {
        return Ok(());
    }
    eprintln!("in-process, on CPUs {}:", args.server_cpus);
    let local: Search =
        serde_json::from_slice(&in_process_child(&args, &[])?).context("reading the in-process search")?;
    let duration = probe_duration(&args);
    let native = match served {
        Served::Vad(..) => Front::Vad(&server),
        Served::Gru(_) => Front::Laned(&server, Via::Stream),
    };
    let mut fronts = vec![(
        match served {
            Served::Vad(..) => "vad-server over WebSocket".to_string(),
            Served::Gru(_) => "laned serve over WebSocket".to_string(),
        },
        native,
    )];
    fronts.extend(laned_fronts(&args, &served, &server));
    let mut remote = vec![];
    for (name, front) in fronts {
        eprintln!("{name}:");
        let found = search(args.max, |n| {
            let started = Server::start(front, &args.server_cpus, &served, n)?;
            over_network(&rt, (&started, &served), (n, args.per_connection), duration)
        })?;
        remote.push((name, found));
    }
    println!("\n| system | capacity (streams) | CPU per chunk at capacity (µs) | disputed (passed/probes) | probes (streams: p99 ms) |");
    println!("|---|---|---|---|---|");
    println!("{}", table_row("in-process (tasks calling the runner)", &local));
    for (name, found) in &remote {
        println!("{}", table_row(&format!("{name} (server process CPU)"), found));
    }
    for (name, found) in &remote {
        let client: Vec<String> = found
            .probes
            .iter()
            .filter_map(|p| {
                p.client_cpu_ns_per_chunk
                    .map(|c| format!("{}: {:.1}", p.streams, c as f64 / 1e3))
            })
            .collect();
        println!("\n{name}: clients' CPU per chunk (µs), by probe: {}", client.join(", "));
        if local.capacity > 0 {
            println!(
                "{name} keeps {:.2}x of the in-process capacity",
                found.capacity as f64 / local.capacity as f64
            );
        }
    }
    Ok(())
}
