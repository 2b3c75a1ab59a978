//! The server crate's integration tests, one binary (tract linked once),
//! a module per topic: the VAD server, the client binary, settings, a
//! ping flood, SIGTERM, HAProxy.

mod client;
mod common;
mod flood;
mod haproxy;
mod settings;
mod sigterm;
mod vad;
