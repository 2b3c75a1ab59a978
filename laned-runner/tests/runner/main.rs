//! laned-runner's integration tests, one binary (so tract is linked once
//! for all of them), a module per topic. The real-model modules (Silero,
//! DTLN, openWakeWord) and the facade's are behind their features.

mod async_streams;
mod common;
mod compat;
mod deploy;
mod dtln;
mod equivalence;
mod explicit_state;
mod hostile;
mod lifecycle;
mod metrics_facade;
mod operations;
mod oww;
mod policy;
mod rules;
mod shards;
mod silero;
