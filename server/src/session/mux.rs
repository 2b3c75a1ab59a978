//! One multiplexed connection: many streams of one model on one WebSocket
//! (the bytes: [`laned_wire::mux`]). Each stream is what a single-stream
//! session's is (a lane from its first pulse, its record, its checkpoints
//! and its hand-over); the connection is one task that reads records,
//! starts each stream's next call, and writes every answer ready at once
//! as one message.
//!
//! A connection's life, in order:
//! 1. The upgrade ([`upgrade`]): a connection place is counted; the
//!    hello goes out.
//! 2. Opening a stream (an [`mux::OPEN`] record): its tag checked (not
//!    open already, under [`mux::MAX_STREAMS`]), its id checked and taken
//!    (one live stream per id, as on the single-stream front); with a
//!    store and an id, its record is looked up off the connection's path
//!    (an event), and [`mux::OPENED`] says where it resumes.
//! 3. Serving: each stream has at most one operation in flight (its
//!    lookup, or its next call, which takes its lane first where it has
//!    none, waited for up to `admission_wait_ms`, the record found
//!    imported); its pulses queue (up to [`mux::MAX_QUEUED`]) meanwhile.
//!    After each read or event, every event already done is taken too, the
//!    next calls started, and every record produced written as one message.
//!    A stream without a pulse for `idle_ms` is closed 1008; every
//!    `checkpoint_every` calls of a stream with an id a checkpoint is
//!    taken.
//! 4. The drain: each stream with an id is handed over between its calls
//!    (1012, the chunk to resume from in its reason; one without a lane
//!    yet is told its position, its record left as found; one whose model's
//!    state stays in its ops restarts at 0); the others are served until
//!    the deadline (1001 for the connection). Once every stream is gone,
//!    the connection closes 1012.
//! 5. The end: the client's close ends every stream (their records
//!    removed, as a clean close does); any other end drops them (records
//!    kept, for a reconnect to resume); dropping a stream frees its lane,
//!    a call in flight first running out (its answer dropped).
//!
//! The task's `select!` arms are cancel-safe: the socket's `recv`, the
//! watch flags' `wait_for`, the events' `next` and an interval's tick.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use laned_models::spec::Interface;
use laned_runner::LanedStateHandle;
use laned_wire::{close, mux};
use serde_json::json;
use tokio::time::Instant;
use tract_core::prelude::{TValue, TVec};

use super::resume::{hand_over_stream, look_up, Resume};
use super::{close_with, Endpoint, LiveGuard, LiveId, Shared, Stream, MAX_WRITE_BUFFER, READ_BUFFER, WRITE_BUFFER};
use crate::handover::{self, Record};

/// How often the idle clock is read.
const IDLE_TICK: Duration = Duration::from_millis(100);

/// Step 1: the upgrade of a multiplexed connection to `endpoint`'s model.
pub(crate) async fn upgrade(ws: WebSocketUpgrade, shared: Arc<Shared>, endpoint: Arc<Endpoint>) -> Response {
    let Some(interface) = endpoint.protocol.interface().cloned() else {
        return (
            axum::http::StatusCode::NOT_FOUND,
            format!(
                "model {:?} is not served in the tensor protocol: it has no mux\n",
                endpoint.name
            ),
        )
            .into_response();
    };
    let cap = mux::max_message_bytes(interface.pulse_bytes());
    // One message out at a time, each at most MAX_OUT_MESSAGE or one record.
    let largest_out = mux::MAX_OUT_MESSAGE.max(mux::HEADER_BYTES + 8 + interface.answer_len());
    // Reads of 4 KiB at most, as the single-stream front's (tungstenite
    // zeroes its whole read buffer before each read).
    ws.max_message_size(cap)
        .max_frame_size(cap)
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_write_buffer_size(MAX_WRITE_BUFFER.max(2 * largest_out + WRITE_BUFFER))
        .on_upgrade(move |socket| async move {
            shared.live.fetch_add(1, Ordering::AcqRel);
            let _guard = LiveGuard(shared.clone());
            Connection::new(socket, shared, endpoint, interface).serve().await;
        })
}

/// What an operation in flight gives back.
enum Event {
    /// Stream `tag`'s record looked up.
    Looked { tag: u32, serial: u64, resume: Resume },
    /// Stream `tag`'s call done: its lane back with the outputs, or the
    /// close it ends with (its lane, if it had one, dropped).
    Called {
        tag: u32,
        serial: u64,
        done: Result<(LanedStateHandle, TVec<TValue>), (u16, String)>,
    },
}

type Pending = Pin<Box<dyn Future<Output = Event> + Send>>;

/// One stream of the connection.
struct MuxStream {
    /// Which opening of its tag this is: an event of an earlier one is
    /// dropped.
    serial: u64,
    stream: Stream,
    /// Its id, where it hands over (a store and an id).
    handing: Option<String>,
    live_id: Option<LiveId>,
    /// Pulses received, not yet called.
    queue: VecDeque<Vec<u8>>,
    /// An operation in flight (its lane, if any, is in it).
    busy: bool,
    /// Its lookup answered ([`mux::OPENED`] sent).
    opened: bool,
    /// Its hand-over failed: it drains as without a store.
    hand_over_failed: bool,
    /// Its last pulse (or its opening).
    last: Instant,
}

/// One multiplexed connection.
struct Connection {
    socket: WebSocket,
    shared: Arc<Shared>,
    endpoint: Arc<Endpoint>,
    interface: Interface,
    streams: HashMap<u32, MuxStream>,
    pending: FuturesUnordered<Pending>,
    /// Records to write, as messages of at most [`mux::MAX_OUT_MESSAGE`].
    out: Vec<Vec<u8>>,
    /// Bytes of pulses queued over every stream (bounded by
    /// [`mux::queue_budget`]: past it, no message is read).
    queued_bytes: usize,
    /// Records removed after a client's end, still being written
    /// (bounded: an open past [`mux::MAX_STREAMS`] of them is refused).
    removals: Arc<std::sync::atomic::AtomicUsize>,
    /// Since when no stream has been open.
    empty_since: Instant,
    serials: u64,
    draining: bool,
    /// The tags not open that the message being read named (each said
    /// closed once a message; past [`mux::MAX_STREAMS`] of them the
    /// connection is closed 1008): the replies a message can draw stay
    /// bounded.
    not_open: std::collections::HashSet<u32>,
}

/// How the connection ends.
struct Ended;

impl Connection {
    fn new(socket: WebSocket, shared: Arc<Shared>, endpoint: Arc<Endpoint>, interface: Interface) -> Connection {
        Connection {
            socket,
            shared,
            endpoint,
            interface,
            streams: HashMap::new(),
            pending: FuturesUnordered::new(),
            out: Vec::new(),
            queued_bytes: 0,
            removals: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            empty_since: Instant::now(),
            serials: 0,
            draining: false,
            not_open: std::collections::HashSet::new(),
        }
    }

    fn idle(&self) -> Duration {
        Duration::from_millis(self.shared.limits.idle_ms)
    }

    /// Steps 1 to 5.
    async fn serve(mut self) {
        let i = &self.interface;
        let mut hello = json!({
            "protocol": laned_wire::tensor::PROTOCOL_VERSION,
            "mux": mux::MUX_VERSION,
            "model": self.endpoint.name,
            "inputs": i.inputs,
            "outputs": i.outputs,
            "pulse_bytes": i.pulse_bytes(),
            "answer_bytes": i.answer_len(),
            "max_streams": mux::MAX_STREAMS,
            "max_queued": mux::MAX_QUEUED,
            "max_message_bytes": mux::max_message_bytes(i.pulse_bytes()),
        });
        if let Some(audio) = &i.audio {
            hello["audio"] = json!(audio);
        }
        if self.socket.send(Message::Text(hello.to_string().into())).await.is_err() {
            return;
        }
        let mut closing = self.shared.closing.clone();
        let mut handing_over = self.shared.handing_over.clone();
        let mut tick = tokio::time::interval(IDLE_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let budget = mux::queue_budget(self.interface.pulse_bytes());
        loop {
            let reading = self.queued_bytes < budget;
            let step = tokio::select! {
                m = self.socket.recv(), if reading => self.read(m).await,
                Some(event) = self.pending.next(), if !self.pending.is_empty() => {
                    self.event(event).await;
                    Ok(())
                }
                // (The flags' guards are dropped inside: they are not Send.)
                _ = async { let _ = closing.wait_for(|c| *c).await; } => {
                    close_with(&mut self.socket, close::GOING_AWAY, "the server is shutting down").await;
                    Err(Ended)
                }
                _ = async { let _ = handing_over.wait_for(|h| *h).await; }, if !self.draining => {
                    self.draining = true;
                    Ok(())
                }
                                _ = tick.tick() => self.idle_streams().await,
            };
            if step.is_err() {
                return;
            }
            // Every event done by now goes in the same message.
            while let Some(Some(event)) = self.pending.next().now_or_never() {
                self.event(event).await;
            }
            if self.draining {
                self.hand_over_between_calls().await;
            }
            self.start_calls();
            if self.flush().await.is_err() {
                return;
            }
            if self.draining && self.streams.is_empty() {
                close_with(
                    &mut self.socket,
                    close::RESTART,
                    "restarting: every stream handed over or gone",
                )
                .await;
                return;
            }
        }
    }

    /// One message from the client.
    async fn read(&mut self, m: Option<Result<Message, axum::Error>>) -> Result<(), Ended> {
        let bytes = match m {
            None => return Err(Ended),
            Some(Err(e)) => {
                let max = mux::max_message_bytes(self.interface.pulse_bytes());
                super::close::refuse_transport_error(&mut self.socket, e, max).await;
                return Err(Ended);
            }
            Some(Ok(Message::Close(_))) => {
                self.closed_by_client();
                // Bounded: a client that reads nothing must not hold the
                // connection.
                let reply = futures_util::SinkExt::close(&mut self.socket);
                let _ = tokio::time::timeout(Duration::from_secs(1), reply).await;
                return Err(Ended);
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => return Ok(()),
            Some(Ok(Message::Text(_))) => {
                let why = "text messages are not records: send binary messages of records";
                close_with(&mut self.socket, close::UNSUPPORTED, why).await;
                return Err(Ended);
            }
            Some(Ok(Message::Binary(b))) => b,
        };
        let records = match mux::records(&bytes) {
            Ok(r) => r,
            Err(why) => {
                close_with(&mut self.socket, close::UNSUPPORTED, &why.to_string()).await;
                return Err(Ended);
            }
        };
        if let Some(r) = records
            .iter()
            .find(|r| ![mux::OPEN, mux::PULSE, mux::END].contains(&r.kind))
        {
            let why = format!("a record of unknown kind {} (tag {})", r.kind, r.tag);
            close_with(&mut self.socket, close::UNSUPPORTED, &why).await;
            return Err(Ended);
        }
        self.not_open.clear();
        for r in records {
            match r.kind {
                mux::OPEN => self.open(r.tag, r.payload),
                mux::PULSE => self.pulses(r.tag, r.payload),
                _ => self.end_by_client(r.tag),
            }
            if self.not_open.len() > mux::MAX_STREAMS {
                let why = format!(
                    "one message named more than {} tags not open: the most a connection can have open",
                    mux::MAX_STREAMS
                );
                close_with(&mut self.socket, close::IDLE, &why).await;
                return Err(Ended);
            }
        }
        Ok(())
    }

    /// A record to write, in the last message unless that would pass
    /// [`mux::MAX_OUT_MESSAGE`].
    fn put(&mut self, kind: u8, tag: u32, payload: &[&[u8]]) {
        let len = mux::HEADER_BYTES + payload.iter().map(|p| p.len()).sum::<usize>();
        match self.out.last_mut() {
            Some(last) if last.len() + len <= mux::MAX_OUT_MESSAGE => mux::put(last, kind, tag, payload),
            _ => {
                let mut message = Vec::with_capacity(len.min(mux::MAX_OUT_MESSAGE));
                mux::put(&mut message, kind, tag, payload);
                self.out.push(message);
            }
        }
    }

    /// A [`mux::CLOSED`] record for `tag`.
    fn say_closed(&mut self, tag: u32, code: u16, why: &str) {
        self.put(mux::CLOSED, tag, &[&code.to_le_bytes(), why.as_bytes()]);
    }

    /// A record named `tag`, not open: said closed 1008, once a message.
    fn not_open(&mut self, tag: u32) {
        if self.not_open.insert(tag) {
            self.say_closed(tag, close::IDLE, &format!("stream tag {tag} is not open"));
        }
    }

    /// Removes stream `tag`, its queue's bytes given back.
    fn remove(&mut self, tag: u32) -> Option<MuxStream> {
        let s = self.streams.remove(&tag)?;
        self.queued_bytes -= s.queue.iter().map(Vec::len).sum::<usize>();
        if self.streams.is_empty() {
            self.empty_since = Instant::now();
        }
        Some(s)
    }

    /// Stream `tag` closed with `code`: its lane freed (a call in flight
    /// first runs out), its id free again.
    fn close_stream(&mut self, tag: u32, code: u16, why: &str) {
        self.remove(tag);
        self.say_closed(tag, code, why);
    }

    /// Step 2.
    fn open(&mut self, tag: u32, payload: &[u8]) {
        if self.streams.contains_key(&tag) {
            self.close_stream(
                tag,
                close::IDLE,
                &format!("stream tag {tag} was opened again while open"),
            );
            return;
        }
        // Streams closed while a call of theirs runs, and records being
        // removed, count too: a client opening and ending streams in a
        // loop piles up nothing.
        let removing = self.removals.load(Ordering::Acquire);
        if self.streams.len() >= mux::MAX_STREAMS
            || self.pending.len() >= mux::MAX_STREAMS
            || removing >= mux::MAX_STREAMS
        {
            let why = format!(
                "{} streams open on this connection, the most it takes",
                mux::MAX_STREAMS
            );
            self.say_closed(tag, close::TRY_AGAIN_LATER, &why);
            return;
        }
        let id = match std::str::from_utf8(payload) {
            Ok("") => None,
            Ok(id) => match handover::check_id(id) {
                Ok(()) => Some(id.to_string()),
                Err(why) => return self.say_closed(tag, close::IDLE, &why),
            },
            Err(_) => return self.say_closed(tag, close::IDLE, "the stream id is not UTF-8"),
        };
        let handing = id.filter(|_| self.shared.store.is_some());
        if handing.is_some() && self.draining {
            return self.say_closed(tag, close::RESTART, "restarting: resume elsewhere");
        }
        let live_id = match &handing {
            Some(id) => {
                let key = self.endpoint.key(id);
                let taken = !self
                    .shared
                    .live_ids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.clone());
                if taken {
                    let why = format!("stream id {id:?} is live in another session");
                    return self.say_closed(tag, close::IDLE, &why);
                }
                Some(LiveId(self.shared.clone(), key))
            }
            None => None,
        };
        let conversation = match self.endpoint.protocol.open(None) {
            Ok(c) => c,
            Err(why) => return self.say_closed(tag, close::UNSUPPORTED, &why),
        };
        self.serials += 1;
        let serial = self.serials;
        let looking = match (&self.shared.store, &handing) {
            (Some(store), Some(id)) => {
                let (endpoint, store, id) = (self.endpoint.clone(), store.clone(), id.clone());
                self.pending.push(Box::pin(async move {
                    let resume = look_up(&endpoint, &store, (&id, None), None).await;
                    Event::Looked { tag, serial, resume }
                }));
                true
            }
            _ => false,
        };
        self.streams.insert(
            tag,
            MuxStream {
                serial,
                stream: Stream {
                    handle: None,
                    resume_from: None,
                    conversation,
                    chunk: 0,
                    writer: handover::Writer::after(None),
                    written: Arc::new(tokio::sync::Mutex::new(None)),
                },
                handing,
                live_id,
                queue: VecDeque::new(),
                busy: looking,
                opened: !looking,
                hand_over_failed: false,
                last: Instant::now(),
            },
        );
        if !looking {
            self.put(mux::OPENED, tag, &[&0u64.to_le_bytes()]);
        }
    }

    /// A stream's pulses, queued in order.
    fn pulses(&mut self, tag: u32, payload: &[u8]) {
        let pulse = self.interface.pulse_bytes();
        let Some(s) = self.streams.get_mut(&tag) else {
            return self.not_open(tag);
        };
        if payload.is_empty() || !payload.len().is_multiple_of(pulse) {
            let why = format!("{} bytes is not a whole number of {pulse}-byte pulses", payload.len());
            return self.close_stream(tag, close::UNSUPPORTED, &why);
        }
        if s.queue.len() + payload.len() / pulse > mux::MAX_QUEUED {
            let why = format!("more than {} pulses queued: read the answers", mux::MAX_QUEUED);
            return self.close_stream(tag, close::IDLE, &why);
        }
        s.queue.extend(payload.chunks(pulse).map(<[u8]>::to_vec));
        s.last = Instant::now();
        self.queued_bytes += payload.len();
    }

    /// An [`mux::END`] record: the stream's record removed after any
    /// checkpoint in flight, as a clean close does.
    fn end_by_client(&mut self, tag: u32) {
        let Some(s) = self.remove(tag) else {
            return self.not_open(tag);
        };
        self.remove_record(s);
        self.say_closed(tag, close::NORMAL, "ended by the client");
    }

    /// The client closed the connection: every stream ended by it.
    fn closed_by_client(&mut self) {
        self.queued_bytes = 0;
        for (_, s) in std::mem::take(&mut self.streams) {
            self.remove_record(s);
        }
    }

    /// A stream ended by its client: its record removed, off the
    /// connection's path.
    fn remove_record(&self, s: MuxStream) {
        let (Some(store), Some(id)) = (self.shared.store.clone(), s.handing.as_ref()) else {
            return;
        };
        let key = self.endpoint.key(id);
        // The lane goes now; the id once the record is gone.
        let Stream { written, writer, .. } = s.stream;
        let live_id = s.live_id;
        let removals = self.removals.clone();
        removals.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let _written = written.lock_owned().await;
            let _ = store.remove_own(&key, &writer).await;
            drop(live_id);
            removals.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// An operation done.
    async fn event(&mut self, event: Event) {
        match event {
            Event::Looked { tag, serial, resume } => {
                let Some(s) = self.streams.get_mut(&tag).filter(|s| s.serial == serial) else {
                    return;
                };
                s.busy = false;
                s.opened = true;
                s.last = Instant::now();
                s.stream.writer = handover::Writer::after(resume.found_generation());
                if let Resume::From(record) = resume {
                    // The protocol's own check, as the single-stream
                    // upgrade makes it.
                    match s.stream.conversation.restore(&record.framing, record.chunk) {
                        Ok(()) => {
                            s.stream.chunk = record.chunk;
                            s.stream.resume_from = Some(record);
                        }
                        Err(why) => {
                            let who = &self.endpoint.who;
                            eprintln!(
                                "{who}: stream tag {tag}: the record held for it is refused ({why}): it starts fresh"
                            );
                            handover::count("laned_resume_total", &self.endpoint.name, "refused");
                        }
                    }
                }
                let at = s.stream.chunk;
                self.put(mux::OPENED, tag, &[&at.to_le_bytes()]);
            }
            Event::Called { tag, serial, done } => {
                let Some(s) = self.streams.get_mut(&tag).filter(|s| s.serial == serial) else {
                    return;
                };
                s.busy = false;
                // The idle clock runs from the answer (a long queue is not
                // idleness).
                s.last = Instant::now();
                let (handle, outputs) = match done {
                    Ok(done) => done,
                    Err((code, why)) => return self.close_stream(tag, code, &why),
                };
                s.stream.handle = Some(handle);
                let n = s.stream.chunk;
                s.stream.chunk += 1;
                let answer = match self.interface.answer_bytes(&outputs) {
                    Ok(a) => a,
                    Err(why) => return self.close_stream(tag, close::INTERNAL, &format!("answering: {why}")),
                };
                self.put(mux::ANSWER, tag, &[&n.to_le_bytes(), &answer]);
                let every = self.shared.limits.checkpoint_every;
                let s = &self.streams[&tag];
                if let (Some(store), Some(id)) = (&self.shared.store, &s.handing) {
                    if every > 0 && s.stream.chunk.is_multiple_of(every) && !self.draining {
                        super::resume::checkpoint((&self.shared, &self.endpoint), store, id, &s.stream).await;
                    }
                }
            }
        }
    }

    /// Each idle stream's next call started, its lane taken first where
    /// it has none.
    fn start_calls(&mut self) {
        let wait = Duration::from_millis(self.shared.limits.admission_wait_ms);
        let mut refused = Vec::new();
        for (tag, s) in self.streams.iter_mut() {
            if s.busy || !s.opened {
                continue;
            }
            let Some(pulse) = s.queue.pop_front() else { continue };
            self.queued_bytes -= pulse.len();
            let inputs = match self.interface.call_inputs(&pulse) {
                Ok(inputs) => inputs,
                Err(why) => {
                    refused.push((*tag, why));
                    continue;
                }
            };
            s.busy = true;
            let (tag, serial) = (*tag, s.serial);
            let lane = s.stream.handle.take();
            let record = s.stream.resume_from.take();
            let handing = s.handing.is_some();
            let endpoint = self.endpoint.clone();
            self.pending.push(Box::pin(async move {
                let done = call(endpoint, wait, handing, lane, record, inputs).await;
                Event::Called { tag, serial, done }
            }));
        }
        for (tag, why) in refused {
            self.close_stream(tag, close::UNSUPPORTED, &why);
        }
    }

    /// Streams without a pulse for `idle_ms` closed (their lanes to
    /// others); the connection closed where no stream has been open so
    /// long.
    async fn idle_streams(&mut self) -> Result<(), Ended> {
        if self.streams.is_empty() && self.pending.is_empty() && self.empty_since.elapsed() >= self.idle() {
            let why = format!("no stream open for {:?}: the place goes to others", self.idle());
            close_with(&mut self.socket, close::IDLE, &why).await;
            return Err(Ended);
        }
        let idle = self.idle();
        let now = Instant::now();
        let gone: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| !s.busy && s.queue.is_empty() && now.duration_since(s.last) >= idle)
            .map(|(tag, _)| *tag)
            .collect();
        for tag in gone {
            self.close_stream(
                tag,
                close::IDLE,
                &format!("no pulse for {idle:?}: the lane goes to others"),
            );
        }
        Ok(())
    }

    /// Step 4: every stream with an id and nothing in flight handed over.
    async fn hand_over_between_calls(&mut self) {
        let Some(store) = self.shared.store.clone() else { return };
        let due: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.handing.is_some() && !s.busy && !s.hand_over_failed)
            .map(|(tag, _)| *tag)
            .collect();
        for tag in due {
            let s = &self.streams[&tag];
            let id = s.handing.clone().expect("filtered");
            match hand_over_stream((&self.shared, &self.endpoint), &store, (&id, false), &s.stream).await {
                Some(why) => self.close_stream(tag, close::RESTART, &why),
                None => self.streams.get_mut(&tag).expect("present").hand_over_failed = true,
            }
        }
    }

    /// Every record produced, as one message; `Err`: the client is gone
    /// or not reading (past `idle`).
    async fn flush(&mut self) -> Result<(), Ended> {
        for message in std::mem::take(&mut self.out) {
            let message = Message::Binary(message.into());
            match tokio::time::timeout(self.idle(), self.socket.send(message)).await {
                Ok(Ok(())) => {}
                _ => return Err(Ended),
            }
        }
        Ok(())
    }
}

/// A stream's next call: its lane taken first where it has none (waited
/// for up to `wait`; the record it resumes from imported), then the call.
async fn call(
    endpoint: Arc<Endpoint>,
    wait: Duration,
    handing: bool,
    lane: Option<LanedStateHandle>,
    record: Option<Box<Record>>,
    inputs: TVec<TValue>,
) -> Result<(LanedStateHandle, TVec<TValue>), (u16, String)> {
    let mut handle = match lane {
        Some(h) => h,
        None => super::lane(&endpoint, wait, handing, record)
            .await
            .map_err(|no| (no.code, no.why))?,
    };
    match handle.call_async(inputs).await {
        Ok(out) => Ok((handle, out)),
        Err(e) => {
            let code = if e.end_reason().is_some() {
                close::GOING_AWAY
            } else {
                close::INTERNAL
            };
            Err((code, format!("stream ended: {e}")))
        }
    }
}
