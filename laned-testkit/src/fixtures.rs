//! Fixture models, built and pulsified in code (no files, no downloads). Each
//! carries the batch symbol `B` on axis 0 of its batched inputs and outputs;
//! each says in its doc line what lane-aware machinery it exercises.

use fastrand::Rng;
use tract_core::internal::*;
use tract_core::ops::array::{Pad, PadMode, Slice, TypedConcat};
use tract_core::ops::cnn::{Conv, KernelFormat, PaddingSpec, PoolSpec};
use tract_core::ops::math::{add, max, mul};
use tract_core::ops::nn::DataFormat;
use tract_pulse::internal::{PulsedModel, PulsedModelExt};

/// A pulsified model ready to be prepared, and what a driver needs to feed it.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// Short name, used in test and bench output.
    pub name: String,
    /// What the fixture exercises.
    pub what: &'static str,
    /// The pulsed model, as a typed model: batch symbol `B` on axis 0.
    pub model: TypedModel,
    /// The batch symbol.
    pub batch: Symbol,
    /// The streaming symbol of the model before pulsification (`S`).
    pub stream: Symbol,
    /// Frames per pulse.
    pub pulse: usize,
    /// Frames of delay between input and output (tract-pulse's `delay`).
    pub delay: usize,
    /// Per input the caller feeds (every model input but the explicit state
    /// ones, in model order): the shape one seat feeds (batched inputs with
    /// 1 on axis 0) and whether it is batched.
    pub inputs: Vec<InputSpec>,
    /// State the model carries as an input and returns as an output, which a
    /// laned runner keeps per lane; empty for models whose state lives in
    /// their ops (every pulsed model).
    pub state: Vec<StatePort>,
}

/// One explicit state of a fixture: model input `input` is fed the state,
/// model output `output` returns the next one. Its batch sits on `axis`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePort {
    /// The model input fed the state.
    pub input: usize,
    /// The model output returning the next state.
    pub output: usize,
    /// The state's batch axis.
    pub axis: usize,
    /// One stream's state (1 on `axis`); a stream starts from zeros.
    pub shape: Vec<usize>,
}

/// One input of a fixture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputSpec {
    /// Shape of one seat's tensor (1 on axis 0 when batched).
    pub shape: Vec<usize>,
    /// Whether axis 0 carries the batch symbol; a shared input otherwise.
    pub batched: bool,
}

impl Fixture {
    /// The model prepared on tract's default (CPU) runtime.
    pub fn runnable(&self) -> TractResult<Arc<dyn Runnable>> {
        Ok(DefaultRuntime.prepare(self.model.clone())?.into())
    }

    /// The model outputs a caller gets (all but the explicit state ones), in
    /// order.
    pub fn data_outputs(&self) -> Vec<usize> {
        (0..self.model.outputs.len())
            .filter(|o| !self.state.iter().any(|s| s.output == *o))
            .collect()
    }

    /// Each stream's explicit state as it starts: zeros.
    pub fn initial_state(&self) -> TVec<Tensor> {
        self.state
            .iter()
            .map(|s| Tensor::zero::<f32>(&s.shape).expect("f32 zeros"))
            .collect()
    }

    /// Deterministic pseudo-random inputs for one call of `rows` rows (the
    /// batched inputs get `rows` on axis 0), drawn from `seed`. Shared inputs
    /// take one of two values so that schedules see both agreeing and
    /// disagreeing seats.
    pub fn inputs(&self, rows: usize, seed: u64) -> TVec<TValue> {
        let mut rng = Rng::with_seed(seed);
        self.inputs
            .iter()
            .map(|spec| {
                if spec.batched {
                    let mut shape = spec.shape.clone();
                    shape[0] = rows;
                    random_tensor(&shape, &mut rng).into_tvalue()
                } else {
                    let v = if rng.bool() { 0.5 } else { 2.0 };
                    Tensor::from_shape(&spec.shape, &vec![v as f32; spec.shape.iter().product()])
                        .unwrap()
                        .into_tvalue()
                }
            })
            .collect()
    }
}

/// Data layout of a TDNN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[B, C, T]`.
    Nchw,
    /// `[B, T, C]`.
    Nhwc,
}

/// The sizes of a causal pad + conv TDNN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TdnnConfig {
    /// Channels of the hidden convs.
    pub width: usize,
    /// Frames per pulse.
    pub pulse: usize,
    /// The TDNN's data layout.
    pub layout: Layout,
}

impl TdnnConfig {
    /// The light TDNN of the reference figures: W = 64, pulse 4.
    pub fn light() -> TdnnConfig {
        TdnnConfig {
            width: 64,
            pulse: 4,
            layout: Layout::Nchw,
        }
    }

    /// The heavy TDNN of the reference figures: W = 256, pulse 16.
    pub fn heavy() -> TdnnConfig {
        TdnnConfig {
            width: 256,
            pulse: 16,
            layout: Layout::Nchw,
        }
    }

    /// A tiny TDNN: W = 8, one frame a pulse. A turn costs next to nothing,
    /// so what a runner adds per call is most of what it measures.
    pub fn tiny() -> TdnnConfig {
        TdnnConfig {
            width: 8,
            pulse: 1,
            layout: Layout::Nchw,
        }
    }

    /// The same sizes with `layout`.
    pub fn with_layout(self, layout: Layout) -> TdnnConfig {
        TdnnConfig { layout, ..self }
    }
}

/// Features per frame fed to every fixture.
pub const FEATURES: usize = 40;

struct Builder {
    model: TypedModel,
    batch: Symbol,
    stream: Symbol,
    layout: Layout,
    seed: u64,
}

impl Builder {
    fn new(layout: Layout) -> Builder {
        let model = TypedModel::default();
        let batch = model.symbols.sym("B");
        let stream = model.symbols.sym("S");
        Builder {
            model,
            batch,
            stream,
            layout,
            seed: 1,
        }
    }

    fn time_axis(&self) -> usize {
        match self.layout {
            Layout::Nchw => 2,
            Layout::Nhwc => 1,
        }
    }

    fn source(&mut self, name: &str, channels: usize) -> TractResult<OutletId> {
        let (b, s) = (self.batch.to_dim(), self.stream.to_dim());
        let shape = match self.layout {
            Layout::Nchw => tvec!(b, channels.to_dim(), s),
            Layout::Nhwc => tvec!(b, s, channels.to_dim()),
        };
        self.model.add_source(name, f32::fact(shape))
    }

    fn next_seed(&mut self) -> u64 {
        self.seed += 1;
        self.seed
    }

    /// A conv of `k` taps, dilation `d`, stride `stride`, preceded by a pad of
    /// `(k - 1) * d` frames before (causal) in `mode`, or by nothing when
    /// `mode` is `None` (a valid conv: the pulse's Delay carries the overlap).
    #[allow(clippy::too_many_arguments)]
    fn conv(
        &mut self,
        name: &str,
        input: OutletId,
        cin: usize,
        cout: usize,
        k: usize,
        d: usize,
        stride: usize,
        mode: Option<PadMode>,
    ) -> TractResult<OutletId> {
        let mut wire = input;
        if let Some(mode) = mode {
            let mut pads = vec![(0, 0); 3];
            pads[self.time_axis()] = ((k - 1) * d, 0);
            wire = self
                .model
                .wire_node(format!("{name}.pad"), Pad { pads, mode }, &[wire])?[0];
        }
        let mut rng = Rng::with_seed(self.next_seed());
        let scale = 1.0 / ((cin * k) as f32).sqrt();
        let weights: Vec<f32> = (0..cout * cin * k).map(|_| uniform(&mut rng) * scale).collect();
        let kernel = self
            .model
            .add_const(format!("{name}.kernel"), Tensor::from_shape(&[cout, cin, k], &weights)?)?;
        let bias: Vec<f32> = (0..cout).map(|_| uniform(&mut rng) * 0.1).collect();
        let bias = self
            .model
            .add_const(format!("{name}.bias"), Tensor::from_shape(&[cout], &bias)?)?;
        let data_format = match self.layout {
            Layout::Nchw => DataFormat::NCHW,
            Layout::Nhwc => DataFormat::NHWC,
        };
        let conv = Conv {
            pool_spec: PoolSpec {
                data_format,
                kernel_shape: tvec!(k),
                padding: PaddingSpec::Valid,
                dilations: Some(tvec!(d)),
                strides: Some(tvec!(stride)),
                input_channels: cin,
                output_channels: cout,
            },
            kernel_fmt: KernelFormat::OIHW,
            group: 1,
            q_params: None,
        };
        Ok(self.model.wire_node(name, conv, &[wire, kernel, bias])?[0])
    }

    fn relu(&mut self, name: &str, input: OutletId) -> TractResult<OutletId> {
        let zero = self.model.add_const(format!("{name}.zero"), tensor3(&[[[0f32]]]))?;
        Ok(self.model.wire_node(name, max(), &[input, zero])?[0])
    }

    fn zero_pad(&self) -> Option<PadMode> {
        Some(PadMode::Constant(rctensor0(0f32)))
    }

    /// The model as built, before pulsification (the streaming symbol `S`
    /// free).
    fn streaming(mut self, name: &str, outputs: &[OutletId]) -> TractResult<TypedModel> {
        self.model.select_output_outlets(outputs)?;
        self.model.set_name(name);
        Ok(self.model)
    }

    fn finish(self, name: String, what: &'static str, outputs: &[OutletId], pulse: usize) -> TractResult<Fixture> {
        let stream = self.stream.clone();
        let model = self.streaming(&name, outputs)?;
        Fixture::pulsify(name, what, model, &stream, pulse)
    }
}

impl Fixture {
    /// `model` (a streaming model on `stream`, with its batch symbol on axis
    /// 0 of its batched inputs) pulsified by `pulse` frames.
    pub fn pulsify(
        name: String,
        what: &'static str,
        model: TypedModel,
        stream: &Symbol,
        pulse: usize,
    ) -> TractResult<Fixture> {
        let model = model.into_decluttered()?;
        let batch = (0..model.inputs.len())
            .find_map(|ix| match model.input_fact(ix).ok()?.shape.dims().first() {
                Some(TDim::Sym(s)) if s != stream => Some(s.clone()),
                _ => None,
            })
            .with_context(|| format!("{name}: no input carries a batch symbol on axis 0"))?;
        let pulsed = PulsedModel::new(&model, stream.clone(), &pulse.to_dim())
            .with_context(|| format!("pulsifying {name} on {stream} by {pulse}"))?;
        let delay = pulsed.output_fact(0)?.stream.as_ref().map(|s| s.delay).unwrap_or(0);
        let model = pulsed.into_typed()?;
        let mut inputs = vec![];
        for ix in 0..model.inputs.len() {
            let fact = model.input_fact(ix)?;
            let batched = matches!(fact.shape.dims().first(), Some(TDim::Sym(s)) if *s == batch);
            let shape = fact
                .shape
                .dims()
                .iter()
                .enumerate()
                .map(|(axis, d)| if axis == 0 && batched { Ok(1) } else { Ok(d.to_usize()?) })
                .collect::<TractResult<Vec<usize>>>()
                .with_context(|| format!("input {ix} of {name} has a symbolic dim besides the batch: {fact:?}"))?;
            ensure!(
                fact.datum_type == f32::datum_type(),
                "input {ix} of {name} is {:?}; fixtures feed f32",
                fact.datum_type
            );
            inputs.push(InputSpec { shape, batched });
        }
        Ok(Fixture {
            name,
            what,
            model,
            batch,
            stream: stream.clone(),
            pulse,
            delay,
            inputs,
            state: vec![],
        })
    }

    /// A user's model from a file in tract's NNEF format (`.nnef.tgz`, `.nnef.tar` or
    /// a directory), streaming on the symbol named `stream`, pulsified by
    /// `pulse` frames. Its batched inputs carry a batch symbol on axis 0.
    pub fn from_file(path: &std::path::Path, stream: &str, pulse: usize) -> TractResult<Fixture> {
        use tract_core::framework::Framework;
        use tract_pulse::internal::tract_nnef;
        let model = tract_nnef::nnef()
            .model_for_path(path)
            .with_context(|| format!("loading {} as NNEF", path.display()))?;
        let symbol = model.symbols.sym(stream);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| "model".into());
        Fixture::pulsify(name, "a model loaded from a file", model, &symbol, pulse)
    }
}

/// The light TDNN as a streaming model, before pulsification: what a user
/// would export (here, for the NNEF round trip of `Fixture::from_file`).
pub fn tdnn_streaming(config: TdnnConfig) -> TractResult<TypedModel> {
    let (b, outputs) = tdnn_builder(config)?;
    b.streaming("tdnn", &outputs)
}

fn tdnn_builder(config: TdnnConfig) -> TractResult<(Builder, Vec<OutletId>)> {
    let mut b = Builder::new(config.layout);
    let w = config.width;
    let x = b.source("features", FEATURES)?;
    let pad = b.zero_pad();
    let c1 = b.conv("conv1", x, FEATURES, w, 5, 1, 1, pad.clone())?;
    let r1 = b.relu("relu1", c1)?;
    let c2 = b.conv("conv2", r1, w, w, 3, 2, 1, pad.clone())?;
    let r2 = b.relu("relu2", c2)?;
    let c3 = b.conv("conv3", r2, w, w, 3, 4, 1, pad.clone())?;
    let r3 = b.relu("relu3", c3)?;
    let c4 = b.conv("conv4", r3, w, 32, 1, 1, 1, pad)?;
    Ok((b, vec![c4]))
}

/// The causal pad + conv TDNN of the reference figures: convs k5/d1, k3/d2,
/// k3/d4, k1 of widths W, W, W, 32 with ReLU between, on 40 features;
/// exercises PulsePad and Delay lanes in a chain.
pub fn tdnn(config: TdnnConfig) -> TractResult<Fixture> {
    let (b, outputs) = tdnn_builder(config)?;
    let layout = match config.layout {
        Layout::Nchw => "nchw",
        Layout::Nhwc => "nhwc",
    };
    let name = format!("tdnn-w{}-p{}-{layout}", config.width, config.pulse);
    b.finish(name, "causal pad + conv TDNN", &outputs, config.pulse)
}

/// The TDNN at width 8: the same ops as the light one, fast enough for
/// tests that run many calls.
pub fn small_tdnn() -> Fixture {
    tdnn(TdnnConfig {
        width: 8,
        pulse: 4,
        layout: Layout::Nchw,
    })
    .expect("the small TDNN builds")
}

/// Dilated and strided convs, valid (unpadded): exercises Delay with overlap
/// and a stride that keeps one output frame of two.
pub fn strided() -> TractResult<Fixture> {
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("features", FEATURES)?;
    let c1 = b.conv("conv1", x, FEATURES, 16, 3, 2, 1, None)?;
    let r1 = b.relu("relu1", c1)?;
    let c2 = b.conv("conv2", r1, 16, 8, 3, 1, 2, None)?;
    b.finish(
        "strided".into(),
        "dilated and strided valid convs (Delay with overlap, stride 2)",
        &[c2],
        4,
    )
}

/// A valid conv of 7 taps behind a pulse of 2: a Delay whose overlap is
/// wider than the pulse.
pub fn wide_overlap() -> TractResult<Fixture> {
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("features", FEATURES)?;
    let c1 = b.conv("conv1", x, FEATURES, 8, 7, 1, 1, None)?;
    b.finish(
        "wide-overlap".into(),
        "a Delay whose overlap is wider than the pulse",
        &[c1],
        2,
    )
}

/// A causal conv padded in edge mode: exercises PulsePad's per-lane memory of
/// the first frame.
pub fn edge_pad() -> TractResult<Fixture> {
    let (b, c2) = edge_pad_builder()?;
    b.finish("edge-pad".into(), "edge-mode causal padding", &[c2], 4)
}

/// [`edge_pad`] before pulsification (pulse it by 4): a model whose state
/// (edge padding's last frame) stays in tract's op and cannot travel.
pub fn edge_pad_streaming() -> TractResult<TypedModel> {
    let (b, c2) = edge_pad_builder()?;
    b.streaming("edge-pad", &[c2])
}

fn edge_pad_builder() -> TractResult<(Builder, OutletId)> {
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("features", FEATURES)?;
    let c1 = b.conv("conv1", x, FEATURES, 16, 3, 1, 1, Some(PadMode::Edge))?;
    let r1 = b.relu("relu1", c1)?;
    let c2 = b.conv("conv2", r1, 16, 8, 2, 1, 1, Some(PadMode::Edge))?;
    Ok((b, c2))
}

/// A conv whose input is padded after the stream's end (two frames of
/// ones): its last output frames depend on where the stream ends, so a
/// stream ended at the wrong length (`finish` resolving the streaming
/// symbol wrongly) gets other outputs.
pub fn end_padded() -> TractResult<Fixture> {
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("features", 4)?;
    let mut pads = vec![(0, 0); 3];
    pads[b.time_axis()] = (0, 2);
    let mode = PadMode::Constant(rctensor0(1f32));
    let padded = b.model.wire_node("end.pad", Pad { pads, mode }, &[x])?[0];
    let c1 = b.conv("conv1", padded, 4, 3, 3, 1, 1, None)?;
    b.finish(
        "end-padded".into(),
        "padding after the stream's end (PulsePad on the stream's length)",
        &[c1],
        2,
    )
}

/// Two valid convs of different reach concatenated on channels: the shorter
/// branch is delayed to align with the longer, so two Delays hold per-lane
/// history of one stream.
pub fn concat_branches() -> TractResult<Fixture> {
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("features", FEATURES)?;
    let short = b.conv("short", x, FEATURES, 8, 2, 1, 1, None)?;
    let long = b.conv("long", x, FEATURES, 8, 3, 3, 1, None)?;
    // short is S - 1 frames long, long S - 6: drop short's first 5 frames.
    let end = b.stream.to_dim() - 1;
    let short = b.model.wire_node("short.align", Slice::new(2, 5, end), &[short])?[0];
    let cat = b.model.wire_node("concat", TypedConcat { axis: 1 }, &[short, long])?[0];
    b.finish("concat".into(), "concat of two delayed branches", &[cat], 4)
}

/// A TDNN block scaled by a gain fed as a shared input `[1, 1, 1]` (no batch
/// axis): seats agreeing on the gain share a turn.
pub fn shared_gain() -> TractResult<Fixture> {
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("features", FEATURES)?;
    let gain = b.model.add_source("gain", f32::fact([1, 1, 1]))?;
    let pad = b.zero_pad();
    let c1 = b.conv("conv1", x, FEATURES, 16, 3, 1, 1, pad)?;
    let scaled = b.model.wire_node("scaled", mul(), &[c1, gain])?[0];
    b.finish("shared-gain".into(), "a shared (unbatched) input", &[scaled], 4)
}

/// Two batched inputs and two outputs: a conv of one, and the sum of both
/// delayed to align.
pub fn two_in_two_out() -> TractResult<Fixture> {
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("left", FEATURES)?;
    let y = b.source("right", FEATURES)?;
    let pad = b.zero_pad();
    let c1 = b.conv("conv1", x, FEATURES, 8, 3, 1, 1, pad.clone())?;
    let sum = b.model.wire_node("sum", add(), &[x, y])?[0];
    let c2 = b.conv("conv2", sum, FEATURES, 4, 2, 2, 1, pad)?;
    b.finish(
        "two-in-two-out".into(),
        "two batched inputs and two outputs",
        &[c1, c2],
        4,
    )
}

/// A transposed conv (stride 2, 3 taps) after a causal conv: pulsified into
/// tract-pulse's DeconvDelay and PulseMask. tract 0.23.9's PulseMask is not
/// lane-aware (its position has no lane axis), so a laned runner must refuse
/// this model at construction, naming the mask; it runs solo.
pub fn deconv() -> TractResult<Fixture> {
    use tract_core::ops::cnn::Deconv;
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("features", FEATURES)?;
    let pad = b.zero_pad();
    let c1 = b.conv("conv1", x, FEATURES, 8, 2, 1, 1, pad)?;
    let mut rng = Rng::with_seed(77);
    let (cin, cout, k) = (8, 4, 3);
    let weights: Vec<f32> = (0..cout * cin * k).map(|_| uniform(&mut rng) * 0.3).collect();
    let kernel = b
        .model
        .add_const("deconv.kernel", Tensor::from_shape(&[cout, cin, k], &weights)?)?;
    let bias = b
        .model
        .add_const("deconv.bias", Tensor::from_shape(&[cout], &vec![0.05f32; cout])?)?;
    let op = Deconv {
        pool_spec: PoolSpec {
            data_format: DataFormat::NCHW,
            kernel_shape: tvec!(k),
            padding: PaddingSpec::Valid,
            dilations: None,
            strides: Some(tvec!(2)),
            input_channels: cin,
            output_channels: cout,
        },
        kernel_format: KernelFormat::OIHW,
        adjustments: tvec!(0),
        group: 1,
    };
    let up = b.model.wire_node("deconv", op, &[c1, kernel, bias])?[0];
    b.finish(
        "deconv".into(),
        "a transposed conv (DeconvDelay and PulseMask lanes)",
        &[up],
        4,
    )
}

/// A GRU cell carrying its hidden state as explicit I/O, the layout of
/// streaming exports: `x [B, F]` and `h [1, B, H]` in, `y [B, H]` and
/// `hN [1, B, H]` out. The state's batch sits on axis 1, so a runner must
/// gather and scatter it along that axis.
pub fn gru_cell(features: usize, hidden: usize) -> TractResult<Fixture> {
    let mut model = TypedModel::default();
    let batch = model.symbols.sym("B");
    let stream = model.symbols.sym("S");
    let x = model.add_source("x", f32::fact(dims!(batch.clone(), features)))?;
    let h0 = model.add_source("h", f32::fact(dims!(1, batch.clone(), hidden)))?;
    let h = model.wire_node("h.squeeze", AxisOp::Rm(0), &[h0])?[0];
    let y = gru_step(&mut model, x, h, features, hidden)?;
    let next = model.wire_node("hN", AxisOp::Add(0), &[y])?[0];
    model.select_output_outlets(&[y, next])?;
    model.set_name("gru-cell");
    let model = model.into_decluttered()?;
    Ok(Fixture {
        name: format!("gru_cell_f{features}_h{hidden}"),
        what: "explicit state (h -> hN) batched on axis 1, gathered and scattered per lane",
        model,
        batch,
        stream,
        pulse: 1,
        delay: 0,
        inputs: vec![InputSpec {
            shape: vec![1, features],
            batched: true,
        }],
        state: vec![StatePort {
            input: 1,
            output: 1,
            axis: 1,
            shape: vec![1, 1, hidden],
        }],
    })
}

/// One GRU step, `x [B, F]` and `h [B, H]` to the next `h [B, H]`, its
/// weights seeded (the same for every fixture built with these sizes):
/// `z = σ(x Wz + h Uz)`, `r = σ(x Wr + h Ur)`, `n = tanh(x Wn + r ⊙ h Un)`,
/// `h' = n + z ⊙ (h - n)`.
fn gru_step(model: &mut TypedModel, x: OutletId, h: OutletId, features: usize, hidden: usize) -> TractResult<OutletId> {
    use tract_core::ops::einsum::EinSum;
    use tract_core::ops::math::{sub, tanh};
    use tract_core::ops::nn::sigmoid;
    let mut rng = Rng::with_seed(57);
    let scale = 1.0 / (features.max(hidden) as f32).sqrt();
    let mut weights = |model: &mut TypedModel, name: &str, rows: usize| -> TractResult<OutletId> {
        let w: Vec<f32> = (0..rows * hidden).map(|_| uniform(&mut rng) * scale).collect();
        model.add_const(name, Tensor::from_shape(&[rows, hidden], &w)?)
    };
    let mut gate = |model: &mut TypedModel, name: &str| -> TractResult<(OutletId, OutletId)> {
        let w = weights(model, &format!("{name}.W"), features)?;
        let u = weights(model, &format!("{name}.U"), hidden)?;
        let xw = model.wire_node(
            format!("{name}.xw"),
            EinSum::new("bf,fh->bh".parse()?, f32::datum_type()),
            &[x, w],
        )?[0];
        let hu = model.wire_node(
            format!("{name}.hu"),
            EinSum::new("bk,kh->bh".parse()?, f32::datum_type()),
            &[h, u],
        )?[0];
        Ok((xw, hu))
    };
    let (zx, zh) = gate(model, "z")?;
    let (rx, rh) = gate(model, "r")?;
    let (nx, nh) = gate(model, "n")?;
    let z = model.wire_node("z.sum", add(), &[zx, zh])?[0];
    let z = model.wire_node("z", sigmoid(), &[z])?[0];
    let r = model.wire_node("r.sum", add(), &[rx, rh])?[0];
    let r = model.wire_node("r", sigmoid(), &[r])?[0];
    let rn = model.wire_node("n.reset", mul(), &[r, nh])?[0];
    let n = model.wire_node("n.sum", add(), &[nx, rn])?[0];
    let n = model.wire_node("n", tanh(), &[n])?[0];
    // h' = (1 - z) n + z h = n + z (h - n)
    let d = model.wire_node("h.minus.n", sub(), &[h, n])?[0];
    let zd = model.wire_node("z.keep", mul(), &[z, d])?[0];
    let y = model.wire_node("y", add(), &[n, zd])?[0];
    Ok(y)
}

/// A GRU over the stream the way tract streams one: tract's `Scan` on the
/// time axis of `x [B, S, F]`, its hidden state `[B, 1, H]` seeded with
/// zeros and carried by the op from pulse to pulse (no explicit state: what
/// an ONNX GRU without `initial_h` exports), out `y [B, S, H]`, pulsified
/// by `pulse` frames. The runner lifts the Scan's state into a lane.
pub fn gru_scan(features: usize, hidden: usize, pulse: usize) -> TractResult<Fixture> {
    let (b, y) = gru_scan_builder(features, hidden)?;
    b.finish(
        format!("gru-scan-f{features}-h{hidden}-p{pulse}"),
        "a GRU as tract streams it: a Scan carrying its hidden state (lifted to a lane)",
        &y,
        pulse,
    )
}

/// [`gru_scan`] before pulsification (the streaming symbol `S` free): what
/// a file saved for `laned check --pulse` holds.
pub fn gru_scan_streaming(features: usize, hidden: usize) -> TractResult<TypedModel> {
    let (b, y) = gru_scan_builder(features, hidden)?;
    b.streaming("gru-scan", &y)
}

fn gru_scan_builder(features: usize, hidden: usize) -> TractResult<(Builder, TVec<OutletId>)> {
    use tract_core::ops::array::MultiBroadcastTo;
    use tract_core::ops::scan::{InputMapping, OutputMapping, Scan, ScanInfo};
    let mut b = Builder::new(Layout::Nhwc);
    let batch = b.batch.clone();
    // The body shares the outer model's symbols, as tract's ONNX GRU does.
    let mut body = TypedModel {
        symbols: b.model.symbols.clone(),
        ..TypedModel::default()
    };
    let x = body.add_source("x", f32::fact(dims!(batch.clone(), 1, features)))?;
    let h = body.add_source("h", f32::fact(dims!(batch.clone(), 1, hidden)))?;
    let xt = body.wire_node("x.t", AxisOp::Rm(1), &[x])?[0];
    let ht = body.wire_node("h.t", AxisOp::Rm(1), &[h])?[0];
    let next = gru_step(&mut body, xt, ht, features, hidden)?;
    // Two nodes for the state and the scanned output (one outlet twice
    // would be one name twice in NNEF).
    let state = body.wire_node("h.next", AxisOp::Add(1), &[next])?[0];
    let y = body.wire_node("y.out", AxisOp::Add(1), &[next])?[0];
    body.select_output_outlets(&[state, y])?;
    let stream = b.stream.clone();
    let x = b
        .model
        .add_source("x", f32::fact(dims!(batch.clone(), stream, features)))?;
    let zeros = b.model.add_const("h0", Tensor::zero::<f32>(&[1, 1, hidden])?)?;
    let h0 = b
        .model
        .wire_node("h0.batch", MultiBroadcastTo::new(dims!(batch, 1, hidden)), &[zeros])?[0];
    let time = ScanInfo { axis: 1, chunk: 1 };
    let scan = Scan::new(
        body,
        vec![InputMapping::Scan(time), InputMapping::State],
        vec![
            OutputMapping {
                scan: None,
                full_dim_hint: None,
                last_value_slot: None,
                state: true,
            },
            OutputMapping {
                scan: Some((0, time)),
                full_dim_hint: None,
                last_value_slot: None,
                state: false,
            },
        ],
        0,
    )?;
    let y = b.model.wire_node("gru", scan, &[x, h0])?;
    Ok((b, y))
}

/// Every fixture the suites check, light sizes first: [`by_tract`]'s and
/// those whose state only a runner's lift lanes.
pub fn all() -> TractResult<Vec<Fixture>> {
    let mut all = by_tract()?;
    all.push(gru_scan(6, 5, 2)?);
    Ok(all)
}

/// The fixtures tract's own laned state serves as they are (driven by hand,
/// no runner): every one but those keeping a state tract refuses to lane
/// (a Scan's hidden state).
pub fn by_tract() -> TractResult<Vec<Fixture>> {
    Ok(vec![
        tdnn(TdnnConfig {
            width: 16,
            pulse: 4,
            layout: Layout::Nchw,
        })?,
        tdnn(TdnnConfig {
            width: 16,
            pulse: 4,
            layout: Layout::Nhwc,
        })?,
        strided()?,
        wide_overlap()?,
        edge_pad()?,
        concat_branches()?,
        shared_gain()?,
        two_in_two_out()?,
    ])
}

/// Uniform in [-1, 1), from `fastrand`'s seeded generator: fixtures and
/// schedules never depend on the platform's randomness.
fn uniform(rng: &mut Rng) -> f32 {
    rng.f32() * 2.0 - 1.0
}

fn random_tensor(shape: &[usize], rng: &mut Rng) -> Tensor {
    let values: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| uniform(rng)).collect();
    Tensor::from_shape(shape, &values).unwrap()
}

/// The value that makes [`panicking`]'s model panic.
pub const POISON: f32 = 666.0;

/// The value that makes [`panicking`]'s model fail with an error (tract's
/// `TractError`, not a panic): "refused input".
pub const REFUSED: f32 = 667.0;

/// An op passing its one input through unchanged, row for row (its
/// output fact the input's, its axes the input's), once `$before` has run
/// with the input in `$inputs`: what a fixture's op adds (a panic, an
/// error, time spent) is `$before`, the tract boilerplate is this macro's.
macro_rules! identity_op {
    ($(#[$doc:meta])* $name:ident, |$inputs:ident| $before:block) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name;

        impl Op for $name {
            fn name(&self) -> StaticName {
                stringify!($name).into()
            }
            op_as_typed_op!();
        }

        impl EvalOp for $name {
            op_out_of_plan!();

            fn eval(&self, _ctx: &EvalContext, $inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
                $before
                Ok($inputs)
            }
        }

        impl TypedOp for $name {
            as_op!();

            fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
                Ok(tvec!(inputs[0].without_value()))
            }

            fn axes_mapping(&self, inputs: &[&TypedFact], outputs: &[&TypedFact]) -> TractResult<AxesMapping> {
                AxesMapping::natural(inputs, outputs)
            }
        }
    };
}

identity_op!(
    /// Identity, except that it panics when its input holds [`POISON`] (what a
    /// turn hitting a bug in an op looks like) and errs when it holds
    /// [`REFUSED`] (an op refusing its input).
    PanicOnPoison,
    |inputs| {
        let values = inputs[0].to_plain_array_view::<f32>()?;
        if values.iter().any(|v| *v == POISON) {
            panic!("poisoned input");
        }
        if values.iter().any(|v| *v == REFUSED) {
            bail!("refused input");
        }
    }
);

/// A causal conv behind an op that panics on [`POISON`]: exercises a turn
/// that panics (isolation).
pub fn panicking() -> TractResult<Fixture> {
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("features", FEATURES)?;
    let checked = b.model.wire_node("check", PanicOnPoison, &[x])?[0];
    let pad = b.zero_pad();
    let c1 = b.conv("conv1", checked, FEATURES, 8, 3, 1, 1, pad)?;
    b.finish("panicking".into(), "an op that panics on a poisoned input", &[c1], 4)
}

/// What [`CrowdedRows`] spends per pair of rows in a batch.
pub const CROWDING: std::time::Duration = std::time::Duration::from_millis(1);

identity_op!(
    /// Identity, row for row, that costs [`CROWDING`] per pair of rows of its
    /// batch (a turn of `k` rows spins `k² · CROWDING` on the clock): what a
    /// model whose ops slow down per row as the batch widens looks like, in the
    /// extreme. Rows never mix; only the time does.
    CrowdedRows,
    |inputs| {
        let rows = inputs[0].shape().first().copied().unwrap_or(1) as u32;
        let until = std::time::Instant::now() + CROWDING * rows * rows;
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
    }
);

/// A causal conv behind [`CrowdedRows`]: a model slower per row the wider
/// its turn (a turn of one row is the cheapest per row), for the learned
/// turn width.
pub fn slower_batched() -> TractResult<Fixture> {
    let mut b = Builder::new(Layout::Nchw);
    let x = b.source("features", FEATURES)?;
    let crowded = b.model.wire_node("crowded", CrowdedRows, &[x])?[0];
    let pad = b.zero_pad();
    let c1 = b.conv("conv1", crowded, FEATURES, 8, 3, 1, 1, pad)?;
    b.finish(
        "slower_batched".into(),
        "an op costing per pair of rows: slower per row batched",
        &[c1],
        1,
    )
}

/// A running sum over time through tract's `Scan` (`[B, 3]` in, `[B, 3]`
/// out), whose state is not lane-aware: a laned runner must refuse it.
pub fn scan_cumsum() -> TractResult<TypedModel> {
    use tract_core::ops::scan::{InputMapping, OutputMapping, Scan, ScanInfo};
    let mut body = TypedModel::default();
    let b = body.symbols.sym("B");
    let x = body.add_source("x", f32::fact(dims!(b.clone(), 1)))?;
    let s = body.add_source("s", f32::fact(dims!(b.clone(), 1)))?;
    let sum = body.wire_node("sum", add(), &[x, s])?[0];
    body.select_output_outlets(&[sum, sum])?;
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let x = model.add_source("x", f32::fact(dims!(b.clone(), 3)))?;
    let s0 = model.add_source("s0", f32::fact(dims!(b.clone(), 1)))?;
    let scan = Scan::new(
        body,
        vec![InputMapping::Scan(ScanInfo { axis: 1, chunk: 1 }), InputMapping::State],
        vec![
            OutputMapping {
                scan: None,
                full_dim_hint: None,
                last_value_slot: None,
                state: true,
            },
            OutputMapping {
                scan: Some((0, ScanInfo { axis: 1, chunk: 1 })),
                full_dim_hint: None,
                last_value_slot: None,
                state: false,
            },
        ],
        0,
    )?;
    let y = model.wire_node("scan", scan, &[x, s0])?;
    model.select_output_outlets(&y)?;
    model.set_name("scan-cumsum");
    Ok(model)
}

/// A recurrent cell carrying its state as a tensor, as streaming ONNX
/// exports do: inputs `x` `[B, F]` and `state` `[1, B, H]` (the batch on
/// axis 1), outputs `y` `[B, H]` and `stateN` `[1, B, H]`, with
/// `y = stateN[0] = tanh(x W + state[0] U)`. The caller feeds `stateN` back.
pub fn rnn_cell(features: usize, hidden: usize) -> TractResult<TypedModel> {
    use tract_core::ops::einsum::EinSum;
    use tract_core::ops::math::tanh;
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let x = model.add_source("x", f32::fact(dims!(b.clone(), features)))?;
    let state = model.add_source("state", f32::fact(dims!(1, b, hidden)))?;
    let mut rng = Rng::with_seed(91);
    let scale = 1.0 / (features.max(hidden) as f32).sqrt();
    let w: Vec<f32> = (0..features * hidden).map(|_| uniform(&mut rng) * scale).collect();
    let u: Vec<f32> = (0..hidden * hidden).map(|_| uniform(&mut rng) * scale).collect();
    let w = model.add_const("W", Tensor::from_shape(&[features, hidden], &w)?)?;
    let u = model.add_const("U", Tensor::from_shape(&[hidden, hidden], &u)?)?;
    let h = model.wire_node("state.squeeze", AxisOp::Rm(0), &[state])?[0];
    let xw = model.wire_node("xw", EinSum::new("bf,fh->bh".parse()?, f32::datum_type()), &[x, w])?[0];
    let hu = model.wire_node("hu", EinSum::new("bk,kh->bh".parse()?, f32::datum_type()), &[h, u])?[0];
    let sum = model.wire_node("sum", add(), &[xw, hu])?[0];
    let y = model.wire_node("y", tanh(), &[sum])?[0];
    let next = model.wire_node("stateN", AxisOp::Add(0), &[y])?[0];
    model.select_output_outlets(&[y, next])?;
    model.set_name("rnn-cell");
    Ok(model)
}
