//! The part of a shard both modes share, and depend on one way: the inbox,
//! the engine's lock, the live settings, holding a free state, the wakes
//! kept while it is held, and the turn loop's body, [`Shared::step`], that
//! every holder of the engine runs. The modes (`worker`, `combining`)
//! decide *who* holds the engine and when it sleeps and wakes; everything
//! here is how a turn is waited for and run, whoever runs it.

use std::sync::{Arc, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::Resolved;
use crate::engine::Engine;
use crate::inbox::{Inbox, Inner};
use crate::life::Life;
use crate::policy::Decision;
use crate::protocol::{Live, Request};
use crate::sync::{lock, AtomicUsize, Mutex, MutexGuard, Ordering};
use crate::wake::Deferred;
use arc_swap::ArcSwap;

use crate::context;

pub(super) struct Shared {
    /// Who may touch it: any thread pushes (handles, spawns, drops); the
    /// thread holding `engine` drains it.
    pub(super) inbox: Inbox<Request>,
    /// The state, held through [`Held`]. Who may touch it: in worker mode
    /// only the worker thread (and a waker it runs, lent the engine); in
    /// combining mode whichever caller or the helper wins `try_lock`, and
    /// the closing thread. `None` only while its holder lends it to the
    /// wakes it runs (see [`context`]): the lock stays held meanwhile.
    engine: Mutex<Option<Box<Engine>>>,
    /// The policy and `max_seats`: written by `set_policy` (any thread),
    /// loaded once per decision by whoever runs the turn, which runs with
    /// the same.
    live: Arc<ArcSwap<Live>>,
    /// The mode's thread (the worker, the helper), joined by the close.
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Whether calls resolving a symbol can be served (read-only).
    can_forget_symbols: bool,
    /// The runner's idle timeout (read-only).
    pub(super) idle_timeout: Option<Duration>,
    /// Callers blocked in `Shard::wait` right now (any thread, relaxed: a
    /// hint for whether to spin, and for the helper whether a thread waits).
    pub(super) waiters: AtomicUsize,
}

/// The inbox's lock, held.
pub(super) type InboxGuard<'a> = MutexGuard<'a, Inner<Request>>;

/// How a [`Shared::step`] decides whether the turn runs.
#[derive(Clone, Copy)]
pub(super) enum Pace<'a> {
    /// Wait as the turn policy says, asleep on the inbox meanwhile (the
    /// worker, the helper: threads with no call of their own).
    Policy,
    /// Only a turn the policy says is due now, and not once `done` (a
    /// caller serving while it waits: it never sleeps holding the state,
    /// where its own cancel or deadline could not reach it).
    DueNow(&'a dyn Fn() -> bool),
    /// Whatever the policy says, while `done` is false (a waker calling
    /// back into the shard its thread holds, a drain).
    AtOnce(&'a dyn Fn() -> bool),
}

/// What a [`Shared::step`] did.
pub(super) enum Stepped {
    /// Nothing was queued once the inbox was taken in.
    Idle,
    /// Seats are queued, but no turn ran: not due yet, the caller done,
    /// or the shard closed while the policy waited.
    Held,
    /// A turn ran.
    Ran,
}

/// An engine held by this thread, as a step runs turns on it: through its
/// lock ([`Held`]) or lent to a waker calling back (`&mut Engine`).
pub(super) trait Holding: std::ops::DerefMut<Target = Engine> {
    /// Run the wakes this thread kept, before a turn.
    fn wake_kept(&mut self, shared: &Arc<Shared>);
}

impl Holding for Held<'_> {
    fn wake_kept(&mut self, shared: &Arc<Shared>) {
        shared.wake_kept(self);
    }
}

/// A lent engine (or one a worker's own waker holds with no scope open):
/// its wakes stay kept for its lender, which runs them.
impl Holding for &mut Engine {
    fn wake_kept(&mut self, _: &Arc<Shared>) {}
}

/// The engine, held: the engine's lock, taken. Derefs to the engine.
pub(super) struct Held<'a>(MutexGuard<'a, Option<Box<Engine>>>);

impl std::ops::Deref for Held<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        self.0
            .as_deref()
            .expect("the engine is back once its lender's wakes ran")
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        self.0
            .as_deref_mut()
            .expect("the engine is back once its lender's wakes ran")
    }
}

impl Held<'_> {
    /// The engine itself, taken out of the lock (which stays held) to be
    /// lent: see [`context::lend`].
    pub(super) fn slot(&mut self) -> &mut Option<Box<Engine>> {
        &mut self.0
    }
}

impl Shared {
    pub(super) fn new(engine: Engine, config: &Resolved, live: Arc<ArcSwap<Live>>, life: Arc<Life>) -> Shared {
        Shared {
            inbox: Inbox::new(life),
            can_forget_symbols: engine.can_forget_symbols(),
            engine: Mutex::new(Some(Box::new(engine))),
            live,
            thread: Mutex::new(None),
            idle_timeout: config.idle_timeout,
            waiters: AtomicUsize::new(0),
        }
    }

    pub(super) fn can_forget_symbols(&self) -> bool {
        self.can_forget_symbols
    }

    /// The mode's thread, to be joined by the close.
    pub(super) fn keep_thread(&self, thread: JoinHandle<()>) {
        *lock(&self.thread) = Some(thread);
    }

    /// Wait for the engine's lock and hold it.
    pub(super) fn lock(&self) -> Held<'_> {
        Held(lock(&self.engine))
    }

    /// The engine's lock, if nobody holds it.
    pub(super) fn try_lock(&self) -> Option<Held<'_>> {
        match self.engine.try_lock() {
            Ok(engine) => Some(Held(engine)),
            Err(TryLockError::Poisoned(e)) => Some(Held(e.into_inner())),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Queue a request for the engine and wake whoever serves it. Once the
    /// shard is closed nobody drains the inbox, so the request is answered
    /// here.
    pub(super) fn push(self: &Arc<Self>, request: Request) {
        let seats = match &request {
            Request::Call(call) => Some(call.seats.len()),
            _ => None,
        };
        match self.inbox.push(request, seats) {
            Ok(()) => (),
            // A stream let go after the close: its lane is booked back by
            // the closed engine (the gauges and `capacity` then agree that
            // nobody holds it). The engine is held at most briefly by now:
            // whoever closed it is done or finishing.
            Err(request @ Request::Release(_)) => {
                let _wakes = Deferred::open();
                let mut request = Some(request);
                // A waker of this shard's holder letting a stream go: the
                // engine is this thread's already.
                let lent = context::with_lent(self, |engine: &mut Engine| {
                    engine.accept_batch(request.take().into_iter().collect(), Instant::now())
                });
                if lent.is_none() {
                    self.lock()
                        .accept_batch(request.take().into_iter().collect(), Instant::now());
                }
            }
            Err(request) => refuse(request),
        }
    }

    /// The state, if it is free and the shard open, with the inbox taken in
    /// and idle streams evicted. `None` when busy: whoever holds it looks at
    /// the inbox after letting go (a combiner hands queued seats to its
    /// helper; the worker serves them). `None` once closed: the closing
    /// thread answers everyone, stay out of its way. Taken by combiners,
    /// by a worker's own waker between its rounds, and by a runner thread
    /// taking its own shard's requests in while it waits on another.
    pub(super) fn hold(&self) -> Option<Held<'_>> {
        if self.is_closed() {
            // A worker's own waker (run between its rounds, or while it
            // closes) finds no one else to answer what it waits for: every
            // shard is closed at once (`Shard::close_all`), so two workers
            // may wait on each other's answers. The engine is the worker's
            // to close: it does so here.
            if context::is_worker_of(self) {
                self.close_here();
            }
            return None;
        }
        let mut engine = self.try_lock()?;
        // A close between the look above and the lock: the engine is closed
        // (its state gone), and the closing thread answers everyone.
        if engine.is_closed() {
            return None;
        }
        // Taking the inbox in evicts idle streams, as of the take: a stream
        // whose call waits there is not idle, however long the last turn.
        self.take_inbox(&mut engine, None);
        Some(engine)
    }

    /// Move every request of the inbox into the engine, which refuses new
    /// calls once the runner drains (step 6 of the runner's life: it reads
    /// the runner's life as it takes each in). Idle streams are evicted as
    /// of the take (see `Engine::accept_batch`): a stream whose call waits
    /// there is not idle, however long the last turn. With `locked`, the
    /// inbox's lock its caller holds already (a worker woken on it).
    pub(super) fn take_inbox(&self, engine: &mut Engine, locked: Option<InboxGuard<'_>>) {
        let (requests, taken_at) = {
            let mut inbox = locked.unwrap_or_else(|| self.inbox.lock());
            // The engine reads the draining step (5) itself as it takes
            // each request in: every request taken in after it finds the
            // engine draining.
            (self.inbox.take(&mut inbox), Instant::now())
        };
        engine.accept_batch(requests, taken_at);
    }

    /// One step of whoever holds the engine, the one turn loop's body for
    /// every holder (the worker, the helper, a combining caller, a drain, a
    /// waker calling back into the shard its thread holds):
    ///
    /// 1. take the inbox in (with `locked`, the lock its caller woke with);
    /// 2. nothing queued: [`Stepped::Idle`], the holder decides whether to
    ///    wait for more (its own business);
    /// 3. decide as `pace` says: wait out the turn policy, or run only a
    ///    turn due now, or run at once; and not once `pace`'s `done` is true
    ///    ([`Stepped::Held`]). The policy's decision takes the inbox in
    ///    once more right before it decides: the calls pushed while the
    ///    first take was accepted (a closed loop's callers, back within
    ///    microseconds) join this turn, and the turns' widths, which the
    ///    learned width is measured on, depend on it;
    /// 4. run the wakes the takes asked for (their grants, statuses,
    ///    cancels) before the turn, not after it (a lent engine's wakes
    ///    stay kept for its lender, see [`Holding`]);
    /// 5. run the turn with the live settings it was decided with.
    ///
    /// The turn's own answers wake when the holder says: when it lets the
    /// engine go (its `Deferred` scope closes), or at once when it serves
    /// turn after turn (the combining helper).
    #[inline]
    pub(super) fn step<E: Holding>(
        self: &Arc<Self>,
        engine: &mut E,
        pace: Pace<'_>,
        locked: Option<InboxGuard<'_>>,
    ) -> Stepped {
        self.take_inbox(engine, locked);
        if !engine.has_queue() {
            return Stepped::Idle;
        }
        let live = match pace {
            Pace::Policy => self.wait_for_turn(engine),
            Pace::DueNow(done) => self.turn_is_due(engine).filter(|_| !done()),
            Pace::AtOnce(done) => (!done()).then(|| self.live()),
        };
        let Some(live) = live else {
            return Stepped::Held;
        };
        engine.wake_kept(self);
        engine.turn(&live);
        Stepped::Ran
    }

    /// Run turns at once while `done` is false and seats are queued, the
    /// policy's waits skipped (a waker calling back into the shard its
    /// thread holds: waiting out a policy here would wait on this very
    /// thread; a drain).
    pub(super) fn serve_at_once<E: Holding>(self: &Arc<Self>, engine: &mut E, done: &dyn Fn() -> bool) {
        while let Stepped::Ran = self.step(engine, Pace::AtOnce(done), None) {}
    }

    /// The live settings, loaded once for a decision and the turn it
    /// decides.
    pub(super) fn live(&self) -> Live {
        **self.live.load()
    }

    /// Whether the turn policy says to run a turn now (after taking the
    /// inbox in once more), without waiting: the live settings it decided
    /// with, which the turn then runs with, or `None`.
    fn turn_is_due(&self, engine: &mut Engine) -> Option<Live> {
        self.take_inbox(engine, None);
        let live = self.live();
        matches!(engine.decide(&live, Instant::now()), None | Some((Decision::RunNow, _))).then_some(live)
    }

    /// Wait as the turn policy says before the next turn, taking requests
    /// in before each decision and meanwhile. Returns the live settings
    /// the turn was decided with (loaded once per decision, and the turn
    /// runs with the same: a `set_policy` meanwhile never decides with one
    /// setting and fills with another), or `None` when the shard closed
    /// meanwhile: the turn must not run, its seats are answered by the
    /// close.
    fn wait_for_turn<E: Holding>(self: &Arc<Self>, engine: &mut E) -> Option<Live> {
        let mut waited: Option<Instant> = None;
        loop {
            self.take_inbox(engine, None);
            let live = self.live();
            let now = Instant::now();
            let Some((decision, recheck)) = engine.decide(&live, now) else {
                return Some(live);
            };
            match decision {
                Decision::RunNow => {
                    if let Some(since) = waited {
                        engine.record_policy_wait(since.elapsed());
                    }
                    return Some(live);
                }
                Decision::WaitUntil(until) => {
                    waited.get_or_insert(now);
                    let inbox = self.inbox.lock();
                    if self.inbox.life().is_closed() {
                        return None;
                    }
                    // Draining: nothing new can join the turn, waiting for
                    // more would only hold up the drain.
                    if self.inbox.life().is_draining() {
                        return Some(live);
                    }
                    // Arrivals change the decision only by making the turn
                    // full, or wider than a latency budget planned for: a
                    // push wakes us once that many seats came. Anything
                    // else pushed, or a policy change, wakes us at once.
                    if inbox.requests.is_empty() {
                        // Nobody is woken late by this wait: the wakes kept
                        // so far run first (the inbox let go meanwhile).
                        if crate::wake::any_kept() {
                            drop(inbox);
                            engine.wake_kept(self);
                            continue;
                        }
                        drop(
                            self.inbox
                                .sleep(inbox, recheck, Some(until.saturating_duration_since(now))),
                        );
                    }
                }
            }
        }
    }

    /// Run the tasks' wakes this thread kept while holding the engine, now,
    /// without letting the engine's lock go (between turns, before
    /// sleeping). A waker calling back into this shard meanwhile finds the
    /// engine lent to it (see [`context`]).
    pub(super) fn wake_kept(self: &Arc<Self>, engine: &mut Held<'_>) {
        if !crate::wake::any_kept() {
            return;
        }
        context::lend(self, engine.slot(), crate::wake::run_kept);
    }

    /// Serve with the engine this thread holds further up and lent to its
    /// wakers, if it is this shard's (a waker calling back into the shard
    /// its thread holds), running the turns it needs at once: see
    /// [`Shared::serve_at_once`]. False when this thread holds no engine of
    /// this shard's.
    pub(super) fn serve_lent(self: &Arc<Self>, done: &dyn Fn() -> bool) -> bool {
        context::with_lent(self, |mut engine: &mut Engine| self.serve_at_once(&mut engine, done)).is_some()
    }

    /// A runner thread running tasks' wakes waits for another shard's
    /// answer: it keeps taking this, its own, shard's requests in meanwhile
    /// (a spawn from the other shard's waker, say), so that two runner
    /// threads waiting on each other never both wait for good.
    pub(super) fn serve_meanwhile(self: &Arc<Self>) {
        if context::with_lent(self, |engine: &mut Engine| self.take_inbox(engine, None)).is_some() {
            return;
        }
        // Taking the state takes the inbox in (or, closed, a worker closes
        // its engine: see `hold`).
        drop(self.hold());
    }

    /// Steps 9 and 10 on the worker's own thread, early, while it runs
    /// wakes once the runner is closed (the engine let go; it is the
    /// worker's to close): close the engine and answer what waits in the
    /// inbox, rather than on the worker's way out, which waits for these
    /// very wakes. The worker closes it again on its way out (a no-op).
    fn close_here(&self) {
        if let Some(mut engine) = self.try_lock() {
            engine.close();
            self.take_inbox(&mut engine, None);
        }
    }

    /// Whether a calling thread sleeps on its answer now (one counted in
    /// `Shard::wait`).
    pub(super) fn threads_wait(&self) -> bool {
        self.waiters.load(Ordering::Relaxed) > 0
    }

    /// Step 8 of the runner's life: join the mode's thread (the worker, the
    /// helper), never the current one (joining oneself fails).
    pub(super) fn join_thread(&self) {
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread.filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = thread.join();
        }
    }

    /// Whether step 7 of the runner's life came.
    pub(super) fn is_closed(&self) -> bool {
        self.inbox.life().is_closed()
    }
}

/// Answer a request pushed after the close.
fn refuse(request: Request) {
    use crate::err::{EndReason, RunError, RunErrorKind, SpawnError};
    let closed = || RunError::new(RunErrorKind::Closed);
    match request {
        Request::Spawn { slot, .. } => slot.fill(Err(SpawnError::Closed)),
        Request::Call(call) => call.slot.fill(Err(closed())),
        Request::ReadState { slot, .. } => slot.fill(Err(closed())),
        Request::WriteState { slot, .. } => slot.fill(Err(closed())),
        Request::Pulses { slot, .. } => slot.fill(Err(closed())),
        Request::Status { slot, .. } => slot.fill(Some(EndReason::Closed)),
        Request::Release(_) | Request::Cancel(_) | Request::Admit => (),
    }
}
