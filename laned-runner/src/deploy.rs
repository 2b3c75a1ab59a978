//! The `laned` runtime of tract's registry, so that tract's deploy config
//! (`TRACT_CONFIG`, the `deploy` runtime) switches a model to laned with no
//! code change:
//!
//! ```toml
//! [vad]
//! runtime = "laned"
//!
//! [vad.knobs]
//! LANED_LANES = 64          # streams per shard
//! LANED_SHARDS = 2          # shards (default 1)
//! LANED_MODE = "worker"     # or "combining" (the default)
//! LANED_LATENCY_BUDGET_US = 16000
//! LANED_STATE = "2=1"       # explicit state: IN=OUT pairs, or "detect"
//! TRACT_TURN_LINGER_US = 500  # tract's knobs reach the runner too
//! ```
//!
//! The model is prepared on tract's CPU runtime and served by a
//! [`LanedRunner`] built from the knobs in force while the deploy runtime
//! prepares it (the section's scope). A model the section's transforms
//! batched (`batchify`) is handed back behind tract's `UnbatchedRunnable`
//! by the deploy runtime, which works over a laned runner as over any.
//!
//! The lanes come from our own knob, `LANED_LANES`, not from tract's
//! `TRACT_AUTOBATCH_LANES`: tract's deploy runtime wraps whatever a
//! runtime prepared in its own `LanedRunnable` whenever that knob is set,
//! which would stack tract's runner on ours. Setting it in a `laned`
//! section is refused, saying so.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use tract_core::internal::*;

use crate::config::env_checked;
use crate::{LanedRunner, Mode, PortRef, RunnerConfig, StatePair, StateSpec, TurnPolicy};

tract_data::declare_knob!(
    scopable LANED_LANES,
    Option<usize>,
    None,
    "Streams each shard of the `laned` runtime's runner serves (its max_lanes); unset, 64."
);

tract_data::declare_knob!(
    scopable LANED_SHARDS,
    usize,
    1,
    "Shards (laned states) of the `laned` runtime's runner."
);

tract_data::declare_knob!(
    scopable LANED_MODE,
    String,
    "combining".to_string(),
    "Who runs the `laned` runtime's turns: combining (the callers, a helper thread per shard when busy) or worker (a thread per shard)."
);

tract_data::declare_knob!(
    scopable LANED_LATENCY_BUDGET_US,
    Option<usize>,
    None,
    "The `laned` runtime's turn policy: a latency budget in microseconds; unset, tract's linger knob decides."
);

tract_data::declare_knob!(
    scopable LANED_STATE,
    String,
    String::new(),
    "The `laned` runtime's explicit state: IN=OUT pairs by index or name, comma separated (`2=1`, `state=stateN`), or `detect`; unset, none."
);

/// The explicit state `LANED_STATE` says: empty, none; `detect`; or
/// `IN=OUT` pairs (each side an index or a node name), comma separated.
pub(crate) fn state_from_knob(text: &str) -> Result<StateSpec, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(StateSpec::None);
    }
    if text == "detect" {
        return Ok(StateSpec::Detect);
    }
    let port = |side: &str| -> PortRef {
        let side = side.trim();
        side.parse::<usize>()
            .map_or_else(|_| PortRef::Name(side.to_string()), PortRef::Index)
    };
    text.split(',')
        .map(|pair| match pair.split_once('=') {
            Some((input, output)) if !input.trim().is_empty() && !output.trim().is_empty() => {
                Ok(StatePair::new(port(input), port(output)))
            }
            _ => Err(format!(
                "LANED_STATE={text:?}: {pair:?} is not IN=OUT (an input and an output by index or name: `2=1`, `state=stateN`), nor is the whole `detect`"
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(StateSpec::Pairs)
}

/// Streams per shard when `LANED_LANES` is unset.
const DEFAULT_LANES: usize = 64;

/// The runtime registered as `laned` (see the module documentation).
#[derive(Debug)]
pub struct LanedRuntime;

impl LanedRuntime {
    /// The runner config the knobs in force say (the calling thread's
    /// `KnobScope` included), or why they cannot.
    pub fn config_from_knobs() -> TractResult<RunnerConfig> {
        // The environment's values are checked first: tract skips one it
        // cannot parse for the next source (a scope's and a deploy config's
        // values are checked by tract when made).
        let integer = "a non-negative integer";
        env_checked(&tract_core::lanes::TRACT_AUTOBATCH_LANES, integer).map_err(TractError::msg)?;
        env_checked(&LANED_LANES, integer).map_err(TractError::msg)?;
        env_checked(&LANED_SHARDS, integer).map_err(TractError::msg)?;
        env_checked(&LANED_MODE, "\"worker\" or \"combining\"").map_err(TractError::msg)?;
        env_checked(&LANED_LATENCY_BUDGET_US, "a non-negative integer of microseconds").map_err(TractError::msg)?;
        if let Some(lanes) = tract_core::lanes::TRACT_AUTOBATCH_LANES.get() {
            bail!(
                "TRACT_AUTOBATCH_LANES={lanes} with the laned runtime: tract's deploy runtime would wrap laned's runner in its own LanedRunnable; set LANED_LANES={lanes} instead"
            );
        }
        let mode = match LANED_MODE.get().trim() {
            "worker" => Mode::Worker,
            "combining" => Mode::Combining,
            other => bail!("LANED_MODE={other:?}: the laned runtime's modes are \"worker\" and \"combining\""),
        };
        let state = state_from_knob(&LANED_STATE.get()).map_err(TractError::msg)?;
        let mut config = RunnerConfig::builder()
            .max_lanes(LANED_LANES.get().unwrap_or(DEFAULT_LANES))
            .shards(LANED_SHARDS.get())
            .mode(mode)
            .state(state);
        if let Some(us) = LANED_LATENCY_BUDGET_US.get() {
            config = config.policy(TurnPolicy::latency_budget(Duration::from_micros(us as u64)));
        }
        Ok(config.build())
    }
}

impl Runtime for LanedRuntime {
    fn name(&self) -> StaticName {
        Cow::Borrowed("laned")
    }

    fn check(&self) -> TractResult<()> {
        Ok(())
    }

    fn prepare_with_options(&self, model: TypedModel, options: &RunOptions) -> TractResult<Box<dyn Runnable>> {
        let config = Self::config_from_knobs()?;
        let inner: Arc<dyn Runnable> = DefaultRuntime.prepare_with_options(model, options)?.into();
        Ok(Box::new(LanedRunner::new(inner, config)?))
    }
}

mod registered {
    use tract_core::internal::inventory;
    use tract_core::register_runtime;

    register_runtime!(super::LanedRuntime = super::LanedRuntime);
}
