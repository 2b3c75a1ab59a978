//! The server crate's integration tests, one binary (tract linked once),
//! a module per topic: the VAD server, the client binary, settings, a
//! ping flood, SIGTERM, idle and slow connections, read-ahead memory,
//! HAProxy, the hand-over through Redis.

mod client;
mod common;
mod flood;
mod handover;
mod haproxy;
mod readahead;
mod round_two;
mod settings;
mod sigterm;
mod slowloris;
mod vad;
