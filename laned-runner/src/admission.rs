//! The admission queue: spawners waiting for a lane on any shard, served in
//! arrival order by the engines themselves.
//!
//! A waiter is a slot in the queue. It never tries the shards from there:
//! an engine with a free lane takes the oldest waiter out and grants the
//! lane into its slot ([`Admission::next_waiter`]), when a lane frees up
//! and when a waiter arriving *kicks* it (an arrival that saw a free lane
//! in the gauges). So:
//!
//! - a freed lane goes to exactly one waiter: nobody else is woken (no
//!   thundering herd), and admitting n waiters costs n grants;
//! - a free lane and a waiting spawner never coexist for longer than a
//!   kick takes to arrive (see [`Admission::arrive`] for why no kick is
//!   missed);
//! - a waiter that stops being polled holds at most the one lane granted
//!   into its slot, never the queue: the waiters behind it are served by
//!   the next lanes, as if it were not there;
//! - a waiter that goes away (its future dropped, its wait timed out)
//!   leaves the queue, or, if a grant was on its way, abandons its slot,
//!   which refuses the grant: the engine takes the lane back and hands it
//!   to the next waiter.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::err::SpawnError;
use crate::life::Life;
use crate::protocol::SpawnResult;
use crate::slot::Slot;
use crate::sync::{lock, Condvar, Mutex, MutexGuard};

/// Who may touch it: spawners (arrive, withdraw), engines (take the next
/// waiter, tell a lane freed up), the closing or draining thread (refuse
/// everyone), the drain (wait for freed lanes).
pub(crate) struct Admission {
    state: Mutex<State>,
    /// Signalled by every freed lane and refusal: the drain waits on it.
    cv: Condvar,
    max_waiting: usize,
    /// The runner's life: step 3 (spawns refused, and why) is set under
    /// `state`'s lock and read under it by the queue (so no arrival joins
    /// after the refusal answered the waiters); `is_refused` and `refusal`
    /// read it without.
    life: Arc<Life>,
    /// The spawners-waiting gauge of the `metrics` facade (nothing without
    /// the feature); set under the lock, so it follows the queue in order.
    meters: crate::facade::AdmissionMeters,
}

struct State {
    next: u64,
    /// The waiters, by arrival.
    waiters: BTreeMap<u64, Waiter>,
    /// Bumped by every freed lane (any shard): the drain waits for it to
    /// move.
    freed: u64,
}

/// A spawner waiting: where its grant goes, and since when it waits.
pub(crate) struct Waiter {
    pub slot: Arc<Slot<SpawnResult>>,
    pub since: Instant,
}

impl Admission {
    /// The runner-wide facade handles (refusals, policy changes are booked
    /// through [`Common`](crate::common::Common), with its counters).
    pub fn meters(&self) -> &crate::facade::AdmissionMeters {
        &self.meters
    }

    pub fn new(max_waiting: usize, life: Arc<Life>, meters: crate::facade::AdmissionMeters) -> Admission {
        Admission {
            state: Mutex::new(State {
                next: 0,
                waiters: BTreeMap::new(),
                freed: 0,
            }),
            cv: Condvar::new(),
            max_waiting,
            life,
            meters,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Spawners may wait at all (`max_waiting` is not 0). With none
    /// allowed, a spawn only ever tries the shards directly.
    pub fn may_wait(&self) -> bool {
        self.max_waiting > 0
    }

    /// Take a place at the back of the queue for `slot`, or refuse: why
    /// spawns are refused (a drain or close started), or `Busy` past
    /// `max_waiting`. The waiters ahead may be being granted lanes right
    /// now: with `lanes_free` lanes free (the gauges' reading) that many of
    /// them are, and only the rest count as waiting against `max_waiting`
    /// (a burst of tasks on free lanes is admitted, not refused).
    ///
    /// Why no kick is missed: an engine freeing a lane publishes its gauge,
    /// then takes the next waiter under this lock. Either it comes after
    /// this arrival (and takes it), or before it, and then the arrival,
    /// reading the gauges after this returns, sees that lane free and kicks
    /// its shard.
    pub fn arrive(&self, slot: Arc<Slot<SpawnResult>>, lanes_free: usize) -> Result<u64, SpawnError> {
        let mut state = self.lock();
        if let Some(e) = self.life.spawn_refusal() {
            return Err(e);
        }
        let waiting = state.waiters.len();
        if waiting >= self.max_waiting.saturating_add(lanes_free) {
            return Err(SpawnError::Busy {
                waiting,
                max_waiting: self.max_waiting,
            });
        }
        let id = state.next;
        state.next += 1;
        state.waiters.insert(
            id,
            Waiter {
                slot,
                since: Instant::now(),
            },
        );
        self.meters.waiting(state.waiters.len());
        Ok(id)
    }

    /// Leave the queue; true if `id` was still in it (no grant is on its
    /// way to its slot), false once an engine took it.
    pub fn withdraw(&self, id: u64) -> bool {
        let mut state = self.lock();
        let removed = state.waiters.remove(&id).is_some();
        if removed {
            self.meters.waiting(state.waiters.len());
        }
        removed
    }

    /// The oldest waiter, taken out of the queue for an engine with a free
    /// lane to grant it (none once refused: the refusal answers them).
    /// Waiters whose slot was abandoned meanwhile are skipped.
    pub fn next_waiter(&self) -> Option<Waiter> {
        let mut state = self.lock();
        if self.life.spawn_refusal().is_some() {
            return None;
        }
        while let Some((_, waiter)) = state.waiters.pop_first() {
            if !waiter.slot.is_abandoned() {
                self.meters.waiting(state.waiters.len());
                return Some(waiter);
            }
        }
        self.meters.waiting(0);
        None
    }

    /// Whether new spawners are refused (a drain or a close started).
    pub fn is_refused(&self) -> bool {
        self.life.spawn_refusal().is_some()
    }

    /// Why spawns are refused, if they are (`Draining` after a drain
    /// started, `Closed` after a close): what a spawn request reaching an
    /// engine then is told, whichever path it took.
    pub fn refusal(&self) -> Option<SpawnError> {
        self.life.spawn_refusal()
    }

    /// The `freed` counter: a lane was freed (or spawns refused) since a
    /// caller read it if it moved.
    pub fn freed(&self) -> u64 {
        self.lock().freed
    }

    /// Block until `freed` moves past `seen` or `until` passes.
    pub fn wait_freed(&self, seen: u64, until: Instant) {
        let mut state = self.lock();
        while state.freed == seen {
            let now = Instant::now();
            if now >= until {
                return;
            }
            state = self
                .cv
                .wait_timeout(state, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Spawners waiting now.
    pub fn waiting(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Spawners that may wait at once (`RunnerConfig::max_waiting`).
    pub fn max_waiting(&self) -> usize {
        self.max_waiting
    }

    /// A lane freed up on some shard (its engine then takes the next waiter
    /// itself): the drain looks again.
    pub fn lane_freed(&self) {
        let mut state = self.lock();
        state.freed += 1;
        drop(state);
        self.cv.notify_all();
    }

    /// Refuse every waiter and every later spawner with `why` (the first
    /// refusal stands).
    pub fn refuse(&self, why: SpawnError) {
        let mut state = self.lock();
        // Under the lock: an arrival looks at the refusal under it too, so
        // none joins the queue after it was answered.
        self.life.refuse_spawns(&why);
        let why = self.life.spawn_refusal().unwrap_or(why);
        let waiters = std::mem::take(&mut state.waiters);
        state.freed += 1;
        self.meters.waiting(0);
        drop(state);
        self.cv.notify_all();
        // Answered outside the lock: an answer wakes a task.
        for (_, waiter) in waiters {
            waiter.slot.fill(Err(why.clone()));
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::protocol::Grant;
    use crate::sync::AtomicUsize;
    use crate::sync::Ordering;
    use lane_table::LaneId;
    use loom::sync::Arc as LoomArc;

    /// A shard as far as admission sees it: its free lanes (the table,
    /// under the engine's lock) and the gauge it publishes.
    struct Shard {
        free: Mutex<usize>,
        gauge: AtomicUsize,
        admission: Admission,
    }

    impl Shard {
        fn new(max_waiting: usize) -> Shard {
            Shard {
                free: Mutex::new(0),
                gauge: AtomicUsize::new(0),
                admission: Admission::new(
                    max_waiting,
                    Arc::new(crate::life::Life::new()),
                    crate::facade::AdmissionMeters::new(None),
                ),
            }
        }

        /// What the engine does with free lanes (`admit_waiting`): the
        /// oldest waiters get them.
        fn admit(&self, free: &mut usize) {
            while *free > 0 {
                let Some(waiter) = self.admission.next_waiter() else {
                    return;
                };
                *free -= 1;
                self.gauge.store(*free, Ordering::SeqCst);
                let grant = Grant {
                    shard: 0,
                    lane: LaneId(0),
                    stream: 0,
                };
                let _ = waiter.slot.offer(Ok(grant));
            }
        }

        /// An engine freeing a lane: the gauge first, then the queue.
        fn free_lane(&self) {
            let mut free = lock(&self.free);
            *free += 1;
            self.gauge.store(*free, Ordering::SeqCst);
            self.admission.lane_freed();
            self.admit(&mut free);
        }

        /// A spawner arriving: a place in the queue, then a kick if the
        /// gauge shows a free lane (the kicked engine admits).
        fn arrive(&self) -> Arc<Slot<SpawnResult>> {
            let slot = Arc::new(Slot::new());
            self.admission
                .arrive(slot.clone(), self.gauge.load(Ordering::SeqCst))
                .unwrap();
            if self.gauge.load(Ordering::SeqCst) > 0 {
                self.admit(&mut lock(&self.free));
            }
            slot
        }
    }

    /// A spawner arriving while an engine frees a lane: whatever the
    /// interleaving, it ends with the lane (no free lane beside a waiting
    /// spawner: the kick or the engine's look at the queue catches it).
    #[test]
    fn a_lane_freed_as_a_spawner_arrives_is_never_missed() {
        loom::model(|| {
            let shard = LoomArc::new(Shard::new(4));
            let freer = {
                let shard = shard.clone();
                loom::thread::spawn(move || shard.free_lane())
            };
            let slot = shard.arrive();
            freer.join().unwrap();
            assert!(slot.is_filled(), "a lane is free and the spawner still waits");
            assert_eq!(*lock(&shard.free), 0);
            assert_eq!(shard.admission.waiting(), 0);
        });
    }

    /// Two spawners waiting, one lane freed: exactly one is granted, the
    /// one that arrived first, and the other keeps its place.
    #[test]
    fn one_freed_lane_grants_one_waiter_in_arrival_order() {
        loom::model(|| {
            let shard = LoomArc::new(Shard::new(4));
            let first = shard.arrive();
            let second = shard.arrive();
            let freer = {
                let shard = shard.clone();
                loom::thread::spawn(move || shard.free_lane())
            };
            freer.join().unwrap();
            assert!(first.is_filled());
            assert!(!second.is_filled());
            assert_eq!(shard.admission.waiting(), 1);
        });
    }

    /// A refusal racing a freed lane: every waiter ends answered exactly
    /// once (granted or refused), none left waiting.
    #[test]
    fn a_refusal_racing_a_freed_lane_answers_every_waiter() {
        loom::model(|| {
            let shard = LoomArc::new(Shard::new(4));
            let waiter = shard.arrive();
            let (a, b) = (shard.clone(), shard.clone());
            let freer = loom::thread::spawn(move || a.free_lane());
            let refuser = loom::thread::spawn(move || b.admission.refuse(SpawnError::Closed));
            freer.join().unwrap();
            refuser.join().unwrap();
            assert!(waiter.is_filled(), "a waiter left unanswered");
            assert_eq!(shard.admission.waiting(), 0);
        });
    }
}
