//! One laned state behind its inbox, and who runs its turns. The two modes
//! are sibling modules behind this one interface, as crossbeam-channel's
//! flavors are: `worker` (a thread owns the state and runs every turn) and
//! `combining` (whichever caller finds the state free runs the turn, and a
//! helper thread serves what callers leave queued). Each mode's own part
//! (`Worker`: the drain's condvar and the worker's quiet flag;
//! `Combining`: the helper's condvar and its help-wanted flag) is a type in
//! its file, held in the shard's `Flavor`, matched once per operation
//! (`serve`, `tend`, `drain`, `close`, `may_run_turns`). The mode files use
//! this module's common part (taking the inbox in, the turn policy's wait,
//! the wakes kept): the one two-way pair left inside `shard/`. A runner
//! holds several shards (one unless asked, one per core to use them all);
//! each is whole on its own.
//!
//! # Draining and closing
//!
//! The runner's life is numbered once, in the `runner` module's doc; a
//! shard does steps 5 and 6 ([`Shard::drain`]) and its part of 7 and
//! then 8 to 10 ([`Shard::close`]), each mode doing 6, 8 and 9 its own way.

mod combining;
mod worker;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{Mode, Resolved};
use crate::engine::{Engine, Parts};
use crate::err::NewRunnerError;
use crate::inbox::Inbox;
use crate::policy::Decision;
use crate::protocol::{Live, Request};
use crate::slot::{Slot, Wake};
use crate::sync::{lock, AtomicUsize, Mutex, Ordering};
use crate::wake::Deferred;
use arc_swap::ArcSwap;
use combining::Combining;
use worker::Worker;

pub(crate) struct Shard {
    /// Who may touch it: any thread pushes (handles, spawns, drops); the
    /// thread holding `engine` drains it.
    inbox: Inbox<Request>,
    /// Who may touch it: in `Worker` mode only the worker thread; in
    /// `Combining` mode whichever caller or the helper wins `try_lock`, and
    /// the closing thread.
    engine: Mutex<Engine>,
    /// The mode's own part (its condvar and flag): matched once per
    /// operation. Read-only itself; see each mode's fields.
    flavor: Flavor,
    /// The policy and `max_seats`: written by `set_policy` (any thread),
    /// read before each turn by whoever runs it.
    live: Arc<ArcSwap<Live>>,
    /// The worker thread in `Worker` mode, the helper in `Combining` mode;
    /// joined by `close`.
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Whether calls resolving a symbol can be served (read-only).
    can_forget_symbols: bool,
    idle_timeout: Option<Duration>,
    /// Callers blocked in `wait` right now (any thread, relaxed: a hint for
    /// whether to spin).
    waiters: AtomicUsize,
}

/// Who runs a shard's turns: the two modes, siblings.
enum Flavor {
    Worker(Worker),
    Combining(Combining),
}

thread_local! {
    /// The shard whose worker this thread is (its address), 0 on any other
    /// thread: a task's waker run by the worker that calls back into its
    /// shard (a spawn from `wake()`) is served on the spot, not left
    /// waiting for the worker, which is itself.
    static WORKER_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// While the thread holding a shard's engine runs the wakes it kept
    /// (`Shard::wake_kept`): that shard (its address) and its engine, lent
    /// for the duration, so that a waker calling back into the shard is
    /// served with it instead of waiting for a lock its own thread holds.
    /// A stack: a waker may hold another shard and lend it in turn. Who may
    /// touch it: this thread only.
    static LENT: std::cell::RefCell<Vec<(usize, *mut Engine)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The machine's cores, read once.
static CORES: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));

impl Shard {
    /// Build the state and reset every lane on the thread that will own it:
    /// the worker's in `Worker` mode, this one otherwise.
    pub fn start(parts: Parts, config: &Resolved) -> Result<Arc<Shard>, NewRunnerError> {
        match config.mode {
            Mode::Combining => Shard::start_combining(parts, config),
            Mode::Worker => Shard::start_worker(parts, config),
        }
    }

    fn new(engine: Engine, config: &Resolved, live: Arc<ArcSwap<Live>>) -> Shard {
        let can_forget_symbols = engine.can_forget_symbols();
        Shard {
            inbox: Inbox::new(),
            idle_timeout: config.idle_timeout,
            waiters: AtomicUsize::new(0),
            engine: Mutex::new(engine),
            flavor: match config.mode {
                Mode::Worker => Flavor::Worker(Worker::new()),
                Mode::Combining => Flavor::Combining(Combining::new()),
            },
            live,
            worker: Mutex::new(None),
            can_forget_symbols,
        }
    }

    pub fn can_forget_symbols(&self) -> bool {
        self.can_forget_symbols
    }

    /// Queue a request for the engine and wake whoever serves it. Once the
    /// shard is closed nobody drains the inbox, so the request is answered
    /// here.
    pub fn push(&self, request: Request) {
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
                match self.lent() {
                    // A waker of this shard's holder letting a stream go:
                    // the engine is this thread's already.
                    // SAFETY: as `borrow_lent` says.
                    Some(engine) => unsafe { self.borrow_lent(engine) }.accept_batch(vec![request], Instant::now()),
                    None => lock(&self.engine).accept_batch(vec![request], Instant::now()),
                }
            }
            Err(request) => refuse(request),
        }
    }

    /// Block until `slot` is answered: the worker serves it in `Worker` mode;
    /// in `Combining` mode this thread serves the state whenever it is free.
    /// Gives up at `deadline` (`Wake::TimedOut`) or when cancelled.
    pub fn wait<T>(&self, slot: &Slot<T>, deadline: Option<Instant>) -> Wake<T> {
        // Combining mode: serve while the state is free, until this wait
        // has something to see (its answer, its cancel) or its deadline
        // passes: a caller never keeps serving others' turns past its own
        // deadline or cancel.
        self.serve(&|| slot.is_settled() || deadline.is_some_and(|d| Instant::now() >= d));
        // Spin before parking only while the waiters leave a core free for
        // whoever runs the turn: more spinners would slow it down.
        // A runner thread (running a waker that called back) waiting on
        // another shard: in short slices, taking its own shard's requests
        // in between (see `serve_home_meanwhile`).
        if let Some(home) = Shard::home().filter(|home| !std::ptr::eq(*home, self)) {
            loop {
                let slice = Instant::now() + Duration::from_millis(1);
                let until = deadline.map_or(slice, |d| d.min(slice));
                match slot.wait_until(Some(until), false) {
                    Wake::TimedOut if deadline.is_none_or(|d| Instant::now() < d) => {
                        Shard::serve_home_meanwhile(home);
                        self.serve(&|| slot.is_settled());
                    }
                    woke => return woke,
                }
            }
        }
        let waiters = self.waiters.fetch_add(1, Ordering::Relaxed) + 1;
        let woke = slot.wait_until(deadline, waiters < *CORES);
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        woke
    }

    /// Move every request of the inbox into the engine, and the draining
    /// flag with them: whoever holds the state takes it in (step 6 of
    /// the runner's life), or a combining helper under steady load would serve new
    /// calls for as long as they came, the drain waiting on its lock. Idle
    /// streams are evicted as of the take (see `Engine::accept_batch`).
    fn take_inbox(&self, engine: &mut Engine) -> bool {
        let (requests, taken_at) = {
            let mut inbox = self.inbox.lock();
            // Under the same lock as the take: every request taken in from
            // now on, this batch included, finds the engine draining.
            if inbox.draining {
                engine.start_draining();
            }
            (self.inbox.take(&mut inbox), Instant::now())
        };
        let any = !requests.is_empty();
        engine.accept_batch(requests, taken_at);
        any
    }

    /// Whether the turn policy says to run a turn now (after taking the
    /// inbox in), without waiting: the live settings it decided with, which
    /// the turn then runs with, or `None`.
    fn turn_is_due(&self, engine: &mut Engine) -> Option<Live> {
        self.take_inbox(engine);
        let live = **self.live.load();
        matches!(engine.decide(&live, Instant::now()), None | Some((Decision::RunNow, _))).then_some(live)
    }

    /// Wait as the turn policy says before the next turn, taking requests
    /// in meanwhile. Returns the live settings the turn was decided with
    /// (loaded once per decision, and the turn runs with the same: a
    /// `set_policy` meanwhile never decides with one setting and fills with
    /// another), or `None` when the shard closed meanwhile: the turn must
    /// not run, its seats are answered by the close.
    fn wait_for_turn(&self, engine: &mut Engine) -> Option<Live> {
        let mut waited: Option<Instant> = None;
        loop {
            self.take_inbox(engine);
            let live = **self.live.load();
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
                    if inbox.closed {
                        return None;
                    }
                    // Draining: nothing new can join the turn, waiting for
                    // more would only hold up the drain.
                    if inbox.draining {
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
                            self.wake_kept(engine);
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

    /// The live settings changed (the runner stored them): wake whoever
    /// waits on the old ones.
    pub fn live_changed(&self) {
        let _inbox = self.inbox.lock();
        self.inbox.notify_all();
    }

    /// Combining mode: hold the state a moment, if it is free, to take in
    /// what is pending (a dropped handle's release), evict idle streams and
    /// hand any queued call to the helper, without running anyone's turn.
    /// Nobody else may be around to do it. The worker does it by itself.
    pub fn tend(&self) {
        if let Flavor::Combining(combining) = &self.flavor {
            self.combine(combining, &|| true, None);
        }
    }

    /// Combining mode: while `done` is false and the state is free, hold it
    /// and run turns, as a calling thread does while it waits (a task does it
    /// in its `poll`). Nothing to do in worker mode: the worker serves.
    pub fn serve(&self, done: &dyn Fn() -> bool) {
        if done() {
            return;
        }
        if let Some(engine) = self.lent() {
            // SAFETY: as `borrow_lent` says.
            return self.serve_here(unsafe { self.borrow_lent(engine) }, done);
        }
        match &self.flavor {
            // The worker's own waker, between its rounds: the engine is let
            // go, and nobody else would run the turn it waits for.
            Flavor::Worker(_) if self.is_own_worker() => {
                if let Some(mut engine) = self.hold() {
                    self.serve_here(&mut engine, done);
                }
            }
            // Any other thread: the worker serves.
            Flavor::Worker(_) => (),
            Flavor::Combining(combining) => self.combine(combining, done, None),
        }
    }

    /// Run the tasks' wakes this thread kept while holding `engine`, now,
    /// without letting the engine go (between turns, before sleeping). A
    /// waker calling back into this shard meanwhile finds the engine lent
    /// to it (see [`Shard::serve`]).
    pub(super) fn wake_kept(&self, engine: &mut Engine) {
        if !crate::wake::any_kept() {
            return;
        }
        let lent = (self as *const Shard as usize, engine as *mut Engine);
        LENT.with(|l| l.borrow_mut().push(lent));
        crate::wake::run_kept();
        LENT.with(|l| l.borrow_mut().pop());
    }

    /// The engine lent to this thread's wakers by its holder (this thread,
    /// further up), if it is this shard's.
    fn lent(&self) -> Option<*mut Engine> {
        let me = self as *const Shard as usize;
        LENT.with(|l| l.borrow().iter().rev().find(|(shard, _)| *shard == me).map(|(_, e)| *e))
    }

    /// The shard this thread serves while it runs tasks' wakes (a waker
    /// calling back into the runner): the one whose engine it lent last, or
    /// the one it is the worker of.
    fn home() -> Option<*const Shard> {
        let lent = LENT.with(|l| l.borrow().last().map(|(shard, _)| *shard));
        let shard = lent.unwrap_or_else(|| WORKER_OF.with(|w| w.get()));
        (shard != 0).then_some(shard as *const Shard)
    }

    /// A waker calling back into a shard this thread serves: serve the
    /// request here, with the engine lent or free, running the turns it
    /// needs at once (waiting out a policy here would wait on this very
    /// thread).
    fn serve_here(&self, engine: &mut Engine, done: &dyn Fn() -> bool) {
        loop {
            self.take_inbox(engine);
            if done() || !engine.has_queue() {
                return;
            }
            engine.turn(&self.live.load());
        }
    }

    /// A lent engine, borrowed.
    ///
    /// SAFETY (for the caller): `engine` comes from [`Shard::lent`]: lent
    /// by `wake_kept` from the `&mut Engine` its caller holds, for the
    /// duration of the wakes it runs on this thread; that caller does not
    /// touch the engine until they return, and the borrow made here ends
    /// within them. So it is the only access to the engine meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn borrow_lent(&self, engine: *mut Engine) -> &mut Engine {
        unsafe { &mut *engine }
    }

    /// A runner thread running tasks' wakes waits for another shard's
    /// answer: it keeps taking its own shard's requests in meanwhile (a
    /// spawn from the other shard's waker, say), so that two runner
    /// threads waiting on each other never both wait for good.
    fn serve_home_meanwhile(home: *const Shard) {
        // SAFETY: `home` is the shard this thread works for or lent the
        // engine of, both alive while this thread runs its wakes (a
        // worker's shard outlives its thread; a lender holds its shard).
        let home = unsafe { &*home };
        match home.lent() {
            // SAFETY: as `borrow_lent` says.
            Some(engine) => {
                home.take_inbox(unsafe { home.borrow_lent(engine) });
            }
            // Taking the state takes the inbox in.
            None => drop(home.hold()),
        }
    }

    /// Whether a caller waiting here may run turns itself (combining
    /// mode), so must come back to do so rather than wait to be woken.
    pub fn may_run_turns(&self) -> bool {
        matches!(self.flavor, Flavor::Combining(_))
    }

    /// Whether this thread is this shard's worker, calling back into it
    /// from a task's waker (run between the worker's rounds, the engine
    /// let go).
    fn is_own_worker(&self) -> bool {
        WORKER_OF.with(|w| w.get()) == self as *const Shard as usize
    }

    /// Stop taking new calls, and return once everything queued has been
    /// answered: steps 5 and 6 of the runner's life
    /// (numbered in the `runner` module's doc).
    pub fn drain(&self) {
        self.inbox.lock().draining = true;
        self.inbox.notify_all();
        match &self.flavor {
            Flavor::Worker(worker) => self.drain_worker(worker),
            Flavor::Combining(_) => self.drain_combining(),
        }
    }

    /// Refuse everything from now on, answer every waiting caller, and drop
    /// the state on a live thread: steps 7 (the inbox, here), 8 (the join,
    /// here), 9 and 10 (the worker's own, or `close_combining`) of the
    /// runner's life.
    pub fn close(&self) {
        self.inbox.lock().closed = true;
        self.inbox.notify_all();
        match &self.flavor {
            Flavor::Worker(worker) => {
                // A drain waiting for the worker to be quiet sees the close.
                worker.quiet.notify_all();
                self.join_thread();
            }
            Flavor::Combining(combining) => {
                combining.help.notify_all();
                self.join_thread();
                self.close_combining();
            }
        }
    }

    /// Step 8: join the mode's thread (the worker, the helper), never the
    /// current one (joining oneself fails).
    fn join_thread(&self) {
        let thread = lock(&self.worker).take();
        if let Some(thread) = thread.filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = thread.join();
        }
    }

    pub fn is_closed(&self) -> bool {
        self.inbox.lock().closed
    }

    /// Seats pushed to this shard's inbox and not taken in yet.
    pub fn waiting_seats(&self) -> usize {
        self.inbox.waiting_seats()
    }
}

/// Answer a request pushed after the close.
fn refuse(request: Request) {
    match request {
        Request::Spawn { slot, .. } => slot.fill(Err(crate::err::SpawnError::Closed)),
        Request::Call(call) => call
            .slot
            .fill(Err(crate::err::RunError::new(crate::err::RunErrorKind::Closed))),
        Request::ReadState { slot, .. } => slot.fill(Err(crate::err::RunError::new(crate::err::RunErrorKind::Closed))),
        Request::WriteState { slot, .. } => slot.fill(Err(crate::err::RunError::new(crate::err::RunErrorKind::Closed))),
        Request::Pulses { slot, .. } => slot.fill(Err(crate::err::RunError::new(crate::err::RunErrorKind::Closed))),
        Request::Status { slot, .. } => slot.fill(Some(crate::err::EndReason::Closed)),
        Request::Release(_) | Request::Cancel(_) | Request::Admit => (),
    }
}
