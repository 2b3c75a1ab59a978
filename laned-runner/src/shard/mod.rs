//! One laned state behind its inbox, and who runs its turns. The two modes
//! are sibling types behind this one interface, as crossbeam-channel's
//! flavors are: [`Worker`] (a thread owns the state and runs every turn)
//! and [`Combining`] (whichever caller finds the state free runs the turn,
//! and a helper thread serves what callers leave queued). The turn loop's
//! body is written once, in the part both share (`shared`: the inbox, the
//! engine's lock, the live settings, the wakes kept, and `Shared::step`:
//! take the inbox in, decide, wake, run the turn); each mode owns only its
//! thread, when it sleeps and wakes, and its draining and closing, and
//! depends on `shared` one way. Who holds the engine on this thread is the
//! crate's `context`. The shard matches its flavor once per operation and
//! delegates. A runner holds several shards (one unless asked, one per
//! core to use them all); each is whole on its own.
//!
//! # Draining and closing
//!
//! The runner's life is numbered once, in the `runner` module's doc; a
//! shard does steps 5 and 6 ([`Shard::drain`]) and its part of 7 and
//! then 8 to 10 ([`Shard::close`]), each mode doing 6, 8 and 9 its own way.

mod combining;
mod shared;
mod worker;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Mode, Resolved};
use crate::context;
use crate::engine::Parts;
use crate::err::NewRunnerError;
use crate::protocol::Request;
use crate::slot::{Slot, Wake};
use crate::sync::Ordering;
use combining::Combining;
use shared::Shared;
use worker::Worker;

pub(crate) struct Shard {
    /// The part both modes share (read-only itself; see its fields).
    shared: Arc<Shared>,
    /// Who runs the turns: matched once per operation.
    flavor: Flavor,
}

/// Who runs a shard's turns: the two modes, siblings. Each is shared with
/// its own thread (the worker, the helper), which runs it.
enum Flavor {
    Worker(Arc<Worker>),
    Combining(Arc<Combining>),
}

/// The machine's cores, read once.
static CORES: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));

impl Shard {
    /// Build the state and reset every lane on the thread that will own it
    /// (the worker's in worker mode, this one otherwise), and start the
    /// mode's thread.
    pub fn start(parts: Parts, config: &Resolved) -> Result<Arc<Shard>, NewRunnerError> {
        let flavor = match config.mode {
            Mode::Worker => Flavor::Worker(Worker::start(parts, config)?),
            Mode::Combining => Flavor::Combining(Combining::start(parts, config)?),
        };
        let shared = match &flavor {
            Flavor::Worker(worker) => worker.shared().clone(),
            Flavor::Combining(combining) => combining.shared().clone(),
        };
        Ok(Arc::new(Shard { shared, flavor }))
    }

    pub fn can_forget_symbols(&self) -> bool {
        self.shared.can_forget_symbols()
    }

    /// Queue a request for the engine and wake whoever serves it. Once the
    /// shard is closed nobody drains the inbox, so the request is answered
    /// here.
    pub fn push(&self, request: Request) {
        self.shared.push(request)
    }

    /// Block until `slot` is answered: the worker serves it in worker mode;
    /// in combining mode this thread serves the state whenever it is free.
    /// Gives up at `deadline` (`Wake::TimedOut`) or when cancelled.
    pub fn wait<T>(&self, slot: &Slot<T>, deadline: Option<Instant>) -> Wake<T> {
        // Combining mode: serve while the state is free, until this wait
        // has something to see (its answer, its cancel) or its deadline
        // passes: a caller never keeps serving others' turns past its own
        // deadline or cancel.
        self.serve(&|| slot.is_settled() || deadline.is_some_and(|d| Instant::now() >= d));
        // A runner thread (running a waker that called back) waiting on
        // another shard: in short slices, taking its own shard's requests
        // in between (see `Shared::serve_meanwhile`).
        if let Some(home) = context::home::<Shared>().filter(|home| !Arc::ptr_eq(home, &self.shared)) {
            loop {
                let slice = Instant::now() + Duration::from_millis(1);
                let until = deadline.map_or(slice, |d| d.min(slice));
                match slot.wait_until(Some(until), false) {
                    Wake::TimedOut if deadline.is_none_or(|d| Instant::now() < d) => {
                        home.serve_meanwhile();
                        self.serve(&|| slot.is_settled());
                    }
                    woke => return woke,
                }
            }
        }
        // Spin before parking only while the waiters leave a core free for
        // whoever runs the turn: more spinners would slow it down.
        let waiters = self.shared.waiters.fetch_add(1, Ordering::Relaxed) + 1;
        let woke = slot.wait_until(deadline, waiters < *CORES);
        self.shared.waiters.fetch_sub(1, Ordering::Relaxed);
        woke
    }

    /// The live settings changed (the runner stored them): wake whoever
    /// waits on the old ones.
    pub fn live_changed(&self) {
        let _inbox = self.shared.inbox.lock();
        self.shared.inbox.notify_all();
    }

    /// Hold the state a moment, if it is free, to take in what is pending
    /// (a dropped handle's release), evict idle streams and hand any queued
    /// call on, without running anyone's turn: combining mode only, the
    /// worker wakes for what is pushed and evicts by itself.
    pub fn tend(&self) {
        if let Flavor::Combining(combining) = &self.flavor {
            combining.tend();
        }
    }

    /// While `done` is false and the state is free, hold it and run turns,
    /// as a calling thread does while it waits (a task does it in its
    /// `poll`), in combining mode; in worker mode only the worker's own
    /// waker does. A waker calling back into the shard whose engine its
    /// thread holds is served with it (see `context`).
    pub fn serve(&self, done: &dyn Fn() -> bool) {
        if done() || self.shared.serve_lent(done) {
            return;
        }
        match &self.flavor {
            Flavor::Worker(worker) => worker.serve(done),
            Flavor::Combining(combining) => combining.serve(done),
        }
    }

    /// Whether a caller waiting here may run turns itself (combining
    /// mode), so must come back to do so rather than wait to be woken.
    pub fn may_run_turns(&self) -> bool {
        match &self.flavor {
            Flavor::Worker(worker) => worker.may_run_turns(),
            Flavor::Combining(combining) => combining.may_run_turns(),
        }
    }

    /// Stop taking new calls, and return once everything queued has been
    /// answered: steps 5 and 6 of the runner's life
    /// (numbered in the `runner` module's doc).
    pub fn drain(&self) {
        self.shared.inbox.start_draining();
        match &self.flavor {
            Flavor::Worker(worker) => worker.drain(),
            Flavor::Combining(combining) => combining.drain(),
        }
    }

    /// Close `shards`: step 7 for every shard first (the runner marked
    /// closed, each shard's sleepers woken: a worker closes its engine and
    /// lets it go at once), then 8 to 10 for each in turn. In this order a
    /// release pushed to a later shard while an earlier one is joined
    /// (a straggler handle dropped, by a waker the earlier shard's worker
    /// runs, say) finds that shard's engine let go, not held by a worker
    /// asleep until its own turn in the close.
    pub fn close_all(shards: &[Arc<Shard>]) {
        for shard in shards {
            shard.mark_closed();
        }
        for shard in shards {
            shard.close();
        }
    }

    /// Step 7 for this shard: the runner is marked closed under its inbox
    /// lock, and whoever sleeps on the inbox or the mode's condvar is woken
    /// to see it.
    fn mark_closed(&self) {
        self.shared.inbox.close();
        match &self.flavor {
            Flavor::Worker(worker) => worker.wake_for_close(),
            Flavor::Combining(combining) => combining.wake_for_close(),
        }
    }

    /// Refuse everything from now on, answer every waiting caller, and drop
    /// the state on a live thread: steps 7 (here, again if `close_all`
    /// did it), 8 (the join) and 9 and 10 (the worker's own, or the closing
    /// thread's in combining mode) of the runner's life.
    fn close(&self) {
        self.mark_closed();
        match &self.flavor {
            Flavor::Worker(worker) => worker.close(),
            Flavor::Combining(combining) => combining.close(),
        }
    }

    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Seats pushed to this shard's inbox and not taken in yet.
    pub fn waiting_seats(&self) -> usize {
        self.shared.inbox.waiting_seats()
    }
}
