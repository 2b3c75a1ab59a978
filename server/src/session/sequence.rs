//! Triton's sequences over KServe v2 requests ([`crate::kserve`]): a
//! sequence is a laned stream whose pulses come one request each, named by
//! its `sequence_id` (within its model). Each is what a single-stream
//! session's stream is (a lane, its record, checkpoints, the hand-over);
//! no connection holds it, so this table does.
//!
//! A sequence's life, in order:
//! 1. `sequence_start`: a second start of a live id is refused; the id is
//!    taken (one live stream per id and model, WebSocket streams
//!    included); with a store, a record left under the id only gives its
//!    generation (a start is a fresh stream), and one that is current is
//!    removed first (nothing may continue the old sequence from it). A
//!    request without `sequence_start` for an id not live resumes it from
//!    its record only where the record is current (a replica that drained
//!    handed it over at its last answer: [`handover::Record::current`]),
//!    marking it not current in the store before the call (so it is
//!    continued once; the mark held by a replica of the store, where it
//!    has one, before the call, so that no failover brings the record back
//!    current); else it is refused by name: "not held here" where
//!    a record is held that may be behind the sequence's last answer (a
//!    checkpoint: the sequence was reaped or its replica killed since),
//!    "never started" where none is. Triton's rule: a sequence the server
//!    does not hold is not continued without `sequence_start`. Ids are
//!    Triton's, a number or a string: 17 and "17" are two sequences.
//! 2. Each request is one call: the sequence is taken out of the table for
//!    it (a second request meanwhile is refused: one in flight a sequence),
//!    its lane taken at its first (waited for up to `admission_wait_ms`,
//!    the record imported), and put back with its position one further;
//!    every `checkpoint_every` calls a checkpoint is taken.
//! 3. `sequence_end` (with its last pulse): the sequence is dropped, its
//!    lane freed, its record removed.
//! 4. Idle for `idle_ms`: the sequence is dropped (its lane to others; its
//!    last checkpoint, if any, stays).
//! 5. The drain: new requests for a sequence are refused 503 "restarting"
//!    (the client sends the same request to another replica, which resumes
//!    the sequence from its record); every sequence not in a call is handed
//!    over at once, one in a call after it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use laned_runner::LanedStateHandle;
use laned_wire::kserve::SequenceId;
use tokio::time::Instant;
use tract_core::prelude::{TValue, TVec};

use super::resume::{checkpoint, hand_over_stream, look_up, Resume};
use super::{Endpoint, LiveId, Shared, Stream};
use crate::handover;

/// Every live sequence of a server, by its model's store key of its id.
#[derive(Default)]
pub(crate) struct Sequences {
    /// Touched by each request (briefly, never across an await), the
    /// reaper and the drain.
    table: Mutex<HashMap<String, Slot>>,
}

enum Slot {
    /// Between requests.
    Idle(Box<Sequence>),
    /// A request of it in flight (the sequence is in that request).
    Busy,
}

/// One live sequence.
struct Sequence {
    stream: Stream,
    /// Its id within its model.
    id: String,
    _live_id: LiveId,
    last: Instant,
}

/// A request refused: its HTTP status and why.
pub(crate) type Refusal = (StatusCode, String);

fn refused<T>(status: StatusCode, why: impl Into<String>) -> Result<T, Refusal> {
    Err((status, why.into()))
}

impl Sequences {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One request's pulse through sequence `id` of `endpoint`'s model
    /// (`None`: a request of no sequence, on a lane of its own); the
    /// answer's outputs.
    pub(crate) async fn call(
        &self,
        (shared, endpoint): (&Arc<Shared>, &Arc<Endpoint>),
        id: Option<&SequenceId>,
        (start, end): (bool, bool),
        inputs: TVec<TValue>,
        clock: &mut crate::stats::Clock,
    ) -> Result<TVec<TValue>, Refusal> {
        let Some(sequence_id) = id else {
            let mut handle = lane(shared, endpoint, None).await?;
            clock.ran = Some(std::time::Instant::now());
            return handle.call_async(inputs).await.map_err(|e| call_failed(&e));
        };
        let id = &crate::kserve::stream_id(sequence_id)
            .map_err(|why| (StatusCode::BAD_REQUEST, format!("sequence_id: {why}")))?;
        let key = endpoint.key(id);
        if *shared.handing_over.borrow() {
            return self.restarting(shared, endpoint, &key).await;
        }
        let shown = sequence_id.to_string();
        let mut sequence = self.take(shared, endpoint, (id, &shown), &key, start).await?;
        // Its slot is freed if this request goes away mid-call (its client
        // gone): the sequence ends with it.
        let slot = SlotGuard {
            sequences: self,
            key: &key,
        };
        // Step 2: the call, the sequence out of the table meanwhile.
        let outputs = match sequence.stream.handle.as_mut() {
            Some(handle) => {
                clock.ran = Some(std::time::Instant::now());
                handle.call_async(inputs).await.map_err(|e| call_failed(&e))
            }
            None => match lane(shared, endpoint, sequence.stream.resume_from.take()).await {
                Ok(mut handle) => {
                    clock.ran = Some(std::time::Instant::now());
                    let out = handle.call_async(inputs).await.map_err(|e| call_failed(&e));
                    sequence.stream.handle = Some(handle);
                    out
                }
                Err(refusal) => Err(refusal),
            },
        };
        let outputs = match outputs {
            Ok(out) => out,
            // The sequence ends with its call (its lane is gone or its
            // state unknown; the guard frees its slot); its last
            // checkpoint, if any, stays.
            Err(refusal) => return Err(refusal),
        };
        sequence.stream.chunk += 1;
        sequence.last = Instant::now();
        let store = shared.store.clone();
        if end {
            // Step 3 (the guard frees its slot).
            drop(slot);
            if let Some(store) = store {
                let _written = sequence.stream.written.clone().lock_owned().await;
                let _ = store.remove_own(&key, &sequence.stream.writer).await;
            }
            return Ok(outputs);
        }
        if let Some(store) = &store {
            if *shared.handing_over.borrow() {
                // Step 5, after its call: handed over, its answer still
                // given.
                drop(slot);
                hand_over_one(shared, endpoint, store, &sequence).await;
                return Ok(outputs);
            }
            let every = shared.limits.checkpoint_every;
            if every > 0 && sequence.stream.chunk.is_multiple_of(every) {
                checkpoint((shared, endpoint), store, id, &sequence.stream).await;
            }
        }
        std::mem::forget(slot);
        self.lock().insert(key, Slot::Idle(sequence));
        Ok(outputs)
    }

    /// Steps 1 and 2: sequence `id`, out of the table for a call (started,
    /// resumed or as it was).
    async fn take(
        &self,
        shared: &Arc<Shared>,
        endpoint: &Arc<Endpoint>,
        (id, shown): (&str, &str),
        key: &str,
        start: bool,
    ) -> Result<Box<Sequence>, Refusal> {
        {
            let mut table = self.lock();
            match table.get_mut(key) {
                Some(Slot::Busy) if start => {
                    return refused(
                        StatusCode::BAD_REQUEST,
                        format!("sequence {shown} is live: started twice"),
                    )
                }
                Some(Slot::Busy) => {
                    return refused(
                        StatusCode::CONFLICT,
                        format!("sequence {shown} has a request in flight: one at a time"),
                    )
                }
                Some(Slot::Idle(_)) if start => {
                    return refused(
                        StatusCode::BAD_REQUEST,
                        format!("sequence {shown} is live: started twice"),
                    )
                }
                Some(slot @ Slot::Idle(_)) => {
                    let Slot::Idle(sequence) = std::mem::replace(slot, Slot::Busy) else {
                        unreachable!("matched Idle")
                    };
                    return Ok(sequence);
                }
                None => {}
            }
        }
        // Not live here: one stream per id, WebSocket streams included.
        if !shared
            .live_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string())
        {
            return refused(
                StatusCode::CONFLICT,
                format!("stream id {id:?} is live in another session"),
            );
        }
        let live_id = LiveId(shared.clone(), key.to_string());
        let resume = match &shared.store {
            Some(store) => look_up(endpoint, store, (id, None), None).await,
            None => Resume::None,
        };
        let found = resume.found_generation();
        let writer = handover::Writer::after(found);
        let (chunk, resume_from) = match (resume, &shared.store) {
            (Resume::From(record), Some(store)) if !start => {
                if !record.current {
                    return refused(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "sequence {shown} is not held here, and its saved state (pulse {}) may be behind its last \
                             answer: restart it with sequence_start",
                            record.chunk
                        ),
                    );
                }
                // Continued once: the store's record no longer current
                // before any answer of this session.
                let mut mark = (*record).clone();
                (mark.current, mark.generation, mark.owner) = (false, writer.generation, writer.owner.clone());
                // Held by a replica too: a failover must not bring the
                // record back current (another replica would continue the
                // sequence from its old position).
                let marked = match store.put(key, &mark).await {
                    Ok(_) => store.replicated(key).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = marked {
                    return refused(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("sequence {shown} could not be taken over ({e}): try again"),
                    );
                }
                (record.chunk, Some(record))
            }
            (Resume::From(record), Some(store)) if record.current => {
                // A fresh start over a sequence handed over: its record
                // goes first, so that nothing continues the old sequence.
                let removed = match store.remove_own(key, &writer).await {
                    Ok(()) => store.replicated(key).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = removed {
                    return refused(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("sequence {shown}: its old record could not be removed ({e}): try again"),
                    );
                }
                (0, None)
            }
            _ if !start => {
                return refused(
                    StatusCode::BAD_REQUEST,
                    format!("sequence {shown} was never started (or has ended): send sequence_start"),
                )
            }
            _ => (0, None),
        };
        let conversation = endpoint
            .protocol
            .open(None)
            .map_err(|why| (StatusCode::BAD_REQUEST, why))?;
        let sequence = Box::new(Sequence {
            stream: Stream {
                handle: None,
                resume_from,
                conversation,
                chunk,
                writer,
                written: Arc::new(tokio::sync::Mutex::new(None)),
            },
            id: id.to_string(),
            _live_id: live_id,
            last: Instant::now(),
        });
        let mut table = self.lock();
        if table.contains_key(key) {
            // Started meanwhile by a request beside this one.
            return refused(
                StatusCode::CONFLICT,
                format!("sequence {shown} has a request in flight: one at a time"),
            );
        }
        table.insert(key.to_string(), Slot::Busy);
        Ok(sequence)
    }

    /// Step 5 for a request arriving in the drain: its sequence handed
    /// over first (or its hand-over in flight waited for), so that the
    /// replica the client turns to finds its record; then 503.
    async fn restarting(
        &self,
        shared: &Arc<Shared>,
        endpoint: &Arc<Endpoint>,
        key: &str,
    ) -> Result<TVec<TValue>, Refusal> {
        let taken = {
            let mut table = self.lock();
            match table.get_mut(key) {
                Some(slot @ Slot::Idle(_)) => match std::mem::replace(slot, Slot::Busy) {
                    Slot::Idle(s) => Some(s),
                    Slot::Busy => None,
                },
                _ => None,
            }
        };
        if let (Some(sequence), Some(store)) = (taken, &shared.store) {
            hand_over_one(shared, endpoint, store, &sequence).await;
            self.lock().remove(key);
        }
        // A hand-over or a call of it in flight elsewhere: its end waited
        // for (bounded by the store's timeout and a call's).
        let until = Instant::now() + Duration::from_millis(shared.limits.store_timeout_ms) + Duration::from_secs(2);
        while self.lock().contains_key(key) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        refused(StatusCode::SERVICE_UNAVAILABLE, "restarting: resume elsewhere")
    }

    /// Step 4: sequences idle past `idle` dropped.
    pub(crate) fn reap(&self, idle: Duration) {
        let now = Instant::now();
        self.lock()
            .retain(|_, slot| !matches!(slot, Slot::Idle(s) if now.duration_since(s.last) >= idle));
    }

    /// Step 5: every sequence not in a call handed over (those in a call
    /// hand over after it).
    pub(crate) async fn hand_over_all(&self, shared: &Arc<Shared>, endpoints: &[Arc<Endpoint>]) {
        let Some(store) = shared.store.clone() else { return };
        // Each marked busy while it is written (a request for it waits),
        // removed once written.
        let idle: Vec<(String, Box<Sequence>)> = {
            let mut table = self.lock();
            table
                .iter_mut()
                .filter(|(_, s)| matches!(s, Slot::Idle(_)))
                .filter_map(|(k, slot)| match std::mem::replace(slot, Slot::Busy) {
                    Slot::Idle(s) => Some((k.clone(), s)),
                    Slot::Busy => None,
                })
                .collect()
        };
        for (key, sequence) in idle {
            if let Some(endpoint) = endpoints.iter().find(|e| key.starts_with(&e.key_prefix)) {
                hand_over_one(shared, endpoint, &store, &sequence).await;
            }
            self.lock().remove(&key);
        }
    }
}

/// A sequence's `Busy` slot, removed when dropped (forgotten where the
/// sequence goes back).
struct SlotGuard<'a> {
    sequences: &'a Sequences,
    key: &'a str,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.sequences.lock().remove(self.key);
    }
}

/// Hands `sequence` over to the store (the session's one hand-over;
/// said where it cannot be).
async fn hand_over_one(shared: &Shared, endpoint: &Endpoint, store: &handover::Store, sequence: &Sequence) {
    // Current: the sequence answers no more here, and its client is told
    // no position (it sends its next request elsewhere).
    let _ = hand_over_stream((shared, endpoint), store, (&sequence.id, true), &sequence.stream).await;
}

/// A lane of `endpoint`'s model, waited for up to `admission_wait_ms`,
/// `record`'s state imported into it.
async fn lane(
    shared: &Shared,
    endpoint: &Endpoint,
    record: Option<Box<handover::Record>>,
) -> Result<LanedStateHandle, Refusal> {
    let wait = Duration::from_millis(shared.limits.admission_wait_ms);
    super::lane(endpoint, wait, shared.store.is_some(), record)
        .await
        .map_err(|super::NoLane { code, why }| match code {
            laned_wire::close::INTERNAL => (StatusCode::INTERNAL_SERVER_ERROR, why),
            laned_wire::close::RESTART | laned_wire::close::GOING_AWAY => {
                (StatusCode::SERVICE_UNAVAILABLE, format!("restarting: {why}"))
            }
            _ => (StatusCode::SERVICE_UNAVAILABLE, why),
        })
}

fn call_failed(e: &laned_runner::RunError) -> Refusal {
    let status = if e.end_reason().is_some() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    (status, format!("the call failed: {e}"))
}
