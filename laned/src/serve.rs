//! `laned serve`: any models `laned check` accepts, behind the server
//! crate's session (every limit, close code, probe and the Redis hand-over
//! of `vad-server`), each at `/v1/models/{name}/stream` in the tensor
//! protocol (`laned_server::tensor`), listed at `/v1/models`.
//!
//! Each model comes from a spec file, `[model]` + `[runner]`, as `laned
//! check` prints it; the server's limits from a config file's `[server]`
//! table and flags. A model the runner refuses, or whose streams' rows mix
//! when run (the check's probe), keeps the server from starting, the
//! reason named.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use laned_models::spec::{Interface, Spec};
use laned_runner::{LanedRunner, StateSpec};
use laned_server::tensor::Tensors;
use laned_server::{Limits, Served};
use serde::Deserialize;

use crate::check;
use crate::model::Candidate;

/// What `laned serve` was asked.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// A model to serve, `NAME=SPEC.toml` (the spec as `laned check`
    /// prints it); repeat for several.
    #[arg(value_name = "NAME=SPEC")]
    pub models: Vec<String>,
    /// A config file: a `[server]` table (the limits, as vad-server's
    /// settings of the same names) and a `[models]` table (`name =
    /// "spec.toml"`, relative to the file).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where to listen [default: 127.0.0.1:8080].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// A second address answering only the probes.
    #[arg(long)]
    pub probe_listen: Option<SocketAddr>,
    /// Serve the KServe v2 gRPC protocol (Triton's clients) here too.
    #[arg(long)]
    pub grpc_listen: Option<SocketAddr>,
    /// The hand-over store, a Redis URL (`redis://host:port/`) or a Redis
    /// Cluster's nodes (`redis+cluster://host:port,host:port,...`)
    /// [default: none].
    #[arg(long)]
    pub store: Option<String>,
    /// A checkpoint of each stream with an id every this many pulses.
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Milliseconds a connection may send nothing or leave a reply
    /// untaken before it is closed (1008) [default: 30000].
    #[arg(long)]
    pub idle_ms: Option<u64>,
    /// Milliseconds live streams may go on after SIGTERM [default: 10000].
    #[arg(long)]
    pub drain_deadline_ms: Option<u64>,
    /// Milliseconds a new connection waits for a lane [default: 1000].
    #[arg(long)]
    pub admission_wait_ms: Option<u64>,
    /// Connections at once [default: every model's lanes + 64].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// The largest frame any model's pulse may be, in bytes (each model's
    /// streams may send one pulse a frame, no more) [default: 1048576].
    #[arg(long)]
    pub max_frame_bytes: Option<usize>,
    /// Serve a page at `/` that streams the browser's microphone to a
    /// model chosen from `/v1/models` (its outputs as numbers, a one-value
    /// output such as Silero's speech probability plotted live) [default:
    /// off].
    #[arg(long)]
    pub web: bool,
}

/// `laned serve`'s config file.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    server: Limits,
    models: BTreeMap<String, PathBuf>,
}

/// The limits and the models `args` name (flags over the file).
fn config(args: &Args) -> Result<(Limits, Vec<(String, PathBuf)>), String> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            let mut c: Config = toml::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
            let dir = path.parent().unwrap_or(Path::new("."));
            for spec in c.models.values_mut() {
                if spec.is_relative() {
                    *spec = dir.join(&*spec);
                }
            }
            c
        }
        None => Config::default(),
    };
    for m in &args.models {
        let (name, spec) = m
            .split_once('=')
            .ok_or_else(|| format!("model {m:?}: wanted NAME=SPEC.toml"))?;
        if config.models.insert(name.to_string(), PathBuf::from(spec)).is_some() {
            return Err(format!("model {name:?} is named twice"));
        }
    }
    let l = &mut config.server;
    let set = |to: &mut u64, v: Option<u64>| {
        if let Some(v) = v {
            *to = v
        }
    };
    if let Some(v) = args.listen {
        l.listen = v;
    }
    if let Some(v) = args.grpc_listen {
        l.grpc_listen = Some(v);
    }
    if let Some(v) = args.probe_listen {
        l.probe_listen = Some(v);
    }
    if let Some(v) = &args.store {
        l.store = Some(v.clone());
    }
    set(&mut l.checkpoint_every, args.checkpoint_every);
    set(&mut l.idle_ms, args.idle_ms);
    set(&mut l.drain_deadline_ms, args.drain_deadline_ms);
    set(&mut l.admission_wait_ms, args.admission_wait_ms);
    if let Some(v) = args.max_connections {
        l.max_connections = Some(v);
    }
    if let Some(v) = args.max_frame_bytes {
        l.max_frame_bytes = v;
    }
    if config.models.is_empty() {
        return Err("no model to serve: give NAME=SPEC.toml, or [models] in --config".into());
    }
    l.validate()?;
    Ok((config.server, config.models.into_iter().collect()))
}

/// Model `name` from its spec file: loaded, its runner built, and (where
/// it is a typed model) run the way `laned check` runs it, so that a model
/// whose streams' rows mix is never served.
pub fn model(name: &str, path: &Path) -> Result<(Served, Vec<String>), String> {
    laned_server::check_name(name)?;
    let mut spec = Spec::from_toml_file(path).map_err(|e| e.to_string())?;
    // The runner's metrics carry the name served under (`runnable`).
    spec.model.name = Some(name.to_string());
    let loaded = spec.model.load().map_err(|e| format!("{}: {e}", path.display()))?;
    let config = loaded.runner_config(&spec.runner);
    let mut facts = loaded.facts.clone();
    if let Some(model) = &loaded.model {
        let pairs = match &config.state {
            StateSpec::Pairs(p) => p.clone(),
            _ => vec![],
        };
        let checked = Candidate::of(model.clone(), &loaded, pairs);
        check::judge(&checked, &loaded.plan, &loaded.fills, &mut facts)
            .map_err(|why| format!("{}: cannot be laned: {why}", path.display()))?;
    }
    let runner = LanedRunner::new(loaded.plan.clone(), config).map_err(|e| format!("{}: {e}", path.display()))?;
    let interface = Interface::of(&loaded, &runner.explicit_state()).map_err(|e| format!("{}: {e}", path.display()))?;
    facts.push(format!(
        "a pulse: {} bytes ({}); an answer: {} bytes ({})",
        interface.pulse_bytes(),
        ports(&interface.inputs),
        interface.answer_len(),
        ports(&interface.outputs)
    ));
    let protocol: Arc<dyn laned_server::protocol::Protocol> = match spec.model.protocol {
        laned_models::spec::Protocol::Vad => {
            facts.push(format!(
                "protocol: vad (vad-server's: 16 kHz PCM frames of any length at /v1/models/{name}/stream and /v1/vad)"
            ));
            Arc::new(laned_server::audio::Vad)
        }
        _ => Arc::new(Tensors::new(name, interface)),
    };
    Ok((
        Served {
            name: name.to_string(),
            runner,
            protocol,
        },
        facts,
    ))
}

fn ports(ports: &[laned_models::spec::Port]) -> String {
    ports
        .iter()
        .map(|p| format!("{} {} {:?}", p.name, p.dtype, p.shape))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn run(args: &Args) -> ExitCode {
    let (limits, specs) = match config(args) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("laned serve: {why}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("laned serve: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async move {
        // Before the runners: each binds its metrics handles when built.
        let prometheus = laned_server::install_prometheus("laned serve");
        let mut served = Vec::new();
        for (name, path) in &specs {
            match model(name, path) {
                Ok((s, facts)) => {
                    println!("laned serve: model {name} from {}", path.display());
                    for fact in facts {
                        println!("  {fact}");
                    }
                    served.push(s);
                }
                Err(why) => {
                    eprintln!("laned serve: model {name}: {why}");
                    return ExitCode::from(1);
                }
            }
        }
        let term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("laned serve: the SIGTERM handler: {e}");
                return ExitCode::from(1);
            }
        };
        let extras = laned_server::Extras { web: args.web };
        let server = match laned_server::start_models_with(served, limits, prometheus, extras).await {
            Ok(s) => s,
            Err(why) => {
                eprintln!("laned serve: {why}");
                return ExitCode::from(1);
            }
        };
        println!("laned serve listening on {}", server.addr);
        if args.web {
            println!("laned serve: the microphone page at http://{}/", server.addr);
        }
        if let Some(probes) = server.probe_addr {
            println!("laned serve answering probes on {probes}");
        }
        if let Some(grpc) = server.grpc_addr {
            println!("laned serve answering gRPC on {grpc}");
        }
        server.run_until_signal(term).await;
        ExitCode::SUCCESS
    })
}
