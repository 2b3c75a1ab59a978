//! `laned serve`'s wire formats, as plain data: what its fronts' bytes
//! mean, shared by the server, its clients (the bench's, the tests') and
//! any Rust client of yours, without the server.
//!
//! A multiplexed message written and read back:
//!
//! ```
//! use laned_wire::mux::{self, Record, OPEN, PULSE};
//!
//! let mut message = Vec::new();
//! mux::put(&mut message, OPEN, 7, &[b"call-7"]);
//! mux::put(&mut message, PULSE, 7, &[&[1, 2, 3, 4]]);
//! let records = mux::records(&message).unwrap();
//! assert_eq!(records[1], Record { kind: PULSE, tag: 7, payload: &[1, 2, 3, 4] });
//!
//! // A message cut inside a record is refused, naming where.
//! let cut = mux::records(&message[..message.len() - 1]).unwrap_err();
//! assert_eq!(cut.to_string(), "record 1 (tag 7) says 4 bytes of payload, 3 follow");
//! ```
//!
//! - [`close`]: the close codes every WebSocket front sends, by name.
//! - [`tensor`]: the single-stream tensor protocol (`GET
//!   /v1/models/NAME/stream`): a binary frame a pulse, its element types
//!   and their widths, an answer's JSON numbers.
//! - [`mux`]: the multiplexed front's records (`GET
//!   /v1/models/NAME/mux`), many streams on one WebSocket.
//! - [`kserve`]: the KServe v2 REST messages' parts that are the format
//!   (datatypes, sequence ids, shapes, JSON tensor data, the binary
//!   extension's header, the extensions listed).
//! - [`grpc`]: the KServe v2 gRPC messages (`inference.GRPCInferenceService`,
//!   with Triton's additions), as prost messages.
//!
//! Std, `serde_json`, `prost` and `half` only: no runtime, no socket, no
//! model. Which requests a model accepts (its ports) is the server's.

#![warn(missing_docs)]

pub mod close;
pub mod grpc;
pub mod kserve;
pub mod mux;
pub mod tensor;
