//! The synchronisation primitives the answer slot is built on: std's, or
//! loom's when the crate is built for model checking (`--cfg loom`, run by
//! `cargo xtask loom`), so the same code is what loom explores.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
