//! `Mode::Worker`: one thread owns the state and runs every turn, as
//! tract's `LanedRunnable` does. Callers push and sleep on their slots.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Resolved;
use crate::engine::{Engine, Parts};
use crate::err::NewRunnerError;
use crate::sync::{AtomicBool, Condvar, Ordering};
use crate::wake::Deferred;

use super::shared::{Pace, Shared};
use crate::context;

/// Worker mode: the shard's shared part, and the worker's own.
pub(super) struct Worker {
    shared: Arc<Shared>,
    /// Signalled (with the inbox lock) by the worker when a draining shard
    /// has nothing queued, and by the close; a drain sleeps on it.
    quiet: Condvar,
    /// The worker's report to a drain (step 6): set once the runner is
    /// draining and nothing is queued or waits for an answer (the engine is
    /// the worker's while it sleeps, so the drain cannot look itself). Who may touch it: only with the inbox lock held (so a
    /// drain's look and sleep never miss it).
    drained: AtomicBool,
}

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

impl Worker {
    /// Start the worker, which builds the engine on its own thread (the
    /// thread that will own the state) and then serves it.
    pub(super) fn start(parts: Parts, config: &Resolved) -> Result<Arc<Worker>, NewRunnerError> {
        let (index, live, life) = (parts.index, parts.live.clone(), parts.life.clone());
        // The engine is built on the worker and handed back through this
        // channel in its shard; then the worker serves it.
        let (built, ready) = std::sync::mpsc::channel::<Result<Arc<Worker>, NewRunnerError>>();
        let config = *config;
        let thread = std::thread::Builder::new()
            .name(format!("laned-worker-{index}"))
            .spawn(move || {
                let worker = match Engine::start(parts, &config) {
                    Ok(engine) => Arc::new(Worker {
                        shared: Arc::new(Shared::new(engine, &config, live, life)),
                        quiet: Condvar::new(),
                        drained: AtomicBool::new(false),
                    }),
                    Err(e) => {
                        let _ = built.send(Err(e));
                        return;
                    }
                };
                if built.send(Ok(worker.clone())).is_ok() {
                    worker.work();
                }
            })
            .map_err(|e| NewRunnerError::Spawn(format!("starting the worker thread: {e}")))?;
        let worker = ready
            .recv()
            .map_err(|_| NewRunnerError::Spawn("the worker died starting".into()));
        match worker {
            Ok(Ok(worker)) => {
                worker.shared.keep_thread(thread);
                Ok(worker)
            }
            Ok(Err(e)) | Err(e) => {
                let _ = thread.join();
                Err(e)
            }
        }
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The worker's loop: wait for requests, move them into the engine, run
    /// a turn while seats are queued; on close, answer everything and drop
    /// the state here, on a live thread.
    fn work(&self) {
        let shared = &self.shared;
        context::set_worker(shared);
        let mut gauge = SpinGauge::default();
        // Pushes already taken into the engine (read under the inbox lock).
        let mut taken = 0;
        loop {
            // Tasks' wakes asked for while the engine is held run once it is
            // let go, at the end of each round (declared first, so dropped
            // after the engine's guard): a waker that panics or calls back
            // into this shard finds no engine held (see `wake`).
            let _wakes = Deferred::open();
            let mut engine = shared.lock();
            // When the next idle stream is due: its eviction comes with the
            // next take of the inbox (below), however empty.
            let next_eviction = engine.next_idle_due();
            // Nothing queued: the callers just answered may be back within
            // a few microseconds (a closed loop), sooner than parking and
            // being woken would take. Spin for them a moment first, as long
            // as such spins have been paying off.
            if !engine.has_queue() && gauge.should_spin() {
                let hit = self.spin_for_push(taken);
                gauge.record(hit);
            }
            let inbox = {
                let mut inbox = shared.inbox.lock();
                let life = shared.inbox.life();
                while inbox.requests.is_empty() && !life.is_closed() && !engine.has_queue() {
                    if life.is_draining() && engine.is_quiet() {
                        self.drained.store(true, Ordering::Relaxed);
                        self.quiet.notify_all();
                    }
                    let timeout = match next_eviction {
                        None => None,
                        Some(due) => match due.checked_duration_since(Instant::now()) {
                            Some(left) if !left.is_zero() => Some(left),
                            _ => break,
                        },
                    };
                    inbox = shared.inbox.sleep(inbox, 1, timeout);
                }
                taken = shared.inbox.pushed();
                inbox
            };
            if shared.inbox.life().is_closed() {
                // Steps 9 and 10, on the worker's way out. The inbox is
                // taken under the lock it woke with (nothing can be pushed
                // after the close), and the engine closed before it takes
                // those requests in: they are answered `Closed`, not served.
                let mut inbox = inbox;
                let (requests, taken_at) = (shared.inbox.take(&mut inbox), Instant::now());
                drop(inbox);
                engine.close();
                engine.accept_batch(requests, taken_at);
                return;
            }
            // The round's step, with the inbox's lock it woke with: the
            // take evicts idle streams as of that moment, before the spawns
            // it brings look for a lane (a stream whose call waited in the
            // inbox through a long turn is not idle); then the turn the
            // policy waits for, what the take answered woken before it.
            shared.step(&mut engine, Pace::Policy, Some(inbox));
        }
    }

    /// Spin until a request beyond the first `taken` is pushed (true) or
    /// `WORKER_SPIN` passes (false).
    fn spin_for_push(&self, taken: usize) -> bool {
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                if self.shared.inbox.pushed() != taken {
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= WORKER_SPIN {
                return false;
            }
        }
    }

    /// Serve while `done` is false: only the worker's own waker does, run
    /// between the worker's rounds with the engine let go (nobody else
    /// would run the turn it waits for). Any other thread leaves it to the
    /// worker.
    pub(super) fn serve(&self, done: &dyn Fn() -> bool) {
        if context::is_worker_of(&*self.shared) {
            // Closed meanwhile, `hold` closes the engine (see there).
            if let Some(mut engine) = self.shared.hold() {
                // No scope open, nothing kept: the wakes run as they come.
                self.shared.serve_at_once(&mut &mut *engine, done);
            }
        }
    }

    /// Callers sleep on their answers; only the worker runs turns.
    pub(super) fn may_run_turns(&self) -> bool {
        false
    }

    /// Draining, step 6 in worker mode: the worker serves the queue and
    /// says when it is quiet; this waits for that.
    pub(super) fn drain(&self) {
        let mut inbox = self.shared.inbox.lock();
        // The worker sets `drained` once the runner drains and nothing is
        // queued.
        while !self.drained.load(Ordering::Relaxed) && !self.shared.is_closed() {
            inbox = self.quiet.wait(inbox).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Step 7, the mode's part: a drain waiting for the worker to be quiet
    /// sees the close (the worker itself sleeps on the inbox, woken by its
    /// close).
    pub(super) fn wake_for_close(&self) {
        self.quiet.notify_all();
    }

    /// Closing in worker mode: step 8 here (the worker joined), steps 9 and
    /// 10 the worker's own, on its way out of [`Worker::work`].
    pub(super) fn close(&self) {
        self.shared.join_thread();
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
