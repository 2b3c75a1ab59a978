//! The KServe v2 REST front on the main listener, for Triton's clients
//! (`tritonclient.http`): health, server and model metadata, a model's
//! config as Triton's clients read it, and infer requests, each one pulse
//! of a sequence (Triton's sequence parameters; the messages:
//! [`crate::kserve`]; the sequences' life: the session's `sequence`
//! module). Every error is `{"error": "..."}` with the status the server's
//! README maps.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use laned_wire::kserve::HEADER_LENGTH;
use serde_json::json;

use crate::kserve::{self, Request};
use crate::routes::{max_body, readiness, Routes};
use crate::session::sequence::Sequences;
use crate::session::{Endpoint, Shared};

/// The v2 routes added to `router`.
pub(crate) fn routes(router: Router<Routes>, endpoints: &[Arc<Endpoint>]) -> Router<Routes> {
    let limit = endpoints
        .iter()
        .filter_map(|e| e.protocol.interface())
        .map(|i| max_body(i.pulse_bytes()))
        .max()
        .unwrap_or(64 << 10);
    router
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route("/v2/models/{name}/config", get(model_config))
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{name}/load", post(repository_load))
        .route("/v2/repository/models/{name}/unload", post(repository_unload))
        .route("/v2/systemsharedmemory/status", get(shm_status_all))
        .route("/v2/systemsharedmemory/region/{region}/status", get(shm_status))
        .route("/v2/systemsharedmemory/region/{region}/register", post(shm_register))
        .route("/v2/systemsharedmemory/unregister", post(shm_unregister_all))
        .route(
            "/v2/systemsharedmemory/region/{region}/unregister",
            post(shm_unregister),
        )
        .route("/v2/cudasharedmemory/status", get(no_cuda))
        .route("/v2/cudasharedmemory/region/{region}/status", get(no_cuda))
        .route("/v2/cudasharedmemory/region/{region}/register", post(no_cuda))
        .route("/v2/cudasharedmemory/unregister", post(no_cuda_to_unregister))
        .route(
            "/v2/cudasharedmemory/region/{region}/unregister",
            post(no_cuda_to_unregister),
        )
        .route("/v2/models/stats", get(all_stats))
        .route("/v2/models/{name}/stats", get(model_stats))
        .route("/v2/models/{name}/versions/{version}/stats", get(version_stats))
        .route(
            "/v2/models/{name}/infer",
            post(infer).layer(DefaultBodyLimit::max(limit)),
        )
}

/// The sequences' upkeep: idle ones reaped each second; on the drain,
/// every one handed over.
pub(crate) fn tend(shared: Arc<Shared>, endpoints: Vec<Arc<Endpoint>>, sequences: Arc<Sequences>) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        let mut handing = shared.handing_over.clone();
        let idle = Duration::from_millis(shared.limits.idle_ms);
        loop {
            tokio::select! {
                _ = every.tick() => sequences.reap(idle),
                // (The flag's guard is dropped inside: it is not Send.)
                changed = async { handing.wait_for(|h| *h).await.is_ok() } => {
                    if changed {
                        sequences.hand_over_all(&shared, &endpoints).await;
                    }
                    return;
                }
            }
        }
    });
}

/// An error answer.
fn error(status: StatusCode, why: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        laned_wire::kserve::error(why),
    )
        .into_response()
}

fn no_model(routes: &Routes, name: &str) -> Response {
    let names: Vec<&str> = routes.endpoints.iter().map(|e| e.name.as_str()).collect();
    error(
        StatusCode::NOT_FOUND,
        &format!("no model {name:?} here: the models are {}", names.join(", ")),
    )
}

fn json_answer(value: serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

/// A shared memory refusal's answer.
fn shm_error(e: crate::shm::ShmError) -> Response {
    use crate::shm::ShmError;
    let status = match &e {
        ShmError::Bad(_) => StatusCode::BAD_REQUEST,
        ShmError::NotFound(_) => StatusCode::NOT_FOUND,
        ShmError::Exists(_) => StatusCode::CONFLICT,
        ShmError::Full(_) => StatusCode::TOO_MANY_REQUESTS,
    };
    error(status, e.why())
}

fn shm_status_answer(routes: &Routes, name: &str) -> Response {
    match routes.regions.status(name) {
        Ok(regions) => json_answer(serde_json::Value::Array(
            regions
                .into_iter()
                .map(|(name, key, offset, byte_size)| {
                    json!({ "name": name, "key": key, "offset": offset, "byte_size": byte_size })
                })
                .collect(),
        )),
        Err(e) => shm_error(e),
    }
}

async fn shm_status_all(State(routes): State<Routes>) -> Response {
    shm_status_answer(&routes, "")
}

async fn shm_status(State(routes): State<Routes>, Path(name): Path<String>) -> Response {
    shm_status_answer(&routes, &name)
}

/// A region's register: `{"key", "offset", "byte_size"}`.
async fn shm_register(State(routes): State<Routes>, Path(name): Path<String>, body: Bytes) -> Response {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "a register's body: wanted {\"key\", \"offset\", \"byte_size\"}",
        );
    };
    let key = v.get("key").and_then(serde_json::Value::as_str);
    let offset = match v.get("offset") {
        None => Some(0),
        Some(o) => o.as_u64(),
    };
    let byte_size = v.get("byte_size").and_then(serde_json::Value::as_u64);
    let (Some(key), Some(offset), Some(byte_size)) = (key, offset, byte_size) else {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("shared memory region {name:?}: wanted a string key, a non-negative offset and byte_size"),
        );
    };
    match routes.regions.register(&name, key, offset, byte_size) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => shm_error(e),
    }
}

async fn shm_unregister_all(State(routes): State<Routes>) -> StatusCode {
    routes.regions.unregister("");
    StatusCode::OK
}

async fn shm_unregister(State(routes): State<Routes>, Path(name): Path<String>) -> StatusCode {
    routes.regions.unregister(&name);
    StatusCode::OK
}

/// CUDA shared memory's routes but its unregister.
async fn no_cuda() -> Response {
    error(StatusCode::NOT_IMPLEMENTED, crate::shm::NO_CUDA)
}

/// CUDA shared memory's unregister (all, or a region): done, there being
/// none to undo, as Triton built without GPUs answers it. Clients that
/// clean up both kinds (perf_analyzer's `--shared-memory system`, at its
/// end) would otherwise fail their cleanup.
async fn no_cuda_to_unregister() -> StatusCode {
    StatusCode::OK
}

/// The `model_repository` extension's index: every served model, version
/// "1", `READY` (or `UNAVAILABLE` while its runner takes no lane); with
/// `{"ready": true}` the ready ones only.
async fn repository_index(State(routes): State<Routes>, body: Bytes) -> Response {
    let ready_only = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("ready").and_then(serde_json::Value::as_bool))
        .unwrap_or(false);
    let models: Vec<_> = routes
        .index()
        .into_iter()
        .filter(|(_, ready)| *ready || !ready_only)
        .map(|(name, ready)| json!({ "name": name, "version": "1", "state": if ready { "READY" } else { "UNAVAILABLE" } }))
        .collect();
    json_answer(serde_json::Value::Array(models))
}

/// A load: a served model's is a no-op; any other refused by name.
async fn repository_load(State(routes): State<Routes>, Path(name): Path<String>) -> Response {
    match routes.load(&name) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(why) => error(StatusCode::NOT_FOUND, &why),
    }
}

/// An unload: refused, naming the model.
async fn repository_unload(State(routes): State<Routes>, Path(name): Path<String>) -> Response {
    error(StatusCode::BAD_REQUEST, &routes.unload(&name))
}

async fn server_metadata() -> Response {
    json_answer(json!({
        "name": "laned",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": laned_wire::kserve::EXTENSIONS,
    }))
}

/// The `statistics` extension: every model's ([`crate::stats`]).
async fn all_stats(State(routes): State<Routes>) -> Response {
    json_answer(routes.stats_json(None).unwrap_or_default())
}

async fn model_stats(State(routes): State<Routes>, Path(name): Path<String>) -> Response {
    match routes.stats_json(Some(&name)) {
        Some(stats) => json_answer(stats),
        None => no_model(&routes, &name),
    }
}

async fn version_stats(State(routes): State<Routes>, Path((name, version)): Path<(String, String)>) -> Response {
    if version != "1" {
        return error(
            StatusCode::NOT_FOUND,
            &format!("model {name:?} has no version {version:?}: its one version is \"1\""),
        );
    }
    model_stats(State(routes), Path(name)).await
}

async fn server_ready(State(routes): State<Routes>) -> StatusCode {
    if routes.endpoints.iter().any(|e| readiness(&e.runner).0) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn model_ready(State(routes): State<Routes>, Path(name): Path<String>) -> Response {
    match routes.endpoint(&name) {
        Some(e) if readiness(&e.runner).0 => StatusCode::OK.into_response(),
        Some(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        None => no_model(&routes, &name),
    }
}

async fn model_metadata(State(routes): State<Routes>, Path(name): Path<String>) -> Response {
    let Some(e) = routes.endpoint(&name) else {
        return no_model(&routes, &name);
    };
    let Some(i) = e.protocol.interface() else {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("model {name:?} is not served as tensors"),
        );
    };
    json_answer(json!({
        "name": name,
        "versions": ["1"],
        "platform": "laned",
        "inputs": i.inputs.iter().map(kserve::metadata).collect::<Vec<_>>(),
        "outputs": i.outputs.iter().map(kserve::metadata).collect::<Vec<_>>(),
    }))
}

/// Triton's model config, as far as its clients read it: the inputs and
/// outputs without the batch axis, the lanes as `max_batch_size`, the
/// sequence batcher's idle time.
async fn model_config(State(routes): State<Routes>, Path(name): Path<String>) -> Response {
    let Some(e) = routes.endpoint(&name) else {
        return no_model(&routes, &name);
    };
    let Some(i) = e.protocol.interface() else {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("model {name:?} is not served as tensors"),
        );
    };
    let port = |p: &laned_models::spec::Port| {
        json!({
            "name": p.name,
            "data_type": format!("TYPE_{}", laned_wire::kserve::datatype(&p.dtype)),
            "dims": p.shape.iter().skip(1).collect::<Vec<_>>(),
        })
    };
    json_answer(json!({
        "name": name,
        "platform": "laned",
        "max_batch_size": e.runner.total_lanes(),
        "input": i.inputs.iter().map(port).collect::<Vec<_>>(),
        "output": i.outputs.iter().map(port).collect::<Vec<_>>(),
        "sequence_batching": {
            "max_sequence_idle_microseconds": routes.shared.limits.idle_ms.saturating_mul(1000),
        },
    }))
}

/// One infer request: one pulse of its sequence (or of a stream of its
/// own where it names none), counted in its model's statistics.
async fn infer(State(routes): State<Routes>, Path(name): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let mut clock = crate::stats::Clock::start();
    let answer = infer_timed(&routes, &name, &headers, &body, &mut clock).await;
    if let Some(stats) = routes.stats(&name) {
        stats.record(&clock, answer.status().is_success());
    }
    answer
}

async fn infer_timed(
    routes: &Routes,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
    clock: &mut crate::stats::Clock,
) -> Response {
    let name = name.to_string();
    let routes = routes.clone();
    let Some(endpoint) = routes.endpoint(&name) else {
        return no_model(&routes, &name);
    };
    let Some(interface) = endpoint.protocol.interface() else {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("model {name:?} is not served as tensors"),
        );
    };
    let limit = max_body(interface.pulse_bytes());
    if body.len() > limit {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "a request of {} bytes, over this model's {limit}-byte limit",
                body.len()
            ),
        );
    }
    let json_len = match headers.get(HEADER_LENGTH).map(|v| v.to_str().map(str::parse::<usize>)) {
        None => None,
        Some(Ok(Ok(n))) => Some(n),
        Some(_) => return error(StatusCode::BAD_REQUEST, &format!("{} is not a number", HEADER_LENGTH)),
    };
    let request = match Request::parse(body, json_len, interface, &routes.regions) {
        Ok(r) => r,
        Err(refused) => return error(StatusCode::BAD_REQUEST, &refused.0),
    };
    let inputs = match interface.call_inputs(&request.pulse) {
        Ok(i) => i,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let id = request.sequence.as_ref();
    clock.checked();
    let outputs = match routes
        .sequences
        .call(
            (&routes.shared, &endpoint),
            id,
            (request.start, request.end),
            inputs,
            clock,
        )
        .await
    {
        Ok(out) => out,
        Err((status, why)) => return error(status, &why),
    };
    clock.answered();
    let bytes = match interface.answer_bytes(&outputs) {
        Ok(b) => b,
        Err(why) => return error(StatusCode::INTERNAL_SERVER_ERROR, &format!("answering: {why}")),
    };
    let (head, binary) = match kserve::answer(&name, &request, interface, &bytes) {
        Ok(answer) => answer,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    if binary.is_empty() {
        return ([(header::CONTENT_TYPE, "application/json")], head).into_response();
    }
    let json_len = head.len();
    (
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::HeaderName::from_static(HEADER_LENGTH), json_len.to_string()),
        ],
        [head, binary].concat(),
    )
        .into_response()
}
