//! The streams: which stream holds which lane (the lane table), when it
//! last called, which lost their state or their lane and why. The only
//! writer of those marks: a failed turn, a rebuild and an eviction all mark
//! a stream through here.
//!
//! It answers nobody and touches no state: granting a lane (reset first),
//! evicting and releasing are the engine's, which resets through the model
//! and answers through the slots.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lane_table::{LaneId, LaneTable};

use crate::err::{NewRunnerError, RunError, RunErrorKind};
use crate::protocol::Grant;

pub(super) struct Streams {
    table: LaneTable,
    /// Per lane: the stream holding it, and when it last called.
    owner: Vec<Option<u64>>,
    last_active: Vec<Instant>,
    /// Per lane: why its stream lost its state (a failed turn), until the
    /// stream is released.
    lost: Vec<Option<String>>,
    /// Per lane: the pulses its stream fed (turns that ran its row 0), for
    /// `finish` to know the stream's length whichever clone called.
    pulses: Vec<u64>,
    /// Streams that lost their lane to eviction, and why, until released.
    evicted: HashMap<u64, String>,
    next_stream: u64,
    idle_timeout: Option<Duration>,
    /// Streams held at most: one lane fewer than the state has.
    max_streams: usize,
    /// Streams that went from keeping their state to having lost it since
    /// the last `take_newly_lost`: what the `lost_streams` counter books.
    newly_lost: usize,
}

impl Streams {
    /// No stream yet, on a state of `max_streams + 1` lanes.
    pub(super) fn new(max_streams: usize, idle_timeout: Option<Duration>) -> Result<Streams, NewRunnerError> {
        let lanes = max_streams + 1;
        Ok(Streams {
            table: LaneTable::new(lanes).map_err(|e| NewRunnerError::Config(e.to_string()))?,
            owner: vec![None; lanes],
            last_active: vec![Instant::now(); lanes],
            lost: vec![None; lanes],
            pulses: vec![0; lanes],
            evicted: HashMap::new(),
            next_stream: 0,
            idle_timeout,
            max_streams,
            newly_lost: 0,
        })
    }

    /// The lane table (the filler reads it).
    pub(super) fn table(&self) -> &LaneTable {
        &self.table
    }

    /// Lanes taken by streams.
    pub(super) fn taken(&self) -> usize {
        self.table.taken()
    }

    /// Whether a stream could be granted a lane now.
    pub(super) fn has_room(&self) -> bool {
        self.table.taken() < self.max_streams
    }

    pub(super) fn max_streams(&self) -> usize {
        self.max_streams
    }

    /// Why a call of `stream`, which holds no lane, is refused.
    fn gone(&self, stream: u64) -> RunError {
        RunError::new(match self.evicted.get(&stream) {
            Some(why) => RunErrorKind::Evicted(why.clone()),
            None => RunErrorKind::Closed,
        })
    }

    /// The lane of `stream` while it holds one, the reason it lost it otherwise.
    pub(super) fn own(&self, stream: Grant) -> Result<usize, RunError> {
        if self.owner[stream.lane.0] == Some(stream.stream) {
            return Ok(stream.lane.0);
        }
        Err(self.gone(stream.stream))
    }

    /// Why `lane`'s stream lost its state, if it did.
    pub(super) fn lost(&self, lane: LaneId) -> Option<&String> {
        self.lost[lane.0].as_ref()
    }

    /// `lane`'s stream lost its state, for `why`.
    pub(super) fn lose(&mut self, lane: LaneId, why: String) {
        if self.lost[lane.0].is_none() && self.owner[lane.0].is_some() {
            self.newly_lost += 1;
        }
        self.lost[lane.0] = Some(why);
    }

    /// Streams that lost their state since the last call (each counted
    /// once, however often it was marked).
    pub(super) fn take_newly_lost(&mut self) -> usize {
        std::mem::take(&mut self.newly_lost)
    }

    /// Every stream holding a lane lost its state (the state was rebuilt).
    pub(super) fn lose_all(&mut self, why: &str) {
        for lane in 0..self.owner.len() {
            if self.owner[lane].is_some() {
                if self.lost[lane].is_none() {
                    self.newly_lost += 1;
                }
                self.lost[lane] = Some(format!("the state was rebuilt after a turn failed: {why}"));
            }
        }
    }

    /// `lane`'s stream called (or was answered) at `at`.
    pub(super) fn touch(&mut self, lane: LaneId, at: Instant) {
        self.last_active[lane.0] = at;
    }

    /// A free lane, taken, for a new stream (`None`: none is free).
    pub(super) fn take_lane(&mut self) -> Option<LaneId> {
        self.table.take()
    }

    /// A lane taken and not handed to a stream goes back free.
    pub(super) fn give_back(&mut self, lane: LaneId) {
        let _ = self.table.give_back(lane);
    }

    /// Borrow `lane` for a turn's later rows.
    pub(super) fn borrow(&mut self, lane: LaneId) {
        let _ = self.table.take_lane(lane);
    }

    /// `lane` (taken) is a new stream's, active now: its id.
    pub(super) fn book(&mut self, lane: LaneId) -> u64 {
        let stream = self.next_stream;
        self.next_stream += 1;
        self.owner[lane.0] = Some(stream);
        self.last_active[lane.0] = Instant::now();
        self.pulses[lane.0] = 0;
        stream
    }

    /// A turn ran a pulse of `lane`'s stream.
    pub(super) fn fed(&mut self, lane: LaneId) {
        self.pulses[lane.0] += 1;
    }

    /// `lane`'s stream continues a stream that fed `pulses` (an imported
    /// state).
    pub(super) fn set_pulses(&mut self, lane: LaneId, pulses: u64) {
        self.pulses[lane.0] = pulses;
    }

    /// The pulses `lane`'s stream fed so far, every clone's calls counted.
    pub(super) fn pulses(&self, lane: usize) -> u64 {
        self.pulses[lane]
    }

    /// The stream booked on `lane` never took it: the lane is free again.
    pub(super) fn unbook(&mut self, lane: LaneId) {
        self.owner[lane.0] = None;
        self.give_back(lane);
    }

    /// `lane` goes back to the table, its marks cleared.
    pub(super) fn free(&mut self, lane: LaneId) {
        self.lost[lane.0] = None;
        self.unbook(lane);
    }

    /// The stream's handle is gone: forget its eviction; whether its lane is
    /// still its own to free (an evicted stream's may be another's by now).
    pub(super) fn release(&mut self, grant: Grant) -> bool {
        self.evicted.remove(&grant.stream);
        self.owner[grant.lane.0] == Some(grant.stream)
    }

    /// Whether the stream on `lane`, no seat of it queued (`queued` false),
    /// had been idle for the timeout by `at` (false without a timeout). The
    /// one rule of idleness: for a take of the inbox, `at` is the take; for
    /// a call, the moment it was made, however late the engine looks.
    pub(super) fn idle_by(&self, lane: LaneId, queued: bool, at: Instant) -> bool {
        let Some(idle) = self.idle_timeout else {
            return false;
        };
        !queued && self.last_active[lane.0].checked_add(idle).is_some_and(|due| due <= at)
    }

    /// Mark `stream` evicted for being idle; returns why, as it is told.
    pub(super) fn mark_evicted(&mut self, stream: u64) -> String {
        let why = format!("it did not call for {:?}", self.idle_timeout.unwrap_or_default());
        self.evicted.insert(stream, why.clone());
        why
    }

    /// Lanes of the state.
    pub(super) fn lanes(&self) -> usize {
        self.owner.len()
    }

    /// The stream holding `lane`, if one does.
    pub(super) fn holder(&self, lane: LaneId) -> Option<u64> {
        self.owner[lane.0]
    }

    /// The streams holding a lane, with it.
    pub(super) fn held(&self) -> impl Iterator<Item = (LaneId, u64)> + '_ {
        self.owner
            .iter()
            .enumerate()
            .filter_map(|(lane, owner)| owner.map(|stream| (LaneId(lane), stream)))
    }

    /// When the next idle stream is due (a time past, for one overdue),
    /// among those `queued` says have no seat queued.
    pub(super) fn next_idle_due(&self, queued: impl Fn(LaneId) -> bool) -> Option<Instant> {
        let idle = self.idle_timeout?;
        self.held()
            .filter(|(lane, _)| !queued(*lane))
            .filter_map(|(lane, _)| self.last_active[lane.0].checked_add(idle))
            .min()
    }
}
