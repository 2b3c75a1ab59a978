//! `Mode::Worker`: one thread owns the state and runs every turn, as
//! tract's `LanedRunnable` does. Callers push and sleep on their slots.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Resolved;
use crate::engine::{Engine, Parts};
use crate::err::NewRunnerError;
use crate::sync::{lock, AtomicBool, Condvar, Ordering};
use crate::wake::Deferred;

use super::{Flavor, Shard};

/// Worker mode's own part of a shard.
pub(super) struct Worker {
    /// Signalled (with the inbox lock) by the worker when a draining shard
    /// has nothing queued, and by the close; a drain sleeps on it.
    pub(super) quiet: Condvar,
    /// Set by the worker once it took the draining flag in and nothing is
    /// queued. Who may touch it: only with the inbox lock held (so a
    /// drain's look and sleep never miss it).
    drained: AtomicBool,
}

impl Worker {
    pub(super) fn new() -> Worker {
        Worker {
            quiet: Condvar::new(),
            drained: AtomicBool::new(false),
        }
    }
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

impl Shard {
    /// Start the worker, which builds the engine on its own thread (the
    /// thread that will own the state) and then serves it.
    pub(super) fn start_worker(parts: Parts, config: &Resolved) -> Result<Arc<Shard>, NewRunnerError> {
        let (index, live) = (parts.index, parts.live.clone());
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
                    if let Flavor::Worker(worker) = &shard.flavor {
                        shard.work(worker);
                    }
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

    /// The worker's loop: wait for requests, move them into the engine, run
    /// a turn while seats are queued; on close, answer everything and drop
    /// the state here, on a live thread.
    pub(super) fn work(&self, worker: &Worker) {
        super::WORKER_OF.with(|w| w.set(self as *const Shard as usize));
        let mut gauge = SpinGauge::default();
        // Pushes already taken into the engine (read under the inbox lock).
        let mut taken = 0;
        loop {
            // Tasks' wakes asked for while the engine is held run once it is
            // let go, at the end of each round (declared first, so dropped
            // after the engine's guard): a waker that panics or calls back
            // into this shard finds no engine held (see `wake`).
            let _wakes = Deferred::open();
            let mut engine = lock(&self.engine);
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
            let (requests, closed, taken_at) = {
                let mut inbox = self.inbox.lock();
                while inbox.requests.is_empty() && !inbox.closed && !engine.has_queue() {
                    if inbox.draining && engine.is_quiet() {
                        worker.drained.store(true, Ordering::Relaxed);
                        worker.quiet.notify_all();
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
                (self.inbox.take(&mut inbox), inbox.closed, Instant::now())
            };
            if closed {
                engine.close();
            }
            // Evicts idle streams as of the take, before the spawns in the
            // batch look for a lane: a stream whose call waited in the
            // inbox through a long turn is not idle.
            engine.accept_batch(requests, taken_at);
            if closed {
                return;
            }
            if engine.has_queue() {
                if let Some(live) = self.wait_for_turn(&mut engine) {
                    // What taking the inbox in answered (grants, statuses,
                    // cancels) wakes its tasks before the turn, not after it.
                    self.wake_kept(&mut engine);
                    engine.turn(&live);
                }
            }
        }
    }

    /// Spin until a request beyond the first `taken` is pushed (true) or
    /// `WORKER_SPIN` passes (false).
    pub(super) fn spin_for_push(&self, taken: usize) -> bool {
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

    /// Draining, step 6 in worker mode: the worker serves the queue and
    /// says when it is quiet; this waits for that.
    pub(super) fn drain_worker(&self, worker: &Worker) {
        let mut inbox = self.inbox.lock();
        // The worker sets `drained` once it took the draining flag in and
        // nothing is queued.
        while !worker.drained.load(Ordering::Relaxed) && !inbox.closed {
            inbox = worker.quiet.wait(inbox).unwrap_or_else(|e| e.into_inner());
        }
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
