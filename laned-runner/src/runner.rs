//! The runner (tract's `Runnable`): its shards, admission across them, and
//! the settings that change while serving. It owns the runner's life; the
//! steps below are numbered here only, and code elsewhere cites them.
//!
//! # A runner's life: start, serve, drain, close
//!
//! A soft drain ([`LanedRunner::drain`]) runs steps 3 to 10;
//! [`LanedRunner::stop_admitting`] alone is step 3; the hard close
//! ([`LanedRunner::close`]) runs step 3 and then 5 on (no wait); dropping
//! the last `LanedRunner` starts at step 7. Steps 3 and 4 are this file's
//! (on the admission queue every shard shares); 5 and 6 are `Shard::drain`'s,
//! 7 to 10 `Shard::close`'s and `Common::close`'s (the deadline thread), each
//! mode doing 6, 8 and 9 its own way (`shard/worker.rs`,
//! `shard/combining.rs`). How far along the steps the runner is, and how it
//! ends, is one state, `life::Life`, which every part reads (steps 3, 4, 5
//! and 7 are its bits).
//!
//! 1. **Start** ([`LanedRunner::new`]). Per shard, in order: the engine
//!    spawns the state and resets every lane once, so an op state that
//!    cannot serve several streams fails here, naming the op; then the
//!    mode's thread starts (the worker, which builds the engine on itself,
//!    or the combining helper). A shard that fails closes those already
//!    started. Last, the deadline thread. No stream exists yet.
//! 2. **Serve.** A spawn takes a free lane (reset) on the least loaded
//!    shard, or waits in the admission queue, whose oldest waiter gets the
//!    next lane freed on any shard. Each call queues its seats in its
//!    shard's inbox; whoever holds the state (the worker, or a combining
//!    caller) takes them in and runs turns as the policy says, answering
//!    each seat. An idle stream is evicted; the last handle dropped gives
//!    its lane back, to the oldest waiter first.
//! 3. **Admission is refused** (`Draining`): every waiting spawner is
//!    answered at once, and every engine refuses a spawn it takes in from
//!    then on (it reads the runner's life), whichever path the
//!    spawn took. Live streams call as before. Once the runner's end is
//!    marked (a drain's step 4, or a close), every spawn path is refused
//!    with that end: `Draining` after a drain, `Closed` after a close, as
//!    its streams are told (`Common::told_spawn`).
//! 4. **The drain waits**, woken by every freed lane, until no stream holds
//!    a lane or its deadline passes; the streams left are the stragglers,
//!    and the runner is marked drained, so that they are told `Draining`
//!    (retry elsewhere), not `Closed`, from now on.
//! 5. **The runner is marked draining** (under the first shard's inbox
//!    lock; each shard's is then taken in turn and its sleeper woken, so no
//!    sleeper misses it): a
//!    turn policy waiting for more seats starts the turn at once (nothing
//!    new can join).
//! 6. **Every engine refuses new calls** (`Draining`) from the next
//!    request it takes in, whoever holds the state (the worker; in combining mode a
//!    caller, the helper, or the draining thread, which waits for the
//!    state); what is queued is served turn after
//!    turn. A draining helper does not wait for more calls: it lets the
//!    state go once nothing is queued. Once nothing is queued or waiting
//!    for an answer, the runner closes every shard.
//! 7. **The deadline thread stops.** The runner is marked closed (as in
//!    5), and on every shard, before any is joined, everyone sleeping on its
//!    inbox or its mode's condvar woken: from now on a push is refused and
//!    answered `Closed` by the pusher itself.
//! 8. **The modes' threads stop**: each worker (or helper) sees the mark;
//!    the closing thread joins them, shard after shard (never itself).
//! 9. **The engine is closed on a live thread** (the worker in worker
//!    mode, the closing thread otherwise): every pending call is answered
//!    `Closed`, the queue dropped, and the state dropped with it.
//! 10. **Late requests are answered**: those pushed between 7 and 9 are
//!     taken in and answered by the same closed engine, so every request
//!     ever pushed gets exactly one answer.
//!
//! Each step has its test, named after it, in the runner's
//! `tests/runner/runner_life.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use laned_metrics::{Metrics, Snapshot};
use tract_core::internal::*;

use crate::admission::Admission;
use crate::capacity::{Capacity, ShardCapacity};
use crate::common::Common;
use crate::config::RunnerConfig;
use crate::engine::Parts;
use crate::err::{EndReason, NewRunnerError, RunError, SpawnError};
use crate::handle::{LanedStateHandle, Stream};
use crate::iface::Interface;
use crate::implicit::ImplicitState;
use crate::life::Life;
use crate::policy::{LearnedTurnTimes, PolicyError, TurnPolicy};
use crate::protocol::{Grant, Live};
use crate::shard::Shard;
use crate::slot::Slot;
use crate::wire::{StreamState, Wire};
use arc_swap::ArcSwap;

/// Closes every shard when the last owning [`LanedRunner`] goes: every
/// waiting caller is answered, the workers joined. Handles do not own the
/// runner.
struct Owner {
    core: Arc<Common>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.core.close();
    }
}

/// A waiter's place in the admission queue: leaves it however the
/// spawn's future ends. Dropped before its answer was taken, it withdraws
/// from the queue, or, if an engine took it already, abandons its slot, so
/// that no lane is granted to nobody (one that landed goes back).
struct Place<'a> {
    core: &'a Common,
    id: u64,
    /// `None` once the answer was taken.
    slot: Option<Arc<Slot<crate::protocol::SpawnResult>>>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else { return };
        if self.core.admission.withdraw(self.id) {
            return;
        }
        // A grant landing later is refused by the abandoned slot, and the
        // engine hands the lane to the next waiter itself.
        if let Some(Ok(grant)) = slot.abandon() {
            let shard = &self.core.shards[grant.shard];
            shard.push(crate::protocol::Request::Release(grant));
            shard.tend();
        }
    }
}

/// Serves many streams through one laned tract state. A drop-in for
/// `tract_core::lanes::LanedRunnable`: it implements [`Runnable`], and
/// [`Runnable::spawn`] hands out a [`LanedStateHandle`] per stream.
///
/// Clones share the runner; once the last clone is dropped, every queued or
/// later call is answered with an error and the worker is joined.
#[derive(Clone)]
pub struct LanedRunner {
    pub(crate) core: Arc<Common>,
    /// `None` in the copy a handle keeps for [`State::runnable`].
    _owner: Option<Arc<Owner>>,
}

impl fmt::Debug for LanedRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LanedRunner({} lanes, {:?})",
            self.core.config.max_lanes, self.core.config.mode
        )
    }
}

impl LanedRunner {
    /// Serve `inner`, prepared from a model carrying one batch symbol on
    /// axis 0 of its batched inputs and outputs (one output at least). Every
    /// lane is reset once here, so a state that cannot serve several streams
    /// fails now, naming its op.
    pub fn new(inner: Arc<dyn Runnable>, config: RunnerConfig) -> Result<LanedRunner, NewRunnerError> {
        // Step 1 of the runner's life (this module's doc).
        let state_spec = config.state.clone();
        let config = config.resolve()?;
        // The ops' implicit state lifted into explicit pairs first, so that
        // everything after sees one kind of state.
        let given = inner.clone();
        let lifted = crate::implicit::lift(inner).map_err(|e| NewRunnerError::Model(format!("{e:#}")))?;
        let inner = lifted.runnable;
        let mut iface = Interface::of(&*inner, &state_spec, &lifted.pairs)?;
        iface.kept = lifted.kept;
        let iface = Arc::new(iface);
        let left: Vec<(String, String)> = lifted
            .report
            .iter()
            .filter_map(|s| match &s.laned {
                crate::implicit::Laned::InPlace { why } => Some((s.node.clone(), why.clone())),
                _ => None,
            })
            .collect();
        let wire = Wire::of(inner.typed_model().map(|m| &**m), &iface, lifted.report);
        let live = Arc::new(ArcSwap::from_pointee(Live {
            policy: config.policy,
            max_seats: config.max_seats,
            learn_width: config.learn_width,
        }));
        let name = inner.typed_model().and_then(|m| m.name());
        let life = Arc::new(Life::new());
        let admission = Arc::new(Admission::new(
            config.max_waiting,
            life.clone(),
            crate::facade::AdmissionMeters::new(name),
        ));
        let mut shards: Vec<Arc<Shard>> = vec![];
        let (mut metrics, mut times) = (vec![], vec![]);
        for index in 0..config.shards {
            let parts = Parts {
                inner: inner.clone(),
                iface: iface.clone(),
                metrics: Arc::new(Metrics::new(config.max_lanes + 1)),
                live: live.clone(),
                times: Arc::new(LearnedTurnTimes::new(config.max_lanes + 1)),
                admission: admission.clone(),
                life: life.clone(),
                index,
                meters: crate::facade::Meters::new(name, index, config.max_lanes),
            };
            metrics.push(parts.metrics.clone());
            times.push(parts.times.clone());
            // A shard failing to start closes those already started (their
            // workers joined, states dropped on their own threads).
            match Shard::start(parts, &config) {
                Ok(shard) => shards.push(shard),
                Err(mut e) => {
                    Shard::close_all(&shards);
                    // An op tract cannot lane that the lift left in place:
                    // why it was left is the caller's next question.
                    if let NewRunnerError::Reset {
                        node: Some(node),
                        cause,
                        ..
                    } = &mut e
                    {
                        if let Some((_, why)) = left.iter().find(|(n, _)| n == node) {
                            cause.push_str(&format!(" (its state was not lifted to a lane: {why})"));
                        }
                    }
                    return Err(e);
                }
            }
        }
        // The deadline thread, started here so that a call with a deadline
        // never finds it missing; it sleeps until the first such call.
        let timer = Arc::new(crate::deadline::Timer::new());
        if let Err(e) = timer.start() {
            Shard::close_all(&shards);
            return Err(NewRunnerError::Spawn(e));
        }
        let core = Arc::new(Common {
            given,
            served: inner.clone(),
            iface,
            wire,
            shards,
            metrics,
            events: Arc::new(Metrics::new(1)),
            times,
            admission,
            config,
            live,
            life,
            timer,
        });
        Ok(LanedRunner {
            _owner: Some(Arc::new(Owner { core: core.clone() })),
            core,
        })
    }

    /// tract's constructor: serve at most `lanes` streams through `inner`,
    /// on one shard, every other setting from tract's knobs
    /// (`TRACT_MAX_SEATS`, `TRACT_TURN_LINGER_US`) as
    /// `tract_core::lanes::LanedRunnable::wrap` reads them. The one-line
    /// switch from tract's runner.
    pub fn wrap(inner: Arc<dyn Runnable>, lanes: usize) -> TractResult<LanedRunner> {
        Ok(LanedRunner::new(
            inner,
            RunnerConfig::builder().max_lanes(lanes).shards(1).build(),
        )?)
    }

    /// Turns run and seats filled so far, every shard's (tract's reading of
    /// its runner): `seats / turns` is the mean occupancy.
    pub fn turns_and_seats(&self) -> (u64, u64) {
        let m = self.metrics();
        (m.turns, m.seats)
    }

    /// A new stream, holding a lane (reset) until its last handle is
    /// dropped. Never waits: fails at once when every lane is taken (tract's
    /// contract), saying how many lanes there are and how many wait.
    pub fn try_spawn(&self) -> Result<LanedStateHandle, SpawnError> {
        self.spawn_with(None).map_err(|e| self.core.told_spawn(e))
    }

    /// A new stream, waiting up to `wait` for a lane when every lane is
    /// taken, in arrival order (first come, first served). Refused at once as
    /// busy when `max_waiting` spawners wait already.
    pub fn spawn_timeout(&self, wait: Duration) -> Result<LanedStateHandle, SpawnError> {
        self.spawn_with(Some(wait)).map_err(|e| self.core.told_spawn(e))
    }

    /// A spawn, step 2 of the runner's life (this module's doc): a free
    /// lane on the least loaded shard, or a place in the admission queue.
    fn spawn_with(&self, wait: Option<Duration>) -> Result<LanedStateHandle, SpawnError> {
        let core = &self.core;
        let (shard, grant) = match wait {
            // First come, first served: each engine grants its free lanes
            // to the admission queue's waiters before a direct try, so
            // this is refused only when no lane is left (never while one
            // is free).
            None => crate::drive::block(core.try_shards(None, &mut crate::drive::Thread)).inspect_err(|e| {
                if matches!(e, SpawnError::Full { .. }) {
                    core.book_refusal();
                }
            })?,
            // The same admission as a task's, driven by this thread: it
            // parks until granted, and gives up at the deadline (`None`: a
            // wait too long for the clock waits on).
            Some(wait) => match crate::drive::on(self.admit(), Instant::now().checked_add(wait)) {
                Some(placed) => placed?,
                None => {
                    core.book_refusal();
                    return Err(SpawnError::TimedOut {
                        waited: wait,
                        total_lanes: core.total_lanes(),
                    });
                }
            },
        };
        Ok(self.handle(shard, grant))
    }

    /// A new stream, for a task: waits for a lane in the same FIFO
    /// admission queue as blocking spawners (one queue, arrival order across
    /// both kinds), with the same refusals (`Busy`, `Draining`, `Closed`),
    /// but no thread waits: the engine granting a lane wakes the task (one
    /// task per lane freed). It waits as long as it takes; bound it with the
    /// executor's timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future before it is ready leaves the
    /// queue clean, and a lane granted to it meanwhile goes back to the
    /// next waiter. A future polled once and then neither polled nor
    /// dropped holds at most the one lane granted to it; the waiters
    /// behind it are served as if it were not there.
    pub async fn spawn_async(&self) -> Result<LanedStateHandle, SpawnError> {
        let (shard, grant) = self.admit().await.map_err(|e| self.core.told_spawn(e))?;
        Ok(self.handle(shard, grant))
    }

    /// A lane, through the admission queue from arrival on: tasks arrive
    /// many at once (an executor polls them in a row), so the queue, not the
    /// order in which tries reach the shards, decides who goes first. The
    /// engines grant the waiters, oldest first (see `admission`).
    async fn admit(&self) -> Result<(usize, Grant), SpawnError> {
        let core = &self.core;
        let refused = |e: &SpawnError| {
            if matches!(e, SpawnError::Busy { .. }) {
                core.book_refusal();
            }
        };
        // Nobody may wait: a free lane now, or busy.
        if !core.admission.may_wait() {
            return match core.try_shards(None, &mut crate::drive::Task).await {
                Err(SpawnError::Full { .. }) => {
                    let busy = SpawnError::Busy {
                        waiting: 0,
                        max_waiting: 0,
                    };
                    refused(&busy);
                    Err(busy)
                }
                placed => placed,
            };
        }
        let slot = Arc::new(Slot::new());
        let lanes_free = core.total_lanes().saturating_sub(core.streams());
        let id = core.admission.arrive(slot.clone(), lanes_free).inspect_err(refused)?;
        // Leaves the queue however this future ends, dropped included.
        let mut place = Place {
            core,
            id,
            slot: Some(slot.clone()),
        };
        // After arriving, not before (see `Admission::arrive`).
        let kicked = core.kick();
        let answer = std::future::poll_fn(|cx| {
            // Combining mode: the kick waits in the inbox of a shard whose
            // state may be free, for whoever holds it; hold it ourselves.
            for &ix in &kicked {
                core.shards[ix].serve(&|| slot.is_filled());
            }
            slot.poll_value(cx)
        })
        .await;
        place.slot = None;
        answer.map(|grant| (grant.shard, grant))
    }

    /// The handle of a stream granted `grant` on shard `shard`.
    fn handle(&self, shard: usize, grant: Grant) -> LanedStateHandle {
        let core = &self.core;
        LanedStateHandle {
            stream: Arc::new(Stream {
                grant,
                shard,
                core: core.clone(),
                finished: crate::sync::AtomicBool::new(false),
            }),
            slot: Arc::new(Slot::new()),
            resolved: vec![],
            dropped: None,
            runner: Arc::new(LanedRunner {
                core: core.clone(),
                _owner: None,
            }),
        }
    }

    /// Stop admitting new streams, step 3 of the runner's life (the
    /// sequence in this module's doc): from the instant this returns every spawn is refused with
    /// [`SpawnError::Draining`], and every spawner waiting for a lane is
    /// answered so at once. Live streams keep calling as before. A
    /// readiness probe reading [`LanedRunner::capacity`] sees `accepting`
    /// false.
    pub fn stop_admitting(&self) {
        self.core.admission.refuse(SpawnError::Draining);
    }

    /// Whether new streams are admitted (no drain or close started).
    pub fn is_admitting(&self) -> bool {
        !self.core.admission.is_refused()
    }

    /// The soft drain, a rolling restart's steps in one call (this
    /// module's doc numbers them all):
    ///
    /// - step 3, stop admitting ([`LanedRunner::stop_admitting`]): new
    ///   spawns are refused with `Draining`;
    /// - step 4, let every live stream finish, calling as usual, until the
    ///   last one has dropped its handle or `deadline` passes;
    /// - steps 5 to 10, close ([`LanedRunner::close`]): what is queued is
    ///   served, and the streams still live past the deadline (the
    ///   stragglers) are told `Draining` at their next call
    ///   ([`RunError::end_reason`] says [`EndReason::Drained`]: retry
    ///   elsewhere).
    ///
    /// [`RunError::end_reason`]: crate::RunError::end_reason
    /// [`EndReason::Drained`]: crate::EndReason::Drained
    pub fn drain(&self, deadline: Instant) -> Drained {
        let core = &self.core;
        crate::trace::event!(
            info,
            streams = core.streams(),
            "a drain started, {:?} to its deadline",
            deadline.saturating_duration_since(Instant::now())
        );
        // Step 3.
        self.stop_admitting();
        // Step 4.
        loop {
            // Read before looking: a lane freed after the look moves it.
            let seen = core.admission.freed();
            if core.streams() == 0 || Instant::now() >= deadline {
                break;
            }
            // Woken by every freed lane; bounded, so that a release seen
            // by the gauge but not signalled yet costs at most 20 ms.
            core.admission
                .wait_freed(seen, deadline.min(Instant::now() + Duration::from_millis(20)));
        }
        let stragglers = core.streams();
        crate::trace::event!(info, stragglers, "a drain's wait ended; closing");
        core.life.mark_end(EndReason::Drained);
        Drained {
            stragglers,
            metrics: self.close(),
        }
    }

    /// The hard close: refuse new streams and calls at once (`Closed`, on
    /// every spawn path and to every stream; after a drain, `Draining`),
    /// finish what is queued on every shard, close the runner (every later
    /// call is refused), and return the final metrics. Streams are cut
    /// wherever they are: [`LanedRunner::drain`] lets them end first.
    pub fn close(&self) -> Snapshot {
        // First, before any stream is refused: every refusal from here on
        // says this end (see `Common::told`).
        self.core.life.mark_end(EndReason::Closed);
        // Step 3 (again, for a close that is not a drain's end).
        self.core.admission.refuse(SpawnError::Draining);
        // Steps 5 and 6, shard by shard.
        for shard in &self.core.shards {
            shard.drain();
        }
        // Steps 7 to 10.
        self.core.close();
        self.metrics()
    }

    /// [`LanedRunner::drain`] for a task: the drain runs on a thread of the
    /// runner's own, and the task is woken when it is done (no executor
    /// thread waits out the deadline).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in that the drain is not undone: once the future was
    /// first polled, the drain goes on to its end whether or not the future
    /// is polled again; only its report is lost.
    pub async fn drain_async(&self, deadline: Instant) -> Drained {
        let runner = self.clone();
        self.off_thread("laned-drain", move || runner.drain(deadline))
            .await
            // The thread could not be started: drained here, then.
            .unwrap_or_else(|| self.drain(deadline))
    }

    /// [`LanedRunner::close`] for a task: the close (which joins the
    /// runner's threads) runs on a thread of the runner's own.
    ///
    /// # Cancel safety
    ///
    /// As [`LanedRunner::drain_async`]'s: a close once started completes.
    pub async fn close_async(&self) -> Snapshot {
        let runner = self.clone();
        self.off_thread("laned-close", move || runner.close())
            .await
            .unwrap_or_else(|| self.close())
    }

    /// Run `job` on a thread of its own and wait for its result as a task;
    /// `None` if the thread could not be started.
    async fn off_thread<T: Send + 'static>(&self, name: &str, job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let slot = Arc::new(Slot::new());
        let answer = slot.clone();
        let started = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || answer.fill(job()));
        if started.is_err() {
            return None;
        }
        Some(std::future::poll_fn(|cx| slot.poll_value(cx)).await)
    }

    /// Free lanes, waiting spawners and queued seats, per shard and in
    /// total, and whether streams are admitted: what a readiness probe or a
    /// gateway reads (cheap: gauges, no round trip to any shard).
    pub fn capacity(&self) -> Capacity {
        let core = &self.core;
        let shards: Vec<ShardCapacity> = core
            .metrics
            .iter()
            .zip(&core.shards)
            .map(|(m, shard)| {
                let lanes = core.config.max_lanes;
                ShardCapacity {
                    lanes,
                    lanes_free: lanes.saturating_sub(m.lanes_taken() as usize),
                    // Taken in by the engine, and pushed but not taken in
                    // yet (a combining task's call waits there until some
                    // caller holds the state).
                    seats_queued: m.seats_queued() as usize + shard.waiting_seats(),
                }
            })
            .collect();
        Capacity {
            accepting: self.is_admitting(),
            lanes: core.total_lanes(),
            lanes_free: shards.iter().map(|s| s.lanes_free).sum(),
            spawners_waiting: core.admission.waiting(),
            max_waiting: core.admission.max_waiting(),
            seats_queued: shards.iter().map(|s| s.seats_queued).sum(),
            shards,
        }
    }

    /// Whether a stream of this runner would import `state`
    /// ([`LanedStateHandle::import_state`]): the same checks (its format
    /// version, its model's identity, each tensor's datum type and shape),
    /// without a stream. A server checks a record here before it tells
    /// its client where the stream resumes. The identity states carry is
    /// [`LanedRunner::state_identity`].
    pub fn check_state(&self, state: &StreamState) -> Result<(), RunError> {
        self.core.wire.import(state).map(|_| ())
    }

    /// What a turn runs: the plan as given with its ops' implicit state
    /// lifted into explicit pairs (a Scan's) or kept in the runner's own
    /// ops (a Delay's, a PulsePad's), and every explicit state the runner
    /// keeps per lane (the caller's pairs and the lifted ones), in input
    /// order. For a loop that batches the same plan by hand: it feeds each
    /// explicit state, a row per lane from its initial value, and feeds
    /// each next value back; on a plain state (no seating), the kept ops
    /// keep a lane per row. Not a ceiling: a bench's ideal loop runs the
    /// model as the user gave it.
    pub fn served(&self) -> (Arc<dyn Runnable>, Vec<KeptState>) {
        let kept = self
            .core
            .iface
            .state
            .iter()
            .map(|s| {
                let initial = s.initial.clone().unwrap_or_else(|| {
                    let shape: Vec<usize> = s
                        .fact
                        .shape
                        .iter()
                        .enumerate()
                        .map(|(ax, d)| if ax == s.axis { 1 } else { d.to_usize().unwrap_or(1) })
                        .collect();
                    Tensor::zero_dt(s.fact.datum_type, &shape).expect("a state's shape")
                });
                KeptState {
                    input: s.input,
                    output: s.output,
                    axis: s.axis,
                    initial,
                }
            })
            .collect();
        (self.core.served.clone(), kept)
    }

    /// Every op of the model keeping state from one turn to the next
    /// (tract-pulse's Delay and PulsePad, a Scan's or GruSeq's hidden
    /// state...) and how it is laned: lifted into explicit state, which
    /// travels, or left in place, which does not.
    pub fn implicit_state(&self) -> &[ImplicitState] {
        self.core.wire.implicit()
    }

    /// Whether a stream's whole state can be exported and imported
    /// elsewhere ([`LanedStateHandle::export_state`]): false when some op
    /// keeps state no export reads ([`LanedRunner::implicit_state`] names
    /// it), and then a stream moved to another runner must start over.
    pub fn state_travels(&self) -> bool {
        self.core.wire.stays().is_none()
    }

    /// The identity of this runner's model as its streams' exported states
    /// carry it ([`StreamState::model`]): its name, its state inputs'
    /// facts, a digest of its weights and one of its graph.
    pub fn state_identity(&self) -> &str {
        self.core.wire.identity()
    }

    /// A clone that does not keep the runner open: once every other clone is
    /// dropped, the runner closes (answering everyone) and spawns or calls
    /// through this one fail as closed. For threads that serve streams but
    /// should not decide the runner's life (an accept loop, say).
    pub fn detached(&self) -> LanedRunner {
        LanedRunner {
            core: self.core.clone(),
            _owner: None,
        }
    }

    /// What the runner has served so far: every shard's records together,
    /// with the runner-wide events (admission refusals, policy changes).
    pub fn metrics(&self) -> Snapshot {
        let mut total = self
            .shard_metrics()
            .iter()
            .fold(self.core.events.snapshot(), |total, shard| total.merge(shard));
        total.spawners_waiting = self.core.admission.waiting() as u64;
        total
    }

    /// What each shard has served (occupancy per shard shows imbalance);
    /// runner-wide events are in [`LanedRunner::metrics`] only.
    pub fn shard_metrics(&self) -> Vec<Snapshot> {
        self.core.metrics.iter().map(|m| m.snapshot()).collect()
    }

    /// Laned states behind the runner.
    pub fn shards(&self) -> usize {
        self.core.shards.len()
    }

    /// Lanes of each shard (`RunnerConfig::max_lanes`): the most streams
    /// one shard holds at once.
    pub fn max_lanes(&self) -> usize {
        self.core.config.max_lanes
    }

    /// Lanes of every shard together: the most streams the runner holds at
    /// once (what [`SpawnError::Full`] counts).
    pub fn total_lanes(&self) -> usize {
        self.core.total_lanes()
    }

    /// The widest turn, after the environment and the clamp to the lanes.
    pub fn max_seats(&self) -> usize {
        self.core.live.load().max_seats
    }

    /// The turn policy now in force.
    pub fn policy(&self) -> TurnPolicy {
        self.core.live.load().policy
    }

    /// Change the turn policy while serving. Queued calls are not lost: the
    /// next turn is decided by the new policy (a waiting worker re-decides at
    /// once). Counted in the metrics (`policy_changes`). Concurrent changes
    /// of the policy and of `max_seats` never undo each other.
    ///
    /// Refused, the policy in place kept, where [`TurnPolicy::check`]
    /// refuses it: the same check and error as its text, serde and
    /// [`LanedRunner::new`] give.
    pub fn set_policy(&self, policy: TurnPolicy) -> Result<(), PolicyError> {
        policy.check()?;
        self.update_live(|live| Live { policy, ..*live });
        Ok(())
    }

    /// Change the widest turn while serving (clamped to the state's lanes,
    /// 1 at least). A width set is the width served: the learned width no
    /// longer caps turns.
    pub fn set_max_seats(&self, max_seats: usize) {
        let max_seats = max_seats.clamp(1, self.core.config.max_lanes + 1);
        self.update_live(|live| Live {
            max_seats,
            learn_width: false,
            ..*live
        });
    }

    /// The turn width each shard learned to cost least per row, where it
    /// caps that shard's turns (`None`: no cap learned, every queued seat
    /// may sit, up to `max_seats`; always `None` with the learning off).
    /// See [`RunnerConfig::learn_width`].
    pub fn learned_width(&self) -> Vec<Option<usize>> {
        // What each engine last published (the gauge): the cap its turns
        // are seated with, not a fresh reading of the curve.
        let learning = self.core.live.load().learn_width;
        self.core
            .metrics
            .iter()
            .map(|m| match m.learned_width() {
                0 => None,
                w if learning => Some(w as usize),
                _ => None,
            })
            .collect()
    }

    /// Apply `change` to the live settings as one read-modify-write (`rcu`:
    /// retried if another setter stored in between), then wake whoever
    /// waits on the old ones.
    fn update_live(&self, change: impl Fn(&Live) -> Live) {
        self.core.live.rcu(|live| Arc::new(change(live)));
        for shard in &self.core.shards {
            shard.live_changed();
        }
        self.core.book_policy_change();
    }

    /// The turn time learned per occupancy, per shard (each shard learns
    /// its own): for each, (occupancy, mean turn time).
    pub fn turn_time_curves(&self) -> Vec<Vec<(usize, Duration)>> {
        self.core.times.iter().map(|t| t.curve()).collect()
    }

    /// Who runs the turns.
    pub fn mode(&self) -> crate::Mode {
        self.core.config.mode
    }

    /// The symbol axis 0 of the batched tensors carries: a turn's occupancy.
    pub fn batch_symbol(&self) -> &Symbol {
        &self.core.iface.batch
    }

    /// The explicit state the runner keeps per lane, as the model's (input,
    /// output) index pairs: the pairs configured, or those
    /// [`StateSpec::Detect`](crate::StateSpec::Detect) found; empty for
    /// none. The caller feeds every other input and gets every other
    /// output, in the model's order.
    /// The pairs lifted out of the model's ops are not among them
    /// ([`LanedRunner::implicit_state`] names those).
    pub fn explicit_state(&self) -> Vec<(usize, usize)> {
        let given = self.core.given.input_count();
        self.core
            .iface
            .state
            .iter()
            .filter(|s| s.input < given)
            .map(|s| (s.input, s.output))
            .collect()
    }

    /// The model as prepared (as given, before the implicit-state lift),
    /// serving one stream at a time.
    pub fn inner(&self) -> &Arc<dyn Runnable> {
        &self.core.given
    }
}

impl Runnable for LanedRunner {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        Ok(Box::new(self.try_spawn()?))
    }

    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.core.given.typed_plan()
    }

    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.core.given.typed_model()
    }

    fn input_count(&self) -> usize {
        self.core.given.input_count()
    }

    fn output_count(&self) -> usize {
        self.core.given.output_count()
    }

    fn input_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.core.given.input_fact(ix)
    }

    fn output_fact(&self, ix: usize) -> TractResult<&TypedFact> {
        self.core.given.output_fact(ix)
    }
}

/// What [`LanedRunner::drain`] saw.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Drained {
    /// Streams still live when the deadline passed (0: every stream ended
    /// in time). Their next call is refused with `Draining`.
    pub stragglers: usize,
    /// The runner's final metrics.
    pub metrics: Snapshot,
}

/// A state a runner keeps per lane, as [`LanedRunner::served`] gives it:
/// the served plan's input `input` is fed it, output `output` returns its
/// next value, its batch on `axis`; `initial` is one stream's first value
/// (1 on `axis`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KeptState {
    /// The served plan's input fed the state.
    pub input: usize,
    /// The served plan's output returning its next value.
    pub output: usize,
    /// The state's batch axis.
    pub axis: usize,
    /// One stream's initial value.
    pub initial: Tensor,
}
