//! laned's servers: one WebSocket connection, one laned stream, through
//! the hardened session every served model shares (limits, admission,
//! drain, Redis hand-over, crash resume, probes). In a library so that
//! tests start them in-process on `127.0.0.1:0`, and `laned serve` is
//! built on the same code.
//!
//! - `vad-server` ([`start`]): Silero VAD at `GET /v1/vad`; binary frames
//!   of 16 kHz mono PCM (little-endian `f32`, or `i16` with
//!   `?format=i16`) of any length, cut into 512-sample chunks (keeping
//!   the model's 64-sample context), each answered `{"chunk": n,
//!   "probability": p}`, plus `{"event": "speech_start" | "speech_end",
//!   "chunk": n}` with hysteresis ([`audio`]).
//! - `laned serve` ([`start_models`]): any models, each at
//!   `GET /v1/models/{name}/stream`, a binary frame a pulse ([`tensor`]),
//!   listed at `GET /v1/models`.
//!
//! Files by job: [`settings`] (what a server is told), [`protocol`] (what
//! frames mean, per model: [`audio`], [`tensor`]), `session` (one
//! connection's life, the same for every model, and the multiplexed
//! front's), [`handover`] (the store), `accept` (the accept loop, the
//! cap, the probes), `server` (the routes, the listeners, the drain),
//! `routes` (what every route's handler shares: the served models, the
//! readiness), [`kserve`] and `v2` (the KServe v2 REST front's request
//! check and routes, Triton's sequences a laned stream each), `grpc` (the
//! same over gRPC, with Triton's streams), [`web`] (`laned serve --web`'s
//! microphone page); `testing` (hidden: the fixtures this crate's and the
//! `laned` tool's tests share).
//!
//! The bytes of every front (the close codes, the multiplexed records, the
//! tensor protocol's framing, the KServe v2 messages) are
//! [`laned_wire`]'s, which clients use without this crate.

mod accept;
pub mod audio;
pub mod grpc;
pub mod handover;
pub mod kserve;
pub mod protocol;
mod routes;
mod server;
mod session;
pub mod settings;
mod shm;
mod stats;
pub mod tensor;
#[doc(hidden)]
pub mod testing;
mod v2;
pub mod web;

pub use accept::{open_files_limit, PROBE_RESERVE};
pub use audio::{Event, Format, Hysteresis, END_THRESHOLD, MIN_SILENCE_MS, START_THRESHOLD};
pub use server::{check_name, install_prometheus, start, start_models, start_models_with, Extras, Served, Server};
pub use session::{CONTROL_BURST, CONTROL_PER_SEC};
pub use settings::{load_plan, model_file, parse_policy, Limits, Settings};

/// Bytes of frames read ahead while a call is in flight: the reading
/// waits once this much is held (so at most this plus one frame).
pub const READ_AHEAD_BYTES: usize = 64 * 1024;

/// Connections beyond the lanes the default cap allows.
pub const CONNECTION_MARGIN: usize = 64;

/// Connections the probe address serves at once; past it, a new one
/// takes the place of the oldest.
pub const PROBE_PLACES: usize = 64;
