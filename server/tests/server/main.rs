//! The server crate's integration tests, one binary (tract linked once),
//! a module per topic: the VAD server, the client binary, settings, ping
//! floods, SIGTERM, idle and slow connections, read-ahead memory, what
//! reaches the client when (delivery), HAProxy, the hand-over through
//! Redis and its store under attack, the resume's generation check, and
//! the store on a Redis Cluster.

mod client;
mod cluster;
mod common;
mod delivery;
mod flood;
mod generation;
mod handover;
mod haproxy;
mod readahead;
mod settings;
mod sigterm;
mod slowloris;
mod store;
mod vad;
