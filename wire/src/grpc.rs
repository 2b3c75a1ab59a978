//! The messages of `inference.GRPCInferenceService` (KServe v2's gRPC
//! protocol, with Triton's `ModelStreamInfer`, `ModelConfig`, statistics,
//! repository and system shared memory calls), the fields `laned serve`
//! reads or writes, numbered as the protocol's `.proto` numbers them (a
//! field left out is skipped by either side's decoder). Prost derives, no
//! protoc at build time; a client sends them with any gRPC stack (the
//! bench's uses tonic's client and `tonic-prost`'s codec) to the paths
//! [`path`] gives.
//!
//! Their fields are the protocol's, named as its `.proto` names them: the
//! KServe v2 and Triton documentation describes each.
//!
//! ```
//! use laned_wire::grpc::{self, InferParameter, ModelInferRequest, ParameterChoice};
//! use prost::Message;
//!
//! let mut request = ModelInferRequest { model_name: "gru".into(), ..Default::default() };
//! request.parameters.insert(
//!     "sequence_id".into(),
//!     InferParameter { parameter_choice: Some(ParameterChoice::Int64(17)) },
//! );
//! let bytes = request.encode_to_vec();
//! assert_eq!(ModelInferRequest::decode(&bytes[..]).unwrap(), request);
//! assert_eq!(grpc::path("ModelStreamInfer"), "/inference.GRPCInferenceService/ModelStreamInfer");
//! ```
#![allow(missing_docs)]

use std::collections::HashMap;

/// The service's name on the wire.
pub const SERVICE: &str = "inference.GRPCInferenceService";

/// The HTTP/2 path of the service's `method` (`ModelInfer`,
/// `ModelStreamInfer`, ...).
pub fn path(method: &str) -> String {
    format!("/{SERVICE}/{method}")
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerLiveRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerLiveResponse {
    #[prost(bool, tag = "1")]
    pub live: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerReadyRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerReadyResponse {
    #[prost(bool, tag = "1")]
    pub ready: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelReadyRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelReadyResponse {
    #[prost(bool, tag = "1")]
    pub ready: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerMetadataRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerMetadataResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(string, repeated, tag = "3")]
    pub extensions: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelMetadataRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub datatype: String,
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelMetadataResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "2")]
    pub versions: Vec<String>,
    #[prost(string, tag = "3")]
    pub platform: String,
    #[prost(message, repeated, tag = "4")]
    pub inputs: Vec<TensorMetadata>,
    #[prost(message, repeated, tag = "5")]
    pub outputs: Vec<TensorMetadata>,
}

/// One of a parameter's kinds.
#[derive(Clone, PartialEq, prost::Oneof)]
#[non_exhaustive]
pub enum ParameterChoice {
    #[prost(bool, tag = "1")]
    Bool(bool),
    #[prost(int64, tag = "2")]
    Int64(i64),
    #[prost(string, tag = "3")]
    Str(String),
    #[prost(double, tag = "4")]
    Double(f64),
    #[prost(uint64, tag = "5")]
    Uint64(u64),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferParameter {
    #[prost(oneof = "ParameterChoice", tags = "1, 2, 3, 4, 5")]
    pub parameter_choice: Option<ParameterChoice>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferTensorContents {
    #[prost(bool, repeated, tag = "1")]
    pub bool_contents: Vec<bool>,
    #[prost(int32, repeated, tag = "2")]
    pub int_contents: Vec<i32>,
    #[prost(int64, repeated, tag = "3")]
    pub int64_contents: Vec<i64>,
    #[prost(uint32, repeated, tag = "4")]
    pub uint_contents: Vec<u32>,
    #[prost(uint64, repeated, tag = "5")]
    pub uint64_contents: Vec<u64>,
    #[prost(float, repeated, tag = "6")]
    pub fp32_contents: Vec<f32>,
    #[prost(double, repeated, tag = "7")]
    pub fp64_contents: Vec<f64>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub bytes_contents: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferInputTensor {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub datatype: String,
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, optional, tag = "5")]
    pub contents: Option<InferTensorContents>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferRequestedOutputTensor {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(map = "string, message", tag = "2")]
    pub parameters: HashMap<String, InferParameter>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelInferRequest {
    #[prost(string, tag = "1")]
    pub model_name: String,
    #[prost(string, tag = "2")]
    pub model_version: String,
    #[prost(string, tag = "3")]
    pub id: String,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, repeated, tag = "5")]
    pub inputs: Vec<InferInputTensor>,
    #[prost(message, repeated, tag = "6")]
    pub outputs: Vec<InferRequestedOutputTensor>,
    #[prost(bytes = "vec", repeated, tag = "7")]
    pub raw_input_contents: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferOutputTensor {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub datatype: String,
    #[prost(int64, repeated, tag = "3")]
    pub shape: Vec<i64>,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, optional, tag = "5")]
    pub contents: Option<InferTensorContents>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelInferResponse {
    #[prost(string, tag = "1")]
    pub model_name: String,
    #[prost(string, tag = "2")]
    pub model_version: String,
    #[prost(string, tag = "3")]
    pub id: String,
    #[prost(map = "string, message", tag = "4")]
    pub parameters: HashMap<String, InferParameter>,
    #[prost(message, repeated, tag = "5")]
    pub outputs: Vec<InferOutputTensor>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub raw_output_contents: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelStreamInferResponse {
    #[prost(string, tag = "1")]
    pub error_message: String,
    #[prost(message, optional, tag = "2")]
    pub infer_response: Option<ModelInferResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelConfigRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelInput {
    #[prost(string, tag = "1")]
    pub name: String,
    /// Triton's `DataType` enum: `TYPE_FP32` is 11 ([`data_type`]).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(int64, repeated, tag = "4")]
    pub dims: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelOutput {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(int64, repeated, tag = "3")]
    pub dims: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelSequenceBatching {
    #[prost(uint64, tag = "1")]
    pub max_sequence_idle_microseconds: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelConfig {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub platform: String,
    #[prost(int32, tag = "4")]
    pub max_batch_size: i32,
    #[prost(message, repeated, tag = "5")]
    pub input: Vec<ModelInput>,
    #[prost(message, repeated, tag = "6")]
    pub output: Vec<ModelOutput>,
    #[prost(message, optional, tag = "13")]
    pub sequence_batching: Option<ModelSequenceBatching>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelConfigResponse {
    #[prost(message, optional, tag = "1")]
    pub config: Option<ModelConfig>,
}

/// Triton's `DataType` number of a v2 datatype name.
pub fn data_type(v2: &str) -> i32 {
    match v2 {
        "BOOL" => 1,
        "UINT8" => 2,
        "UINT16" => 3,
        "UINT32" => 4,
        "UINT64" => 5,
        "INT8" => 6,
        "INT16" => 7,
        "INT32" => 8,
        "INT64" => 9,
        "FP16" => 10,
        "FP32" => 11,
        "FP64" => 12,
        "BYTES" => 13,
        _ => 0,
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelStatisticsRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatisticDuration {
    #[prost(uint64, tag = "1")]
    pub count: u64,
    #[prost(uint64, tag = "2")]
    pub ns: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InferStatistics {
    #[prost(message, optional, tag = "1")]
    pub success: Option<StatisticDuration>,
    #[prost(message, optional, tag = "2")]
    pub fail: Option<StatisticDuration>,
    #[prost(message, optional, tag = "3")]
    pub queue: Option<StatisticDuration>,
    #[prost(message, optional, tag = "4")]
    pub compute_input: Option<StatisticDuration>,
    #[prost(message, optional, tag = "5")]
    pub compute_infer: Option<StatisticDuration>,
    #[prost(message, optional, tag = "6")]
    pub compute_output: Option<StatisticDuration>,
    #[prost(message, optional, tag = "7")]
    pub cache_hit: Option<StatisticDuration>,
    #[prost(message, optional, tag = "8")]
    pub cache_miss: Option<StatisticDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelStatistics {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(uint64, tag = "3")]
    pub last_inference: u64,
    #[prost(uint64, tag = "4")]
    pub inference_count: u64,
    #[prost(uint64, tag = "5")]
    pub execution_count: u64,
    #[prost(message, optional, tag = "6")]
    pub inference_stats: Option<InferStatistics>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelStatisticsResponse {
    #[prost(message, repeated, tag = "1")]
    pub model_stats: Vec<ModelStatistics>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RepositoryIndexRequest {
    #[prost(string, tag = "1")]
    pub repository_name: String,
    #[prost(bool, tag = "2")]
    pub ready: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelIndex {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(string, tag = "3")]
    pub state: String,
    #[prost(string, tag = "4")]
    pub reason: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RepositoryIndexResponse {
    #[prost(message, repeated, tag = "1")]
    pub models: Vec<ModelIndex>,
}

/// `RepositoryModelLoadRequest` and `RepositoryModelUnloadRequest` (the
/// same fields this server reads; the load's `parameters`, tag 3, are
/// skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RepositoryModelRequest {
    #[prost(string, tag = "1")]
    pub repository_name: String,
    #[prost(string, tag = "2")]
    pub model_name: String,
}

/// `RepositoryModelLoadResponse`, `RepositoryModelUnloadResponse`, the
/// shared-memory calls' answers: empty.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SystemSharedMemoryStatusRequest {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegionStatus {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub key: String,
    #[prost(uint64, tag = "3")]
    pub offset: u64,
    #[prost(uint64, tag = "4")]
    pub byte_size: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SystemSharedMemoryStatusResponse {
    #[prost(map = "string, message", tag = "1")]
    pub regions: HashMap<String, RegionStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SystemSharedMemoryRegisterRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub key: String,
    #[prost(uint64, tag = "3")]
    pub offset: u64,
    #[prost(uint64, tag = "4")]
    pub byte_size: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SystemSharedMemoryUnregisterRequest {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// Answered done with nothing to undo: no CUDA region is ever registered.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CudaSharedMemoryUnregisterRequest {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// A streamed answer with raw outputs and parameters of every kind
    /// reads back as written; an unknown datatype is Triton's 0 (invalid).
    #[test]
    fn messages_round_trip() {
        let parameters: HashMap<String, InferParameter> = [
            ParameterChoice::Bool(true),
            ParameterChoice::Int64(-4),
            ParameterChoice::Str("region".into()),
            ParameterChoice::Double(0.5),
            ParameterChoice::Uint64(u64::MAX),
        ]
        .into_iter()
        .enumerate()
        .map(|(k, p)| {
            (
                format!("p{k}"),
                InferParameter {
                    parameter_choice: Some(p),
                },
            )
        })
        .collect();
        let answer = ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(ModelInferResponse {
                model_name: "gru".into(),
                model_version: "1".into(),
                id: "7".into(),
                parameters,
                outputs: vec![InferOutputTensor {
                    name: "y".into(),
                    datatype: "FP32".into(),
                    shape: vec![1, 2],
                    ..Default::default()
                }],
                raw_output_contents: vec![[1.0f32, -1.0].iter().flat_map(|x| x.to_le_bytes()).collect()],
            }),
        };
        let bytes = answer.encode_to_vec();
        assert_eq!(ModelStreamInferResponse::decode(&bytes[..]).unwrap(), answer);
        assert!(ModelInferRequest::decode(&[0xff][..]).is_err());
        assert_eq!(data_type("FP32"), 11);
        assert_eq!(data_type("BYTES"), 13);
        assert_eq!(data_type("COMPLEX"), 0);
    }
}
