//! The close codes the servers send and the clients read (RFC 6455), by
//! name: the server, `vad-client`, `laned client` and the tests use these,
//! never the bare numbers. The multiplexed front's [`CLOSED`](crate::mux::CLOSED)
//! records carry the same codes, per stream.
//!
//! ```
//! use laned_wire::close;
//!
//! // A client deciding what a close means.
//! let retry_elsewhere = |code: u16| matches!(code, close::RESTART | close::GOING_AWAY);
//! assert!(retry_elsewhere(1012));
//! assert!(!retry_elsewhere(close::TOO_BIG));
//! ```

/// A stream ended as asked: the client's own close, or a multiplexed
/// stream the client ended.
pub const NORMAL: u16 = 1000;
/// The server is going away (SIGTERM, past the drain deadline).
pub const GOING_AWAY: u16 = 1001;
/// A text frame, a frame that is not whole samples (or not one pulse), an
/// unknown format.
pub const UNSUPPORTED: u16 = 1003;
/// The client sent no audio (pings, pongs and empty frames do not count),
/// or took no reply, for `idle_ms` (silent, stalled or gone without a
/// word): its lane goes to others. Also a bad or live stream id, and a
/// flood of frames without audio.
pub const IDLE: u16 = 1008;
/// A frame over the maximum size.
pub const TOO_BIG: u16 = 1009;
/// The runner failed the stream.
pub const INTERNAL: u16 = 1011;
/// The server restarts: the stream's state is handed over, reconnect with
/// the same stream id (to any replica) and resend from the chunk the
/// reason names.
pub const RESTART: u16 = 1012;
/// No lane freed up within the admission wait: try again later.
pub const TRY_AGAIN_LATER: u16 = 1013;
