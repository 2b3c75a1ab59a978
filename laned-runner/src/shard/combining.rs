//! `Mode::Combining`: no hand-off while the state is idle. The calling
//! thread that finds the state free runs the turn itself; a caller whose
//! own call is answered leaves at once, handing what is still queued to the
//! shard's helper thread, which serves it as a worker would until nothing is
//! queued for a moment. While no calling thread sleeps on an answer (the
//! callers are tasks), the helper runs one turn and hands the next back to
//! a queued task, whose poll runs it on its own executor thread.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Resolved;
use crate::engine::{Engine, Parts};
use crate::err::NewRunnerError;
use crate::sync::{AtomicBool, Condvar, Ordering};
use crate::wake::Deferred;

use super::shared::{Pace, Shared, Stepped};

/// Combining mode: the shard's shared part, and the helper's own.
pub(super) struct Combining {
    shared: Arc<Shared>,
    /// Signalled (with the inbox lock) when help is wanted or the shard
    /// closes; the helper sleeps on it.
    help: Condvar,
    /// Set by a combiner leaving the state with seats still queued, taken
    /// by the helper, which then serves the queue. Who may touch it: only
    /// with the inbox lock held (so the helper's look and sleep never miss
    /// it).
    help_wanted: AtomicBool,
}

/// How long the helper keeps the state once nothing is queued.
const HELPER_HOLD: Duration = Duration::from_micros(200);

impl Combining {
    /// Build the engine on this thread and start the helper.
    pub(super) fn start(parts: Parts, config: &Resolved) -> Result<Arc<Combining>, NewRunnerError> {
        let (index, live, life) = (parts.index, parts.live.clone(), parts.life.clone());
        let engine = Engine::start(parts, config)?;
        let combining = Arc::new(Combining {
            shared: Arc::new(Shared::new(engine, config, live, life)),
            help: Condvar::new(),
            help_wanted: AtomicBool::new(false),
        });
        let helper = combining.clone();
        let thread = std::thread::Builder::new()
            .name(format!("laned-helper-{index}"))
            .spawn(move || helper.help())
            .map_err(|e| NewRunnerError::Spawn(format!("starting the helper thread: {e}")))?;
        combining.shared.keep_thread(thread);
        Ok(combining)
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Combining mode: while `done` is false and the state is free, hold it
    /// and run turns. With `hold_when_empty` (the helper), wait that long
    /// for the next request once nothing is queued before letting go.
    /// Leaving with seats queued, hand them to the helper.
    fn combine(&self, done: &dyn Fn() -> bool, hold_when_empty: Option<Duration>) {
        let shared = &self.shared;
        let pace = match hold_when_empty {
            Some(_) => Pace::Policy,
            None => Pace::DueNow(done),
        };
        loop {
            // Wakes asked for while holding the state run once it is let go
            // (see `wake`): the scope closes after the guard below drops.
            let _wakes = Deferred::open();
            let Some(mut engine) = shared.hold() else {
                return;
            };
            // Set when the helper handed the next turn to a task: the turns
            // run by then.
            let mut passed = None;
            loop {
                // A caller (no `hold_when_empty`) runs only a turn that is
                // due now: waiting out the turn policy is the helper's job,
                // so that a caller (or a task, in its poll) never sleeps
                // holding the state where its own cancel or deadline cannot
                // reach it. Our own call answered, we leave at once (`done`):
                // another turn here would keep this thread from its own
                // stream's next call, which may be the one the others wait
                // for. The helper serves what is queued.
                match shared.step(&mut engine, pace, None) {
                    Stepped::Held => break,
                    Stepped::Idle => {
                        // The callers just answered come back soon under
                        // load: the helper waiting for them keeps their
                        // seats in one turn, where a caller finding the
                        // state free would run a narrow one of its own.
                        // Not while draining: no new call can join, and the
                        // drain waits for the state.
                        if !engine.is_draining() && hold_when_empty.is_some() {
                            // The turn's answers wake their tasks before the
                            // helper waits for more.
                            shared.wake_kept(&mut engine);
                        }
                        // Only threads wait for the helper's hold: a task
                        // whose call arrives runs its turn in its own poll.
                        let hold = hold_when_empty.filter(|_| shared.threads_wait());
                        if !engine.is_draining() && hold.is_some_and(|hold| self.arrival_within(hold)) {
                            continue;
                        }
                        break;
                    }
                    Stepped::Ran => (),
                }
                // Serving turn after turn: each turn's answers wake their
                // tasks now, not when the state is let go.
                shared.wake_kept(&mut engine);
                // The helper, with seats still queued and no thread asleep
                // on an answer: every queued caller is a task (or a thread
                // about to try the state itself). One of those tasks runs
                // the next turn in its poll, where its answers wake their
                // tasks on their own executor: the helper lets go and wakes
                // it (after the state is let go, as every wake), instead of
                // waking each task from outside the executor, turn after
                // turn.
                if hold_when_empty.is_some()
                    && !engine.is_draining()
                    && !shared.threads_wait()
                    && engine.has_queue()
                    && engine.pass_to_a_task()
                {
                    passed = Some(engine.turns_run());
                    break;
                }
            }
            if let Some(turns) = passed {
                // Let go, and the task's wake runs (it was kept while the
                // state was held). Then make sure the turn was taken: a
                // task woken need not be polled soon (its future dropped,
                // its owner busy elsewhere, its waker a panicking one).
                drop(engine);
                drop(_wakes);
                if self.handed_turn_taken(turns) {
                    return;
                }
                continue;
            }
            let queued = engine.has_queue();
            drop(engine);
            // A request pushed while we held the state found it busy and
            // relies on us: queued seats go to the helper, and requests
            // still in the inbox make us go round once more.
            let inbox = shared.inbox.lock();
            if queued {
                self.help_wanted.store(true, Ordering::Relaxed);
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
    ///
    /// With an idle timeout it also wakes every `idle_tick` to look after
    /// idle streams (`tend`): callers may all be tasks, or all asleep, and
    /// no other thread of the runner's watches the clock in this mode.
    fn help(&self) {
        let shared = &self.shared;
        // Only with an idle timeout: no other thread of the runner's
        // watches the clock in this mode (callers may all be asleep, or
        // tasks).
        let tick = shared.idle_timeout.map(|_| Duration::from_millis(5));
        loop {
            let wanted = {
                let mut inbox = shared.inbox.lock();
                let mut ticked = false;
                while !self.help_wanted.load(Ordering::Relaxed) && !shared.is_closed() && !ticked {
                    inbox = match tick {
                        None => self.help.wait(inbox).unwrap_or_else(|e| e.into_inner()),
                        Some(tick) => {
                            let (inbox, timeout) =
                                self.help.wait_timeout(inbox, tick).unwrap_or_else(|e| e.into_inner());
                            ticked = timeout.timed_out();
                            inbox
                        }
                    };
                }
                if shared.is_closed() {
                    return;
                }
                self.help_wanted.swap(false, Ordering::Relaxed)
            };
            if wanted {
                // Never done: it has no call of its own.
                self.combine(&|| false, Some(HELPER_HOLD));
            } else {
                self.tend();
            }
        }
    }

    /// After handing the next turn to a task (`turns` run by then): wait
    /// up to `HELPER_HOLD` for it to take the state. True once a turn ran
    /// since, or someone holds the state, or nothing waits to be served;
    /// false when the state is still free with seats queued or requests in
    /// the inbox and no turn ran: the helper serves again.
    fn handed_turn_taken(&self, turns: u64) -> bool {
        let until = std::time::Instant::now() + HELPER_HOLD;
        loop {
            std::thread::sleep(HELPER_HOLD / 4);
            // Someone holds it: they look at the queue and the inbox when
            // they let go, as every holder does.
            let Some(engine) = self.shared.try_lock() else {
                return true;
            };
            if engine.is_closed() || engine.turns_run() != turns {
                return true;
            }
            if !engine.has_queue() && self.shared.inbox.lock().requests.is_empty() {
                return true;
            }
            drop(engine);
            if std::time::Instant::now() >= until {
                return false;
            }
        }
    }

    /// Sleep until a request arrives (true) or `hold` passes or the shard
    /// closes (false).
    fn arrival_within(&self, hold: Duration) -> bool {
        let inbox = &self.shared.inbox;
        let mut pending = inbox.lock();
        if pending.requests.is_empty() && !self.shared.is_closed() {
            pending = inbox.sleep(pending, 1, Some(hold));
        }
        !pending.requests.is_empty() && !self.shared.is_closed()
    }

    /// Serve while `done` is false and the state is free, as a calling
    /// thread does while it waits (a task does it in its `poll`).
    pub(super) fn serve(&self, done: &dyn Fn() -> bool) {
        self.combine(done, None);
    }

    /// Hold the state a moment, if it is free, to take in what is pending
    /// (a dropped handle's release), evict idle streams and hand any queued
    /// call to the helper, without running anyone's turn. Nobody else may
    /// be around to do it.
    pub(super) fn tend(&self) {
        self.combine(&|| true, None);
    }

    /// A caller finding the state free runs the turn itself: a waiting task
    /// must come back to do so rather than wait to be woken.
    pub(super) fn may_run_turns(&self) -> bool {
        true
    }

    /// Draining, step 6 in combining mode: this thread holds the state and
    /// serves the queue until it is empty.
    pub(super) fn drain(&self) {
        let shared = &self.shared;
        let _wakes = Deferred::open();
        shared.serve_at_once(&mut shared.lock(), &|| false);
    }

    /// Step 7, the mode's part: the helper is woken to see the close.
    pub(super) fn wake_for_close(&self) {
        self.help.notify_all();
    }

    /// Closing in combining mode: step 8 (the helper joined), then 9 and 10
    /// on the closing thread.
    pub(super) fn close(&self) {
        self.shared.join_thread();
        let _wakes = Deferred::open();
        let mut engine = self.shared.lock();
        engine.close();
        // Requests pushed after the close are answered by the same close:
        // the engine is closed for good.
        let requests = self.shared.inbox.take(&mut self.shared.inbox.lock());
        engine.accept_batch(requests, std::time::Instant::now());
    }
}
