//! One laned state behind its inbox, and who runs its turns: a worker thread
//! (`Mode::Worker`), or whichever caller finds it free and, under load, a
//! helper thread (`Mode::Combining`).
//! A runner could hold several of these (one per core); each is whole on its
//! own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use laned_metrics::Metrics;
use tract_core::internal::Runnable;

use crate::admission::Admission;
use crate::config::{Mode, Resolved};
use crate::engine::{Engine, Live, Request};
use crate::err::NewRunnerError;
use crate::iface::Interface;
use crate::inbox::Inbox;
use crate::policy::{decide, recheck_after, Decision, LearnedTurnTimes};
use crate::slot::{Slot, Wake};
use crate::sync::Condvar;
use arc_swap::ArcSwap;

pub(crate) struct Shard {
    /// Who may touch it: any thread pushes (handles, spawns, drops); the
    /// thread holding `engine` drains it.
    inbox: Inbox<Request>,
    /// `Combining` mode: signalled (with the inbox lock) when help is wanted
    /// or the shard closes; the helper sleeps on it.
    help: Condvar,
    /// Who may touch it: in `Worker` mode only the worker thread; in
    /// `Combining` mode whichever caller or the helper wins `try_lock`, and
    /// the closing thread.
    engine: Mutex<Engine>,
    mode: Mode,
    /// The policy and `max_seats`: written by `set_policy` (any thread),
    /// read before each turn by whoever runs it.
    live: Arc<ArcSwap<Live>>,
    /// The worker thread in `Worker` mode, the helper in `Combining` mode;
    /// joined by `close`.
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Whether calls resolving a symbol can be served (read-only).
    can_forget_symbols: bool,
    /// Signalled (with the inbox lock) by the worker when a draining shard
    /// has nothing queued.
    quiet: Condvar,
    idle_timeout: Option<Duration>,
    /// Callers blocked in `wait` right now (any thread, relaxed: a hint for
    /// whether to spin).
    waiters: AtomicUsize,
}

/// The machine's cores, read once.
static CORES: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));

/// How long an idle worker spins for the next request before parking.
const WORKER_SPIN: Duration = Duration::from_micros(30);

/// The worker's record of whether spinning before parking pays off: a
/// spin that sees a request arrive saves a park and a futex wake; one that
/// does not wasted its time. Spins while recent ones paid off, and tries
/// one now and then otherwise, so a change of load is noticed.
#[derive(Default)]
struct SpinGauge {
    /// Earned by hits (two each), spent by misses (one each), in [0, 8].
    credit: u8,
    /// Idle moments since the last spin tried while out of credit.
    skipped: u8,
}

impl SpinGauge {
    fn should_spin(&mut self) -> bool {
        if self.credit > 0 {
            return true;
        }
        self.skipped = self.skipped.wrapping_add(1);
        self.skipped.is_multiple_of(32)
    }

    fn record(&mut self, hit: bool) {
        self.credit = if hit {
            (self.credit + 2).min(8)
        } else {
            self.credit.saturating_sub(1)
        };
    }
}

/// What a shard is built from: the runner's shared parts and its own.
pub(crate) struct Parts {
    pub inner: Arc<dyn Runnable>,
    pub iface: Arc<Interface>,
    /// This shard's counters.
    pub metrics: Arc<Metrics>,
    /// The live policy, shared by every shard.
    pub live: Arc<ArcSwap<Live>>,
    /// This shard's learned turn times.
    pub times: Arc<LearnedTurnTimes>,
    /// The runner's admission queue, shared by every shard.
    pub admission: Arc<Admission>,
    pub index: usize,
}

/// How long the helper keeps the state once nothing is queued.
const HELPER_HOLD: Duration = Duration::from_micros(200);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shard {
    /// Build the state and reset every lane on the thread that will own it:
    /// the worker's in `Worker` mode, this one otherwise.
    pub fn start(parts: Parts, config: &Resolved) -> Result<Arc<Shard>, NewRunnerError> {
        let (index, live) = (parts.index, parts.live.clone());
        match config.mode {
            Mode::Combining => {
                let engine = Engine::start(parts, config)?;
                let shard = Arc::new(Shard::new(engine, config, live));
                let helper = shard.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("laned-helper-{index}"))
                    .spawn(move || helper.help())
                    .map_err(|e| NewRunnerError::Spawn(format!("starting the helper thread: {e}")))?;
                *lock(&shard.worker) = Some(thread);
                Ok(shard)
            }
            Mode::Worker => {
                // The engine is built on the worker, handed back through this
                // channel to be placed in the shard, then the worker waits for
                // the shard to serve it.
                let (built, ready) = std::sync::mpsc::channel::<Result<Arc<Shard>, NewRunnerError>>();
                let (go, shard_rx) = std::sync::mpsc::channel::<Arc<Shard>>();
                let config = *config;
                let thread = std::thread::Builder::new()
                    .name(format!("laned-worker-{index}"))
                    .spawn(move || {
                        match Engine::start(parts, &config) {
                            Ok(engine) => {
                                let shard = Arc::new(Shard::new(engine, &config, live));
                                let _ = built.send(Ok(shard));
                            }
                            Err(e) => {
                                let _ = built.send(Err(e));
                                return;
                            }
                        }
                        drop(built);
                        if let Ok(shard) = shard_rx.recv() {
                            shard.work();
                        }
                    })
                    .map_err(|e| NewRunnerError::Spawn(format!("starting the worker thread: {e}")))?;
                let shard = ready
                    .recv()
                    .map_err(|_| NewRunnerError::Spawn("the worker died starting".into()))?;
                let shard = match shard {
                    Ok(shard) => shard,
                    Err(e) => {
                        let _ = thread.join();
                        return Err(e);
                    }
                };
                *lock(&shard.worker) = Some(thread);
                let _ = go.send(shard.clone());
                Ok(shard)
            }
        }
    }

    fn new(engine: Engine, config: &Resolved, live: Arc<ArcSwap<Live>>) -> Shard {
        let can_forget_symbols = engine.can_forget_symbols();
        Shard {
            inbox: Inbox::new(),
            help: Condvar::new(),
            quiet: Condvar::new(),
            idle_timeout: config.idle_timeout,
            waiters: AtomicUsize::new(0),
            engine: Mutex::new(engine),
            mode: config.mode,
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
        if let Err(request) = self.inbox.push(request, seats) {
            refuse(request);
        }
    }

    /// Block until `slot` is answered: the worker serves it in `Worker` mode;
    /// in `Combining` mode this thread serves the state whenever it is free.
    /// Gives up at `deadline` (`Wake::TimedOut`) or when cancelled.
    pub fn wait<T>(&self, slot: &Slot<T>, deadline: Option<Instant>) -> Wake<T> {
        loop {
            let mut until = deadline;
            if self.mode == Mode::Combining {
                if !slot.is_filled() {
                    self.combine(&|| slot.is_filled(), None);
                }
                // Nobody else may be around to evict idle streams or admit
                // waiters: look again now and then.
                if self.idle_timeout.is_some() {
                    let tick = Instant::now() + Duration::from_millis(5);
                    until = Some(deadline.map_or(tick, |d| d.min(tick)));
                }
            }
            // Spin before parking only while the waiters leave a core free
            // for whoever runs the turn: more spinners would slow it down.
            let waiters = self.waiters.fetch_add(1, Ordering::Relaxed) + 1;
            let woke = slot.wait_until(until, waiters < *CORES);
            self.waiters.fetch_sub(1, Ordering::Relaxed);
            match woke {
                Wake::TimedOut if deadline.is_none_or(|d| Instant::now() < d) => continue,
                other => return other,
            }
        }
    }

    /// Move every request of the inbox into the engine.
    fn take_inbox(&self, engine: &mut Engine) -> bool {
        let requests = std::mem::take(&mut self.inbox.lock().requests);
        let any = !requests.is_empty();
        for request in requests {
            engine.accept(request);
        }
        any
    }

    /// Wait as the turn policy says before the next turn, taking requests
    /// in meanwhile. Returns false when the shard closed meanwhile: the turn
    /// must not run, its seats are answered by the close.
    fn wait_for_turn(&self, engine: &mut Engine) -> bool {
        let mut waited: Option<Instant> = None;
        loop {
            self.take_inbox(engine);
            let live = **self.live.load();
            let Some(queue) = engine.queue_state(live.max_seats) else {
                return true;
            };
            let now = Instant::now();
            match decide(&live.policy, &queue, engine.times(), now) {
                Decision::RunNow => {
                    if let Some(since) = waited {
                        engine.record_policy_wait(since.elapsed());
                    }
                    return true;
                }
                Decision::WaitUntil(until) => {
                    waited.get_or_insert(now);
                    let inbox = self.inbox.lock();
                    if inbox.closed {
                        return false;
                    }
                    // Draining: nothing new can join the turn, waiting for
                    // more would only hold up the drain.
                    if inbox.draining {
                        return true;
                    }
                    // Arrivals change the decision only by making the turn
                    // full, or wider than a latency budget planned for: a
                    // push wakes us once that many seats came. Anything
                    // else pushed, or a policy change, wakes us at once.
                    if inbox.requests.is_empty() {
                        let seats = recheck_after(&live.policy, &queue, now);
                        drop(
                            self.inbox
                                .sleep(inbox, seats, Some(until.saturating_duration_since(now))),
                        );
                    }
                }
            }
        }
    }

    /// A new policy or `max_seats`: wake whoever waits on the old one.
    pub fn set_live(&self, live: Live) {
        self.live.store(Arc::new(live));
        let _inbox = self.inbox.lock();
        self.inbox.notify_all();
    }

    /// Combining mode: the state, if it is free and the shard open, with
    /// idle streams evicted. `None` when busy: whoever holds it looks at the
    /// inbox after letting go, and hands queued seats to the helper. `None`
    /// once closed: the closing thread answers everyone, stay out of its
    /// way.
    fn hold(&self) -> Option<MutexGuard<'_, Engine>> {
        if self.is_closed() {
            return None;
        }
        let mut engine = match self.engine.try_lock() {
            Ok(engine) => engine,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        // A close between the look above and the lock: the engine is closed
        // (its state gone), and the closing thread answers everyone.
        if engine.is_closed() {
            return None;
        }
        engine.evict_idle();
        Some(engine)
    }

    /// Combining mode: while `done` is false and the state is free, hold it
    /// and run turns. With `hold_when_empty` (the helper), wait that long
    /// for the next request once nothing is queued before letting go.
    /// Leaving with seats queued, hand them to the helper.
    fn combine(&self, done: &dyn Fn() -> bool, hold_when_empty: Option<Duration>) {
        loop {
            let Some(mut engine) = self.hold() else {
                return;
            };
            loop {
                self.take_inbox(&mut engine);
                if !engine.has_queue() {
                    // The callers just answered come back soon under load:
                    // the helper waiting for them keeps their seats in one
                    // turn, where a caller finding the state free would run
                    // a narrow one of its own.
                    if hold_when_empty.is_some_and(|hold| self.arrival_within(hold)) {
                        continue;
                    }
                    break;
                }
                // Our own call answered, we leave at once: another turn here
                // would keep this thread from its own stream's next call,
                // which may be the one the others wait for. The helper
                // serves what is queued.
                if done() || !self.wait_for_turn(&mut engine) {
                    break;
                }
                engine.turn();
            }
            let queued = engine.has_queue();
            drop(engine);
            // A request pushed while we held the state found it busy and
            // relies on us: queued seats go to the helper, and requests
            // still in the inbox make us go round once more.
            let mut inbox = self.inbox.lock();
            if queued {
                inbox.help_wanted = true;
                drop(inbox);
                self.help.notify_one();
                return;
            }
            if inbox.requests.is_empty() {
                return;
            }
        }
    }

    /// Combining mode, the helper's loop: sleep until a combiner leaves
    /// seats queued, then serve the state until nothing is queued, lingering
    /// as the turn policy says. It has no call of its own, so under steady
    /// load it serves as a worker would, and no caller is held up serving
    /// others.
    fn help(&self) {
        loop {
            {
                let mut inbox = self.inbox.lock();
                while !inbox.help_wanted && !inbox.closed {
                    inbox = self.help.wait(inbox).unwrap_or_else(|e| e.into_inner());
                }
                if inbox.closed {
                    return;
                }
                inbox.help_wanted = false;
            }
            // Never done: it has no call of its own.
            self.combine(&|| false, Some(HELPER_HOLD));
        }
    }

    /// Sleep until a request arrives (true) or `hold` passes or the shard
    /// closes (false).
    fn arrival_within(&self, hold: Duration) -> bool {
        let mut inbox = self.inbox.lock();
        if inbox.requests.is_empty() && !inbox.closed {
            inbox = self.inbox.sleep(inbox, 1, Some(hold));
        }
        !inbox.requests.is_empty() && !inbox.closed
    }

    /// Combining mode: move what is pending into the engine (a dropped
    /// handle's release) and hand any queued call to the helper, without
    /// running anyone's turn.
    pub fn kick(&self) {
        if self.mode == Mode::Combining {
            self.combine(&|| true, None);
        }
    }

    /// The worker's loop: wait for requests, move them into the engine, run
    /// a turn while seats are queued; on close, answer everything and drop
    /// the state here, on a live thread.
    fn work(&self) {
        let mut engine = lock(&self.engine);
        let mut gauge = SpinGauge::default();
        // Pushes already taken into the engine (read under the inbox lock).
        let mut taken = 0;
        loop {
            let next_eviction = engine.evict_idle();
            // Nothing queued: the callers just answered may be back within
            // a few microseconds (a closed loop), sooner than parking and
            // being woken would take. Spin for them a moment first, as long
            // as such spins have been paying off.
            if !engine.has_queue() && gauge.should_spin() {
                let hit = self.spin_for_push(taken);
                gauge.record(hit);
            }
            let (requests, closed) = {
                let mut inbox = self.inbox.lock();
                while inbox.requests.is_empty() && !inbox.closed && !engine.has_queue() {
                    if inbox.draining && engine.is_quiet() {
                        inbox.drained = true;
                        self.quiet.notify_all();
                    }
                    let timeout = match next_eviction {
                        None => None,
                        Some(due) => match due.checked_duration_since(Instant::now()) {
                            Some(left) if !left.is_zero() => Some(left),
                            _ => break,
                        },
                    };
                    inbox = self.inbox.sleep(inbox, 1, timeout);
                }
                if inbox.draining {
                    engine.start_draining();
                }
                taken = self.inbox.pushed();
                (std::mem::take(&mut inbox.requests), inbox.closed)
            };
            if closed {
                engine.close();
            }
            for request in requests {
                engine.accept(request);
            }
            if closed {
                return;
            }
            if engine.has_queue() && self.wait_for_turn(&mut engine) {
                engine.turn();
            }
        }
    }

    /// Spin until a request beyond the first `taken` is pushed (true) or
    /// `WORKER_SPIN` passes (false).
    fn spin_for_push(&self, taken: usize) -> bool {
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                if self.inbox.pushed() != taken {
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= WORKER_SPIN {
                return false;
            }
        }
    }

    /// Stop taking new streams and calls, and return once everything queued
    /// has been answered.
    pub fn drain(&self) {
        self.inbox.lock().draining = true;
        self.inbox.notify_all();
        match self.mode {
            Mode::Worker => {
                let mut inbox = self.inbox.lock();
                // The worker sets `drained` once it took the draining flag in
                // and nothing is queued.
                while !inbox.drained && !inbox.closed {
                    inbox = self.quiet.wait(inbox).unwrap_or_else(|e| e.into_inner());
                }
            }
            Mode::Combining => {
                let mut engine = lock(&self.engine);
                engine.start_draining();
                loop {
                    self.take_inbox(&mut engine);
                    if !engine.has_queue() {
                        break;
                    }
                    engine.turn();
                }
            }
        }
    }

    /// Refuse everything from now on, answer every waiting caller, and (in
    /// `Worker` mode) join the worker, which drops the state.
    pub fn close(&self) {
        self.inbox.lock().closed = true;
        self.inbox.notify_all();
        self.help.notify_all();
        let worker = lock(&self.worker).take();
        // Never the current thread: joining oneself fails.
        if let Some(worker) = worker.filter(|w| w.thread().id() != std::thread::current().id()) {
            let _ = worker.join();
        }
        match self.mode {
            Mode::Worker => (),
            Mode::Combining => {
                let mut engine = lock(&self.engine);
                engine.close();
                // Requests pushed after the close are answered by the same
                // close: the engine is closed for good.
                let requests = std::mem::take(&mut self.inbox.lock().requests);
                for request in requests {
                    engine.accept(request);
                }
            }
        }
    }
}

impl Shard {
    pub fn is_closed(&self) -> bool {
        self.inbox.lock().closed
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
        Request::Release(_) | Request::Cancel(_) => (),
    }
}

#[cfg(test)]
mod tests {
    use super::SpinGauge;

    /// Out of credit the worker tries one spin in 32 idle moments; a spin
    /// that catches an arrival makes it spin every time again, and misses
    /// use the credit up.
    #[test]
    fn spin_gauge_follows_what_spins_catch() {
        let mut gauge = SpinGauge::default();
        let tried = (0..64).filter(|_| gauge.should_spin()).count();
        assert_eq!(tried, 2);
        gauge.record(true);
        assert!((0..8).all(|_| gauge.should_spin()));
        for _ in 0..8 {
            gauge.record(true);
        }
        let mut spins = 0;
        while gauge.should_spin() && spins < 100 {
            gauge.record(false);
            spins += 1;
        }
        assert_eq!(spins, 8, "a full credit lasts eight misses");
        assert!(!gauge.should_spin());
    }
}
