//! What a served model's streams say on the wire, behind one interface:
//! [`Protocol`] (one per served model) opens a [`Conversation`] (one per
//! connection), which cuts the client's binary frames into the model's
//! calls and turns each answer into messages. The session
//! (the session (`session/`)) owns everything else (limits, admission, the
//! hand-over, closing) and is the same for every protocol.
//!
//! Two protocols: [`crate::audio::Vad`] (Silero over PCM with speech
//! events, `vad-server`'s) and [`crate::tensor::Tensors`] (any model, a
//! binary frame a pulse, `laned serve`'s).

use axum::extract::ws::Message;
use tract_core::internal::*;

/// A served model's wire protocol.
pub trait Protocol: Send + Sync + 'static {
    /// Its name, as a spec names it (`[model] protocol`) and `GET
    /// /v1/models` lists it: `tensor`, `vad`.
    fn name(&self) -> &'static str;

    /// A connection's conversation, from its query string (`format=`,
    /// say); `Err` is the reason it is refused (closed 1003 after the
    /// upgrade).
    fn open(&self, query: Option<&str>) -> Result<Box<dyn Conversation>, String>;

    /// What a stream feeds and gets, where the protocol carries a model's
    /// tensors as they are (listed by `GET /v1/models`).
    fn interface(&self) -> Option<&laned_models::spec::Interface> {
        None
    }

    /// The largest binary frame a stream ever needs to send, where the
    /// protocol knows it (one pulse, for tensors); `None`: any up to the
    /// server's `max_frame_bytes`.
    fn max_frame_bytes(&self) -> Option<usize> {
        None
    }
}

/// Where a stream opens, as its hello tells the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The chunk (pulse) it resumes at: the client resends from there.
    pub resume: u64,
    /// The stream has an id and the server a store, so it hands over and
    /// checkpoints; the two fields below are set only then.
    pub handing: bool,
    /// The session's generation, on every record it writes: a client
    /// reconnecting sends it back (`x-resume-generation`), so no record
    /// older than what it knew is resumed from.
    pub generation: Option<u64>,
    /// Why a stream the client had started (it sent a generation) starts
    /// again at 0: one of [`crate::handover::RESTARTED`].
    pub restarted: Option<&'static str>,
}

/// One connection's side of a protocol: what it holds between frames
/// (samples not yet a chunk, a chunk's context, hysteresis) and how it
/// answers.
pub trait Conversation: Send + Sync {
    /// The first message after the upgrade, for stream `id` opening as
    /// `opened` says; `None`: none.
    fn hello(&self, id: Option<&str>, opened: &Opened) -> Option<String>;

    /// Take a non-empty binary frame; `Err` is the reason it is refused
    /// (closed 1003).
    fn take(&mut self, frame: &[u8]) -> Result<(), String>;

    /// The next call's inputs, once the frames taken hold one.
    fn next_call(&mut self) -> Option<TVec<TValue>>;

    /// The messages answering call `n` (counted from the stream's start).
    fn answer(&mut self, n: u64, outputs: TVec<TValue>) -> Result<Vec<Message>, String>;

    /// Why a text frame is refused (closed 1003).
    fn text_refused(&self) -> &'static str;

    /// What a record keeps of the conversation beside the model's state.
    fn save(&self) -> serde_json::Map<String, serde_json::Value>;

    /// Continue from what [`Conversation::save`] kept, at position `at`;
    /// `Err` (nothing changed) for fields missing, unknown or out of
    /// range.
    fn restore(&mut self, saved: &serde_json::Map<String, serde_json::Value>, at: u64) -> Result<(), String>;
}

/// The value of `key` in a query string, refused when given twice, so that
/// every bad query is a 1003 close after the upgrade rather than a bare
/// HTTP 400.
pub(crate) fn query_value<'q>(query: Option<&'q str>, key: &str) -> Result<Option<&'q str>, String> {
    let mut values = query
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter(|(k, _)| *k == key)
        .map(|(_, value)| value);
    let first = values.next();
    if values.next().is_some() {
        return Err(format!("{key} given more than once: give it once"));
    }
    Ok(first)
}
