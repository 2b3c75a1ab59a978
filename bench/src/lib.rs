//! The benchmark binaries' shared parts, behind `cargo xtask bench`. One
//! closed loop and one real-time driver serve every model and system; they
//! are `laned_load`'s (shared with `laned bench`), re-exported here:
//!
//! - [`load`]: streams as threads (closed loop, real time), the two
//!   references (a state per stream, the ideal loop) on the testkit's
//!   fixtures, the CPU clocks and the capacity search;
//! - [`searches`]: several capacity searches per system, interleaved, and
//!   their median as the model benches print it;
//! - [`tasks`]: the same streams as tokio tasks, as a server holds them;
//! - [`report`]: what a run found (`report.json`), the machine it ran on,
//!   the markdown tables, and `--compare` of two reports;
//! - [`plot`]: the SVG plots (plotters);
//! - [`progress`]: the progress bar of long runs (indicatif);
//! - [`cli`]: the flags the model benches share;
//! - [`feedback`]: a state per stream for an explicit-state model, its
//!   state fed back by hand.
//!
//! ```no_run
//! use laned_bench::load;
//! // The most streams (doubling from 8, then bisecting) a probe accepts.
//! let capacity = load::search_capacity(8, 1024, 4, |n| Ok(n <= 100)).unwrap();
//! assert!(capacity.streams <= 100);
//! ```

#![warn(missing_docs)]

pub mod cli;
pub mod load;
pub mod plot;
pub mod progress;
pub mod report;
pub mod searches;

pub use laned_load::{feedback, tasks};

/// The workspace README's examples, compiled and run as doc tests here
/// (this crate has the testkit and tokio they use).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct WorkspaceReadme;
