//! The synchronisation primitives the answer slot and the inbox are built on: std's, or
//! loom's when the crate is built for model checking (`--cfg loom`, run by
//! `cargo xtask loom`), so the same code is what loom explores.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
