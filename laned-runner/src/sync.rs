//! The synchronisation primitives the runner is built on: std's, or loom's
//! when the crate is built for model checking (`--cfg loom`, run by
//! `cargo xtask loom`), so the code loom explores (the answer slot, the
//! inbox, admission, the deadline timer) is the code that runs.
//!
//! The rule: every lock, condition variable and atomic that two threads of
//! the runner share (the slot, the inbox, admission, the deadline timer,
//! the engine's lock, the shards' and streams' flags, cancel tokens, the
//! learned turn times) comes from here, never from `std::sync` directly.
//! Two things stay std's, because loom has no model of them: the parking
//! of `drive::on` (`std::thread::park`, woken through a `Waker`) and the
//! combining mode's `try_lock` error type. `Arc` and `Weak` are std's
//! (loom's `Arc` checks leaks only).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Lock `mutex`, recovering from poisoning: the runner's locks guard data
/// that every holder leaves consistent (turns run under `catch_unwind`), so
/// a panic elsewhere while one was held is no reason to stop serving.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
