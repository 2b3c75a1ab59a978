//! Load for benchmarks, over any tract `Runnable` or a `LanedRunner`: many
//! streams calling one model, measured the same way however they are held.
//! What `laned bench` and the benchmark binaries (`laned-bench`) share.
//!
//! - [`threads`]: streams as threads, closed loop (each calling as soon as
//!   answered) and real time (one pulse per period);
//! - [`tasks`]: the same streams as tokio tasks, the way a server holds
//!   them;
//! - [`Throughput`] and [`Latencies`]: what a closed-loop and a real-time
//!   run found; [`median`] and [`spread`] of repeated runs;
//! - [`process_cpu_time`], [`cpu_time_of`], [`threads_cpu_time`]: the CPU
//!   clocks a run is costed with;
//! - [`search_capacity`]: the most streams a real-time probe accepts;
//! - [`FeedBack`]: a state per stream for an explicit-state model, its
//!   state fed back by hand: the reference a runner is measured against;
//! - [`ideal`]: the ideal loop, the ceiling: the model as given on one
//!   plain batched tract state (no lanes API), its explicit state fed back
//!   by hand, inputs pre-stacked.
//!
//! ```
//! use std::time::Duration;
//!
//! // Two streams, each calling as soon as answered for 50 ms (after one
//! // untimed call): calls per second, all streams together.
//! let run = laned_load::threads::closed_loop(
//!     2,
//!     Duration::from_millis(50),
//!     |_stream| Ok(()),
//!     |_state| Ok(1),
//! )?;
//! assert!(run.per_sec > 0.0);
//!
//! // The most streams (doubling from 8, then bisecting) a probe accepts.
//! let capacity = laned_load::search_capacity(8, 1024, 4, |n| Ok(n <= 100))?;
//! assert!(capacity.streams <= 100);
//! # Ok::<(), tract_core::internal::TractError>(())
//! ```

#![warn(missing_docs)]

mod capacity;
mod cpu;
mod feedback;
pub mod ideal;
mod measure;
mod phase;
pub mod tasks;
pub mod threads;

pub use capacity::{search_capacity, Capacity, Disputed};
pub use cpu::{cpu_time_of, process_cpu_time, threads_cpu_time};
pub use feedback::FeedBack;
pub use measure::{median, spread, Latencies, Throughput};
pub use phase::phase;
