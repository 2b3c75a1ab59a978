//! The soak's clients, one module a front, behind one interface: `slot(ctx,
//! slot)` runs streams one after another on that slot (a mux slot: several
//! at once on one connection) until the soak stops starting them, and
//! returns what happened to each ([`Run`](super::stream::Run)). Each
//! follows the front's documented resume rules (docs/protocols.md).

pub mod grpc;
pub mod mux;
pub mod rest;
pub mod ws;

/// A close frame's code and reason, as a client reports what it was told.
pub fn close_said(frame: Option<tokio_tungstenite::tungstenite::protocol::CloseFrame>) -> Option<String> {
    frame.map(|f| format!("{} {}", u16::from(f.code), f.reason))
}
