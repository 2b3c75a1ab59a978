//! The KServe v2 gRPC front's clients (`laned serve --grpc-listen`): one
//! HTTP/2 connection, one `ModelStreamInfer` stream carrying many of
//! Triton's sequences, as `tritonclient.grpc`'s `start_stream` and
//! `async_stream_infer` do. A request a pulse (raw input contents,
//! `sequence_id`, `sequence_start` on the first); the sequences share the
//! connection's clock as the multiplexed front's streams do, and each
//! waits for its answer before its next pulse.

use std::collections::HashMap;
use std::time::Instant;

use laned_models::spec::Interface;
use laned_wire::grpc::{
    InferInputTensor, InferParameter, ModelInferRequest, ModelStreamInferResponse, ParameterChoice,
};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tract_core::internal::*;

use crate::pace::Pace;
use crate::ANSWER_TIMEOUT;

/// One connection's sequences: their requests' sender and the stream of
/// answers.
pub(crate) struct Connection {
    requests: tokio::sync::mpsc::UnboundedSender<ModelInferRequest>,
    answers: tonic::Streaming<ModelStreamInferResponse>,
}

/// Connects to `addr` and opens one `ModelStreamInfer` stream.
pub(crate) async fn open(addr: std::net::SocketAddr) -> TractResult<Connection> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to the gRPC front at {addr}"))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| format_err!("the gRPC channel: {e}"))?;
    let (requests, rx) = tokio::sync::mpsc::unbounded_channel();
    let outgoing = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let answers = grpc
        .streaming(
            tonic::Request::new(outgoing),
            PathAndQuery::try_from(laned_wire::grpc::path("ModelStreamInfer"))?,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .map_err(|e| format_err!("ModelStreamInfer: {e}"))?
        .into_inner();
    Ok(Connection { requests, answers })
}

/// Sequence `id`'s request for one pulse of `bytes` (every fed input in
/// order), the first of its sequence if `start`.
fn request(model: &str, interface: &Interface, id: i64, start: bool, bytes: &[u8]) -> ModelInferRequest {
    let mut at = 0;
    let mut inputs = Vec::new();
    let mut raw = Vec::new();
    for p in &interface.inputs {
        let n = p.len() * laned_wire::tensor::width(&p.dtype).expect("a served port's dtype has a width");
        inputs.push(InferInputTensor {
            name: p.name.clone(),
            datatype: laned_wire::kserve::datatype(&p.dtype).into(),
            shape: p.shape.iter().map(|d| *d as i64).collect(),
            parameters: HashMap::new(),
            contents: None,
        });
        raw.push(bytes[at..at + n].to_vec());
        at += n;
    }
    let mut parameters = HashMap::new();
    let mut put = |name: &str, choice: ParameterChoice| {
        parameters.insert(
            name.to_string(),
            InferParameter {
                parameter_choice: Some(choice),
            },
        );
    };
    put("sequence_id", ParameterChoice::Int64(id));
    if start {
        put("sequence_start", ParameterChoice::Bool(true));
    }
    ModelInferRequest {
        model_name: model.into(),
        model_version: String::new(),
        id: id.to_string(),
        parameters,
        inputs,
        outputs: Vec::new(),
        raw_input_contents: raw,
    }
}

/// The connection's sequences (ids `first_id`..) from `first` to `end`,
/// sequence `s` feeding `frames[s]`. Latencies in microseconds, from the
/// request's send to its answer's arrival, of the pulses sent from
/// `counted` on.
pub(crate) async fn run(
    mut c: Connection,
    (model, interface): (&str, &Interface),
    first_id: i64,
    frames: Vec<Vec<u8>>,
    (first, counted, end): (Instant, Instant, Instant),
) -> TractResult<Vec<u64>> {
    let k = frames.len();
    let mut pace = Pace::new(k, (first, counted, end));
    let mut started = vec![false; k];
    loop {
        for s in pace.take_due(Instant::now()) {
            let r = request(model, interface, first_id + s as i64, !started[s], &frames[s]);
            started[s] = true;
            c.requests
                .send(r)
                .map_err(|_| format_err!("the gRPC stream's sender is gone"))?;
        }
        if pace.done() {
            break;
        }
        let answer = match pace.next_due() {
            Some(at) => tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => continue,
                a = next(&mut c.answers) => a?,
            },
            None => next(&mut c.answers).await?,
        };
        ensure!(
            answer.error_message.is_empty(),
            "the stream's error: {}",
            answer.error_message
        );
        let response = answer
            .infer_response
            .ok_or_else(|| format_err!("an answer without a response"))?;
        let id: i64 = response
            .id
            .parse()
            .with_context(|| format!("an answer's id {:?}", response.id))?;
        let s = usize::try_from(id - first_id).ok().filter(|s| *s < k);
        let s = s.ok_or_else(|| format_err!("an answer for sequence {id}, not one of this connection's"))?;
        pace.answered(s);
    }
    Ok(pace.latencies())
}

async fn next(answers: &mut tonic::Streaming<ModelStreamInferResponse>) -> TractResult<ModelStreamInferResponse> {
    match tokio::time::timeout(ANSWER_TIMEOUT, answers.message()).await {
        Err(_) => bail!("no answer within {ANSWER_TIMEOUT:?}: the server is wedged"),
        Ok(Err(status)) => bail!("the gRPC stream: {status}"),
        Ok(Ok(None)) => bail!("the server ended the stream"),
        Ok(Ok(Some(a))) => Ok(a),
    }
}
