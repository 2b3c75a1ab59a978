//! The loader: a [`ModelSpec`] made a [`Loaded`] model. A file is read
//! (ONNX with the facts its spec gives, or tract's NNEF) and checked
//! against its digest, a built-in fetched; either is decluttered,
//! pulsified where asked and prepared, with a line for each fact found.
//! [`Loaded::runner_config`] gives the runner the model's own state pairs.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use laned_runner::{RunnerConfig, StatePair, StateSpec};
use tract_core::internal::*;
use tract_onnx::prelude::InferenceModelExt;
use tract_pulse::internal::tract_nnef;
use tract_pulse::model::{PulsedModel, PulsedModelExt};

use super::interface::dtype_of;
use super::{AudioFraming, Builtin, Fill, InputFact, ModelSpec, Protocol};

/// A model that could not be loaded: what was being read and why (the
/// input, the fact, the file).
#[derive(Debug)]
pub struct LoadError(pub(super) String);

impl LoadError {
    fn of(e: impl fmt::Display) -> LoadError {
        LoadError(e.to_string())
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

impl From<TractError> for LoadError {
    fn from(e: TractError) -> LoadError {
        LoadError(format!("{e:#}"))
    }
}

/// A model loaded from its spec.
#[derive(Clone)]
pub struct Loaded {
    /// The model run: the typed model's plan, or a built-in runnable.
    pub plan: Arc<dyn Runnable>,
    /// The typed model, where the model is one (`None` for the DTLN chain,
    /// two models and a loop).
    pub model: Option<TypedModel>,
    /// The symbol on axis 0 of its first input that has one.
    pub batch: Option<Symbol>,
    /// What was found, a line each.
    pub facts: Vec<String>,
    /// The explicit state the model comes with (a built-in's pairs), used
    /// where the runner's config names none.
    pub state: StateSpec,
    /// Shared inputs' values: (input index, value).
    pub fills: Vec<(usize, f64)>,
    /// How audio is cut into its pulses, where the spec or the built-in
    /// says.
    pub audio: Option<AudioFraming>,
}

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded")
            .field("facts", &self.facts)
            .finish_non_exhaustive()
    }
}

impl Loaded {
    /// `config` with the model's own state pairs where it names none.
    pub fn runner_config(&self, config: &RunnerConfig) -> RunnerConfig {
        let mut config = config.clone();
        if config.state == StateSpec::None {
            config.state = self.state.clone();
        }
        config
    }
}

/// The symbol on axis 0 of `fact`, if its first dim is one.
pub fn symbol_on_axis_0(fact: &TypedFact) -> Option<Symbol> {
    match fact.shape.dims().first() {
        Some(TDim::Sym(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Read `path` as ONNX (its inputs' facts set from `inputs`) or NNEF, typed.
fn read(path: &Path, inputs: &[InputFact]) -> Result<TypedModel, LoadError> {
    use tract_core::framework::Framework;
    let name = path.display().to_string();
    if !path.exists() {
        return Err(LoadError(format!("model {name}: no such file or directory")));
    }
    if name.ends_with(".onnx") {
        let mut model = tract_onnx::onnx()
            .with_ignore_output_shapes(!inputs.is_empty())
            .model_for_path(path)
            .map_err(|e| LoadError(format!("reading {name} as ONNX: {e:#}")))?;
        for fact in inputs {
            let dt = dtype_of(&fact.dtype).map_err(|why| LoadError(format!("{name}: input {}: {why}", fact.index)))?;
            let dims: Vec<&str> = fact.shape.split(',').map(str::trim).collect();
            if dims.iter().any(|d| d.is_empty()) {
                return Err(LoadError(format!(
                    "{name}: input {}: shape {:?} has an empty dim (wanted numbers and symbols, B,1,40)",
                    fact.index, fact.shape
                )));
            }
            let dims: TVec<TDim> = dims
                .iter()
                .map(|d| match d.parse::<i64>() {
                    Ok(n) => TDim::Val(n),
                    Err(_) => TDim::Sym(model.symbols.sym(d)),
                })
                .collect();
            if fact.index >= model.inputs.len() {
                return Err(LoadError(format!(
                    "{name}: input {} given a fact, but the model has {} inputs",
                    fact.index,
                    model.inputs.len()
                )));
            }
            model
                .set_input_fact(fact.index, dt.fact(dims).into())
                .map_err(|e| LoadError(format!("{name}: input {}: {e:#}", fact.index)))?;
        }
        model
            .into_typed()
            .map_err(|e| LoadError(format!("typing {name}: {e:#}")))
    } else {
        if !inputs.is_empty() {
            return Err(LoadError(format!(
                "{name} is read as NNEF, which carries its own facts: input facts are for ONNX files"
            )));
        }
        tract_nnef::nnef().model_for_path(path).map_err(|e| {
            LoadError(format!(
                "reading {name} as NNEF (a .nnef.tgz, .nnef.tar or directory): {e:#}"
            ))
        })
    }
}

impl ModelSpec {
    /// Loads the model: fetched (a built-in, into `LANED_CACHE_DIR` or the
    /// user's cache) or read, checked against `sha256`, typed,
    /// decluttered, pulsified if asked.
    pub fn load(&self) -> Result<Loaded, LoadError> {
        self.load_in(None)
    }

    /// [`ModelSpec::load`], fetching a built-in model into `cache` (or the
    /// default cache).
    pub fn load_in(&self, cache: Option<&Path>) -> Result<Loaded, LoadError> {
        if let Some(sha) = self.sha256.as_deref().filter(|sha| !crate::fetch::is_sha256(sha)) {
            return Err(LoadError(format!("sha256 {sha:?} is not 64 lowercase hex digits")));
        }
        for fill in &self.fills {
            if !fill.value.is_finite() {
                return Err(LoadError(format!(
                    "fill of input {}: {} is not a number",
                    fill.index, fill.value
                )));
            }
        }
        if self.protocol == Protocol::Vad && self.builtin != Some(Builtin::Silero) {
            return Err(LoadError(
                "protocol = \"vad\" is Silero VAD's audio protocol: it serves builtin = \"silero\" only".into(),
            ));
        }
        match (&self.file, self.builtin) {
            (Some(_), Some(_)) => Err(LoadError("a model spec names a file and a builtin: name one".into())),
            (None, None) => Err(LoadError("a model spec names no file and no builtin: name one".into())),
            (None, Some(builtin)) => self.load_builtin(builtin, cache),
            (Some(path), None) => {
                if let Some(want) = &self.sha256 {
                    let got = crate::fetch::sha256_of(path).map_err(LoadError::of)?;
                    if &got != want {
                        return Err(LoadError(format!(
                            "{} has sha256 {got}, the spec says {want}",
                            path.display()
                        )));
                    }
                }
                let model = read(path, &self.inputs)?
                    .into_decluttered()
                    .map_err(|e| LoadError(format!("decluttering {}: {e:#}", path.display())))?;
                self.finish(model, vec![format!("model: {}", path.display())], StateSpec::None)
            }
        }
    }

    fn load_builtin(&self, builtin: Builtin, cache: Option<&Path>) -> Result<Loaded, LoadError> {
        if self.pulse.is_some() || !self.inputs.is_empty() {
            return Err(LoadError(format!(
                "builtin {builtin:?} comes with its facts and pulse: give no pulse or input facts"
            )));
        }
        match builtin {
            Builtin::Silero => {
                let path = match cache {
                    Some(dir) => crate::silero::fetch_in(dir),
                    None => crate::silero::fetch(),
                }
                .map_err(LoadError::of)?;
                let model = crate::silero::load(&path)?;
                let mut spec = self.clone();
                spec.audio = spec.audio.or(Some(crate::silero::AUDIO));
                if spec.fills.is_empty() {
                    spec.fills = vec![Fill {
                        index: 1,
                        value: crate::silero::SAMPLE_RATE as f64,
                    }];
                }
                let state = StateSpec::Pairs(vec![StatePair::new("state", 1)]);
                spec.finish(model, vec![format!("model: silero-vad ({})", path.display())], state)
            }
            Builtin::DeepFilterNet3 => {
                let files = crate::dfn::fetch().map_err(LoadError::of)?;
                let model = crate::dfn::load(&files)?;
                let mut spec = self.clone();
                spec.audio = spec.audio.or(Some(crate::dfn::AUDIO));
                let facts = vec![format!(
                    "model: DeepFilterNet3 ({}, {} and {}, pulsified by one frame, joined with the glue)",
                    files.enc.display(),
                    files.erb_dec.display(),
                    files.df_dec.display()
                )];
                spec.finish(model, facts, StateSpec::Pairs(crate::dfn::graph::state_pairs()))
            }
            Builtin::DtlnChain => {
                let files = crate::dtln::fetch().map_err(LoadError::of)?;
                let prepare =
                    |m: TypedModel| -> TractResult<Arc<dyn Runnable>> { Ok(DefaultRuntime.prepare(m)?.into()) };
                let chain = crate::dtln::Chain::new(
                    prepare(crate::dtln::load_model_1(&files.model_1)?)?,
                    prepare(crate::dtln::load_model_2(&files.model_2)?)?,
                )?;
                let plan: Arc<dyn Runnable> = Arc::new(chain);
                let batch = symbol_on_axis_0(plan.input_fact(0)?);
                let pairs = crate::dtln::Chain::STATE_PAIRS
                    .iter()
                    .map(|(i, o)| StatePair::new(*i, *o))
                    .collect();
                Ok(Loaded {
                    plan,
                    model: None,
                    batch,
                    facts: vec![format!(
                        "model: the DTLN chain ({} and {})",
                        files.model_1.display(),
                        files.model_2.display()
                    )],
                    state: StateSpec::Pairs(pairs),
                    fills: self.fills.iter().map(|f| (f.index, f.value)).collect(),
                    audio: self.audio.or(Some(crate::dtln::AUDIO)),
                })
            }
        }
    }

    /// Pulsify where asked, list the facts, prepare the plan.
    fn finish(&self, model: TypedModel, mut facts: Vec<String>, state: StateSpec) -> Result<Loaded, LoadError> {
        let mut model = match self.pulse {
            None => model,
            Some(0) => return Err(LoadError("pulse is 0: wanted a positive number of frames".into())),
            Some(pulse) => {
                let stream = model.symbols.sym(&self.symbol);
                let pulsed = PulsedModel::new(&model, stream, &pulse.to_dim())
                    .map_err(|e| LoadError(format!("pulsifying on {} by {pulse} frames: {e:#}", self.symbol)))?;
                let delay = pulsed.output_fact(0)?.stream.as_ref().map(|s| s.delay).unwrap_or(0);
                facts.push(format!(
                    "pulse: {pulse} frames on {}; delay {delay} frames (the outputs lag the inputs so much)",
                    self.symbol
                ));
                pulsed.into_typed()?
            }
        };
        if let Some(name) = &self.name {
            model.set_name(name.clone());
        }
        let batch = (0..model.inputs.len()).find_map(|ix| symbol_on_axis_0(model.input_fact(ix).ok()?));
        facts.push(match &batch {
            Some(b) => format!("batch symbol: {b} (axis 0)"),
            None => "batch symbol: none on axis 0 of any input".into(),
        });
        for fill in &self.fills {
            if fill.index >= model.inputs.len() {
                return Err(LoadError(format!(
                    "fill of input {}: the model has {} inputs",
                    fill.index,
                    model.inputs.len()
                )));
            }
        }
        for (what, outlets) in [("input", &model.inputs), ("output", &model.outputs)] {
            for (ix, outlet) in outlets.iter().enumerate() {
                let fact = model.outlet_fact(*outlet)?;
                facts.push(describe(what, ix, &model.node(outlet.node).name, fact, batch.as_ref()));
            }
        }
        let plan: Arc<dyn Runnable> = DefaultRuntime
            .prepare(model.clone())
            .map_err(|e| LoadError(format!("preparing the model: {e:#}")))?
            .into();
        Ok(Loaded {
            plan,
            model: Some(model),
            batch,
            facts,
            state,
            fills: self.fills.iter().map(|f| (f.index, f.value)).collect(),
            audio: self.audio,
        })
    }
}

/// A fact's line: its name, type and shape, and how the runner will see it.
fn describe(what: &str, ix: usize, name: &str, fact: &TypedFact, batch: Option<&Symbol>) -> String {
    let batched = batch.is_some() && symbol_on_axis_0(fact).as_ref() == batch;
    // The batch symbol elsewhere than axis 0: the shape of an explicit
    // state (`[2, B, 128]`), to be paired.
    let state_axis = batch.filter(|_| !batched).and_then(|b| {
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
    format!(
        "{what} {ix} {name:?}: {:?} {:?}, {}{}",
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
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec naming neither a file nor a builtin, or both, is refused
    /// saying so; a missing file is named.
    #[test]
    fn a_spec_names_one_model() {
        let neither = ModelSpec::default().load_in(None).unwrap_err().to_string();
        assert!(neither.contains("no file and no builtin"), "{neither}");
        let both = ModelSpec {
            builtin: Some(Builtin::Silero),
            ..ModelSpec::file("x.onnx")
        };
        assert!(both
            .load_in(None)
            .unwrap_err()
            .to_string()
            .contains("a file and a builtin"));
        let missing = ModelSpec::file("/nonexistent/gru.onnx")
            .load_in(None)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("/nonexistent/gru.onnx"), "{missing}");
    }

    /// The VAD protocol is refused for any model but the built-in Silero,
    /// naming what it serves; read from TOML by its name.
    #[test]
    fn the_vad_protocol_serves_silero_only() {
        let file = ModelSpec {
            protocol: Protocol::Vad,
            ..ModelSpec::file("/nonexistent/gru.onnx")
        };
        let why = file.load_in(None).unwrap_err().to_string();
        assert!(why.contains("builtin = \"silero\" only"), "{why}");
        let spec: crate::spec::Spec = toml::from_str("[model]\nbuiltin = \"silero\"\nprotocol = \"vad\"\n").unwrap();
        assert_eq!(spec.model.protocol, Protocol::Vad);
        let tensor: crate::spec::Spec = toml::from_str("[model]\nbuiltin = \"silero\"\n").unwrap();
        assert_eq!(tensor.model.protocol, Protocol::Tensor);
        assert!(
            !tensor.to_toml().unwrap().contains("protocol"),
            "the default is not written"
        );
        assert!(toml::from_str::<crate::spec::Spec>("[model]\nbuiltin = \"silero\"\nprotocol = \"audio\"\n").is_err());
    }
}
