//! Whether a stream's rows stay its own: the model run on a fresh plain
//! state with one stream, then with that stream beside another, a few
//! calls each; row 0 of every batched output compared. The runner refuses
//! an output without a row per stream, but an op that reduces or
//! normalises across axis 0 and broadcasts back (a maximum over the whole
//! batch) keeps the batch axis and mixes the streams all the same: only
//! running it shows that. The other stream is fed twice: noise like the
//! first's, and noise ten thousand times louder (80 dB), which moves
//! what a maximum or a norm over the batch sees.

use std::sync::Arc;

use tract_core::internal::*;

use crate::feed::Feed;
use crate::model::Candidate;

/// Calls per run: past a pulsed model's first pulse, where a delay's
/// padding can hide what the stream's own frames do.
const CALLS: u64 = 4;

/// What the probe found.
#[derive(Debug, Clone, PartialEq)]
pub enum Apart {
    /// Row 0 was the same, bit for bit.
    Exact,
    /// Row 0 moved, by no more than float rounding (the kernels chosen by
    /// batch size): `diff` at most, against values up to `scale`.
    Rounding { output: usize, diff: f32, scale: f32 },
    /// Row 0 moved by more: the streams mix in `output`.
    Mixed { output: usize, diff: f32, scale: f32 },
}

/// What the model's outputs are, call after call, for `streams` fed together.
fn run(plan: &Arc<dyn Runnable>, feed: &Feed, streams: &[(u64, f32)]) -> TractResult<Vec<TVec<TValue>>> {
    let mut state = plan.spawn()?;
    let mut kept: Vec<(usize, usize, TValue)> = feed
        .state(streams.len())?
        .into_iter()
        .map(|(i, o, t)| (i, o, t.into_tvalue()))
        .collect();
    (0..CALLS)
        .map(|call| {
            let seeds: Vec<(u64, f32)> = streams.iter().map(|(s, g)| (s << 32 | call, *g)).collect();
            let values: Vec<(usize, TValue)> = kept.iter().map(|(i, _, v)| (*i, v.clone())).collect();
            let out = state.run(Feed::with_state(&feed.inputs_gained(&seeds)?, &values))?;
            for (_, o, v) in &mut kept {
                *v = out.get(*o).with_context(|| format!("no state output {o}"))?.clone();
            }
            Ok(out)
        })
        .collect()
}

/// The other stream's gains.
const NEIGHBOURS: [f32; 2] = [1.0, 1e4];

/// Runs the probe: stream 0 alone, then beside stream 1, quiet and loud.
pub fn probe(loaded: &Candidate, plan: &Arc<dyn Runnable>, feed: &Feed) -> TractResult<Apart> {
    let alone = run(plan, feed, &[(0, 1.0)])?;
    let mut pairs = vec![];
    for gain in NEIGHBOURS {
        let beside = run(plan, feed, &[(0, 1.0), (1, gain)])?;
        pairs.extend(alone.iter().cloned().zip(beside));
    }
    let state_outputs = feed.state_outputs();
    let mut worst: Option<(usize, f32, f32)> = None;
    for (one, two) in &pairs {
        for (ix, (a, b)) in one.iter().zip(two.iter()).enumerate() {
            let batched = loaded.batched(loaded.model.output_fact(ix)?) || state_outputs.contains(&ix);
            if !batched {
                continue;
            }
            // A state's batch axis need not be 0: row 0 of it is
            // where its rows begin, so compare it on that axis.
            let axis = feed.state_axis_of_output(ix).unwrap_or(0);
            let b = b.slice(axis, 0, 1)?;
            ensure!(
                a.shape() == b.shape(),
                "output {ix}: one stream gave {:?}, two gave {:?} (a row each on axis {axis} expected)",
                a.shape(),
                b.shape()
            );
            let Some((diff, scale)) = crate::compare::difference(a, &b) else {
                continue;
            };
            if worst.is_none_or(|(_, d, _)| diff > d) {
                worst = Some((ix, diff, scale));
            }
        }
    }
    Ok(match worst {
        None => Apart::Exact,
        Some((output, diff, scale)) if diff <= 1e-5 * scale.max(1.0) => Apart::Rounding { output, diff, scale },
        Some((output, diff, scale)) => Apart::Mixed { output, diff, scale },
    })
}

/// The nodes of `loaded` that reduce over axis 0 while it carries the
/// batch: where rows mixing in an output usually comes from, by name and op.
pub fn reducers_over_the_batch(loaded: &Candidate) -> Vec<String> {
    let model = &loaded.model;
    model
        .nodes()
        .iter()
        .filter_map(|node| {
            let reduce = node.op_as::<tract_core::ops::nn::Reduce>()?;
            let input = model.outlet_fact(*node.inputs.first()?).ok()?;
            (reduce.axes.contains(&0) && loaded.batched(input))
                .then(|| format!("{:?} ({:?} over axes {:?})", node.name, reduce.reducer, reduce.axes))
        })
        .collect()
}
