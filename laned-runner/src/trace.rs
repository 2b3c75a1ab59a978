//! The runner's `tracing` events (feature `tracing`), all under the target
//! `laned`: a failed turn (warn), a rebuilt state (error: every stream lost
//! its state), an evicted stream (info), a drain's start and end (info).
//! Only what happens rarely: nothing per call or per turn. Without the
//! feature, [`event!`] expands to nothing and its arguments are not
//! evaluated.

/// `event!(warn, shard = 1, "text")`: a `tracing` event of that level under
/// target `laned`, or nothing without the feature.
#[cfg(feature = "tracing")]
macro_rules! event {
    ($level:ident, $($rest:tt)*) => {
        ::tracing::$level!(target: "laned", $($rest)*)
    };
}

#[cfg(not(feature = "tracing"))]
macro_rules! event {
    ($level:ident, $($rest:tt)*) => {};
}

pub(crate) use event;
