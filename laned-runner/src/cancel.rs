//! Cancelling a call from another thread.

use std::fmt;
use std::sync::Arc;

use crate::slot::Cancel;

/// Cancels a call from another thread. The call then ends one of two ways,
/// and its result says which: `RunErrorKind::Cancelled` when none of its
/// seats had been seated (they are removed: nothing of the call ran, the
/// stream's state is as before it), or its answer when a seat had already
/// been seated (the call completed; cancelling came too late). A cancel
/// affects only the call it guards, never the stream's next one.
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<TokenInner>,
}

#[derive(Default)]
struct TokenInner {
    cancelled: std::sync::atomic::AtomicBool,
    /// The call the token guards now, if any: its slot, and the call's
    /// number there (a cancel reaching the slot after that call ended is
    /// ignored by it).
    target: std::sync::Mutex<Option<(Arc<dyn Cancel>, u64)>>,
}

impl fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CancelToken(cancelled: {})", self.is_cancelled())
    }
}

impl CancelToken {
    /// A token not cancelled yet, guarding no call until one is made with it.
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Cancel the call the token guards now, and every later one made with
    /// it (refused at once, inputs handed back).
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
        let target = self.inner.target.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((slot, call)) = target {
            slot.cancel(call);
        }
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn guard(&self, target: Option<(Arc<dyn Cancel>, u64)>) {
        *self.inner.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }
}
