//! The synchronisation primitives the runner is built on: std's, or loom's
//! when the crate is built for model checking (`--cfg loom`, run by
//! `cargo xtask loom`), so the code loom explores (the answer slot, the
//! inbox) is the code that runs.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Lock `mutex`, recovering from poisoning: the runner's locks guard data
/// that every holder leaves consistent (turns run under `catch_unwind`), so
/// a panic elsewhere while one was held is no reason to stop serving.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
