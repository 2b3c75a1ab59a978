//! The KServe v2 gRPC front (`laned serve --grpc-listen ADDR`):
//! `inference.GRPCInferenceService` as Triton's clients
//! (`tritonclient.grpc`) call it. Health, metadata and Triton's model
//! config; `ModelInfer`, one pulse a request; and the bidirectional
//! `ModelStreamInfer`, many sequences on one stream, each sequence's
//! requests served in order (a task a sequence), the sequences side by
//! side. A sequence is the REST front's: the same table, the same
//! parameters (`sequence_id`, `sequence_start`, `sequence_end`), the same
//! hand-over (the session's `sequence` module). Inputs come as
//! `raw_input_contents` or typed contents; outputs go as
//! `raw_output_contents`. An error is a status on `ModelInfer` and an
//! `error_message` on the stream, its text the REST front's: `restarting`
//! on a drain (send the request to another replica: it resumes the
//! sequence from its record).
//!
//! The service is written by hand over tonic's server (the messages are
//! prost derives in [`laned_wire::grpc`]): no protoc at build time.

mod places;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::StatusCode;
use futures_util::Stream;
use laned_wire::grpc::*;
use laned_wire::kserve::{datatype, SequenceId, EXTENSIONS};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use crate::kserve::{self, Pulse};
use crate::routes::{max_body, readiness, Routes};

/// Sequences one connection's streams may carry at once, all its
/// `ModelStreamInfer` streams together (a sequence of `ModelInfer`
/// requests is held by the server's table, not by a connection).
pub const MAX_SEQUENCES_PER_CONNECTION: usize = laned_wire::mux::MAX_STREAMS;

/// Requests of one sequence queued on a stream, not yet served.
const QUEUED_PER_SEQUENCE: usize = laned_wire::mux::MAX_QUEUED;

/// The service: every route's state.
#[derive(Clone)]
pub(crate) struct Inference {
    routes: Routes,
    /// The largest request message: the REST front's body limit.
    max_request: usize,
}

impl Inference {
    pub(crate) fn new(routes: Routes) -> Inference {
        let max_request = routes
            .endpoints
            .iter()
            .filter_map(|e| e.protocol.interface())
            .map(|i| max_body(i.pulse_bytes()))
            .max()
            .unwrap_or(64 << 10);
        Inference { routes, max_request }
    }
}

impl NamedService for Inference {
    const NAME: &'static str = SERVICE;
}

/// A function as a tonic service (unary, or streaming with a stream of
/// requests).
struct Handler<F>(F);

impl<F, Req, Resp, Fut> Service<Request<Req>> for Handler<F>
where
    F: FnMut(Request<Req>) -> Fut,
    Fut: Future<Output = Result<Response<Resp>, Status>>,
{
    type Response = Response<Resp>;
    type Error = Status;
    type Future = Fut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Req>) -> Fut {
        (self.0)(request)
    }
}

/// A codec of request `Req` and response `Resp`, bounded by `max`.
fn grpc<Resp, Req>(max: usize) -> Grpc<ProstCodec<Resp, Req>>
where
    Resp: prost::Message + Send + 'static,
    Req: prost::Message + Default + Send + 'static,
{
    Grpc::new(ProstCodec::default()).max_decoding_message_size(max)
}

impl<B> Service<http::Request<B>> for Inference
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let this = self.clone();
        let method = req
            .uri()
            .path()
            .strip_prefix(&format!("/{SERVICE}/"))
            .map(str::to_string);
        let place = req.extensions().get::<places::Place>().cloned();
        let over_cap = place.as_ref().and_then(|p| p.over_cap);
        let held = match place {
            Some(p) => p.held,
            None => Bounds {
                sequences: Default::default(),
                requests: Arc::new(tokio::sync::Semaphore::new(self.routes.shared.limits.grpc_max_requests)),
            },
        };
        let closing = *self.routes.shared.closing.borrow();
        Box::pin(async move {
            if let Some(cap) = over_cap {
                return Ok(Status::unavailable(format!(
                    "the server's connection cap ({cap}) is reached: retry later or on another replica"
                ))
                .into_http());
            }
            if closing && matches!(method.as_deref(), Some("ModelInfer" | "ModelStreamInfer")) {
                return Ok(Status::unavailable(RESTARTING).into_http());
            }
            let routes = this.routes.clone();
            let small = 64 << 10;
            Ok(match method.as_deref() {
                Some("ServerLive") => {
                    let h = Handler(|_: Request<ServerLiveRequest>| async {
                        Ok(Response::new(ServerLiveResponse { live: true }))
                    });
                    grpc(small).unary(h, req).await
                }
                Some("ServerReady") => {
                    let h = Handler(move |_: Request<ServerReadyRequest>| {
                        let ready = routes.endpoints.iter().any(|e| readiness(&e.runner).0);
                        async move { Ok(Response::new(ServerReadyResponse { ready })) }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("ModelReady") => {
                    let h = Handler(move |r: Request<ModelReadyRequest>| {
                        let ready = routes.endpoint(&r.get_ref().name).map(|e| readiness(&e.runner).0);
                        let name = r.into_inner().name;
                        async move {
                            match ready {
                                Some(ready) => Ok(Response::new(ModelReadyResponse { ready })),
                                None => Err(Status::not_found(format!("no model {name:?} here"))),
                            }
                        }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("ServerMetadata") => {
                    let h = Handler(|_: Request<ServerMetadataRequest>| async {
                        Ok(Response::new(ServerMetadataResponse {
                            name: "laned".into(),
                            version: env!("CARGO_PKG_VERSION").into(),
                            extensions: EXTENSIONS
                                .iter()
                                .filter(|e| **e != "binary_tensor_data")
                                .map(|e| e.to_string())
                                .collect(),
                        }))
                    });
                    grpc(small).unary(h, req).await
                }
                Some("ModelMetadata") => {
                    let h = Handler(move |r: Request<ModelMetadataRequest>| {
                        let answer = model_metadata(&routes, &r.into_inner().name);
                        async move { answer.map(Response::new) }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("ModelConfig") => {
                    let h = Handler(move |r: Request<ModelConfigRequest>| {
                        let answer = model_config(&routes, &r.into_inner().name);
                        async move { answer.map(Response::new) }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("RepositoryIndex") => {
                    let h = Handler(move |r: Request<RepositoryIndexRequest>| {
                        let ready_only = r.get_ref().ready;
                        let models = routes
                            .index()
                            .into_iter()
                            .filter(|(_, ready)| *ready || !ready_only)
                            .map(|(name, ready)| ModelIndex {
                                name,
                                version: "1".into(),
                                state: if ready { "READY" } else { "UNAVAILABLE" }.into(),
                                reason: String::new(),
                            })
                            .collect();
                        async move { Ok(Response::new(RepositoryIndexResponse { models })) }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("RepositoryModelLoad") => {
                    let h = Handler(move |r: Request<RepositoryModelRequest>| {
                        let answer = routes.load(&r.get_ref().model_name);
                        async move { answer.map(|()| Response::new(Empty {})).map_err(Status::not_found) }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("RepositoryModelUnload") => {
                    let h = Handler(move |r: Request<RepositoryModelRequest>| {
                        let why = routes.unload(&r.get_ref().model_name);
                        async move { Err::<Response<Empty>, _>(Status::invalid_argument(why)) }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("SystemSharedMemoryStatus") => {
                    let h = Handler(move |r: Request<SystemSharedMemoryStatusRequest>| {
                        let answer = routes
                            .regions
                            .status(&r.get_ref().name)
                            .map(|regions| {
                                Response::new(SystemSharedMemoryStatusResponse {
                                    regions: regions
                                        .into_iter()
                                        .map(|(name, key, offset, byte_size)| {
                                            let status = RegionStatus {
                                                name: name.clone(),
                                                key,
                                                offset,
                                                byte_size,
                                            };
                                            (name, status)
                                        })
                                        .collect(),
                                })
                            })
                            .map_err(shm_status);
                        async move { answer }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("SystemSharedMemoryRegister") => {
                    let h = Handler(move |r: Request<SystemSharedMemoryRegisterRequest>| {
                        let r = r.into_inner();
                        let answer = routes
                            .regions
                            .register(&r.name, &r.key, r.offset, r.byte_size)
                            .map(|()| Response::new(Empty {}))
                            .map_err(shm_status);
                        async move { answer }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("SystemSharedMemoryUnregister") => {
                    let h = Handler(move |r: Request<SystemSharedMemoryUnregisterRequest>| {
                        routes.regions.unregister(&r.get_ref().name);
                        async move { Ok(Response::new(Empty {})) }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("CudaSharedMemoryStatus" | "CudaSharedMemoryRegister") => {
                    Status::unimplemented(crate::shm::NO_CUDA).into_http()
                }
                // Done, there being none to undo, as Triton built without
                // GPUs answers it (perf_analyzer's cleanup unregisters both
                // kinds).
                Some("CudaSharedMemoryUnregister") => {
                    let h =
                        Handler(|_: Request<CudaSharedMemoryUnregisterRequest>| async { Ok(Response::new(Empty {})) });
                    grpc(small).unary(h, req).await
                }
                Some("ModelStatistics") => {
                    let h = Handler(move |r: Request<ModelStatisticsRequest>| {
                        let r = r.into_inner();
                        let answer = model_statistics(&routes, &r.name, &r.version);
                        async move { answer.map(Response::new) }
                    });
                    grpc(small).unary(h, req).await
                }
                Some("ModelInfer") => {
                    let h = Handler(move |r: Request<ModelInferRequest>| {
                        let routes = routes.clone();
                        async move { infer(&routes, r.into_inner()).await.map(Response::new) }
                    });
                    grpc(this.max_request).unary(h, req).await
                }
                Some("ModelStreamInfer") => {
                    let h = Handler(move |r: Request<Streaming<ModelInferRequest>>| {
                        let routes = routes.clone();
                        let held = held.clone();
                        async move { Ok(Response::new(stream_infer(routes, held, r.into_inner()))) }
                    });
                    grpc(this.max_request).streaming(h, req).await
                }
                _ => Status::unimplemented(format!("{} is not served here", req.uri().path())).into_http(),
            })
        })
    }
}

/// A v2 datatype's Triton `DataType` number, from the tensor protocol's
/// name.
fn triton_type(dtype: &str) -> i32 {
    data_type(datatype(dtype))
}

fn model_metadata(routes: &Routes, name: &str) -> Result<ModelMetadataResponse, Status> {
    let (_, i) = served(routes, name)?;
    let tensor = |p: &laned_models::spec::Port| TensorMetadata {
        name: p.name.clone(),
        datatype: datatype(&p.dtype).into(),
        shape: p
            .shape
            .iter()
            .enumerate()
            .map(|(axis, d)| if axis == 0 { -1 } else { *d as i64 })
            .collect(),
    };
    Ok(ModelMetadataResponse {
        name: name.into(),
        versions: vec!["1".into()],
        platform: "laned".into(),
        inputs: i.inputs.iter().map(tensor).collect(),
        outputs: i.outputs.iter().map(tensor).collect(),
    })
}

fn model_config(routes: &Routes, name: &str) -> Result<ModelConfigResponse, Status> {
    let (e, i) = served(routes, name)?;
    let dims = |p: &laned_models::spec::Port| p.shape.iter().skip(1).map(|d| *d as i64).collect();
    Ok(ModelConfigResponse {
        config: Some(ModelConfig {
            name: name.into(),
            platform: "laned".into(),
            max_batch_size: e.runner.total_lanes().try_into().unwrap_or(i32::MAX),
            input: i
                .inputs
                .iter()
                .map(|p| ModelInput {
                    name: p.name.clone(),
                    data_type: triton_type(&p.dtype),
                    dims: dims(p),
                })
                .collect(),
            output: i
                .outputs
                .iter()
                .map(|p| ModelOutput {
                    name: p.name.clone(),
                    data_type: triton_type(&p.dtype),
                    dims: dims(p),
                })
                .collect(),
            sequence_batching: Some(ModelSequenceBatching {
                max_sequence_idle_microseconds: routes.shared.limits.idle_ms.saturating_mul(1000),
            }),
        }),
    })
}

/// A shared memory refusal's status.
fn shm_status(e: crate::shm::ShmError) -> Status {
    use crate::shm::ShmError;
    match e {
        ShmError::Bad(why) => Status::invalid_argument(why),
        ShmError::NotFound(why) => Status::not_found(why),
        ShmError::Exists(why) => Status::already_exists(why),
        ShmError::Full(why) => Status::resource_exhausted(why),
    }
}

/// A tensor's shared memory parameters, where it has them: its place,
/// checked.
fn shm_place(
    routes: &Routes,
    what: &str,
    p: &HashMap<String, InferParameter>,
) -> Result<Option<crate::shm::Place>, Status> {
    let get = |k: &str| p.get(k).and_then(|v| v.parameter_choice.as_ref());
    let Some(region) = get("shared_memory_region") else {
        return Ok(None);
    };
    let ParameterChoice::Str(region) = region else {
        return Err(Status::invalid_argument(format!(
            "{what}: shared_memory_region {region:?}: wanted a string"
        )));
    };
    let number = |key: &str, default: Option<u64>| -> Result<u64, Status> {
        match get(key) {
            None => {
                default.ok_or_else(|| Status::invalid_argument(format!("{what}: shared_memory_region without {key}")))
            }
            Some(ParameterChoice::Int64(n)) if *n >= 0 => Ok(*n as u64),
            Some(ParameterChoice::Uint64(n)) => Ok(*n),
            Some(other) => Err(Status::invalid_argument(format!(
                "{what}: {key} {other:?}: wanted a non-negative integer"
            ))),
        }
    };
    let byte_size = number("shared_memory_byte_size", None)?;
    let offset = number("shared_memory_offset", Some(0))?;
    routes
        .regions
        .place(what, region, byte_size, offset)
        .map(Some)
        .map_err(Status::invalid_argument)
}

/// The `statistics` extension: model `name`'s (every model's where it
/// is empty), as [`crate::stats`] counts them.
fn model_statistics(routes: &Routes, name: &str, version: &str) -> Result<ModelStatisticsResponse, Status> {
    if !name.is_empty() {
        served(routes, name)?;
    }
    if !version.is_empty() && version != "1" {
        return Err(Status::not_found(format!(
            "model {name:?} has no version {version:?}: its one version is \"1\""
        )));
    }
    let duration = |s: &crate::stats::Stat| {
        let (count, ns) = s.get();
        Some(StatisticDuration { count, ns })
    };
    let model_stats = routes
        .endpoints
        .iter()
        .zip(routes.stats.iter())
        .filter(|(e, _)| name.is_empty() || e.name == name)
        .map(|(e, s)| {
            let successes = s.success.get().0;
            ModelStatistics {
                name: e.name.clone(),
                version: "1".into(),
                last_inference: s.last_inference.load(Ordering::Relaxed),
                inference_count: successes,
                execution_count: successes,
                inference_stats: Some(InferStatistics {
                    success: duration(&s.success),
                    fail: duration(&s.fail),
                    queue: duration(&s.queue),
                    compute_input: duration(&s.compute_input),
                    compute_infer: duration(&s.compute_infer),
                    compute_output: duration(&s.compute_output),
                    cache_hit: Some(StatisticDuration::default()),
                    cache_miss: Some(StatisticDuration::default()),
                }),
            }
        })
        .collect();
    Ok(ModelStatisticsResponse { model_stats })
}

/// Model `name`'s endpoint and interface, or why not.
fn served(
    routes: &Routes,
    name: &str,
) -> Result<(std::sync::Arc<crate::session::Endpoint>, laned_models::spec::Interface), Status> {
    let Some(e) = routes.endpoint(name) else {
        let names: Vec<&str> = routes.endpoints.iter().map(|e| e.name.as_str()).collect();
        return Err(Status::not_found(format!(
            "no model {name:?} here: the models are {}",
            names.join(", ")
        )));
    };
    let Some(i) = e.protocol.interface().cloned() else {
        return Err(Status::invalid_argument(format!(
            "model {name:?} is not served as tensors"
        )));
    };
    Ok((e, i))
}

/// The status of a refusal, by the REST front's HTTP status.
fn status(code: StatusCode, why: String) -> Status {
    match code {
        StatusCode::NOT_FOUND => Status::not_found(why),
        StatusCode::CONFLICT => Status::failed_precondition(why),
        StatusCode::PAYLOAD_TOO_LARGE => Status::resource_exhausted(why),
        StatusCode::SERVICE_UNAVAILABLE => Status::unavailable(why),
        StatusCode::INTERNAL_SERVER_ERROR => Status::internal(why),
        _ => Status::invalid_argument(why),
    }
}

/// A request's parameter.
fn param<'a>(r: &'a ModelInferRequest, name: &str) -> Option<&'a ParameterChoice> {
    r.parameters.get(name).and_then(|p| p.parameter_choice.as_ref())
}

/// A request's sequence id, where it names one (`0` or empty: none): a
/// number or a string, two kinds as Triton keeps them.
fn sequence_of(r: &ModelInferRequest) -> Result<Option<SequenceId>, Status> {
    Ok(match param(r, "sequence_id") {
        None | Some(ParameterChoice::Int64(0)) | Some(ParameterChoice::Uint64(0)) => None,
        Some(ParameterChoice::Int64(n)) if *n > 0 => Some(SequenceId::Number(*n as u64)),
        Some(ParameterChoice::Uint64(n)) => Some(SequenceId::Number(*n)),
        Some(ParameterChoice::Str(s)) if s.is_empty() => None,
        Some(ParameterChoice::Str(s)) => Some(SequenceId::Name(s.clone())),
        Some(other) => {
            return Err(Status::invalid_argument(format!(
                "sequence_id {other:?}: wanted a positive integer or a string"
            )))
        }
    })
}

fn flag(r: &ModelInferRequest, name: &str) -> bool {
    matches!(param(r, name), Some(ParameterChoice::Bool(true)))
}

/// Typed contents as little-endian bytes of `dtype`.
fn contents_bytes(c: &InferTensorContents, dtype: &str) -> Result<Vec<u8>, String> {
    Ok(match dtype {
        "f32" => c.fp32_contents.iter().flat_map(|x| x.to_le_bytes()).collect(),
        "f64" => c.fp64_contents.iter().flat_map(|x| x.to_le_bytes()).collect(),
        "i64" => c.int64_contents.iter().flat_map(|x| x.to_le_bytes()).collect(),
        "i32" => c.int_contents.iter().flat_map(|x| x.to_le_bytes()).collect(),
        "i16" => c.int_contents.iter().flat_map(|x| (*x as i16).to_le_bytes()).collect(),
        "i8" => c.int_contents.iter().map(|x| *x as i8 as u8).collect(),
        "u64" => c.uint64_contents.iter().flat_map(|x| x.to_le_bytes()).collect(),
        "u32" => c.uint_contents.iter().flat_map(|x| x.to_le_bytes()).collect(),
        "u16" => c.uint_contents.iter().flat_map(|x| (*x as u16).to_le_bytes()).collect(),
        "u8" => c.uint_contents.iter().map(|x| *x as u8).collect(),
        "bool" => c.bool_contents.iter().map(|b| u8::from(*b)).collect(),
        other => {
            return Err(format!(
                "{other} cannot come as typed contents: send raw_input_contents"
            ))
        }
    })
}

/// A request checked whole, before any model runs: its model, its
/// sequence and flags, its pulse's inputs and the outputs it asks for
/// (the REST front's checks, [`kserve::Pulse`] and [`kserve::output`]).
struct Checked {
    endpoint: std::sync::Arc<crate::session::Endpoint>,
    interface: laned_models::spec::Interface,
    sequence: Option<SequenceId>,
    ends: (bool, bool),
    inputs: tract_core::prelude::TVec<tract_core::prelude::TValue>,
    /// The outputs answered, by index in the interface's (all where the
    /// request names none).
    wanted: Vec<bool>,
    /// The outputs asked into shared memory, their places checked.
    shm_out: Vec<Option<crate::shm::Place>>,
}

/// Request `r` checked whole ([`Checked`]), or the refusal.
fn check(routes: &Routes, r: &ModelInferRequest) -> Result<Checked, Status> {
    let (endpoint, interface) = served(routes, &r.model_name)?;
    let sequence = sequence_of(r)?;
    let mut pulse = Pulse::new(&interface);
    // Raw contents are the inputs' not in shared memory, in order.
    let mut raw_at = 0;
    for input in &r.inputs {
        let k = pulse
            .port(&input.name, &input.datatype, &input.shape)
            .map_err(|e| Status::invalid_argument(e.0))?;
        let what = format!("input {:?}", input.name);
        let shm = shm_place(routes, &what, &input.parameters)?;
        let bytes = if let Some(place) = shm {
            let port = &interface.inputs[k];
            place
                .input(&what, kserve::port_bytes(port))
                .map_err(Status::invalid_argument)?
        } else if r.raw_input_contents.is_empty() {
            let contents = input
                .contents
                .as_ref()
                .ok_or_else(|| Status::invalid_argument(format!("input {:?}: no contents", input.name)))?;
            contents_bytes(contents, &interface.inputs[k].dtype)
                .map_err(|why| Status::invalid_argument(format!("input {:?}: {why}", input.name)))?
        } else {
            raw_at += 1;
            r.raw_input_contents.get(raw_at - 1).cloned().ok_or_else(|| {
                Status::invalid_argument(format!(
                    "input {:?}: {} raw contents for {} inputs",
                    input.name,
                    r.raw_input_contents.len(),
                    r.inputs.len()
                ))
            })?
        };
        pulse.give(k, bytes).map_err(|e| Status::invalid_argument(e.0))?;
    }
    let bytes = pulse.finish().map_err(|e| Status::invalid_argument(e.0))?;
    let inputs = interface.call_inputs(&bytes).map_err(Status::invalid_argument)?;
    let mut wanted = vec![r.outputs.is_empty(); interface.outputs.len()];
    let mut shm_out = vec![None; interface.outputs.len()];
    for o in &r.outputs {
        let k = kserve::output(&interface, &o.name).map_err(|e| Status::invalid_argument(e.0))?;
        wanted[k] = true;
        let what = format!("output {:?}", o.name);
        if let Some(place) = shm_place(routes, &what, &o.parameters)? {
            let port = &interface.outputs[k];
            place
                .check_output(&what, kserve::port_bytes(port))
                .map_err(Status::invalid_argument)?;
            shm_out[k] = Some(place);
        }
    }
    let ends = (flag(r, "sequence_start"), flag(r, "sequence_end"));
    Ok(Checked {
        endpoint,
        interface,
        sequence,
        ends,
        inputs,
        wanted,
        shm_out,
    })
}

/// One request: one pulse of its sequence (or of a stream of its own),
/// checked whole before it is called; counted in its model's statistics.
async fn infer(routes: &Routes, r: ModelInferRequest) -> Result<ModelInferResponse, Status> {
    let mut clock = crate::stats::Clock::start();
    let model = r.model_name.clone();
    let answer = infer_timed(routes, r, &mut clock).await;
    if let Some(stats) = routes.stats(&model) {
        stats.record(&clock, answer.is_ok());
    }
    answer
}

async fn infer_timed(
    routes: &Routes,
    r: ModelInferRequest,
    clock: &mut crate::stats::Clock,
) -> Result<ModelInferResponse, Status> {
    let Checked {
        endpoint,
        interface,
        sequence,
        ends,
        inputs,
        wanted,
        shm_out,
    } = check(routes, &r)?;
    clock.checked();
    let outputs = routes
        .sequences
        .call((&routes.shared, &endpoint), sequence.as_ref(), ends, inputs, clock)
        .await
        .map_err(|(code, why)| status(code, why))?;
    clock.answered();
    let answer = interface.answer_bytes(&outputs).map_err(Status::internal)?;
    let (mut outputs, mut raw) = (Vec::new(), Vec::new());
    let mut at = 0;
    for (k, p) in interface.outputs.iter().enumerate() {
        let n = kserve::port_bytes(p);
        let bytes = &answer[at..at + n];
        at += n;
        if !wanted[k] {
            continue;
        }
        let mut parameters = HashMap::new();
        if let Some(place) = &shm_out[k] {
            place
                .region
                .write(place.offset, bytes)
                .map_err(Status::invalid_argument)?;
            let param = |c| InferParameter {
                parameter_choice: Some(c),
            };
            parameters.insert(
                "shared_memory_region".to_string(),
                param(ParameterChoice::Str(place.region.name.clone())),
            );
            parameters.insert(
                "shared_memory_byte_size".to_string(),
                param(ParameterChoice::Int64(n as i64)),
            );
            parameters.insert(
                "shared_memory_offset".to_string(),
                param(ParameterChoice::Int64(place.offset as i64)),
            );
        }
        outputs.push(InferOutputTensor {
            name: p.name.clone(),
            datatype: datatype(&p.dtype).into(),
            shape: p.shape.iter().map(|d| *d as i64).collect(),
            parameters,
            contents: None,
        });
        // Raw contents stay one an output (empty for one in shared memory).
        raw.push(if shm_out[k].is_some() {
            Vec::new()
        } else {
            bytes.to_vec()
        });
    }
    let mut parameters = HashMap::new();
    if let Some(s) = param(&r, "sequence_id") {
        parameters.insert(
            "sequence_id".to_string(),
            InferParameter {
                parameter_choice: Some(s.clone()),
            },
        );
    }
    Ok(ModelInferResponse {
        model_name: r.model_name,
        model_version: "1".into(),
        id: r.id,
        parameters,
        outputs,
        raw_output_contents: raw,
    })
}

/// An answer on the stream: the response, or the error's message.
fn on_stream(answer: Result<ModelInferResponse, Status>) -> Result<ModelStreamInferResponse, Status> {
    Ok(match answer {
        Ok(response) => ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(response),
        },
        Err(status) => ModelStreamInferResponse {
            error_message: status.message().to_string(),
            infer_response: None,
        },
    })
}

type Answers = tokio::sync::mpsc::Sender<Result<ModelStreamInferResponse, Status>>;
type ResponseStream = Pin<Box<dyn Stream<Item = Result<ModelStreamInferResponse, Status>> + Send>>;

/// What a stream's client is told when the server's drain ends (its
/// sequences were handed over, with a store, when it began).
pub(crate) const RESTARTING: &str =
    "restarting: the server is shutting down: send the stream's requests to another replica";

/// A request received on a stream and not yet answered: its place under
/// the connection's `grpc_max_requests`, freed with its answer.
type InFlight = tokio::sync::OwnedSemaphorePermit;

/// An answer put on the stream, waited for up to `idle` (the client
/// takes none: then `false`, and the stream ends, as a WebSocket whose
/// replies stay untaken does).
async fn answer(answers: &Answers, answer: Result<ModelStreamInferResponse, Status>, idle: Duration) -> bool {
    matches!(tokio::time::timeout(idle, answers.send(answer)).await, Ok(Ok(())))
}

/// One sequence's requests on a stream, served in order by a task of its
/// own, after the task of the same id's previous sequence on the stream.
struct Worker {
    requests: tokio::sync::mpsc::Sender<(ModelInferRequest, InFlight)>,
    done: tokio::task::JoinHandle<()>,
}

/// A sequence counted on its connection until its task ends (an ended
/// sequence whose requests are still served counts too).
struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn worker(routes: Routes, answers: Answers, after: Option<tokio::task::JoinHandle<()>>, held: Held) -> Worker {
    let (requests, mut queue) = tokio::sync::mpsc::channel::<(ModelInferRequest, InFlight)>(QUEUED_PER_SEQUENCE);
    let idle = Duration::from_millis(routes.shared.limits.idle_ms);
    let done = tokio::spawn(async move {
        let _held = held;
        if let Some(previous) = after {
            let _ = previous.await;
        }
        while let Some((r, in_flight)) = queue.recv().await {
            let reply = on_stream(infer(&routes, r).await);
            if !answer(&answers, reply, idle).await {
                return;
            }
            drop(in_flight);
        }
    });
    Worker { requests, done }
}

/// What one connection's streams hold together, bounded: its sequences
/// ([`MAX_SEQUENCES_PER_CONNECTION`]) and its requests in flight
/// (`grpc_max_requests`).
#[derive(Clone, Debug)]
pub(crate) struct Bounds {
    pub(crate) sequences: Arc<AtomicUsize>,
    pub(crate) requests: Arc<tokio::sync::Semaphore>,
}

/// `ModelStreamInfer`: each request routed to its sequence's worker (a
/// request of no sequence served on a task of its own), every answer on
/// the response stream as it is ready. Bounded (what a bound refuses is
/// answered `RESOURCE_EXHAUSTED` on the stream, naming it, the stream
/// going on): the connection's requests received and not answered
/// (`grpc_max_requests`, all its streams together), its sequences
/// ([`MAX_SEQUENCES_PER_CONNECTION`], those ended and still served
/// included), each sequence's requests queued ([`QUEUED_PER_SEQUENCE`]);
/// answers the client leaves untaken for `idle_ms` end the stream. When
/// the server's drain ends, the stream ends `UNAVAILABLE` [`RESTARTING`].
fn stream_infer(routes: Routes, held: Bounds, mut incoming: Streaming<ModelInferRequest>) -> ResponseStream {
    let (answers, mut out) = tokio::sync::mpsc::channel(QUEUED_PER_SEQUENCE);
    tokio::spawn(async move {
        let idle = Duration::from_millis(routes.shared.limits.idle_ms);
        let max_requests = routes.shared.limits.grpc_max_requests;
        let mut closing = crate::session::Flag::new(routes.shared.closing.clone());
        // Live sequences' workers by model and id; those whose last
        // request ended them, still finishing.
        let mut workers: HashMap<(String, SequenceId), Worker> = HashMap::new();
        let mut ending: HashMap<(String, SequenceId), tokio::task::JoinHandle<()>> = HashMap::new();
        loop {
            let r = tokio::select! {
                m = incoming.message() => match m {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(status) => {
                        let _ = answer(&answers, Err(status), idle).await;
                        break;
                    }
                },
                _ = &mut closing => {
                    let _ = answer(&answers, Err(Status::unavailable(RESTARTING)), idle).await;
                    break;
                }
            };
            let refuse = |why: String| on_stream(Err(Status::resource_exhausted(why)));
            let Ok(in_flight) = held.requests.clone().try_acquire_owned() else {
                let why = format!(
                    "{max_requests} requests in flight on this connection (grpc_max_requests), the most it takes: \
                     wait for their answers"
                );
                if !answer(&answers, refuse(why), idle).await {
                    break;
                }
                continue;
            };
            let sequence = match sequence_of(&r) {
                Ok(s) => s,
                Err(status) => {
                    if !answer(&answers, on_stream(Err(status)), idle).await {
                        break;
                    }
                    continue;
                }
            };
            let Some(id) = sequence else {
                let (routes, answers) = (routes.clone(), answers.clone());
                tokio::spawn(async move {
                    let reply = on_stream(infer(&routes, r).await);
                    let _ = answer(&answers, reply, idle).await;
                    drop(in_flight);
                });
                continue;
            };
            let key = (r.model_name.clone(), id);
            ending.retain(|_, done| !done.is_finished());
            if !workers.contains_key(&key) {
                let counted = held
                    .sequences
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < MAX_SEQUENCES_PER_CONNECTION).then_some(n + 1)
                    })
                    .is_ok();
                if !counted {
                    let why = format!(
                        "sequence {}: {MAX_SEQUENCES_PER_CONNECTION} sequences live on this connection's streams \
                         (those ended and still answering included), the most it takes: end one, or open another \
                         connection",
                        key.1
                    );
                    if !answer(&answers, refuse(why), idle).await {
                        break;
                    }
                    continue;
                }
                let held = Held(held.sequences.clone());
                let w = worker(routes.clone(), answers.clone(), ending.remove(&key), held);
                workers.insert(key.clone(), w);
            }
            let end = flag(&r, "sequence_end");
            let Some(w) = workers.get(&key) else { continue };
            match w.requests.try_send((r, in_flight)) {
                Ok(()) => {}
                Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                    let why = format!(
                        "sequence {}: {QUEUED_PER_SEQUENCE} requests queued, the most a sequence takes: wait for its \
                         answers",
                        key.1
                    );
                    if !answer(&answers, refuse(why), idle).await {
                        break;
                    }
                    continue;
                }
                // Its task ended: its answers were left untaken.
                Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => break,
            }
            if end {
                // Its queue closes behind this request; a later sequence
                // of the same id waits for it.
                if let Some(w) = workers.remove(&key) {
                    ending.insert(key, w.done);
                }
            }
        }
    });
    Box::pin(futures_util::stream::poll_fn(move |cx| out.poll_recv(cx)))
}

/// Serves the gRPC front on `at`; its address and task.
pub(crate) async fn listen(
    at: std::net::SocketAddr,
    routes: Routes,
) -> Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>), String> {
    let listener = tokio::net::TcpListener::bind(at)
        .await
        .map_err(|e| format!("binding the gRPC address {at}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Counted under the server's cap with its live sessions (`places`).
    let lanes = routes.endpoints.iter().map(|e| e.runner.total_lanes()).sum();
    let cap = routes.shared.limits.connection_cap(lanes);
    let incoming = places::incoming(listener, routes.shared.clone(), cap);
    let (max_streams, routes_closing) = (routes.shared.limits.grpc_max_streams, routes.shared.closing.clone());
    let service = Inference::new(routes);
    let task = tokio::spawn(async move {
        // The drain's end: every stream told RESTARTING (above), then each
        // connection sent GOAWAY and closed once its streams end.
        let mut closing = routes_closing;
        let served = tonic::transport::Server::builder()
            .max_concurrent_streams(max_streams)
            .serve_with_incoming_shutdown(service, incoming, async move {
                let _ = closing.wait_for(|c| *c).await;
            })
            .await;
        if let Err(e) = served {
            eprintln!("laned serve: the gRPC front stopped: {e}");
        }
    });
    Ok((addr, task))
}
