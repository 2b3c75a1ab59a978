//! The runner's configuration: a plain serde struct with a builder.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tract_data::knobs::{Knob, KnobValue};

use crate::err::NewRunnerError;
use crate::policy::{TurnPolicy, MAX_WAIT_US};

/// Who runs the turns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One thread owns the state and runs every turn, as tract's
    /// `LanedRunnable` does. Required for states bound to a device thread.
    Worker,
    /// The default. No hand-off while the state is idle: the calling thread
    /// that finds the state free runs the turn itself, seating everything
    /// queued, and answers the others; waiting callers are served by whoever
    /// holds the state. A caller whose own call is answered leaves at once:
    /// seats still queued go to the shard's helper thread, which serves them
    /// as a worker would until nothing is queued for a moment, then lets
    /// callers combine again. It runs the turn on the caller when the state
    /// is free and hands it off when it is busy, so it needs no choosing:
    /// level with the worker where many streams keep the state busy, and
    /// without the worker's hand-off where few do (`BENCHMARKS.md`,
    /// "2026-12-04: small models pay").
    #[default]
    Combining,
}

/// How a [`LanedRunner`](crate::LanedRunner) serves its streams.
///
/// Loadable from TOML or JSON; fields left out take their defaults:
/// `max_seats` and `linger_us` then fall back to tract's knobs
/// `TRACT_MAX_SEATS` and `TRACT_TURN_LINGER_US`, read through tract's knob
/// system with tract's precedence (`Knob::set`, then a `KnobScope` such as a
/// deploy config's model section, then the environment, then the deploy
/// config's global knobs), and to tract's defaults (256 seats, no linger).
///
/// ```
/// use laned_runner::{Mode, RunnerConfig};
/// let config: RunnerConfig = serde_json::from_str(r#"{ "max_lanes": 32, "mode": "combining" }"#).unwrap();
/// assert_eq!(config.max_lanes, 32);
/// assert_eq!(config.mode, Mode::Combining);
/// assert_eq!(config.max_seats, None);
/// ```
///
/// `#[non_exhaustive]`: built with [`RunnerConfig::builder`] (or
/// `Default`, or serde), so a setting added later breaks no caller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RunnerConfig {
    /// Lanes of each shard's state: the most streams a shard holds at once.
    /// With the default single shard, the most streams the runner holds, as
    /// tract's `lanes` caps them.
    pub max_lanes: usize,
    /// Laned states (shards) behind the runner, each with its own lanes
    /// (`max_lanes` each: `LanedRunner::total_lanes` in all), queue, turn
    /// policy and (in `Worker` mode) thread; the plan and weights are
    /// shared. `None`: one, so that a runner built like tract's serves and
    /// batches like it; ask for one per core to use them all.
    pub shards: Option<usize>,
    /// The widest turn, clamped to the state's lanes (`max_lanes` plus the
    /// one kept for the later rows of wide calls). `None`:
    /// tract's knob `TRACT_MAX_SEATS`, else 256.
    pub max_seats: Option<usize>,
    /// Cap each turn at the width learned to cost least per row (on by
    /// default): a model that runs slower per row batched wide is served in
    /// turns of its cheapest width, never worse than a state per stream
    /// would be. Off where `max_seats` is given here (or set while
    /// serving): a width set is the width served; tract's knob
    /// `TRACT_MAX_SEATS` only bounds it. `LanedRunner::learned_width` and the `learned_width` metric
    /// say what was learned; `laned_runner`'s `width` module how.
    pub learn_width: bool,
    /// How long a turn waits for more seats once one is queued, in
    /// microseconds; it starts early once every held lane has a seat queued.
    /// `None`: tract's knob `TRACT_TURN_LINGER_US`, else 0.
    pub linger_us: Option<u64>,
    /// Who runs the turns.
    pub mode: Mode,
    /// When a turn starts. `None`: `Linger` of `linger_us` when that is set
    /// (or `TRACT_TURN_LINGER_US`), `Immediate` otherwise. Changeable while
    /// serving (`LanedRunner::set_policy`).
    pub policy: Option<TurnPolicy>,
    /// State the model carries as inputs and outputs (streaming exports:
    /// `state` in, `stateN` out): the runner keeps it per lane, and callers
    /// feed and get only the other inputs and outputs.
    pub state: StateSpec,
    /// Streams that may wait for a lane (`spawn_timeout`); past it spawning
    /// is refused at once as busy.
    pub max_waiting: usize,
    /// A stream that has not called for this long (milliseconds) loses its
    /// lane; `None` (the default): never. Idleness runs from the stream's
    /// grant or its last answer to the moment it calls, however late the
    /// runner takes the call in: a call made in time is served.
    pub idle_timeout_ms: Option<u64>,
}

impl Default for RunnerConfig {
    fn default() -> RunnerConfig {
        RunnerConfig {
            max_lanes: 64,
            shards: None,
            max_seats: None,
            learn_width: true,
            linger_us: None,
            mode: Mode::Combining,
            policy: None,
            state: StateSpec::None,
            max_waiting: 1024,
            idle_timeout_ms: None,
        }
    }
}

impl RunnerConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> RunnerConfigBuilder {
        RunnerConfigBuilder {
            config: RunnerConfig::default(),
        }
    }

    /// The settings with the environment applied and checked.
    pub(crate) fn resolve(&self) -> Result<Resolved, NewRunnerError> {
        if self.max_lanes == 0 {
            return Err(NewRunnerError::Config(
                "max_lanes is 0: a laned state needs one lane at least".into(),
            ));
        }
        if self.max_lanes > MAX_LANES {
            return Err(NewRunnerError::Config(format!(
                "max_lanes is {}, past the limit of {MAX_LANES} lanes per shard (every lane holds a row of every stateful op's buffers): use shards for more streams",
                self.max_lanes
            )));
        }
        // tract's knobs, as tract reads them: `Knob::set`, then the thread's
        // `KnobScope` (a deploy config's model section), then the
        // environment, then a deploy config's global `[knobs]`, then
        // tract's default.
        // A knob read from the environment is checked there: tract would
        // skip a value it cannot parse for the next source, silently.
        let max_seats = match self.max_seats {
            Some(n) => n,
            None => {
                let knob = &tract_core::lanes::TRACT_MAX_SEATS;
                env_checked(knob, "a non-negative integer").map_err(NewRunnerError::Config)?;
                knob.get()
            }
        };
        if max_seats == 0 {
            return Err(NewRunnerError::Config(
                "max_seats is 0: a turn seats one stream at least".into(),
            ));
        }
        let linger_us = match self.linger_us {
            Some(us) => us,
            None => {
                let knob = &tract_core::lanes::TRACT_TURN_LINGER_US;
                env_checked(knob, "a non-negative integer of microseconds").map_err(NewRunnerError::Config)?;
                knob.get() as u64
            }
        };
        if linger_us > MAX_WAIT_US {
            return Err(NewRunnerError::Config(format!(
                "linger_us is {linger_us}, past the limit of {MAX_WAIT_US} µs (an hour): a turn would hold its seats longer than any caller waits"
            )));
        }
        if let Some(policy) = self.policy {
            policy.check().map_err(|e| NewRunnerError::Config(e.to_string()))?;
        }
        if self.idle_timeout_ms == Some(0) {
            return Err(NewRunnerError::Config(
                "idle_timeout_ms is 0: every stream would be evicted at once".into(),
            ));
        }
        // One shard unless asked: `max_lanes` then caps the streams in
        // total, as tract's `lanes` does, and streams share every turn.
        let shards = self.shards.unwrap_or(1);
        if shards == 0 {
            return Err(NewRunnerError::Config(
                "shards is 0: a runner needs one laned state at least".into(),
            ));
        }
        if shards > MAX_SHARDS {
            return Err(NewRunnerError::Config(format!(
                "shards is {shards}, past the limit of {MAX_SHARDS} (a shard is a laned state and a thread)"
            )));
        }
        Ok(Resolved {
            shards,
            max_waiting: self.max_waiting,
            idle_timeout: self.idle_timeout_ms.map(Duration::from_millis),
            max_lanes: self.max_lanes,
            // The state has one lane more than the streams (see `Engine`), so
            // a turn can seat that many.
            max_seats: max_seats.min(self.max_lanes + 1),
            learn_width: self.learn_width && self.max_seats.is_none(),
            policy: self.policy.unwrap_or(if linger_us == 0 {
                TurnPolicy::Immediate
            } else {
                TurnPolicy::Linger { us: linger_us }
            }),
            mode: self.mode,
        })
    }
}

/// Lanes a shard's state may have at most: the runner's per-lane books
/// (metrics, learned turn times) are sized by lanes, so an absurd count
/// would abort on allocation rather than fail.
pub(crate) const MAX_LANES: usize = 1 << 20;

/// Shards a runner may have at most.
pub(crate) const MAX_SHARDS: usize = 4096;

/// A knob's environment variable that is set but that tract would skip (not
/// text, or not a value of the knob's type: `lots`, `-1`, `1.5`, `64k`, an
/// overflow) is refused, named with its value and `wanted`, what it should
/// be: tract falls through to the next source silently, and a deployer
/// would never learn why their value was ignored. Unset or blank, it is
/// not there. Only the environment is checked: `Knob::set` takes a typed
/// value, and a `KnobScope` or a deploy config's global knobs are checked
/// by tract when made.
pub(crate) fn env_checked<T: KnobValue>(knob: &Knob<T>, wanted: &str) -> Result<(), String> {
    let name = knob.name;
    let Some(value) = std::env::var_os(name) else {
        return Ok(());
    };
    match value.to_str() {
        None => Err(format!("{name}={value:?} is not valid UTF-8, so not {wanted}")),
        Some(text) if !text.trim().is_empty() && T::parse_knob(text).is_none() => {
            Err(format!("{name}={text:?}: not {wanted}"))
        }
        Some(_) => Ok(()),
    }
}

/// A model input or output, by index or by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortRef {
    /// The input or output at this position.
    Index(usize),
    /// The input or output whose node has this name.
    Name(String),
}

/// An explicit state: the input it is fed through and the output its next
/// value comes out of. The batch axis is where the batch symbol sits in
/// the input's fact (`[2, B, 128]`: axis 1).
///
/// ```
/// use laned_runner::{PortRef, StatePair};
/// let pair: StatePair = serde_json::from_str(
///     r#"{ "input": "state", "output": 1, "initial": { "shape": [1, 1, 2], "values": [0.5, -0.5] } }"#,
/// ).unwrap();
/// assert_eq!(pair, StatePair::new("state", 1).with_initial(vec![1, 1, 2], vec![0.5, -0.5]));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatePair {
    /// The input the state is fed through.
    pub input: PortRef,
    /// The output its next value comes out of.
    pub output: PortRef,
    /// What a new stream's state starts from; zeros when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial: Option<InitialState>,
}

impl StatePair {
    /// A pair starting from zeros.
    pub fn new(input: impl Into<PortRef>, output: impl Into<PortRef>) -> StatePair {
        StatePair {
            input: input.into(),
            output: output.into(),
            initial: None,
        }
    }

    /// The pair, its streams starting from `values` (row-major, one stream's
    /// shape: 1 on the batch axis).
    pub fn with_initial(self, shape: Vec<usize>, values: Vec<f64>) -> StatePair {
        StatePair {
            initial: Some(InitialState { shape, values }),
            ..self
        }
    }
}

/// One stream's initial state, row-major, in the model's shape for one
/// stream (1 on the batch axis); cast to the state's datum type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitialState {
    /// One stream's shape of the state (1 on the batch axis).
    pub shape: Vec<usize>,
    /// The values, row-major.
    pub values: Vec<f64>,
}

impl From<usize> for PortRef {
    fn from(ix: usize) -> PortRef {
        PortRef::Index(ix)
    }
}

impl From<&str> for PortRef {
    fn from(name: &str) -> PortRef {
        PortRef::Name(name.to_string())
    }
}

/// Which inputs and outputs are explicit state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateSpec {
    /// None: every input and output is the caller's.
    #[default]
    None,
    /// Pairs detected where unambiguous: an output named like an input plus
    /// `N`, `_out`, `_new` or a digit (`state` -> `stateN`), of the same fact.
    /// Detected states start from zeros.
    Detect,
    /// These pairs.
    Pairs(Vec<StatePair>),
}

/// The configuration as the runner uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub shards: usize,
    pub max_waiting: usize,
    pub idle_timeout: Option<Duration>,
    pub max_lanes: usize,
    pub max_seats: usize,
    pub learn_width: bool,
    pub policy: TurnPolicy,
    pub mode: Mode,
}

/// Builds a [`RunnerConfig`].
#[derive(Debug, Clone)]
pub struct RunnerConfigBuilder {
    config: RunnerConfig,
}

impl RunnerConfigBuilder {
    /// Lanes of each shard (see [`RunnerConfig::max_lanes`]).
    pub fn max_lanes(mut self, lanes: usize) -> Self {
        self.config.max_lanes = lanes;
        self
    }

    /// Laned states behind the runner (see [`RunnerConfig::shards`]).
    pub fn shards(mut self, shards: usize) -> Self {
        self.config.shards = Some(shards);
        self
    }

    /// The widest turn (see [`RunnerConfig::max_seats`]).
    pub fn max_seats(mut self, seats: usize) -> Self {
        self.config.max_seats = Some(seats);
        self
    }

    /// Whether turns are capped at the learned width (see
    /// [`RunnerConfig::learn_width`]).
    pub fn learn_width(mut self, learn: bool) -> Self {
        self.config.learn_width = learn;
        self
    }

    /// How long a turn waits for more seats (saturating: a linger too long
    /// for `u64` microseconds is refused by `LanedRunner::new`, never
    /// wrapped).
    pub fn linger(mut self, linger: Duration) -> Self {
        self.config.linger_us = Some(u64::try_from(linger.as_micros()).unwrap_or(u64::MAX));
        self
    }

    /// Who runs the turns.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.config.mode = mode;
        self
    }

    /// When a turn starts (see [`RunnerConfig::policy`]).
    pub fn policy(mut self, policy: TurnPolicy) -> Self {
        self.config.policy = Some(policy);
        self
    }

    /// The model's explicit state (see [`RunnerConfig::state`]).
    pub fn state(mut self, state: StateSpec) -> Self {
        self.config.state = state;
        self
    }

    /// Streams that may wait for a lane at once.
    pub fn max_waiting(mut self, streams: usize) -> Self {
        self.config.max_waiting = streams;
        self
    }

    /// Evict a stream idle this long (at least a millisecond).
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.config.idle_timeout_ms = Some(u64::try_from(idle.as_millis().max(1)).unwrap_or(u64::MAX));
        self
    }

    /// The configuration built (checked by `LanedRunner::new`).
    pub fn build(self) -> RunnerConfig {
        self.config
    }
}
