//! DeepFilterNet3's three pulsified models and its glue as **one** typed
//! model, so that a runner serves a stream's frame in one call and keeps
//! all of its state per lane.
//!
//! Ports (batch `B` on axis 0 of each), one frame a call:
//! - input 0: [`HOP`] samples, `[B, 480]`; output 0: the [`HOP`] denoised
//!   samples the frame completes, [`super::DELAY`] samples late;
//! - input / output 1: the last hop of input, `[B, 480]`;
//! - input / output 2: the ERB features' running mean, `[B, 32]`;
//! - input / output 3: the complex features' running magnitude, `[B, 96]`;
//! - input / output 4: the last five frames' spectra, `[B, 5, 481, 2]`;
//! - input / output 5: the overlap-add buffer, `[B, 480]`.
//!
//! Pairs 1 to 5 are the glue's explicit state ([`state_pairs`], with
//! their initial values); the models' own state (their convolutions' delay
//! buffers, their GRUs' hidden states) stays inside their ops, where a
//! `laned_runner::LanedRunner` lifts it to pairs of its own. Two ops of
//! ours hold the glue, a row at a time: [`DfnFront`] (window, FFT,
//! features) and [`DfnBack`] (gains, deep filter, inverse FFT,
//! overlap-add); the rest are the models' nodes, spliced in.

use std::collections::HashMap;

use laned_runner::StatePair;
use tract_core::internal::*;

use super::{back, front, Pulsed, BINS, DF_BINS, ERB, HOP, ORDER, RING};

/// The explicit state pairs a runner serving the model is configured with,
/// each with a new stream's value.
pub fn state_pairs() -> Vec<StatePair> {
    let to_f64 = |v: Vec<f32>| v.into_iter().map(f64::from).collect();
    vec![
        StatePair::new(1, 1),
        StatePair::new(2, 2).with_initial(vec![1, ERB], to_f64(super::erb_norm_initial())),
        StatePair::new(3, 3).with_initial(vec![1, DF_BINS], to_f64(super::unit_norm_initial())),
        StatePair::new(4, 4),
        StatePair::new(5, 5),
    ]
}

/// `part`'s nodes wired into `into`, its inputs fed from `inputs`, names
/// prefixed: its outputs' outlets in `into`.
fn splice(into: &mut TypedModel, part: &TypedModel, prefix: &str, inputs: &[OutletId]) -> TractResult<TVec<OutletId>> {
    ensure!(
        part.inputs.len() == inputs.len(),
        "{prefix}: {} inputs, fed {}",
        part.inputs.len(),
        inputs.len()
    );
    let mut map: HashMap<OutletId, OutletId> = part.inputs.iter().copied().zip(inputs.iter().copied()).collect();
    for id in part.eval_order()? {
        let node = &part.nodes[id];
        if part.inputs.iter().any(|i| i.node == id) {
            continue;
        }
        let wires: TVec<OutletId> = node
            .inputs
            .iter()
            .map(|i| map.get(i).copied().with_context(|| format!("{prefix}: {i:?} unwired")))
            .collect::<TractResult<_>>()?;
        let outs = into.wire_node(format!("{prefix}.{}", node.name), node.op.clone(), &wires)?;
        for (ix, o) in outs.iter().enumerate() {
            map.insert(OutletId::new(id, ix), *o);
        }
    }
    part.outputs
        .iter()
        .map(|o| {
            map.get(o)
                .copied()
                .with_context(|| format!("{prefix}: output {o:?} unwired"))
        })
        .collect()
}

/// The one model: see the module doc for its ports.
pub fn build(pulsed: &Pulsed) -> TractResult<TypedModel> {
    let mut model = TypedModel {
        symbols: pulsed.enc.symbols.clone(),
        ..TypedModel::default()
    };
    let b = TDim::Sym(model.symbols.sym("batch"));
    let fact = |dims: &[usize]| {
        let mut shape: TVec<TDim> = tvec![b.clone()];
        shape.extend(dims.iter().map(|d| d.to_dim()));
        f32::fact(shape)
    };
    let audio = model.add_source("audio", fact(&[HOP]))?;
    let analysis = model.add_source("analysis", fact(&[HOP]))?;
    let erb_norm = model.add_source("erb_norm", fact(&[ERB]))?;
    let unit_norm = model.add_source("unit_norm", fact(&[DF_BINS]))?;
    let ring = model.add_source("ring", fact(&[RING, BINS, 2]))?;
    let synthesis = model.add_source("synthesis", fact(&[HOP]))?;
    let f = model.wire_node("dfn.front", DfnFront, &[audio, analysis, erb_norm, unit_norm, ring])?;
    let enc = splice(&mut model, &pulsed.enc, "enc", &[f[0], f[1]])?;
    ensure!(
        enc.len() == 7,
        "enc has {} outputs, not 7: not DeepFilterNet3's",
        enc.len()
    );
    let (e0, e1, e2, e3, emb, c0) = (enc[0], enc[1], enc[2], enc[3], enc[4], enc[5]);
    let m = splice(&mut model, &pulsed.erb_dec, "erb_dec", &[emb, e3, e2, e1, e0])?;
    let coefs = splice(&mut model, &pulsed.df_dec, "df_dec", &[emb, c0])?;
    let back = model.wire_node("dfn.back", DfnBack, &[f[5], m[0], coefs[0], synthesis])?;
    model.select_output_outlets(&[back[0], f[2], f[3], f[4], f[5], back[1]])?;
    for (ix, name) in [
        "denoised",
        "analysis.next",
        "erb_norm.next",
        "unit_norm.next",
        "ring.next",
        "synthesis.next",
    ]
    .iter()
    .enumerate()
    {
        model.set_outlet_label(model.outputs[ix], name.to_string())?;
    }
    model.into_decluttered()
}

/// `value` as f32 rows of `row` values each, or an error naming `what`, the
/// shape it has and the one wanted.
fn rows<'a>(what: &str, value: &'a TValue, row: &[usize]) -> TractResult<&'a [f32]> {
    let shape = value.shape();
    ensure!(
        value.datum_type() == f32::datum_type() && shape.len() == row.len() + 1 && shape[1..] == *row,
        "{what} is {:?} {:?}, not f32 [batch, {row:?}]",
        value.datum_type(),
        shape
    );
    value.try_as_plain_ram()?.as_slice::<f32>()
}

/// The glue's front, a row at a time ([`super::front`]): inputs audio,
/// the last hop, the two normalisations and the spectra; outputs
/// `feat_erb [B, 1, 1, 32]`, `feat_spec [B, 2, 1, 96]` and the four
/// states' next values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DfnFront;

impl Op for DfnFront {
    fn name(&self) -> StaticName {
        "DfnFront".into()
    }

    op_as_typed_op!();
}

impl EvalOp for DfnFront {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (audio, analysis, erb_norm, unit_norm, ring) = args_5!(inputs);
        let n = audio.shape()[0];
        let audio = rows("DfnFront's audio", &audio, &[HOP])?;
        let mut analysis = rows("DfnFront's last hop", &analysis, &[HOP])?.to_vec();
        let mut erb_norm = rows("DfnFront's ERB mean", &erb_norm, &[ERB])?.to_vec();
        let mut unit_norm = rows("DfnFront's unit norm", &unit_norm, &[DF_BINS])?.to_vec();
        let mut ring = rows("DfnFront's spectra", &ring, &[RING, BINS, 2])?.to_vec();
        for len in [
            analysis.len() / HOP,
            erb_norm.len() / ERB,
            unit_norm.len() / DF_BINS,
            ring.len() / (RING * BINS * 2),
        ] {
            ensure!(len == n, "DfnFront: a state of {len} rows for {n} rows of audio");
        }
        let (mut feat_erb, mut feat_spec) = (vec![0.0f32; n * ERB], vec![0.0f32; n * 2 * DF_BINS]);
        for r in 0..n {
            front(
                &audio[r * HOP..][..HOP],
                (
                    &mut analysis[r * HOP..][..HOP],
                    &mut erb_norm[r * ERB..][..ERB],
                    &mut unit_norm[r * DF_BINS..][..DF_BINS],
                    &mut ring[r * RING * BINS * 2..][..RING * BINS * 2],
                ),
                &mut feat_erb[r * ERB..][..ERB],
                &mut feat_spec[r * 2 * DF_BINS..][..2 * DF_BINS],
            );
        }
        Ok(tvec!(
            Tensor::from_shape(&[n, 1, 1, ERB], &feat_erb)?.into_tvalue(),
            Tensor::from_shape(&[n, 2, 1, DF_BINS], &feat_spec)?.into_tvalue(),
            Tensor::from_shape(&[n, HOP], &analysis)?.into_tvalue(),
            Tensor::from_shape(&[n, ERB], &erb_norm)?.into_tvalue(),
            Tensor::from_shape(&[n, DF_BINS], &unit_norm)?.into_tvalue(),
            Tensor::from_shape(&[n, RING, BINS, 2], &ring)?.into_tvalue(),
        ))
    }
}

impl TypedOp for DfnFront {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let b = inputs[0].shape[0].clone();
        let fact = |dims: &[usize]| {
            let mut shape: TVec<TDim> = tvec![b.clone()];
            shape.extend(dims.iter().map(|d| d.to_dim()));
            f32::fact(shape)
        };
        Ok(tvec!(
            fact(&[1, 1, ERB]),
            fact(&[2, 1, DF_BINS]),
            fact(&[HOP]),
            fact(&[ERB]),
            fact(&[DF_BINS]),
            fact(&[RING, BINS, 2]),
        ))
    }

    as_op!();
}

/// The glue's back, a row at a time ([`super::back`]): inputs the spectra
/// (the front's), the gains `[B, 1, 1, 32]`, the taps `[B, 1, 96, 10]`
/// and the overlap-add buffer; outputs the completed hop `[B, 480]` and
/// the buffer's next value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DfnBack;

impl Op for DfnBack {
    fn name(&self) -> StaticName {
        "DfnBack".into()
    }

    op_as_typed_op!();
}

impl EvalOp for DfnBack {
    op_out_of_plan!();

    fn eval(&self, _ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let (ring, gains, taps, synthesis) = args_4!(inputs);
        let n = ring.shape()[0];
        let ring = rows("DfnBack's spectra", &ring, &[RING, BINS, 2])?;
        let gains = rows("DfnBack's gains", &gains, &[1, 1, ERB])?;
        let taps = rows("DfnBack's taps", &taps, &[1, DF_BINS, ORDER * 2])?;
        let mut synthesis = rows("DfnBack's overlap-add buffer", &synthesis, &[HOP])?.to_vec();
        for len in [
            gains.len() / ERB,
            taps.len() / (DF_BINS * ORDER * 2),
            synthesis.len() / HOP,
        ] {
            ensure!(len == n, "DfnBack: an input of {len} rows for {n} rows of spectra");
        }
        let mut out = vec![0.0f32; n * HOP];
        for r in 0..n {
            back(
                &ring[r * RING * BINS * 2..][..RING * BINS * 2],
                &gains[r * ERB..][..ERB],
                &taps[r * DF_BINS * ORDER * 2..][..DF_BINS * ORDER * 2],
                &mut synthesis[r * HOP..][..HOP],
                &mut out[r * HOP..][..HOP],
            );
        }
        Ok(tvec!(
            Tensor::from_shape(&[n, HOP], &out)?.into_tvalue(),
            Tensor::from_shape(&[n, HOP], &synthesis)?.into_tvalue(),
        ))
    }
}

impl TypedOp for DfnBack {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        let b = inputs[0].shape[0].clone();
        Ok(tvec!(
            f32::fact(tvec![b.clone(), HOP.to_dim()]),
            f32::fact(tvec![b, HOP.to_dim()])
        ))
    }

    as_op!();
}
