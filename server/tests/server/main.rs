//! The server crate's integration tests, one binary (tract linked once),
//! a module per topic: the VAD server and client, SIGTERM, HAProxy.

mod common;
mod haproxy;
mod sigterm;
mod vad;
