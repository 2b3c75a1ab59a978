//! A running server: its routes, its listeners and its drain. Every
//! server starts one way (`serve`): `vad-server` ([`start`]) is a preset
//! of it, Silero VAD as the one model at `/v1/vad`, and `laned serve`
//! ([`start_models`]) serves several, each model its own runner and
//! protocol, all of them sharing the limits, the connection cap, the
//! probes and the store.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use laned_runner::LanedRunner;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use tokio::sync::watch;
use tract_core::internal::*;

use crate::accept::{self, open_files_limit, PROBE_RESERVE};
use crate::handover::{self, Store};
use crate::protocol::Protocol;
use crate::routes::{readiness, Routes};
use crate::session::{self, Endpoint, Shared};
use crate::settings::{Limits, Settings};
use crate::PROBE_PLACES;

/// A model to serve: its name (in its URL, its records' keys and its
/// metrics), its runner and its protocol.
pub struct Served {
    /// The model's name: letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// The runner serving it.
    pub runner: LanedRunner,
    /// Its protocol: [`crate::tensor::Tensors`] for any model.
    pub protocol: Arc<dyn Protocol>,
}

/// A running server.
pub struct Server {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The address answering only the probes, if one was asked for.
    pub probe_addr: Option<SocketAddr>,
    probe_task: Option<tokio::task::JoinHandle<()>>,
    /// The KServe v2 gRPC front's address, if one was asked for.
    pub grpc_addr: Option<SocketAddr>,
    grpc_task: Option<tokio::task::JoinHandle<()>>,
    shared: Arc<Shared>,
    endpoints: Vec<Arc<Endpoint>>,
    closing: watch::Sender<bool>,
    handing_over: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Who the log lines say they come from.
    who: &'static str,
}

/// `vad-server`, a preset of the one start: builds the runner on `plan`
/// (Silero) and serves it, with the VAD protocol, on
/// `settings.limits.listen` (port 0: any) at `/v1/vad`. Install the Prometheus
/// recorder before calling this: the runner binds its metrics handles when
/// it is built.
pub async fn start(
    plan: Arc<dyn Runnable>,
    settings: Settings,
    prometheus: Option<PrometheusHandle>,
) -> Result<Server, String> {
    settings.validate()?;
    let runner = LanedRunner::new(plan, settings.runner_config()?).map_err(|e| e.to_string())?;
    let cap = settings.connection_cap();
    let vad = Served {
        name: "vad".into(),
        runner,
        protocol: Arc::new(crate::audio::Vad),
    };
    serve(
        vec![vad],
        settings.limits,
        Some(cap),
        prometheus,
        Paths::Vad,
        Extras::default(),
    )
    .await
}

/// `laned serve`: serves every model of `models` on `limits.listen`, each
/// at `/v1/models/{name}/stream`, listed at `/v1/models`.
pub async fn start_models(
    models: Vec<Served>,
    limits: Limits,
    prometheus: Option<PrometheusHandle>,
) -> Result<Server, String> {
    start_models_with(models, limits, prometheus, Extras::default()).await
}

/// What `laned serve` may serve besides its models.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extras {
    /// The microphone page at `/` (`laned serve --web`; [`crate::web`]).
    pub web: bool,
}

/// [`start_models`], with the `extras` asked for.
pub async fn start_models_with(
    models: Vec<Served>,
    limits: Limits,
    prometheus: Option<PrometheusHandle>,
    extras: Extras,
) -> Result<Server, String> {
    serve(models, limits, None, prometheus, Paths::Models, extras).await
}

/// The one way a server starts, `vad-server`'s preset ([`start`]) and
/// `laned serve`'s ([`start_models_with`]) alike: every model of `models`
/// checked and made an endpoint, served at `paths`' routes on
/// `limits.listen`, `cap` connections at once (`None`: every model's
/// lanes plus [`crate::CONNECTION_MARGIN`]).
async fn serve(
    models: Vec<Served>,
    limits: Limits,
    cap: Option<usize>,
    prometheus: Option<PrometheusHandle>,
    paths: Paths,
    extras: Extras,
) -> Result<Server, String> {
    limits.validate()?;
    if models.is_empty() {
        return Err("no model to serve: name at least one".into());
    }
    let mut endpoints: Vec<Endpoint> = Vec::new();
    for m in models {
        check_name(&m.name)?;
        if endpoints.iter().any(|e| e.name == m.name) {
            return Err(format!(
                "model {:?} is named twice: each model's name is its own",
                m.name
            ));
        }
        // A frame is one pulse: the limit derived from the model, which
        // the server's own limit must allow.
        let max_frame_bytes = match m.protocol.max_frame_bytes() {
            Some(pulse) if pulse > limits.max_frame_bytes => {
                return Err(format!(
                    "model {:?}: a pulse is {pulse} bytes, over max_frame_bytes ({}): raise it",
                    m.name, limits.max_frame_bytes
                ))
            }
            Some(pulse) => pulse,
            None => limits.max_frame_bytes,
        };
        if paths == Paths::Models && limits.store.is_some() && !m.runner.state_travels() {
            let stays: Vec<String> = m
                .runner
                .implicit_state()
                .iter()
                .filter(|s| !s.travels())
                .map(|s| format!("{:?} ({})", s.node, s.op))
                .collect();
            eprintln!(
                "laned serve: model {}: its state does not travel (kept inside {}): on a hand-over its streams restart at chunk 0, said so in the close",
                m.name,
                stays.join(", ")
            );
        }
        endpoints.push(Endpoint {
            max_frame_bytes,
            key_prefix: paths.key_prefix(&m.name),
            who: paths.who_of(&m.name),
            name: m.name,
            runner: m.runner,
            protocol: m.protocol,
        });
    }
    let cap = cap.unwrap_or_else(|| limits.connection_cap(endpoints.iter().map(|e| e.runner.total_lanes()).sum()));
    listen(limits, cap, endpoints, prometheus, paths, extras).await
}

/// A model's name, checked: 1 to 64 ASCII letters, digits, `-`, `_`, `.`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "model name {name:?}: 1 to 64 ASCII letters, digits, -, _ and . (it is a URL segment and a key)"
        ))
    }
}

/// Where a server's streams are: the preset's part of a server's start.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Paths {
    /// `vad-server`'s one model at `/v1/vad` (and no other route but the
    /// probes), its records under [`handover::KEY_PREFIX`].
    Vad,
    /// Each model at `/v1/models/{name}/stream`, listed at `/v1/models`.
    Models,
}

impl Paths {
    /// Who the server's log lines say they come from.
    fn who(self) -> &'static str {
        match self {
            Paths::Vad => "vad-server",
            Paths::Models => "laned serve",
        }
    }

    /// Who a model's log lines say they come from.
    fn who_of(self, name: &str) -> String {
        match self {
            Paths::Vad => "vad-server".into(),
            Paths::Models => format!("laned serve: model {name}"),
        }
    }

    /// The prefix of the keys of model `name`'s records in the store
    /// (`vad-server`'s its own, as it always was).
    fn key_prefix(self, name: &str) -> String {
        match self {
            Paths::Vad => handover::KEY_PREFIX.into(),
            Paths::Models => handover::key_prefix(name),
        }
    }
}

/// Serves `endpoints` on `limits.listen`, `cap` connections at once.
async fn listen(
    limits: Limits,
    cap: usize,
    endpoints: Vec<Endpoint>,
    prometheus: Option<PrometheusHandle>,
    paths: Paths,
    extras: Extras,
) -> Result<Server, String> {
    let who = paths.who();
    let listener = tokio::net::TcpListener::bind(limits.listen)
        .await
        .map_err(|e| format!("binding {}: {e}", limits.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (closing, closing_rx) = watch::channel(false);
    let (handing_over, handing_over_rx) = watch::channel(false);
    let timeout = Duration::from_millis(limits.store_timeout_ms);
    let store = match &limits.store {
        Some(url) => {
            let store = Store::open(url, timeout, limits.handover_ttl_s)?;
            // Said at start, not fatal: the store may come up later.
            if let Err(e) = store.get("-").await {
                eprintln!("{who}: the store at {url} does not answer ({e}): streams start fresh and hand-overs are skipped until it does");
            }
            Some(Arc::new(store))
        }
        None => None,
    };
    let shared = Arc::new(Shared {
        limits,
        prometheus,
        closing: closing_rx,
        live: Arc::new(AtomicUsize::new(0)),
        reading: Arc::new(AtomicUsize::new(0)),
        store,
        handing_over: handing_over_rx,
        tally: Mutex::new(handover::Tally::default()),
        checkpoint_said: accept::Said::new(),
        live_ids: Mutex::new(std::collections::HashSet::new()),
    });
    let endpoints: Vec<Arc<Endpoint>> = endpoints.into_iter().map(Arc::new).collect();
    let sequences = Arc::new(session::sequence::Sequences::default());
    if matches!(paths, Paths::Models) {
        crate::v2::tend(shared.clone(), endpoints.clone(), sequences.clone());
    }
    let state = Routes {
        shared: shared.clone(),
        endpoints: endpoints.clone(),
        sequences,
        stats: Arc::new(endpoints.iter().map(|_| Default::default()).collect()),
        regions: Default::default(),
    };
    let grpc_routes = state.clone();
    let probes = Router::new()
        .route("/ready", get(ready))
        .route("/live", get(|| async { "live\n" }))
        .route("/metrics", get(metrics));
    // Each model's readiness is a probe too (a balancer checks a model's
    // backend by it), on the probe address as on the main one.
    let probes = match paths {
        Paths::Vad => probes,
        Paths::Models => probes.route("/v1/models/{name}/ready", get(model_ready)),
    };
    let app = match paths {
        Paths::Vad => probes.clone().route("/v1/vad", get(vad)),
        Paths::Models => crate::v2::routes(probes.clone(), &endpoints)
            .route("/v1/vad", get(vad))
            .route("/v1/models", get(models))
            .route("/v1/models/{name}/stream", get(stream))
            .route("/v1/models/{name}/mux", get(mux_stream)),
    };
    let app = crate::web::routes(app, extras.web);
    // The drain's end: every request but a probe answered 503 `restarting`
    // until the listener closes.
    let app = app
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            restarting_when_closed,
        ))
        .with_state(state.clone());
    // Past the cap: the probes, and 503 for anything else.
    let probes = probes
        .fallback(|| async {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the server's connection cap is reached: retry later\n",
            )
        })
        .with_state(state);
    let accept_limits = accept::Limits {
        max_connections: cap,
        header_timeout: Duration::from_millis(shared.limits.header_timeout_ms),
    };
    if let Some(files) = open_files_limit() {
        let wanted = cap + PROBE_RESERVE + 64;
        if files < wanted {
            eprintln!(
                "{who}: the open-files limit ({files}) is under the connection cap ({cap}) plus the probes' \
                 reserve and the server's own files ({wanted} in all): raise it (ulimit -n) or lower max_connections"
            );
        }
    }
    let (probe_addr, probe_task) = match shared.limits.probe_listen {
        Some(at) => {
            let listener = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| format!("binding the probe address {at}: {e}"))?;
            let probe_addr = listener.local_addr().map_err(|e| e.to_string())?;
            let only = accept::Limits {
                max_connections: PROBE_PLACES,
                ..accept_limits
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
    let (grpc_addr, grpc_task) = match (shared.limits.grpc_listen, &paths) {
        (Some(at), Paths::Models) => {
            let (addr, task) = crate::grpc::listen(at, grpc_routes).await?;
            (Some(addr), Some(task))
        }
        (Some(_), Paths::Vad) => return Err("grpc_listen: vad-server serves no gRPC (laned serve does)".into()),
        (None, _) => (None, None),
    };
    let task = tokio::spawn(accept::serve(
        listener,
        app,
        probes,
        accept_limits,
        shared.live.clone(),
        shared.reading.clone(),
    ));
    Ok(Server {
        addr,
        probe_addr,
        probe_task,
        grpc_addr,
        grpc_task,
        shared,
        endpoints,
        closing,
        handing_over,
        task,
        who,
    })
}

impl Server {
    /// The runner (capacity, metrics) of the first model served.
    pub fn runner(&self) -> &LanedRunner {
        &self.endpoints[0].runner
    }

    /// The runner of model `name`.
    pub fn runner_of(&self, name: &str) -> Option<&LanedRunner> {
        self.endpoints.iter().find(|e| e.name == name).map(|e| &e.runner)
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// The graceful shutdown, in order:
    /// 1. Every runner stops admitting (`/ready` answers 503 at once).
    /// 2. With a store, streams with an id hand over (each after its call
    ///    in flight): a WebSocket or mux stream closed 1012 with its
    ///    position, a v2 sequence written current and its next request
    ///    answered 503 / UNAVAILABLE `restarting: resume elsewhere`.
    /// 3. The drain: live connections go on until no lane and no stream id
    ///    is held, or the drain deadline passes (or `now`, for
    ///    [`Server::shutdown_or`]).
    /// 4. Its end (`closing`): WebSocket sessions left are closed 1001;
    ///    every gRPC stream is told UNAVAILABLE `restarting` and ends, each
    ///    gRPC connection sent GOAWAY (no new one taken); every HTTP
    ///    request but the probes is answered 503 `restarting`.
    /// 5. Up to 3 s for those closes and answers to go out (every session,
    ///    gRPC connection and connection reading its request ended).
    /// 6. Only then the listeners close.
    ///
    /// Returns the streams still live at the deadline.
    pub async fn shutdown(self) -> usize {
        self.shutdown_or(std::future::pending()).await
    }

    /// [`Server::shutdown`], cut short when `now` completes (a second
    /// SIGTERM, say): the drain ends then, the streams still live are
    /// closed with 1001 as at the deadline.
    pub async fn shutdown_or(self, now: impl std::future::Future<Output = ()>) -> usize {
        let runners: Vec<LanedRunner> = self.endpoints.iter().map(|e| e.runner.clone()).collect();
        for runner in &runners {
            runner.stop_admitting();
        }
        // Streams with an id hand over (each after its call in flight) and
        // close 1012; the others drain as before.
        let _ = self.handing_over.send(self.shared.store.is_some());
        let mut deadline = Instant::now() + Duration::from_millis(self.shared.limits.drain_deadline_ms);
        let mut now = std::pin::pin!(now);
        // The drain's wait, here where a second signal can cut it: until no
        // lane and no stream id is held, the deadline, or `now`.
        loop {
            // A stream with an id and no lane yet (it has sent nothing)
            // holds its id only: waited for too, so that it is told 1012
            // with its position before `closing` would tell it 1001.
            let idle = runners.iter().all(|r| {
                let capacity = r.capacity();
                capacity.lanes_free == capacity.lanes
            }) && self
                .shared
                .live_ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty();
            if idle || Instant::now() >= deadline {
                break;
            }
            tokio::select! {
                _ = &mut now => {
                    eprintln!("{}: told again: ending the drain now", self.who);
                    deadline = Instant::now();
                    break;
                }
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        let drained = tokio::task::spawn_blocking(move || runners.iter().map(|r| r.drain(deadline).stragglers).sum())
            .await
            .unwrap_or(0);
        // The drain's end (`closing`): every WebSocket session is closed
        // 1001; every gRPC stream is told `restarting` (UNAVAILABLE) and
        // ends, and each gRPC connection is sent GOAWAY and closes as its
        // streams end (no new gRPC connection is taken); every HTTP
        // request but the probes is answered 503 `restarting` while the
        // main listener is still open, so none is cut.
        let _ = self.closing.send(true);
        // The close frames and statuses out, bounded: every session and
        // gRPC connection ended, and every connection still reading its
        // request answered (a request now gets 503, a WebSocket upgrade
        // too); checked twice, 50 ms apart, for a connection between the
        // two counts.
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
        // Only now do the listeners close (a proxy retries a connection
        // refused elsewhere).
        self.task.abort();
        if let Some(probes) = &self.probe_task {
            probes.abort();
        }
        if let Some(grpc) = &self.grpc_task {
            grpc.abort();
        }
        if self.shared.store.is_some() {
            let tally = self.shared.tally.lock().unwrap_or_else(|e| e.into_inner());
            println!("{}: {}", self.who, tally.summary());
        }
        drained
    }
}

/// What a request (not a probe) is told once the drain has ended and the
/// server is closing: 503, `restarting`, as JSON (the v2 routes' errors).
pub(crate) const CLOSING: &str = "restarting: the server is shutting down: send it to another replica";

/// Answers every request but the probes 503 [`CLOSING`] once the drain
/// has ended (`closing`), so that one reaching the server until its
/// listener closes is told, never cut; the connection is closed after it.
async fn restarting_when_closed(
    State(routes): State<Routes>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    let probe = matches!(
        path,
        "/live" | "/ready" | "/metrics" | "/v2/health/live" | "/v2/health/ready"
    ) || (path.starts_with("/v1/models/") && path.ends_with("/ready"));
    if *routes.shared.closing.borrow() && !probe {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (axum::http::header::CONTENT_TYPE, "application/json"),
                (axum::http::header::CONNECTION, "close"),
            ],
            laned_wire::kserve::error(CLOSING),
        )
            .into_response();
    }
    next.run(request).await
}

/// Ready when any model is (one model full must not pull the replica out
/// for the others: a balancer checks each model by its own route); a line
/// per model (the model's name first where there are several).
async fn ready(State(routes): State<Routes>) -> Response {
    let mut any = false;
    let mut body = String::new();
    for e in &routes.endpoints {
        let (ok, line) = readiness(&e.runner);
        any |= ok;
        if routes.endpoints.len() > 1 {
            body.push_str(&format!("model {} ", e.name));
        }
        body.push_str(&line);
    }
    let code = if any {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body).into_response()
}

async fn model_ready(State(routes): State<Routes>, Path(name): Path<String>) -> Response {
    match routes.endpoint(&name) {
        Some(e) => {
            let (ok, line) = readiness(&e.runner);
            let code = if ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (code, line).into_response()
        }
        None => unknown_model(&routes, &name),
    }
}

fn unknown_model(routes: &Routes, name: &str) -> Response {
    let names: Vec<&str> = routes.endpoints.iter().map(|e| e.name.as_str()).collect();
    (
        StatusCode::NOT_FOUND,
        format!("no model {name:?} here: the models are {}\n", names.join(", ")),
    )
        .into_response()
}

async fn metrics(State(routes): State<Routes>) -> Response {
    match &routes.shared.prometheus {
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

/// `GET /v1/models`: every model, its interface and its runner's shape.
async fn models(State(routes): State<Routes>) -> Response {
    let list: Vec<serde_json::Value> = routes
        .endpoints
        .iter()
        .map(|e| {
            let (inputs, outputs) = match e.protocol.interface() {
                Some(i) => (json!(i.inputs), json!(i.outputs)),
                None => (json!(null), json!(null)),
            };
            json!({
                "name": e.name,
                "stream": format!("/v1/models/{}/stream", e.name),
                "protocol": laned_wire::tensor::PROTOCOL_VERSION,
                "speaks": e.protocol.name(),
                "inputs": inputs,
                "outputs": outputs,
                "lanes": e.runner.total_lanes(),
                "shards": e.runner.shards(),
                "mode": format!("{:?}", e.runner.mode()).to_lowercase(),
                "policy": e.runner.policy().to_string(),
                "state": e.runner.state_identity(),
            })
        })
        .collect();
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json!({ "models": list }).to_string(),
    )
        .into_response()
}

/// `/v1/vad`: the first model served with the VAD protocol (`vad-server`'s
/// one model; on `laned serve`, an alias of the stream route of the model
/// whose spec says `protocol = "vad"`).
async fn vad(
    ws: Result<axum::extract::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    State(routes): State<Routes>,
) -> Response {
    let Some(endpoint) = routes.endpoints.iter().find(|e| e.protocol.name() == "vad").cloned() else {
        return (
            StatusCode::NOT_FOUND,
            "no model here speaks the VAD protocol: /v1/vad is the stream route of a model whose spec says \
             protocol = \"vad\" (builtin = \"silero\")\n",
        )
            .into_response();
    };
    match ws {
        Ok(ws) => session::upgrade(ws, query, headers, routes.shared, endpoint).await,
        Err(rejection) => rejection.into_response(),
    }
}

async fn stream(
    ws: Result<axum::extract::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    State(routes): State<Routes>,
) -> Response {
    let Some(endpoint) = routes.endpoint(&name) else {
        return unknown_model(&routes, &name);
    };
    match ws {
        Ok(ws) => session::upgrade(ws, query, headers, routes.shared, endpoint).await,
        Err(rejection) => rejection.into_response(),
    }
}

/// Many streams of a model on one connection ([`laned_wire::mux`]).
async fn mux_stream(
    ws: Result<axum::extract::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
    Path(name): Path<String>,
    State(routes): State<Routes>,
) -> Response {
    let Some(endpoint) = routes.endpoint(&name) else {
        return unknown_model(&routes, &name);
    };
    match ws {
        Ok(ws) => session::mux::upgrade(ws, routes.shared, endpoint).await,
        Err(rejection) => rejection.into_response(),
    }
}

/// Installs the Prometheus recorder (before any runner is built: a runner
/// binds its metrics handles then), with its upkeep every 5 s (the
/// recorder keeps every histogram sample until upkeep drains it into the
/// buckets; a deployment never scraped would grow without it). `None`,
/// said, where one is installed already. Call it inside a tokio runtime.
pub fn install_prometheus(who: &str) -> Option<PrometheusHandle> {
    match metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() {
        Ok(h) => {
            let upkeep = h.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_secs(5));
                loop {
                    every.tick().await;
                    upkeep.run_upkeep();
                }
            });
            Some(h)
        }
        Err(e) => {
            eprintln!("{who}: no /metrics: {e}");
            None
        }
    }
}

impl Server {
    /// Serves until SIGTERM (`term`, installed before the server said it
    /// listens, so that none is missed) or ^C, then drains
    /// ([`Server::shutdown_or`]); a second signal ends the drain at once.
    /// Returns the streams closed at the deadline.
    pub async fn run_until_signal(self, mut term: tokio::signal::unix::Signal) -> usize {
        let who = self.who;
        tokio::select! {
            _ = term.recv() => println!("{who}: SIGTERM: draining"),
            _ = tokio::signal::ctrl_c() => println!("{who}: interrupted: draining"),
        }
        let again = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        let stragglers = self.shutdown_or(again).await;
        println!("{who}: drained ({stragglers} streams closed at the deadline)");
        stragglers
    }
}
