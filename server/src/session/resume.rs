//! A session's side of the hand-over ([`crate::handover`]): the record
//! looked up before the upgrade ([`look_up`]), checkpoints off the answer
//! path ([`checkpoint`]), the hand-over on a drain ([`try_hand_over`]) and
//! the record removed on a clean close ([`closed_by_client`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::WebSocket;
use laned_wire::close;

use super::{close_with, Endpoint, LiveId, Shared, Stream};
use crate::handover::{self, Record, Store, LOST, REFUSED, STALE, UNREAD};
use crate::protocol::Conversation;

/// What a connection resumes from: `None` without a store or an id.
pub(crate) enum Resume {
    None,
    /// Position 0, nothing held (or nothing usable).
    Fresh {
        /// The generation the new session's records must be above: the
        /// record refused, if one was read, or the client's claim, the
        /// higher.
        above: Option<u64>,
        /// Why a stream the client had already started (it claimed a
        /// generation) starts again at 0: one of [`handover::RESTARTED`].
        restarted: Option<&'static str>,
    },
    From(Box<Record>),
}

impl Resume {
    /// The generation this session's records must be above (the record
    /// found, or the client's claim, the higher), if any.
    pub(crate) fn found_generation(&self) -> Option<u64> {
        match self {
            Resume::None => None,
            Resume::Fresh { above, .. } => *above,
            Resume::From(record) => Some(record.generation),
        }
    }

    /// Where the client resends from, when it has an id and there is a store.
    pub(crate) fn position(&self) -> Option<u64> {
        match self {
            Resume::None => None,
            Resume::Fresh { .. } => Some(0),
            Resume::From(r) => Some(r.chunk),
        }
    }

    /// Why a stream the client had started starts again at 0, if it does.
    pub(crate) fn restarted(&self) -> Option<&'static str> {
        match self {
            Resume::Fresh { restarted, .. } => *restarted,
            _ => None,
        }
    }
}

/// The generation a record refused at parse says it has, if it says one.
fn generation_in(bytes: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()?
        .get("generation")?
        .as_u64()
}

/// The generation a reconnecting client says it last knew: its
/// `x-resume-generation` header, else its `generation` URL parameter
/// (browsers); `Err` naming it for one that is not a number from 1 to
/// [`handover::MAX_RECORD_CHUNK`].
pub(crate) fn claimed_generation(headers: &axum::http::HeaderMap, query: Option<&str>) -> Result<Option<u64>, String> {
    let claim = super::header_or_param(headers, "x-resume-generation", query, "generation")?;
    match claim {
        None => Ok(None),
        Some(g) => match g.trim().parse::<u64>() {
            Ok(n) if (1..=handover::MAX_RECORD_CHUNK).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "a resume generation of {g:?}: a number from 1 to {} (the hello's \"generation\")",
                handover::MAX_RECORD_CHUNK
            )),
        },
    }
}

/// The record under `id`, if it is one this server may continue (and
/// `conversation` restored from it): every other outcome starts the stream
/// fresh, with a log line where something was wrong (the store failing, a
/// record too large, unreadable, out of range, of another model or refused
/// by the runner's or the protocol's checks). `claimed`: the generation
/// the client last knew ([`claimed_generation`]): a record of a lower one
/// (an older record that survived a store's failover, the newer lost) is
/// never resumed from, and a stream so claimed that starts at 0 for any
/// reason is told why ([`Resume::restarted`]). Decided here, before the
/// upgrade, so that where the client is told to resume from is where the
/// stream resumes.
pub(crate) async fn look_up(
    endpoint: &Endpoint,
    store: &Store,
    (id, claimed): (&str, Option<u64>),
    conversation: Option<&mut Box<dyn Conversation>>,
) -> Resume {
    let who = &endpoint.who;
    // A fresh start above both the record refused and the claim, told why
    // where the client claimed a generation.
    let fresh = |found: Option<u64>, why: &'static str| Resume::Fresh {
        above: found.max(claimed),
        restarted: claimed.map(|_| why),
    };
    let bytes = match store.get(&endpoint.key(id)).await {
        Ok(handover::Found::Bytes(b)) => b,
        Ok(handover::Found::Nothing) => {
            if let Some(g) = claimed {
                eprintln!("{who}: stream {id}: no record is held for it (its client knew generation {g}): it restarts at 0, told so");
            }
            handover::count(
                "laned_resume_total",
                &endpoint.name,
                if claimed.is_some() { "lost" } else { "fresh" },
            );
            return fresh(None, LOST);
        }
        Ok(handover::Found::TooBig(n)) => {
            eprintln!(
                "{who}: stream {id}: the record held for it is refused ({n} bytes, over the {}-byte limit; left unread): it starts fresh",
                handover::MAX_RECORD_BYTES
            );
            handover::count("laned_resume_total", &endpoint.name, "refused");
            return fresh(None, REFUSED);
        }
        Err(e) => {
            eprintln!("{who}: stream {id}: no record read ({e}): it starts fresh");
            handover::count("laned_resume_total", &endpoint.name, "failed");
            return fresh(None, UNREAD);
        }
    };
    let refused = |why: String, generation: Option<u64>| {
        eprintln!("{who}: stream {id}: the record held for it is refused ({why}): it starts fresh");
        handover::count("laned_resume_total", &endpoint.name, "refused");
        fresh(generation, REFUSED)
    };
    let record = match Record::from_bytes(&bytes) {
        Ok(r) => r,
        // Superseded by this session's records where its generation can
        // still be read.
        Err(why) => return refused(format!("{} bytes, {why}", bytes.len()), generation_in(&bytes)),
    };
    // Older than what the client knew: the stream's newer records were
    // lost, and this one may be at a position the client no longer holds.
    if let Some(g) = claimed.filter(|g| record.generation < *g) {
        eprintln!(
            "{who}: stream {id}: the record held for it (chunk {}, generation {}) is older than generation {g} its client knew (a newer one was lost): it restarts at 0, told so",
            record.chunk, record.generation
        );
        handover::count("laned_resume_total", &endpoint.name, "stale");
        return fresh(Some(record.generation), STALE);
    }
    // The runner's own check: its format, its model's identity (naming
    // both), each tensor's type and shape.
    if let Err(e) = endpoint.runner.check_state(&record.state) {
        return refused(format!("its state: {e}"), Some(record.generation));
    }
    if let Some(conversation) = conversation {
        if let Err(why) = conversation.restore(&record.framing, record.chunk) {
            return refused(why, Some(record.generation));
        }
    }
    Resume::From(Box::new(record))
}

/// The stream's record as it stands (its state exported from the runner),
/// and how long the export took.
async fn record_of(stream: &Stream) -> Result<(Record, Duration), String> {
    let started = Instant::now();
    let state = stream
        .handle
        .as_ref()
        .ok_or("the stream has sent no pulse: it holds no lane")?
        .export_state_async()
        .await
        .map_err(|e| format!("exporting the state: {e}"))?;
    let record = Record::of(stream.chunk, stream.conversation.save(), state, &stream.writer);
    Ok((record, started.elapsed()))
}

/// A stream's state to the store, after any checkpoint in flight (so a
/// later position is never overwritten by an earlier one), marked
/// `current` where the stream answers no more ([`Record::current`]): `Ok`
/// with its bytes and the times the export (from the runner) and the
/// write (to the store) took.
pub(crate) async fn hand_over(
    store: &Store,
    key: &str,
    stream: &Stream,
    current: bool,
) -> Result<(usize, Duration, Duration), String> {
    let (mut record, export) = record_of(stream).await?;
    record.current = current;
    let written = stream.written.clone().lock_owned().await;
    let started = Instant::now();
    let bytes = put_after(store, key, &record, written).await?;
    Ok((bytes, export, started.elapsed()))
}

/// Writes `record` unless the stream's last write was at a later position
/// (`written`: the last position written, held for the write); the bytes
/// written (0: none).
async fn put_after(
    store: &Store,
    key: &str,
    record: &Record,
    mut written: tokio::sync::OwnedMutexGuard<Option<u64>>,
) -> Result<usize, String> {
    if written.is_some_and(|at| at > record.chunk) {
        return Ok(0);
    }
    let bytes = store.put(key, record).await.map_err(|e| e.to_string())?;
    *written = Some(record.chunk);
    Ok(bytes)
}

/// A checkpoint, off the answer path: the record is taken now, written by
/// a task of its own. At most one is in flight per stream: one due while
/// the last is still being written is dropped (counted `dropped`), so a
/// slow or hung store costs the stream no wait and no memory.
pub(crate) async fn checkpoint(
    (shared, endpoint): (&Arc<Shared>, &Arc<Endpoint>),
    store: &Arc<Store>,
    id: &str,
    stream: &Stream,
) {
    // A model whose state stays in its ops has nothing a checkpoint could
    // resume from (said once, at the start).
    if !endpoint.runner.state_travels() {
        return;
    }
    let key = endpoint.key(id);
    let Ok(written) = stream.written.clone().try_lock_owned() else {
        handover::count("laned_checkpoint_total", &endpoint.name, "dropped");
        return;
    };
    let record = match record_of(stream).await {
        Ok((record, _)) => record,
        Err(why) => {
            handover::count("laned_checkpoint_total", &endpoint.name, "failed");
            shared
                .checkpoint_said
                .say(|| format!("{key}: a checkpoint skipped ({why})"));
            return;
        }
    };
    let (shared, endpoint, store) = (shared.clone(), endpoint.clone(), store.clone());
    tokio::spawn(async move {
        match put_after(&store, &key, &record, written).await {
            Ok(_) => handover::count("laned_checkpoint_total", &endpoint.name, "ok"),
            Err(why) => {
                handover::count("laned_checkpoint_total", &endpoint.name, "failed");
                shared
                    .checkpoint_said
                    .say(|| format!("{key}: a checkpoint skipped ({why})"));
            }
        }
    });
}

/// The record a session resumes from, written back as its own (its
/// generation and owner) before any checkpoint of it, off the answer path:
/// a reconnect claiming this session's generation (its hello's) then finds
/// a record of it at the position the hello named, even where the session
/// writes nothing more (no checkpoints, or killed before its first); else
/// the record it resumed from, one generation older, would restart the
/// stream at 0. Lost to a failover, it costs that restart, told.
pub(crate) fn restamp(
    (shared, endpoint): (&Arc<Shared>, &Arc<Endpoint>),
    store: &Arc<Store>,
    id: &str,
    stream: &Stream,
) {
    let Some(record) = stream.resume_from.as_deref() else {
        return;
    };
    let Ok(written) = stream.written.clone().try_lock_owned() else {
        return;
    };
    let mut own = record.clone();
    (own.generation, own.owner, own.current) = (stream.writer.generation, stream.writer.owner.clone(), false);
    let (shared, key, store) = (shared.clone(), endpoint.key(id), store.clone());
    tokio::spawn(async move {
        if let Err(why) = put_after(&store, &key, &own, written).await {
            shared
                .checkpoint_said
                .say(|| format!("{key}: the record resumed from not written back as this session's ({why})"));
        }
    });
}

/// The close reason of a stream whose model's state does not travel, on a
/// drain with a store: it restarts from its first chunk.
pub(crate) const RESTART_AT_ZERO: &str =
    "restarting: this model's state does not travel: resume at chunk 0 (the stream starts again)";

/// Hands the stream over and closes it 1012 (`true`: the session ends), or
/// says why it could not (`false`: it drains as without a store).
pub(crate) async fn try_hand_over(
    socket: &mut WebSocket,
    (shared, endpoint): (&Shared, &Endpoint),
    store: &Store,
    (id, live_id): (&str, &mut Option<LiveId>),
    stream: &Stream,
) -> bool {
    match hand_over_stream((shared, endpoint), store, (id, false), stream).await {
        Some(why) => {
            // Handed over: the id is free for the client's reconnect (here
            // or elsewhere) while the close waits for its reply.
            drop(live_id.take());
            close_with(socket, close::RESTART, &why).await;
            true
        }
        None => false,
    }
}

/// Stream `id`'s hand-over, the one every front makes on a drain: its
/// record written (or, where its model's state stays in its ops, any
/// record removed: it restarts at 0; or, with no lane yet, the record it
/// resumes from left as found), counted and tallied; `current` where the
/// stream's client is not told its position (a v2 sequence:
/// [`Record::current`]). The 1012 reason to tell its client; `None` where
/// the write failed (said, counted: the stream drains as without a
/// store).
pub(crate) async fn hand_over_stream(
    (shared, endpoint): (&Shared, &Endpoint),
    store: &Store,
    (id, current): (&str, bool),
    stream: &Stream,
) -> Option<String> {
    if !endpoint.runner.state_travels() {
        // Its state cannot be written: the client is never told a position
        // whose state is lost. It starts again at 0 (here or elsewhere),
        // said so; any record under its id goes first, so no server
        // resumes it from one.
        let _written = stream.written.clone().lock_owned().await;
        let _ = store.remove_own(&endpoint.key(id), &stream.writer).await;
        handover::count("laned_handover_total", &endpoint.name, "restarted");
        return Some(RESTART_AT_ZERO.to_string());
    }
    let resume_at = format!("restarting: resume at chunk {}", stream.chunk);
    if stream.handle.is_none() {
        // No pulse yet, so no lane: nothing moved since the record it
        // resumes from (if any), which stays as found; it resumes there.
        handover::count("laned_handover_total", &endpoint.name, "ok");
        return Some(resume_at);
    }
    match hand_over(store, &endpoint.key(id), stream, current).await {
        Ok((bytes, export, write)) => {
            shared
                .tally
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(bytes, export, write);
            handover::count("laned_handover_total", &endpoint.name, "ok");
            Some(resume_at)
        }
        Err(why) => {
            shared.tally.lock().unwrap_or_else(|e| e.into_inner()).failed += 1;
            handover::count("laned_handover_total", &endpoint.name, "failed");
            eprintln!(
                "{}: stream {id}: hand-over skipped ({why}): it drains as without a store",
                endpoint.who
            );
            None
        }
    }
}

/// The client closed: flush the close reply tungstenite queued, and drop
/// the stream's record if it is still this session's (a later stream of
/// the same id starts fresh; a newer session's record stays).
pub(crate) async fn closed_by_client(socket: &mut WebSocket, handing: Option<(&Arc<Store>, String)>, stream: &Stream) {
    let _ = futures_util::SinkExt::close(socket).await;
    if let Some((store, key)) = handing {
        // After any checkpoint in flight, which would write it back.
        let _written = stream.written.clone().lock_owned().await;
        let _ = store.remove_own(&key, &stream.writer).await;
    }
}
