//! laned-runner's integration tests, one binary (so tract is linked once
//! for all of them), a module per topic. The facade's and the tracing
//! events' are behind their features; the real models' tests are laned-models' own.

mod async_streams;
mod common;
mod compat;
mod deploy;
mod equivalence;
mod explicit_state;
mod hostile;
mod implicit_state;
mod metrics_facade;
mod operations;
mod policy;
mod rules;
mod runner_life;
mod shards;
mod stream_life;
mod tracing_events;
mod width;
