//! Cancelling a call from another thread.

use std::fmt;
use std::sync::Arc;

use crate::slot::Cancel;

/// Cancels a call from another thread. The call then ends one of two ways,
/// and its result says which: `RunErrorKind::Cancelled` when none of its
/// seats had been seated (they are removed: nothing of the call ran, the
/// stream's state is as before it), or its answer when a seat had already
/// been seated (the call completed; cancelling came too late). A cancel
/// affects only the calls it guards, never a stream's next one. One token
/// may guard calls of several streams at once (clones are the same token):
/// a cancel reaches every one of them.
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<TokenInner>,
}

#[derive(Default)]
struct TokenInner {
    cancelled: crate::sync::AtomicBool,
    /// The calls the token guards now (one token may guard calls on
    /// several streams at once): each one's slot, and the call's number
    /// there (a cancel reaching the slot after that call ended is ignored
    /// by it). Who may touch it: the calling threads (add and remove their
    /// own entry), any thread cancelling (reads).
    targets: crate::sync::Mutex<Vec<(Arc<dyn Cancel>, u64)>>,
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

    /// Cancel every call the token guards now, and every later one made
    /// with it (refused at once, inputs handed back).
    pub fn cancel(&self) {
        // The flag first: a call guarding itself after the copy below sees
        // it when it looks, so no call escapes both ways.
        self.inner.cancelled.store(true, crate::sync::Ordering::SeqCst);
        let targets = self.targets().clone();
        for (slot, call) in targets {
            slot.cancel(call);
        }
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(crate::sync::Ordering::SeqCst)
    }

    fn targets(&self) -> crate::sync::MutexGuard<'_, Vec<(Arc<dyn Cancel>, u64)>> {
        self.inner.targets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Guard call number `call` of `slot` until the returned guard drops.
    pub(crate) fn guard(&self, slot: Arc<dyn Cancel>, call: u64) -> Guarded<'_> {
        self.targets().push((slot.clone(), call));
        Guarded {
            token: self,
            slot,
            call,
        }
    }
}

/// A call guarded by a token; dropping it (the call ended, whichever way)
/// takes the call off the token's list, and no other call.
pub(crate) struct Guarded<'a> {
    token: &'a CancelToken,
    slot: Arc<dyn Cancel>,
    call: u64,
}

impl Drop for Guarded<'_> {
    fn drop(&mut self) {
        let mut targets = self.token.targets();
        if let Some(at) = targets
            .iter()
            .position(|(slot, call)| Arc::ptr_eq(slot, &self.slot) && *call == self.call)
        {
            targets.swap_remove(at);
        }
    }
}
