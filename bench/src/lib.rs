//! The benchmark binaries' shared parts, behind `cargo xtask bench`. One
//! closed loop and one real-time driver serve every model and system; they
//! are `laned_load`'s (shared with `laned bench`, with the measures, the
//! CPU clocks, the capacity search, the tasks and `FeedBack`); here:
//!
//! - [`load`]: the two references (a state per stream, the ideal loop) and
//!   streams through any runnable, on the testkit's fixtures;
//! - [`searches`]: several capacity searches per system, interleaved, and
//!   their median as the model benches print it;
//! - [`report`]: what a run found (`report.json`), the machine it ran on,
//!   the markdown tables, and `--compare` of two reports;
//! - [`plot`]: the SVG plots (plotters);
//! - [`progress`]: the progress bar of long runs (indicatif);
//! - [`cli`]: the flags the model benches share.

#![warn(missing_docs)]

pub mod cli;
pub mod load;
pub mod plot;
pub mod progress;
pub mod report;
pub mod searches;

/// The workspace README's examples, compiled and run as doc tests here
/// (this crate has the testkit and tokio they use).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct WorkspaceReadme;

/// The library guide's examples (`docs/library.md`), compiled and run as
/// doc tests here, as the README's are.
#[cfg(doctest)]
#[doc = include_str!("../../docs/library.md")]
struct LibraryGuide;
