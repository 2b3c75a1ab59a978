//! A laned session as data: streams arriving and leaving, the calls each
//! makes, and the seating of every turn (for the by-hand driver).

use proptest::prelude::*;

/// One stream of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPlan {
    /// Seeds the stream's inputs.
    pub seed: u64,
    /// Rows of each call, in order: 1 for a plain pulse, more for a wide
    /// call (its later rows are independent one-pulse runs).
    pub calls: Vec<usize>,
    /// The turn (by hand) or the rank (through a runner) at which the stream
    /// asks for a lane.
    pub arrive: usize,
    /// The stream's true length in frames, resolved for its last call (a
    /// stream ending on a partial pulse).
    pub end: Option<i64>,
}

impl StreamPlan {
    /// The seed of call `call`'s inputs.
    pub fn call_seed(&self, call: usize) -> u64 {
        self.seed.wrapping_mul(7919).wrapping_add(call as u64)
    }
}

/// A whole session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Lanes of the state; one of them is kept free for the later rows of
    /// wide calls, so at most `max_lanes - 1` streams hold one at once.
    pub max_lanes: usize,
    /// The streams; a stream's index here is its number in the outputs and in
    /// a [`Mismatch`](crate::check::Mismatch).
    pub streams: Vec<StreamPlan>,
    /// Per turn (cycled): bit `i % 64` seats the `i`th live stream; the high
    /// bits rotate the seat order.
    pub picks: Vec<u64>,
}

/// What schedules may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// The most streams in a schedule (1 at least).
    pub max_streams: usize,
    /// The most calls a stream makes (1 at least).
    pub max_calls: usize,
    /// The most lanes of a schedule's state (2 are drawn when it is lower).
    pub max_lanes: usize,
    /// Allow wide calls (2 rows).
    pub wide: bool,
    /// Allow streams ending on a partial pulse (a resolved stream length).
    pub ends: bool,
}

impl Default for ScheduleConfig {
    fn default() -> ScheduleConfig {
        ScheduleConfig {
            max_streams: 6,
            max_calls: 5,
            max_lanes: 4,
            wide: true,
            ends: true,
        }
    }
}

/// A proptest strategy for schedules.
pub fn schedule(config: ScheduleConfig) -> impl Strategy<Value = Schedule> {
    let stream = (
        any::<u64>(),
        prop::collection::vec(
            if config.wide {
                prop_oneof![4 => Just(1usize), 1 => Just(2usize)].boxed()
            } else {
                Just(1usize).boxed()
            },
            1..=config.max_calls,
        ),
        0..6usize,
        if config.ends {
            prop::option::weighted(0.3, 1..64i64).boxed()
        } else {
            Just(None).boxed()
        },
    )
        .prop_map(|(seed, calls, arrive, end)| StreamPlan {
            seed,
            calls,
            arrive,
            end,
        });
    (
        2..=config.max_lanes.max(2),
        prop::collection::vec(stream, 1..=config.max_streams),
        prop::collection::vec(any::<u64>(), 1..8),
    )
        .prop_map(|(max_lanes, streams, picks)| Schedule {
            max_lanes,
            streams,
            picks,
        })
}

/// The cases a property test runs: `LANED_PROPTEST_CASES` (what `cargo xtask
/// fuzz` sets), else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("LANED_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A proptest config with [`cases`] cases, seeded from `LANED_PROPTEST_SEED`
/// when set (so `cargo xtask fuzz --seed S` replays).
pub fn proptest_config(default_cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        cases: cases(default_cases),
        ..ProptestConfig::default()
    };
    if let Some(seed) = std::env::var("LANED_PROPTEST_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(seed);
    }
    config
}
