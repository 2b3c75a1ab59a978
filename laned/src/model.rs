//! Reading a model the way every `laned` command does: ONNX (its inputs'
//! facts as given) or NNEF, decluttered, pulsified if asked; what the
//! runner will see in it, a line per fact; and the plan every command runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use laned_runner::{PortRef, StatePair};
use tract_core::internal::*;
use tract_onnx::prelude::InferenceModelExt;
use tract_pulse::internal::tract_nnef;
use tract_pulse::model::{PulsedModel, PulsedModelExt};

/// Which model, and how to read it.
#[derive(Debug, Clone, clap::Args)]
#[group(skip)]
pub struct Source {
    /// The model: an `.onnx` file, or tract's NNEF (`.nnef.tgz`,
    /// `.nnef.tar`, or a directory).
    pub model: PathBuf,
    /// Pulsify the model by this many frames first (a streaming model on
    /// --symbol); without it, the model is taken as it is.
    #[arg(long)]
    pub pulse: Option<usize>,
    /// The streaming symbol the pulse applies to.
    #[arg(long, default_value = "S")]
    pub symbol: String,
    /// An explicit state: the input it is fed through and the output its
    /// next value comes out of, by index or name (`2=1`, `state=stateN`);
    /// repeat for several. Without it, pairs are detected by name where
    /// they can be.
    #[arg(long = "state", value_name = "IN=OUT")]
    pub states: Vec<String>,
    /// An ONNX input's fact, f32: `0=batch,1,257` (each dim a number or a
    /// symbol); repeat for several. For files whose inputs say a fixed
    /// batch of 1, or nothing; their output shapes are then ignored and
    /// inferred.
    #[arg(long = "input", value_name = "IX=DIMS")]
    pub inputs: Vec<String>,
}

/// A model read, typed, decluttered (and pulsified if asked).
pub struct Loaded {
    /// The model as the runner gets it.
    pub model: TypedModel,
    /// The symbol on axis 0 of its first input that has one.
    pub batch: Option<Symbol>,
    /// What was found, a line each.
    pub facts: Vec<String>,
    /// The state pairs given with `--state`.
    pub pairs: Vec<StatePair>,
}

impl Loaded {
    /// The model prepared to run (tract's default runtime).
    pub fn plan(&self) -> TractResult<Arc<dyn Runnable>> {
        Ok(DefaultRuntime.prepare(self.model.clone())?.into())
    }

    /// Whether outlet fact `fact` carries the batch symbol on axis 0.
    pub fn batched(&self, fact: &TypedFact) -> bool {
        self.batch.is_some() && symbol_on_axis_0(fact) == self.batch
    }
}

fn symbol_on_axis_0(fact: &TypedFact) -> Option<Symbol> {
    match fact.shape.dims().first() {
        Some(TDim::Sym(s)) => Some(s.clone()),
        _ => None,
    }
}

/// `IX=d0,d1,...` as an input index and its dims (numbers or symbols).
fn input_fact(text: &str) -> TractResult<(usize, Vec<String>)> {
    let (ix, dims) = text
        .split_once('=')
        .with_context(|| format!("--input: got {text:?}, wanted IX=DIMS (0=batch,1,257)"))?;
    let ix = ix
        .trim()
        .parse()
        .with_context(|| format!("--input: got {ix:?} for the input's index, wanted a number"))?;
    let dims: Vec<String> = dims.split(',').map(|d| d.trim().to_string()).collect();
    ensure!(
        dims.iter().all(|d| !d.is_empty()),
        "--input: got {text:?}, a dim is empty"
    );
    Ok((ix, dims))
}

/// `IN=OUT` as a state pair: a number is an index, anything else a name.
fn pair(text: &str) -> TractResult<StatePair> {
    let (input, output) = text
        .split_once('=')
        .with_context(|| format!("--state: got {text:?}, wanted IN=OUT (indices or names)"))?;
    let port = |p: &str| match p.trim().parse::<usize>() {
        Ok(ix) => PortRef::Index(ix),
        Err(_) => PortRef::Name(p.trim().to_string()),
    };
    Ok(StatePair::new(port(input), port(output)))
}

/// Read `path` as ONNX (its inputs' facts set from `inputs`) or NNEF, typed.
fn read(path: &Path, inputs: &[(usize, Vec<String>)]) -> TractResult<TypedModel> {
    use tract_core::framework::Framework;
    let name = path.to_string_lossy();
    if name.ends_with(".onnx") {
        let mut model = tract_onnx::onnx()
            .with_ignore_output_shapes(!inputs.is_empty())
            .model_for_path(path)
            .with_context(|| format!("reading {name} as ONNX"))?;
        for (ix, dims) in inputs {
            let dims: TVec<TDim> = dims
                .iter()
                .map(|d| match d.parse::<i64>() {
                    Ok(n) => TDim::Val(n),
                    Err(_) => TDim::Sym(model.symbols.sym(d)),
                })
                .collect();
            model
                .set_input_fact(*ix, f32::fact(dims).into())
                .with_context(|| format!("--input {ix}: the model has {} inputs", model.inputs.len()))?;
        }
        model.into_typed().with_context(|| format!("typing {name}"))
    } else {
        ensure!(
            inputs.is_empty(),
            "--input sets an ONNX file's inputs; {name} is read as NNEF"
        );
        tract_nnef::nnef()
            .model_for_path(path)
            .with_context(|| format!("reading {name} as NNEF (a .nnef.tgz, .nnef.tar or directory)"))
    }
}

/// Read the model `source` names and list what the runner will see in it.
pub fn load(source: &Source) -> TractResult<Loaded> {
    let pairs = source.states.iter().map(|s| pair(s)).collect::<TractResult<Vec<_>>>()?;
    let inputs = source
        .inputs
        .iter()
        .map(|s| input_fact(s))
        .collect::<TractResult<Vec<_>>>()?;
    let model = read(&source.model, &inputs)?.into_decluttered()?;
    let mut facts = vec![format!("model: {}", source.model.display())];
    let model = match source.pulse {
        None => model,
        Some(pulse) => {
            ensure!(pulse > 0, "--pulse: got 0, wanted a positive number of frames");
            let stream = model.symbols.sym(&source.symbol);
            let pulsed = PulsedModel::new(&model, stream, &pulse.to_dim())
                .with_context(|| format!("pulsifying on {} by {pulse} frames", source.symbol))?;
            let delay = pulsed.output_fact(0)?.stream.as_ref().map(|s| s.delay).unwrap_or(0);
            facts.push(format!(
                "pulse: {pulse} frames on {}; delay {delay} frames (the outputs lag the inputs so much)",
                source.symbol
            ));
            pulsed.into_typed()?
        }
    };
    let batch = (0..model.inputs.len()).find_map(|ix| symbol_on_axis_0(model.input_fact(ix).ok()?));
    facts.push(match &batch {
        Some(b) => format!("batch symbol: {b} (axis 0)"),
        None => "batch symbol: none on axis 0 of any input".into(),
    });
    for (what, outlets) in [("input", &model.inputs), ("output", &model.outputs)] {
        for (ix, outlet) in outlets.iter().enumerate() {
            let fact = model.outlet_fact(*outlet)?;
            let batched = batch.is_some() && symbol_on_axis_0(fact) == batch;
            // The batch symbol elsewhere than axis 0: the shape of an
            // explicit state (`[2, B, 128]`), to be paired.
            let state_axis = batch.as_ref().filter(|_| !batched).and_then(|b| {
                fact.shape
                    .dims()
                    .iter()
                    .position(|d| matches!(d, TDim::Sym(s) if s == b))
            });
            let free: Vec<String> = fact
                .shape
                .dims()
                .iter()
                .enumerate()
                .filter(|(axis, _)| !(batched && *axis == 0) && Some(*axis) != state_axis)
                .map(|(_, d)| d)
                .filter(|d| d.to_i64().is_err())
                .map(|d| d.to_string())
                .collect();
            facts.push(format!(
                "{what} {ix} {:?}: {:?} {:?}, {}{}",
                model.node(outlet.node).name,
                fact.datum_type,
                fact.shape,
                match (batched, state_axis) {
                    (true, _) => "batched (a row per stream)".to_string(),
                    (false, Some(axis)) => {
                        format!("the batch symbol on axis {axis}: an explicit state? (--state IN=OUT)")
                    }
                    (false, None) => "shared by a turn's streams".to_string(),
                },
                if free.is_empty() {
                    String::new()
                } else {
                    format!("; free dims {} (resolved per call)", free.join(", "))
                }
            ));
        }
    }
    Ok(Loaded {
        model,
        batch,
        facts,
        pairs,
    })
}
