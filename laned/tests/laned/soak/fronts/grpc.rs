//! KServe v2 sequences over gRPC (`ModelInfer`, a request a pulse) to the
//! replicas directly: a sequence to the replica its id hashes to, to the
//! next where that one is unavailable (`restarting`, or gone). A refusal
//! naming `sequence_start` starts it again at pulse 0 under a fresh id.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use laned_wire::grpc::{InferInputTensor, InferParameter, ModelInferRequest, ModelInferResponse, ParameterChoice};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use super::super::stream::{pace, Answer, Ended, Interrupted, Plan, Run, WAIT};
use super::super::Ctx;
use super::rest::says_restart;

const INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

/// Sequences one after another on slot `slot` until the soak stops.
pub async fn slot(ctx: Arc<Ctx>, slot: usize) {
    let channels: Vec<Channel> = ctx
        .grpc
        .iter()
        .map(|a| {
            Channel::from_shared(format!("http://{a}"))
                .unwrap()
                .connect_timeout(Duration::from_secs(2))
                .timeout(WAIT)
                .connect_lazy()
        })
        .collect();
    let mut k = 0;
    while ctx.open() {
        let plan = ctx.plan("grpc", slot, k);
        ctx.finish(sequence(&ctx, &channels, plan).await);
        k += 1;
    }
}

/// Pulse `pulse` of sequence `id` as a request.
fn request(ctx: &Ctx, plan: &Plan, id: &str, pulse: usize) -> ModelInferRequest {
    let model = &ctx.models[plan.model];
    let (mut inputs, mut raw, mut at) = (vec![], vec![], 0);
    for p in &model.interface.inputs {
        assert_eq!(p.dtype, "f32", "the soak's models take f32");
        inputs.push(InferInputTensor {
            name: p.name.clone(),
            datatype: "FP32".into(),
            shape: p.shape.iter().map(|d| *d as i64).collect(),
            parameters: HashMap::new(),
            contents: None,
        });
        raw.push(plan.pulses[pulse][at..at + 4 * p.len()].to_vec());
        at += 4 * p.len();
    }
    let choice = |c| InferParameter {
        parameter_choice: Some(c),
    };
    let parameters = HashMap::from([
        ("sequence_id".to_string(), choice(ParameterChoice::Str(id.into()))),
        ("sequence_start".to_string(), choice(ParameterChoice::Bool(pulse == 0))),
        (
            "sequence_end".to_string(),
            choice(ParameterChoice::Bool(pulse + 1 == plan.pulses.len())),
        ),
    ]);
    ModelInferRequest {
        model_name: model.name.into(),
        model_version: String::new(),
        id: format!("{id}/{pulse}"),
        parameters,
        inputs,
        outputs: vec![],
        raw_input_contents: raw,
    }
}

/// One sequence, pulse by pulse, moved to the next replica where its own
/// is unavailable, started again where it is told to.
async fn sequence(ctx: &Ctx, channels: &[Channel], plan: Plan) -> Run {
    let hash = plan
        .id
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(131).wrapping_add(b as u64));
    let mut replica = hash as usize % channels.len();
    let mut run = Run::new("grpc", plan);
    let (mut next, mut last, mut interrupted, mut restarts) = (0, None, Interrupted::default(), 0);
    while next < run.plan.pulses.len() {
        if interrupted.given_up() {
            run.ended = Ended::Lost {
                told: interrupted.told.take(),
            };
            return run;
        }
        pace(last, ctx.period).await;
        let id = format!("{}.{restarts}", run.plan.id);
        let sent = Instant::now();
        last = Some(sent);
        let mut grpc = tonic::client::Grpc::new(channels[replica].clone());
        let answered = async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            grpc.unary::<_, ModelInferResponse, _>(
                tonic::Request::new(request(ctx, &run.plan, &id, next)),
                PathAndQuery::from_static(INFER),
                tonic_prost::ProstCodec::default(),
            )
            .await
        };
        match tokio::time::timeout(WAIT, answered).await {
            Ok(Ok(answer)) => {
                run.answers.push(Answer {
                    pulse: next,
                    bytes: answer.into_inner().raw_output_contents.concat(),
                    sent,
                    got: Instant::now(),
                });
                next += 1;
                interrupted.clear();
            }
            Ok(Err(status)) if says_restart(status.message()) && next > 0 => {
                let why = format!("grpc: {:?} {}", status.code(), status.message());
                next = run.resume_at(0, next, || why);
                restarts += 1;
                interrupted.clear();
            }
            Ok(Err(status)) => {
                interrupted.add(Some(format!("{:?} {}", status.code(), status.message())));
                if status.code() == tonic::Code::Unavailable {
                    replica = (replica + 1) % channels.len();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => {
                interrupted.add(None);
                replica = (replica + 1) % channels.len();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    run.ended = Ended::Done;
    run
}
