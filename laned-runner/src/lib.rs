//! Serve many streams through one batched tract state.
//!
//! A [`LanedRunner`] wraps a prepared tract model whose batch symbol sits on
//! axis 0. Each stream [`spawn`](LanedRunner::try_spawn)s a handle holding
//! a lane of one long-lived state; a *turn* runs the model once for every
//! stream with a call queued, one row per stream, and hands each stream back
//! its own row: exactly what the stream would get running alone.
//!
//! ```
//! use std::sync::Arc;
//! use laned_runner::{LanedRunner, Mode, RunnerConfig};
//! use tract_core::internal::*;
//!
//! // [B, 3] * 2: the batch symbol B on axis 0.
//! let mut model = TypedModel::default();
//! let b = model.symbols.sym("B");
//! let x = model.add_source("x", f32::fact(dims!(b, 3)))?;
//! let two = model.add_const("two", tensor2(&[[2f32]]))?;
//! let y = model.wire_node("y", tract_core::ops::math::mul(), &[x, two])?;
//! model.select_output_outlets(&y)?;
//! let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(model)?.into();
//!
//! let runner = LanedRunner::new(plan, RunnerConfig::builder().max_lanes(8).mode(Mode::Combining).build())?;
//! let mut stream = runner.try_spawn()?;
//! let out = stream.run(tvec!(tensor2(&[[1f32, 2., 3.]]).into_tvalue()))?;
//! assert_eq!(*out[0], tensor2(&[[2f32, 4., 6.]]));
//! # Ok::<(), TractError>(())
//! ```
//!
//! Isolation: each call is checked against the model's facts before it is
//! queued; seats disagreeing on shared inputs, resolved symbols or free
//! dims go to different turns instead of failing or mixing; a model whose
//! unbatched output mixes streams is refused; whatever an op does (errs or
//! panics creating its state, resetting a lane or running a turn) fails
//! only the spawn or the seats concerned (their streams are told when their
//! state was lost), and the runner keeps serving. A cancelled call either
//! never ran (`Cancelled`) or completed (its answer), never half of each.

#![warn(missing_docs)]

mod admission;
mod call;
mod cancel;
mod capacity;
mod common;
mod config;
mod context;
mod deadline;
mod deploy;
mod drive;
mod engine;
mod err;
mod explicit;
mod facade;
mod handle;
mod identity;
mod iface;
mod implicit;
mod inbox;
mod life;
mod policy;
mod policy_syntax;
mod protocol;
mod runner;
mod shard;
mod slot;
mod stack;
mod sync;
mod trace;
mod wake;
mod width;
mod wire;

pub use cancel::CancelToken;
pub use capacity::{Capacity, ShardCapacity};
pub use config::{InitialState, Mode, PortRef, RunnerConfig, RunnerConfigBuilder, StatePair, StateSpec};
pub use deploy::{LanedRuntime, LANED_LANES, LANED_LATENCY_BUDGET_US, LANED_MODE, LANED_SHARDS};
pub use err::{EndReason, NewRunnerError, RunError, RunErrorKind, SpawnError};
pub use handle::{LanedStateHandle, Settled};
/// What [`LanedRunner::metrics`] and [`LanedRunner::close`] return: the
/// counters as serde data (from `laned-metrics`, so a caller needs no
/// dependency of its own to name it).
pub use implicit::{ImplicitState, Laned};
pub use laned_metrics::Snapshot;
pub use policy::{ParsePolicyError, PolicyError, TurnPolicy};
pub use runner::{Drained, KeptState, LanedRunner};
pub use width::cheapest_width;
pub use wire::{StateTensor, StreamState, STREAM_STATE_VERSION};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
