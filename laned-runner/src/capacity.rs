//! What a readiness probe or a gateway reads: free lanes, waiting
//! spawners, queued seats, per shard and in total. Every figure is a gauge
//! read without a lock on the hot path (the shards' atomics, and the
//! admission queue's length), so polling it every second costs nothing.

/// The runner's capacity at one instant ([`LanedRunner::capacity`]).
///
/// [`LanedRunner::capacity`]: crate::LanedRunner::capacity
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capacity {
    /// Whether new streams are admitted: false once
    /// [`LanedRunner::stop_admitting`](crate::LanedRunner::stop_admitting),
    /// a drain or a close started.
    pub accepting: bool,
    /// Lanes of every shard together (streams the runner can hold).
    pub lanes: usize,
    /// Lanes free now, every shard together.
    pub lanes_free: usize,
    /// Spawners waiting for a lane now (any shard's).
    pub spawners_waiting: usize,
    /// Spawners that may wait at once (`RunnerConfig::max_waiting`): with
    /// none allowed, a runner with no lane free refuses every spawn.
    pub max_waiting: usize,
    /// Seats queued for a turn now, every shard together: every seat of a
    /// call made and not yet seated or withdrawn, from the moment it was
    /// queued (a task's first poll of `call_async`), whether its shard's
    /// engine took it in already or it waits in the shard's inbox (in
    /// combining mode, until a caller holds the state).
    pub seats_queued: usize,
    /// Each shard's share, in shard order.
    pub shards: Vec<ShardCapacity>,
}

/// One shard's part of a [`Capacity`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardCapacity {
    /// Lanes of this shard.
    pub lanes: usize,
    /// Lanes of this shard free now.
    pub lanes_free: usize,
    /// Seats queued on this shard now (as [`Capacity::seats_queued`]).
    pub seats_queued: usize,
}

impl Capacity {
    /// Streams holding a lane now.
    pub fn streams(&self) -> usize {
        self.lanes - self.lanes_free
    }

    /// What a readiness probe answers: admitting, and either a lane is free
    /// or nobody waits for one and a spawner may wait (`max_waiting` is not
    /// 0). A pod reports unready (HTTP 503) otherwise, so that its gateway
    /// sends new streams elsewhere: exactly when a spawn arriving now would
    /// be refused or queued behind others.
    pub fn is_ready(&self) -> bool {
        self.accepting && (self.lanes_free > 0 || (self.spawners_waiting == 0 && self.max_waiting > 0))
    }
}
