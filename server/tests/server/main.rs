//! The server crate's integration tests, one binary (tract linked once),
//! a module per topic: the VAD server, the client binary, settings, ping
//! floods, SIGTERM, idle and slow connections, read-ahead memory, what
//! reaches the client when (delivery), HAProxy, the hand-over through
//! Redis and its store under attack.

mod client;
mod common;
mod delivery;
mod flood;
mod handover;
mod haproxy;
mod readahead;
mod settings;
mod sigterm;
mod slowloris;
mod store;
mod vad;
