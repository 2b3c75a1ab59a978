//! Reading a model the way every `laned` command does: the command line
//! made a [`ModelSpec`] and loaded by `laned_models::spec` (ONNX with its
//! inputs' facts as given, or NNEF; decluttered, pulsified if asked); what
//! the runner will see in it, a line per fact; and the plan every command
//! runs.

use std::path::PathBuf;
use std::sync::Arc;

use laned_models::spec::{symbol_on_axis_0, InputFact, ModelSpec, Spec};
use laned_runner::{PortRef, StatePair, StateSpec};
use tract_core::internal::*;

/// Which model, and how to read it.
#[derive(Debug, Clone, clap::Args)]
#[group(skip)]
pub struct Source {
    /// The model: an `.onnx` file, tract's NNEF (`.nnef.tgz`, `.nnef.tar`,
    /// or a directory), or a spec (`.toml`, as `laned serve` reads one: a
    /// built-in's `[model] builtin = "deepfilternet3"`).
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

/// A model read, typed, decluttered (and pulsified if asked), with the
/// state pairs given: what `laned check` judges and `laned bench` runs.
pub struct Candidate {
    /// The model as the runner gets it.
    pub model: TypedModel,
    /// The symbol on axis 0 of its first input that has one.
    pub batch: Option<Symbol>,
    /// What was found, a line each.
    pub facts: Vec<String>,
    /// The state pairs given with `--state`.
    pub pairs: Vec<StatePair>,
    /// The spec it was read from (the `[model]` table `laned check` prints).
    pub spec: ModelSpec,
    /// Its plan, prepared by the loader.
    plan: Arc<dyn Runnable>,
}

impl Candidate {
    /// What the spec loader gave, as the check takes it: its typed model
    /// `model`, the state pairs `pairs`.
    pub fn of(model: TypedModel, loaded: &laned_models::spec::Loaded, pairs: Vec<StatePair>) -> Candidate {
        Candidate {
            model,
            batch: loaded.batch.clone(),
            facts: loaded.facts.clone(),
            pairs,
            spec: ModelSpec::default(),
            plan: loaded.plan.clone(),
        }
    }

    /// The model prepared to run (tract's default runtime).
    pub fn plan(&self) -> TractResult<Arc<dyn Runnable>> {
        Ok(self.plan.clone())
    }

    /// Whether outlet fact `fact` carries the batch symbol on axis 0.
    pub fn batched(&self, fact: &TypedFact) -> bool {
        self.batch.is_some() && symbol_on_axis_0(fact) == self.batch
    }
}

/// `IX=d0,d1,...` as an input's fact (f32).
fn input_fact(text: &str) -> TractResult<InputFact> {
    let (ix, dims) = text
        .split_once('=')
        .with_context(|| format!("--input: got {text:?}, wanted IX=DIMS (0=batch,1,257)"))?;
    let index = ix
        .trim()
        .parse()
        .with_context(|| format!("--input: got {ix:?} for the input's index, wanted a number"))?;
    ensure!(
        dims.split(',').all(|d| !d.trim().is_empty()),
        "--input: got {text:?}, a dim is empty"
    );
    Ok(InputFact {
        index,
        shape: dims.split(',').map(str::trim).collect::<Vec<_>>().join(","),
        dtype: "f32".into(),
    })
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

/// The `[model]` table `source` describes.
pub fn spec(source: &Source) -> TractResult<ModelSpec> {
    Ok(ModelSpec {
        pulse: source.pulse,
        symbol: source.symbol.clone(),
        inputs: source
            .inputs
            .iter()
            .map(|s| input_fact(s))
            .collect::<TractResult<Vec<_>>>()?,
        ..ModelSpec::file(source.model.clone())
    })
}

/// Read the model `source` names and list what the runner will see in it.
pub fn load(source: &Source) -> TractResult<Candidate> {
    if let Some(pulse) = source.pulse {
        ensure!(pulse > 0, "--pulse: got 0, wanted a positive number of frames");
    }
    let mut pairs = source.states.iter().map(|s| pair(s)).collect::<TractResult<Vec<_>>>()?;
    // A spec file (`laned check`'s output, or a built-in's) is read as
    // `laned serve` reads it: its `[model]` table says everything.
    let is_spec = source.model.extension().is_some_and(|e| e.eq_ignore_ascii_case("toml"));
    let spec = if is_spec {
        ensure!(
            source.pulse.is_none() && source.inputs.is_empty(),
            "{}: a spec file says its pulse and facts itself: give no --pulse or --input",
            source.model.display()
        );
        Spec::from_toml_file(&source.model)
            .map_err(|e| format_err!("{e}"))?
            .model
    } else {
        spec(source)?
    };
    let loaded = spec.load().map_err(|e| format_err!("{e}"))?;
    if let (true, StateSpec::Pairs(given)) = (pairs.is_empty(), &loaded.state) {
        pairs = given.clone();
    }
    Ok(Candidate {
        model: loaded.model.context("the loader gave no typed model")?,
        batch: loaded.batch,
        facts: loaded.facts,
        pairs,
        spec,
        plan: loaded.plan,
    })
}
