//! One WebSocket connection, one laned stream, for any served model: the
//! protocol ([`crate::protocol`]) says what the frames mean; everything
//! else is here and the same for every model.
//!
//! A session's life, in order:
//! 1. Before the upgrade ([`upgrade`]): the protocol opens the
//!    connection's conversation from its query; with a store and a stream
//!    id, the record held for the id is looked up and checked (the
//!    runner's checks, then the protocol's, and against the generation
//!    the client claims, `x-resume-generation`), so that the position the
//!    upgrade's `x-resume-chunk` names is where the stream resumes.
//! 2. Admission ([`Session::admit`]): a refused query closes 1003, a bad
//!    id or claimed generation 1008; during a drain a stream with an id is sent elsewhere
//!    (1012); a second live session of an id is refused (1008); the
//!    protocol's hello goes out (the position a record found resumes at,
//!    the session's generation, why a claimed stream restarted at 0).
//! 3. The lane ([`Session::take_lane`]), at the stream's first non-empty
//!    binary frame, not before: a connection that never sends holds a
//!    connection place (the cap's), never a lane, so idle connections
//!    lock no stream out of the model. A lane is waited for up to
//!    `admission_wait_ms` (1013 past it); a record found is imported.
//! 4. Serving ([`Session::run`]): frames are read, control frames spent
//!    from a budget, binary frames given to the conversation, and every
//!    call it holds run, the socket read ahead (up to
//!    [`crate::READ_AHEAD_BYTES`]) while a call is in flight. Between
//!    calls: a drain hands the stream over (1012; one with no lane yet is
//!    told its position, its record left as found), the idle and
//!    untaken-reply clocks close it (1008, its lane freed first), every
//!    `checkpoint_every` calls a checkpoint is taken.
//! 5. The end: the client's close removes its own record; every other end
//!    sends its close frame from one place ([`close::close_with`]) and
//!    lingers for the reply; dropping the stream frees the lane.
//!
//! A session is one task and its async fns are not cancel-safe (a call
//! dropped mid-way is cancelled, a close dropped mid-way is not sent):
//! nothing races them but the socket's reads (`recv`, cancel-safe), the
//! closing and drain flags (each one wait for the session's life,
//! [`Flag`]) and the call itself, whose drop cancels it and frees nothing
//! early (the runner settles it).
//!
//! What a message costs is kept to the socket's: no timer armed, no
//! receiver cloned, no waiter registered per message (the read's clock is
//! one timer for the session's life, moved; the flags are waited on by one
//! future each), a call's replies fed and flushed once, the send's clock
//! armed only when the write must wait.
//! Nothing here blocks the executor: calls are `call_async`, the store's
//! operations async and bounded, the drain on a blocking thread.

mod close;
mod cost;
pub(crate) mod mux;
mod resume;
pub(crate) mod sequence;

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use laned_runner::{LanedRunner, LanedStateHandle, SpawnError};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;
use tract_core::prelude::{TValue, TVec};

pub(crate) use close::close_with;
use close::refuse_transport_error;
use cost::{too_many_frames, ControlBudget, Taken};
pub use cost::{CONTROL_BURST, CONTROL_PER_SEC};
use resume::{checkpoint, claimed_generation, closed_by_client, look_up, restamp, try_hand_over, Resume};

use crate::handover::{self, Store};
use crate::protocol::{Conversation, Protocol};
use crate::settings::Limits;
use crate::{accept, READ_AHEAD_BYTES};

/// Bytes one read of a connection's socket takes at most. tungstenite
/// zeroes its read buffer's free space before every read
/// (`FrameCodec::read_in`), and a message takes two reads (its frame,
/// then the one that finds nothing more): at its default of 128 KiB that
/// zeroing was a quarter of the server's CPU (BENCHMARKS, 2026-12-06). A
/// pulse of every built-in model fits one read; a larger frame takes
/// several.
pub(crate) const READ_BUFFER: usize = 4 * 1024;

/// Bytes a connection's writes gather before they go out.
const WRITE_BUFFER: usize = 64 * 1024;

/// Bytes a connection's unsent writes may hold at most: past it the client
/// (which is not reading) is dropped.
const MAX_WRITE_BUFFER: usize = 256 * 1024;

/// What every connection of a server shares, whatever its model.
pub(crate) struct Shared {
    /// Read by every session; set at start.
    pub limits: Limits,
    pub prometheus: Option<PrometheusHandle>,
    /// Set when the drain's deadline passes: every session closes 1001.
    pub closing: watch::Receiver<bool>,
    /// Live WebSocket sessions (the accept loop's cap counts them).
    pub live: Arc<AtomicUsize>,
    /// Connections reading their request (not yet sessions).
    pub reading: Arc<AtomicUsize>,
    /// The hand-over store, if one is configured.
    pub store: Option<Arc<Store>>,
    /// Set when the drain starts: streams with an id hand over.
    pub handing_over: watch::Receiver<bool>,
    /// The drain's hand-overs, added to by each session handing over.
    pub tally: Mutex<handover::Tally>,
    /// Checkpoint failures, logged once a second at most.
    pub checkpoint_said: accept::Said,
    /// The store keys of the streams live in a session now: one session
    /// per id and model. Taken at admission, freed by [`LiveId`]'s drop.
    pub live_ids: Mutex<HashSet<String>>,
}

/// One served model: its runner and protocol, and its records' keys.
pub(crate) struct Endpoint {
    /// Its name (`vad` for `vad-server`).
    pub name: String,
    /// Who log lines say they come from.
    pub who: String,
    pub runner: LanedRunner,
    pub protocol: Arc<dyn Protocol>,
    /// The prefix of its streams' keys in the store.
    pub key_prefix: String,
    /// The largest binary frame its streams may send: the protocol's
    /// (a pulse, for tensors), else the server's `max_frame_bytes`.
    pub max_frame_bytes: usize,
}

impl Endpoint {
    /// The store key of stream `id`.
    pub(crate) fn key(&self, id: &str) -> String {
        format!("{}{id}", self.key_prefix)
    }
}

/// Why a stream got no lane: the close code and reason every front maps
/// from (a WebSocket closes with them, a mux stream's closed record
/// carries them, a v2 request answers the matching status).
pub(crate) struct NoLane {
    pub code: u16,
    pub why: String,
}

/// A stream's lane on `endpoint`'s model, waited for up to `wait`, the
/// record it resumes from (if any) imported: the one way every front takes
/// a lane. `handing`: the stream has an id and the server a store (a drain
/// then sends it elsewhere, 1012). Cancel-safe: dropped, it holds nothing.
pub(crate) async fn lane(
    endpoint: &Endpoint,
    wait: Duration,
    handing: bool,
    record: Option<Box<handover::Record>>,
) -> Result<LanedStateHandle, NoLane> {
    let mut handle = match tokio::time::timeout(wait, endpoint.runner.spawn_async()).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            let code = match e {
                SpawnError::Draining | SpawnError::Closed if handing => laned_wire::close::RESTART,
                SpawnError::Draining | SpawnError::Closed => laned_wire::close::GOING_AWAY,
                _ => laned_wire::close::TRY_AGAIN_LATER,
            };
            let why = format!("no lane: {e}");
            return Err(NoLane { code, why });
        }
        Err(_) => {
            let why = format!("no lane freed up within {wait:?}: try again later");
            return Err(NoLane {
                code: laned_wire::close::TRY_AGAIN_LATER,
                why,
            });
        }
    };
    if let Some(record) = record {
        // The record was checked before; an import can only fail now for
        // the runner's end.
        if let Err(e) = handle.import_state_async(&record.state).await {
            let code = if e.end_reason().is_some() {
                laned_wire::close::GOING_AWAY
            } else {
                laned_wire::close::INTERNAL
            };
            let why = format!("resuming: {e}");
            return Err(NoLane { code, why });
        }
        handover::count("laned_resume_total", &endpoint.name, "resumed");
    }
    Ok(handle)
}

/// What a connection says in header `header`, else in its URL parameter
/// `param` (browsers cannot set a WebSocket's headers); `Err` for a header
/// that is not ASCII.
fn header_or_param(
    headers: &axum::http::HeaderMap,
    header: &str,
    query: Option<&str>,
    param: &str,
) -> Result<Option<String>, String> {
    match headers.get(header) {
        Some(v) => Ok(Some(
            v.to_str()
                .map_err(|_| format!("the {header} header is not ASCII"))?
                .to_string(),
        )),
        None => Ok(query
            .unwrap_or("")
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(key, _)| *key == param)
            .map(|(_, value)| value.to_string())),
    }
}

/// The stream id a connection gives: its `x-stream-id` header, else its
/// `stream` URL parameter; `Err` for one that is not an id
/// ([`handover::check_id`]).
fn stream_id_of(headers: &axum::http::HeaderMap, query: Option<&str>) -> Result<Option<String>, String> {
    let id = header_or_param(headers, "x-stream-id", query, "stream")?;
    match id {
        Some(id) => handover::check_id(&id).map(|()| Some(id)),
        None => Ok(None),
    }
}

/// What the upgrade learnt of a connection.
struct Opening {
    conversation: Result<Box<dyn Conversation>, String>,
    id: Result<Option<String>, String>,
    /// The generation the client last knew (`x-resume-generation`), read
    /// with the id.
    claimed: Result<Option<u64>, String>,
    resume: Resume,
}

/// Step 1: the upgrade of a connection to `endpoint`'s model.
pub(crate) async fn upgrade(
    ws: WebSocketUpgrade,
    query: Option<String>,
    headers: axum::http::HeaderMap,
    shared: Arc<Shared>,
    endpoint: Arc<Endpoint>,
) -> Response {
    let mut conversation = endpoint.protocol.open(query.as_deref());
    let id = stream_id_of(&headers, query.as_deref());
    let claimed = claimed_generation(&headers, query.as_deref());
    let resume = match (&shared.store, &id, &claimed, conversation.as_mut()) {
        (Some(store), Ok(Some(id)), Ok(claimed), Ok(conversation)) => {
            look_up(&endpoint, store, (id, *claimed), Some(conversation)).await
        }
        (Some(store), Ok(Some(id)), Ok(claimed), Err(_)) => look_up(&endpoint, store, (id, *claimed), None).await,
        _ => Resume::None,
    };
    let resume_chunk = resume.position();
    // The session's generation ([`handover::Writer::after`]).
    let generation = resume_chunk.map(|_| resume.found_generation().unwrap_or(0).saturating_add(1));
    let opening = Opening {
        conversation,
        id,
        claimed,
        resume,
    };
    // Oversized frames are refused by the session with 1009: the transport
    // itself takes frames up to twice the limit.
    let cap = endpoint.max_frame_bytes.saturating_mul(2).max(1 << 16);
    // The write buffer is bounded: a client that does not read (pongs to a
    // ping flood, replies it never takes) fills it and is dropped, rather
    // than growing the server's memory without end.
    let mut response = ws
        .max_message_size(cap)
        .max_frame_size(cap)
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_write_buffer_size(MAX_WRITE_BUFFER)
        .on_upgrade(move |socket| async move {
            shared.live.fetch_add(1, Ordering::AcqRel);
            let _guard = LiveGuard(shared.clone());
            if let Some(mut session) = Session::admit(socket, shared, endpoint, opening).await {
                session.run().await;
            }
        });
    // Where the client resends from, before any frame: a client reads it
    // off the upgrade (the first message says it too, for browsers).
    if let Some(chunk) = resume_chunk {
        response
            .headers_mut()
            .insert("x-resume-chunk", axum::http::HeaderValue::from(chunk));
    }
    if let Some(generation) = generation {
        response
            .headers_mut()
            .insert("x-resume-generation", axum::http::HeaderValue::from(generation));
    }
    response
}

struct LiveGuard(Arc<Shared>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Frees a stream id (its store key) when its session ends.
pub(crate) struct LiveId(Arc<Shared>, String);

impl Drop for LiveId {
    fn drop(&mut self) {
        self.0
            .live_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

/// What a message read ahead holds: its payload and its place in the
/// queue (so a flood of empty or control frames is bounded too).
fn message_bytes(m: &Message) -> usize {
    let payload = match m {
        Message::Binary(b) => b.len(),
        Message::Text(t) => t.len(),
        Message::Ping(p) | Message::Pong(p) => p.len(),
        Message::Close(_) => 0,
    };
    payload + std::mem::size_of::<Message>()
}

/// A drain flag as a session waits on it: one wait for the session's
/// life, its receiver cloned once, polled by every read and call (not a
/// receiver cloned and a waiter registered and dropped per message).
/// Ready until the session ends once the flag is set or its sender gone.
pub(crate) struct Flag {
    wait: Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
    done: bool,
}

impl Flag {
    pub(crate) fn new(mut rx: watch::Receiver<bool>) -> Flag {
        Flag {
            wait: Box::pin(async move {
                let _ = rx.wait_for(|c| *c).await;
            }),
            done: false,
        }
    }
}

impl Future for Flag {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // The wait is polled to its end once only: ready for good after.
        if !self.done {
            std::task::ready!(self.wait.as_mut().poll(cx));
            self.done = true;
        }
        Poll::Ready(())
    }
}

/// A stream being served: its lane and what it keeps beside it.
pub(crate) struct Stream {
    /// Its lane, from its first pulse on ([`Session::take_lane`]).
    handle: Option<LanedStateHandle>,
    /// The record it resumes from, imported when the lane is taken.
    resume_from: Option<Box<handover::Record>>,
    conversation: Box<dyn Conversation>,
    /// Calls answered: the next call's number.
    chunk: u64,
    /// This session's generation and owner token, on every record it writes.
    writer: handover::Writer,
    /// The last position this session wrote to the store, held while a
    /// write is in flight (a checkpoint's task, a hand-over, a removal):
    /// one write at a time, never an earlier position after a later one.
    written: Arc<tokio::sync::Mutex<Option<u64>>>,
}

/// The session ended (its close, if any, sent).
struct Ended;

/// One admitted connection.
struct Session {
    socket: WebSocket,
    shared: Arc<Shared>,
    endpoint: Arc<Endpoint>,
    /// `None` once the lane is given back (before a close that lingers).
    stream: Option<Stream>,
    /// The stream's id, where it hands over and checkpoints (a store and
    /// an id).
    handing: Option<String>,
    live_id: Option<LiveId>,
    /// A hand-over that failed is not tried again: the stream drains.
    hand_over_failed: bool,
    /// Frames read while a call was in flight, handled in order after it.
    backlog: VecDeque<Message>,
    /// Their bytes, bounded by `READ_AHEAD_BYTES`.
    backlog_bytes: usize,
    /// Only audio moves this on: pings, pongs and empty frames keep no lane.
    idle_until: tokio::time::Instant,
    /// The read's clock, set to each read's deadline (the idle and
    /// untaken-reply clocks, the earlier) by [`Session::next_message`]: one
    /// timer for the session's life, moved later at no cost (a fresh
    /// timeout per read was registered and removed each time).
    read_clock: Pin<Box<tokio::time::Sleep>>,
    /// The drain's two flags ([`Shared::closing`], waited on by every read
    /// and call; [`Shared::handing_over`], by the reads of a stream that
    /// hands over).
    closing: Flag,
    handing_over: Flag,
    budget: ControlBudget,
    taken: Taken,
}

impl Session {
    /// Step 2: admission, or `None` with the connection closed.
    async fn admit(
        mut socket: WebSocket,
        shared: Arc<Shared>,
        endpoint: Arc<Endpoint>,
        opening: Opening,
    ) -> Option<Session> {
        let conversation = match opening.conversation {
            Ok(c) => c,
            Err(why) => {
                close_with(&mut socket, laned_wire::close::UNSUPPORTED, &why).await;
                return None;
            }
        };
        // An id is only read with a store (without one, any header is let
        // through unread).
        let id = match opening.id {
            Ok(id) => id,
            Err(why) if shared.store.is_some() => {
                close_with(&mut socket, laned_wire::close::IDLE, &why).await;
                return None;
            }
            Err(_) => None,
        };
        // A claimed generation likewise (it is read only with an id).
        if let (Err(why), Some(_), Some(_)) = (&opening.claimed, &id, &shared.store) {
            close_with(&mut socket, laned_wire::close::IDLE, why).await;
            return None;
        }
        let handing = id.clone().filter(|_| shared.store.is_some());
        // Draining already: a stream with an id is told to go elsewhere with
        // its record untouched.
        if handing.is_some() && *shared.handing_over.borrow() {
            close_with(&mut socket, laned_wire::close::RESTART, "restarting: resume elsewhere").await;
            return None;
        }
        // One live session per id: a second is refused while the first
        // lives, so that nobody continues (or overwrites) another's stream.
        let live_id = match &handing {
            Some(id) => {
                let key = endpoint.key(id);
                if !shared
                    .live_ids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.clone())
                {
                    let why = format!("stream id {id:?} is live in another session");
                    close_with(&mut socket, laned_wire::close::IDLE, &why).await;
                    return None;
                }
                Some(LiveId(shared.clone(), key))
            }
            None => None,
        };
        // The position a record found resumes at: it was checked before
        // the upgrade (the runner's checks and the protocol's, the
        // conversation restored by the latter); its state goes in with the
        // lane.
        let found = opening.resume.found_generation();
        let restarted = opening.resume.restarted();
        let (chunk, resume_from) = match (opening.resume, &handing) {
            (Resume::From(record), Some(_)) => (record.chunk, Some(record)),
            _ => (0, None),
        };
        let admitted = (conversation, chunk, resume_from);
        Session::serving(socket, shared, endpoint, admitted, (found, restarted), handing, live_id).await
    }

    /// Step 3: the stream's lane, taken at its first pulse (waited for up
    /// to `admission_wait_ms`), its record imported; `Err` with the
    /// session closed.
    async fn take_lane(&mut self) -> Result<(), Ended> {
        let wait = Duration::from_millis(self.shared.limits.admission_wait_ms);
        let record = self.stream.as_mut().expect("serving").resume_from.take();
        let taken = tokio::select! {
            r = lane(&self.endpoint, wait, self.handing.is_some(), record) => r,
            _ = &mut self.closing => {
                return self.refuse(laned_wire::close::GOING_AWAY, "the server is shutting down").await;
            }
        };
        match taken {
            Ok(handle) => {
                self.stream.as_mut().expect("serving").handle = Some(handle);
                Ok(())
            }
            Err(NoLane { code, why }) => self.refuse(code, &why).await,
        }
    }

    /// Admitted: the hello sent, the session ready to serve.
    async fn serving(
        mut socket: WebSocket,
        shared: Arc<Shared>,
        endpoint: Arc<Endpoint>,
        (conversation, chunk, resume_from): (Box<dyn Conversation>, u64, Option<Box<handover::Record>>),
        (found, restarted): (Option<u64>, Option<&'static str>),
        handing: Option<String>,
        live_id: Option<LiveId>,
    ) -> Option<Session> {
        let writer = handover::Writer::after(found);
        let opened = crate::protocol::Opened {
            resume: chunk,
            handing: handing.is_some(),
            generation: handing.as_ref().map(|_| writer.generation),
            restarted: handing.as_ref().and(restarted),
        };
        if let Some(hello) = conversation.hello(handing.as_deref(), &opened) {
            if socket.send(Message::Text(hello.into())).await.is_err() {
                return None;
            }
        }
        let idle = Duration::from_millis(shared.limits.idle_ms);
        let idle_until = tokio::time::Instant::now() + idle;
        let session = Session {
            socket,
            stream: Some(Stream {
                handle: None,
                resume_from,
                conversation,
                chunk,
                writer,
                written: Arc::new(tokio::sync::Mutex::new(None)),
            }),
            handing,
            live_id,
            hand_over_failed: false,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            idle_until,
            read_clock: Box::pin(tokio::time::sleep_until(idle_until)),
            closing: Flag::new(shared.closing.clone()),
            handing_over: Flag::new(shared.handing_over.clone()),
            budget: ControlBudget::new(),
            taken: Taken::new(idle),
            shared,
            endpoint,
        };
        // The record resumed from, this session's own from now on.
        if let (Some(store), Some(id), Some(stream)) = (&session.shared.store, &session.handing, &session.stream) {
            restamp((&session.shared, &session.endpoint), store, id, stream);
        }
        Some(session)
    }

    fn idle(&self) -> Duration {
        Duration::from_millis(self.shared.limits.idle_ms)
    }

    fn stream(&self) -> &Stream {
        self.stream.as_ref().expect("the stream lives while the session serves")
    }

    /// Closes the session with `code`: the lane goes back first (a client
    /// that does not read may never answer the close).
    async fn end<T>(&mut self, code: u16, why: &str) -> Result<T, Ended> {
        drop(self.stream.take());
        close_with(&mut self.socket, code, why).await;
        Err(Ended)
    }

    /// Closes the session with `code`, the lane held until the close is
    /// done (where the stream ends because the client erred).
    async fn refuse<T>(&mut self, code: u16, why: &str) -> Result<T, Ended> {
        close_with(&mut self.socket, code, why).await;
        Err(Ended)
    }

    /// Step 3: serve until the session ends.
    async fn run(&mut self) {
        while self.serve_one().await.is_ok() {}
    }

    /// A hand-over, if the drain has started and none failed yet.
    async fn hand_over_if_draining(&mut self) -> Result<(), Ended> {
        // Looked at before anything is cloned: this runs twice a message.
        if self.hand_over_failed || self.handing.is_none() || !*self.shared.handing_over.borrow() {
            return Ok(());
        }
        let (Some(store), Some(id)) = (self.shared.store.clone(), self.handing.clone()) else {
            return Ok(());
        };
        let shared = self.shared.clone();
        let endpoint = self.endpoint.clone();
        let stream = self.stream.as_ref().expect("serving");
        if try_hand_over(
            &mut self.socket,
            (&shared, &endpoint),
            &store,
            (&id, &mut self.live_id),
            stream,
        )
        .await
        {
            return Err(Ended);
        }
        self.hand_over_failed = true;
        Ok(())
    }

    /// The idle and untaken-reply clocks: checked here too, not only by the
    /// read's clock (looked at only when the read is pending, and a flood
    /// of pings keeps the read ready).
    async fn clocks(&mut self) -> Result<(), Ended> {
        if tokio::time::Instant::now() >= self.idle_until {
            let why = format!("no audio for {:?}: the lane goes to others", self.idle());
            return self.end(laned_wire::close::IDLE, &why).await;
        }
        self.untaken().await
    }

    async fn untaken(&mut self) -> Result<(), Ended> {
        if self.taken.overdue() {
            let why = format!("replies untaken for {:?}: the lane goes to others", self.idle());
            return self.end(laned_wire::close::IDLE, &why).await;
        }
        Ok(())
    }

    /// The next message: from the backlog, else read (up to the clocks).
    async fn next_message(&mut self) -> Result<Option<Option<Result<Message, axum::Error>>>, Ended> {
        if let Some(m) = self.backlog.pop_front() {
            self.backlog_bytes -= message_bytes(&m);
            return Ok(Some(Some(Ok(m))));
        }
        let read_until = self
            .taken
            .deadline()
            .map_or(self.idle_until, |d| d.min(self.idle_until));
        // Moved only when the deadline moves (audio moves it later: no
        // re-registration; a pong taken moves it earlier, which re-registers).
        if self.read_clock.deadline() != read_until {
            self.read_clock.as_mut().reset(read_until);
        }
        let watching = self.handing.is_some() && !self.hand_over_failed;
        let Session {
            socket,
            read_clock,
            closing,
            handing_over,
            ..
        } = self;
        // The read before its clock, as a timeout polls them: a message
        // that has come is taken whatever the clock says. `None`: the
        // clock ran out.
        let read = std::future::poll_fn(|cx| {
            if let Poll::Ready(m) = socket.poll_next_unpin(cx) {
                return Poll::Ready(Some(m));
            }
            read_clock.as_mut().poll(cx).map(|()| None)
        });
        tokio::select! {
            m = read => Ok(m),
            _ = closing => {
                self.refuse(laned_wire::close::GOING_AWAY, "the server is shutting down").await
            }
            // Handed over at the loop's top (a flag dropped unset, the
            // server gone, is not waited on again).
            _ = handing_over, if watching => {
                self.hand_over_failed |= !*self.shared.handing_over.borrow();
                Ok(None)
            }
        }
    }

    /// One message read and served.
    async fn serve_one(&mut self) -> Result<(), Ended> {
        self.hand_over_if_draining().await?;
        self.clocks().await?;
        // `None`: a clock ran out or the drain started; the next turn of
        // the loop says which.
        let Some(msg) = self.next_message().await? else {
            return Ok(());
        };
        let max = self.endpoint.max_frame_bytes;
        let bytes = match msg {
            // Gone: dropping the handle frees the lane.
            None => return Err(Ended),
            Some(Err(e)) => {
                refuse_transport_error(&mut self.socket, e, max).await;
                return Err(Ended);
            }
            Some(Ok(Message::Close(_))) => return self.closed_by_client().await,
            Some(Ok(m @ (Message::Ping(_) | Message::Pong(_)))) => {
                if matches!(m, Message::Pong(_)) {
                    self.taken.ponged();
                }
                if !self.budget.spend() {
                    return self.refuse(laned_wire::close::IDLE, &too_many_frames()).await;
                }
                return Ok(());
            }
            Some(Ok(Message::Text(_))) => {
                let why = self.stream().conversation.text_refused();
                return self.refuse(laned_wire::close::UNSUPPORTED, why).await;
            }
            Some(Ok(Message::Binary(b))) => b,
        };
        if bytes.len() > max {
            let why = format!("frame of {} bytes over the {max}-byte limit", bytes.len());
            return self.refuse(laned_wire::close::TOO_BIG, &why).await;
        }
        if bytes.is_empty() {
            if !self.budget.spend() {
                return self.refuse(laned_wire::close::IDLE, &too_many_frames()).await;
            }
            return Ok(());
        }
        let taken = self.stream.as_mut().expect("serving").conversation.take(&bytes);
        if let Err(why) = taken {
            return self.refuse(laned_wire::close::UNSUPPORTED, &why).await;
        }
        // A frame refused takes no lane: the lane after the frame's check.
        if self.stream().handle.is_none() {
            self.take_lane().await?;
        }
        // The idle clock from the lane on: the wait for it is no idleness
        // (a stream that waited `idle` for its lane is not closed at once).
        self.idle_until = tokio::time::Instant::now() + self.idle();
        self.serve_calls().await
    }

    async fn closed_by_client<T>(&mut self) -> Result<T, Ended> {
        let handing = match (&self.shared.store, &self.handing) {
            (Some(store), Some(id)) => Some((store, self.endpoint.key(id))),
            _ => None,
        };
        let stream = self.stream.as_ref().expect("serving");
        closed_by_client(&mut self.socket, handing, stream).await;
        Err(Ended)
    }

    /// Every call the conversation holds, each answered in order.
    async fn serve_calls(&mut self) -> Result<(), Ended> {
        loop {
            // Between calls: a drain hands over here (the client resends
            // what is left from the position the close names).
            self.hand_over_if_draining().await?;
            self.untaken().await?;
            let Some(inputs) = self.stream.as_mut().expect("serving").conversation.next_call() else {
                return Ok(());
            };
            let out = self.call(inputs).await?;
            let stream = self.stream.as_mut().expect("serving");
            let n = stream.chunk;
            stream.chunk += 1;
            let mut replies = match stream.conversation.answer(n, out) {
                Ok(replies) => replies,
                Err(why) => {
                    return self
                        .end(laned_wire::close::INTERNAL, &format!("answering: {why}"))
                        .await
                }
            };
            replies.extend(self.taken.ping(n));
            self.send(replies).await?;
            let every = self.shared.limits.checkpoint_every;
            if let (Some(store), Some(id)) = (&self.shared.store, &self.handing) {
                let stream = self.stream();
                if every > 0 && stream.chunk.is_multiple_of(every) {
                    checkpoint((&self.shared, &self.endpoint), store, id, stream).await;
                }
            }
        }
    }

    /// A call's replies, in order: each fed, then one flush (a write for
    /// all). A client not taking its replies stalls the writes once the
    /// buffers fill: past `idle`, it is dropped (no close frame could reach
    /// it either). The clock is armed only when the writes must wait.
    async fn send(&mut self, replies: Vec<Message>) -> Result<(), Ended> {
        let idle = self.idle();
        let socket = &mut self.socket;
        let send = async move {
            for r in replies {
                socket.feed(r).await?;
            }
            socket.flush().await
        };
        let mut send = std::pin::pin!(send);
        let sent = match std::future::poll_fn(|cx| Poll::Ready(send.as_mut().poll(cx))).await {
            Poll::Ready(r) => r.is_ok(),
            Poll::Pending => matches!(tokio::time::timeout(idle, send).await, Ok(Ok(()))),
        };
        if sent {
            Ok(())
        } else {
            Err(Ended)
        }
    }

    /// One call, the socket read meanwhile: a client gone drops the call
    /// (cancelled) and frees its lane at once.
    async fn call(&mut self, inputs: TVec<TValue>) -> Result<TVec<TValue>, Ended> {
        let max = self.endpoint.max_frame_bytes;
        let Session {
            socket,
            stream,
            backlog,
            backlog_bytes,
            closing,
            ..
        } = self;
        let stream = stream.as_mut().expect("serving");
        enum Read {
            Gone,
            Failed(axum::Error),
            Close,
            Closing,
        }
        let out = {
            let handle = stream.handle.as_mut().expect("a call is made with the lane taken");
            let call = handle.call_async(inputs);
            tokio::pin!(call);
            loop {
                tokio::select! {
                    r = &mut call => break Ok(r),
                    m = socket.recv(), if *backlog_bytes < READ_AHEAD_BYTES => match m {
                        None => break Err(Read::Gone),
                        Some(Err(e)) => break Err(Read::Failed(e)),
                        Some(Ok(Message::Close(_))) => break Err(Read::Close),
                        Some(Ok(m)) => {
                            *backlog_bytes += message_bytes(&m);
                            backlog.push_back(m);
                        }
                    },
                    _ = &mut *closing => break Err(Read::Closing),
                }
            }
        };
        match out {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => {
                let code = if e.end_reason().is_some() {
                    laned_wire::close::GOING_AWAY
                } else {
                    laned_wire::close::INTERNAL
                };
                self.refuse(code, &format!("stream ended: {e}")).await
            }
            Err(Read::Gone) => Err(Ended),
            Err(Read::Failed(e)) => {
                refuse_transport_error(&mut self.socket, e, max).await;
                Err(Ended)
            }
            Err(Read::Close) => {
                self.closed_by_client().await?;
                Err(Ended)
            }
            Err(Read::Closing) => {
                self.refuse(laned_wire::close::GOING_AWAY, "the server is shutting down")
                    .await?;
                Err(Ended)
            }
        }
    }
}
