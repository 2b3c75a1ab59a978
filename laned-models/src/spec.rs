//! A streaming model described once, the way `laned check` prints it and
//! `laned serve` reads it: a [`Spec`] is a TOML file of two tables,
//! `[model]` ([`ModelSpec`]: the file or a built-in model, its digest,
//! the facts of inputs the file leaves open, the pulse, fills for shared
//! inputs) and `[runner]` (a `laned_runner::RunnerConfig`, its `state`
//! naming the explicit-state pairs).
//!
//! [`ModelSpec::load`] reads the model (ONNX with the facts given, or
//! tract's NNEF), declutters and pulsifies it, and returns a [`Loaded`]:
//! the typed model, the plan, the fills as tensors and what was found, a
//! line per fact. [`Interface::of`] then says what one stream feeds and
//! gets back once a runner has taken the model: every fed input's and
//! output's name, type and per-stream shape, so that a server can cut a
//! client's bytes into calls without knowing the model.
//!
//! ```
//! use laned_models::spec::{Interface, Spec};
//! use laned_runner::LanedRunner;
//! use tract_pulse::internal::tract_nnef;
//!
//! // A user's GRU (40 features in, 64 hidden), its state an input/output
//! // pair, in a file (tract's NNEF here; an ONNX file is read the same way,
//! // `inputs = [{ index = 0, shape = "B,40" }, ...]` giving its facts).
//! let dir = tempfile::tempdir()?;
//! let file = dir.path().join("gru.nnef.tar");
//! let gru = laned_testkit::fixtures::gru_cell(40, 64)?.model;
//! tract_nnef::nnef().write_to_tar(&gru, std::fs::File::create(&file)?)?;
//!
//! // Its spec, as `laned check gru.nnef.tar --state 1=1` prints it.
//! let spec: Spec = toml::from_str(&format!(
//!     "[model]\nfile = {file:?}\n[runner]\nmax_lanes = 8\nstate = {{ pairs = [{{ input = 1, output = 1 }}] }}\n"
//! ))?;
//! let loaded = spec.model.load()?;
//! let runner = LanedRunner::new(loaded.plan.clone(), loaded.runner_config(&spec.runner))?;
//! let interface = Interface::of(&loaded, &runner.explicit_state())?;
//! assert_eq!(interface.inputs[0].shape, [1, 40]);
//! let mut stream = runner.try_spawn()?;
//! let pulse = vec![0u8; interface.pulse_bytes()]; // 40 f32, little-endian
//! let answer = stream.call(interface.call_inputs(&pulse)?)?;
//! assert_eq!(interface.answer_bytes(&answer)?.len(), 64 * 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use laned_runner::{RunnerConfig, StatePair, StateSpec};
use serde::{Deserialize, Serialize};
use tract_core::internal::*;
use tract_onnx::prelude::InferenceModelExt;
use tract_pulse::internal::tract_nnef;
use tract_pulse::model::{PulsedModel, PulsedModelExt};

/// A spec file: the model and the runner that serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// What model, and how to read it.
    pub model: ModelSpec,
    /// How the runner serves it (lanes, shards, mode, policy, state pairs).
    #[serde(default)]
    pub runner: RunnerConfig,
}

impl Spec {
    /// Reads a spec file; a relative `model.file` is taken from the
    /// file's folder.
    pub fn from_toml_file(path: &Path) -> Result<Spec, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|e| SpecError::new(path, format!("reading it: {e}")))?;
        let mut spec: Spec = toml::from_str(&text).map_err(|e| SpecError::new(path, e.to_string()))?;
        if let Some(file) = &spec.model.file {
            if file.is_relative() {
                let dir = path.parent().unwrap_or(Path::new("."));
                spec.model.file = Some(dir.join(file));
            }
        }
        Ok(spec)
    }

    /// The spec as a TOML file.
    pub fn to_toml(&self) -> Result<String, SpecError> {
        toml::to_string(self).map_err(|e| SpecError::new(Path::new("(written)"), e.to_string()))
    }
}

/// A model built into this crate, fetched and checked like every other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Builtin {
    /// Silero VAD ([`crate::silero`]): a stream feeds 576 samples (64 of
    /// context, then a 512-sample chunk), gets a speech probability.
    Silero,
    /// DTLN's two models and frame loop as one ([`crate::dtln::Chain`]): a
    /// stream feeds 128 samples, gets 128 denoised samples.
    DtlnChain,
    /// DeepFilterNet3's three models and glue as one typed model
    /// ([`crate::dfn`]): a stream feeds 480 samples at 48 kHz, gets 480
    /// denoised samples, 1440 samples late; the models' state is lifted
    /// by the runner and travels.
    #[serde(rename = "deepfilternet3")]
    DeepFilterNet3,
}

impl Builtin {
    /// Every built-in model.
    pub const ALL: [Builtin; 3] = [Builtin::Silero, Builtin::DtlnChain, Builtin::DeepFilterNet3];

    /// Its name in a spec (`builtin = "silero"`).
    pub fn name(self) -> &'static str {
        match self {
            Builtin::Silero => "silero",
            Builtin::DtlnChain => "dtln-chain",
            Builtin::DeepFilterNet3 => "deepfilternet3",
        }
    }

    /// The built-in named `name`, as a spec names it.
    pub fn named(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Its files fetched into the cache and checked against their pins
    /// (nothing fetched where the cache holds them already): a serving
    /// host or an image fetched so needs no registry client at start.
    pub fn fetch(self) -> Result<Vec<PathBuf>, crate::fetch::FetchError> {
        Ok(match self {
            Builtin::Silero => vec![crate::silero::fetch()?],
            Builtin::DtlnChain => {
                let files = crate::dtln::fetch()?;
                vec![files.model_1, files.model_2]
            }
            Builtin::DeepFilterNet3 => {
                let files = crate::dfn::fetch()?;
                vec![files.enc, files.erb_dec, files.df_dec]
            }
        })
    }
}

/// What model a spec serves, and how to read it: the `[model]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The model file: `.onnx`, or tract's NNEF (`.nnef.tgz`, `.nnef.tar`,
    /// a directory). One of `file` and `builtin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// A built-in model instead of a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builtin: Option<Builtin>,
    /// The model's name (tract's `tract.name`), which the runner's metrics
    /// carry as their `runnable` label; `laned serve` sets it to the name
    /// it serves the model under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The SHA-256 the file must have (lowercase hex); `None`: read as it
    /// is. (A built-in model is always checked against its pin.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Pulsify the model by this many frames on `symbol` first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulse: Option<usize>,
    /// The streaming symbol the pulse applies to (`S`).
    #[serde(default = "default_symbol")]
    pub symbol: String,
    /// Facts of an ONNX file's inputs, for files that say a fixed batch of
    /// 1 or nothing (their output shapes are then inferred).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<InputFact>,
    /// Values for inputs shared by a turn's streams (Silero's sample rate).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fills: Vec<Fill>,
    /// How audio is cut into this model's pulses (`[model.audio]`), where
    /// its one fed input is samples: a WAV sent by `laned client` is cut so
    /// and its sample rate checked. A built-in says its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<AudioFraming>,
}

/// How a model's pulses are cut from audio (`[model.audio]`): pulse `k` is
/// the `context` samples before sample `k * hop` (zeros before the first
/// sample), then the `hop` samples from it; the last pulse is padded with
/// zeros. The model's one fed input is `f32` of `context + hop` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AudioFraming {
    /// Samples a second the model was made for; a WAV at another rate is
    /// refused.
    pub sample_rate: u32,
    /// New samples a pulse.
    pub hop: usize,
    /// Samples of the pulse before it repeated at each pulse's start.
    #[serde(default)]
    pub context: usize,
}

impl AudioFraming {
    /// Samples a pulse holds: context, then the hop's new ones.
    pub fn pulse_len(&self) -> usize {
        self.context + self.hop
    }

    /// `samples` cut into pulses, each [`AudioFraming::pulse_len`] long.
    pub fn pulses(&self, samples: &[f32]) -> Vec<Vec<f32>> {
        let hop = self.hop.max(1);
        (0..samples.len().div_ceil(hop))
            .map(|k| {
                let start = (k * hop) as isize - self.context as isize;
                (0..self.pulse_len())
                    .map(|i| {
                        let at = start + i as isize;
                        if at < 0 {
                            0.0
                        } else {
                            samples.get(at as usize).copied().unwrap_or(0.0)
                        }
                    })
                    .collect()
            })
            .collect()
    }
}

fn default_symbol() -> String {
    "S".into()
}

impl Default for ModelSpec {
    fn default() -> ModelSpec {
        ModelSpec {
            file: None,
            builtin: None,
            name: None,
            sha256: None,
            pulse: None,
            symbol: default_symbol(),
            inputs: Vec::new(),
            fills: Vec::new(),
            audio: None,
        }
    }
}

/// One ONNX input's fact: `shape` a comma-separated list of numbers and
/// symbols (`B,1,40`), `dtype` `f32` (the default), `f64`, `i64`, `i32`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputFact {
    /// The input's index.
    pub index: usize,
    /// Its dims.
    pub shape: String,
    /// Its element type.
    #[serde(default = "default_dtype")]
    pub dtype: String,
}

fn default_dtype() -> String {
    "f32".into()
}

/// A shared input's value for every call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fill {
    /// The input's index.
    pub index: usize,
    /// Its value (every element; integers exactly up to 2^53).
    pub value: f64,
}

/// A spec file that could not be read, naming the file.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecError {
    file: PathBuf,
    why: String,
}

impl SpecError {
    fn new(file: &Path, why: String) -> SpecError {
        SpecError {
            file: file.to_path_buf(),
            why,
        }
    }

    /// The spec file.
    pub fn file(&self) -> &Path {
        &self.file
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spec {}: {}", self.file.display(), self.why)
    }
}

impl std::error::Error for SpecError {}

/// A model that could not be loaded: what was being read and why (the
/// input, the fact, the file).
#[derive(Debug)]
pub struct LoadError(String);

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

fn dtype_of(text: &str) -> Result<DatumType, String> {
    Ok(match text {
        "f32" => f32::datum_type(),
        "f64" => f64::datum_type(),
        "f16" => f16::datum_type(),
        "i64" => i64::datum_type(),
        "i32" => i32::datum_type(),
        "i16" => i16::datum_type(),
        "i8" => i8::datum_type(),
        "u8" => u8::datum_type(),
        "bool" => bool::datum_type(),
        other => {
            return Err(format!(
                "dtype {other:?} is not one of f32, f64, f16, i64, i32, i16, i8, u8, bool"
            ))
        }
    })
}

/// A datum type as the wire and the spec name it.
pub fn dtype_name(dt: DatumType) -> String {
    format!("{dt:?}").to_lowercase()
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
    /// A spec of the model file `file`, everything else by default.
    pub fn file(file: impl Into<PathBuf>) -> ModelSpec {
        ModelSpec {
            file: Some(file.into()),
            ..ModelSpec::default()
        }
    }

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

/// One port as a stream sees it: a fed input or an output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    /// The model's index of the input or output.
    pub index: usize,
    /// Its name in the model.
    pub name: String,
    /// Its element type (`f32`, `i64`, ...).
    pub dtype: String,
    /// One stream's shape: 1 on the batch axis, every other dim a number.
    pub shape: Vec<usize>,
}

impl Port {
    /// Elements in one stream's pulse of it.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether one stream's pulse of it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How one input of a call is made.
#[derive(Debug, Clone)]
enum Source {
    /// The `k`-th fed input, from the client's bytes.
    Fed(usize),
    /// A shared input's value, the same for every call.
    Filled(TValue),
}

/// What one stream feeds and gets back, once the runner has taken the
/// model: the inputs a client sends (every input but the explicit state
/// and the filled ones), in the model's order, and the outputs it gets
/// (every output but the explicit state).
#[derive(Debug, Clone)]
pub struct Interface {
    /// The inputs a stream feeds, in order.
    pub inputs: Vec<Port>,
    /// The outputs a stream gets, in order.
    pub outputs: Vec<Port>,
    /// How audio is cut into its pulses, where the model says (checked
    /// against its one fed input).
    pub audio: Option<AudioFraming>,
    dtypes_in: Vec<DatumType>,
    dtypes_out: Vec<DatumType>,
    call: Vec<Source>,
}

/// The bytes of one element of `dt` on the wire, or why it has none.
fn width(dt: DatumType) -> Option<usize> {
    (dt.is_number() || dt == bool::datum_type()).then(|| dt.size_of())
}

/// `fact`'s shape for one stream: 1 on `batch_axis`, every other dim a
/// number; `Err` with the axis and the dim that is not.
pub fn one_stream_shape(fact: &TypedFact, batch_axis: Option<usize>) -> Result<Vec<usize>, (usize, TDim)> {
    fact.shape
        .dims()
        .iter()
        .enumerate()
        .map(|(axis, d)| match d.to_usize() {
            _ if Some(axis) == batch_axis => Ok(1),
            Ok(n) => Ok(n),
            Err(_) => Err((axis, d.clone())),
        })
        .collect()
}

/// [`one_stream_shape`], or an error naming the port and its free dim.
fn one_stream(what: &str, fact: &TypedFact, batch_axis: Option<usize>) -> Result<Vec<usize>, LoadError> {
    one_stream_shape(fact, batch_axis).map_err(|(axis, d)| {
        LoadError(format!(
            "{what} {:?} has the free dim {d} on axis {axis}: a stream's pulse needs every dim but the batch a number (pulse = N in [model], or the input's fact with numbers)",
            fact.shape
        ))
    })
}

impl Interface {
    /// The interface of `loaded` served with the explicit state `state`
    /// (the runner's (input, output) pairs, `LanedRunner::explicit_state`).
    pub fn of(loaded: &Loaded, state: &[(usize, usize)]) -> Result<Interface, LoadError> {
        let plan = &loaded.plan;
        let batch = loaded.batch.as_ref();
        let name_of = |what: &str, ix: usize| -> String {
            match &loaded.model {
                Some(m) => {
                    let outlet = if what == "input" { m.inputs[ix] } else { m.outputs[ix] };
                    m.node(outlet.node).name.clone()
                }
                None => format!("{what}_{ix}"),
            }
        };
        let (mut inputs, mut dtypes_in, mut call) = (vec![], vec![], vec![]);
        for ix in 0..plan.input_count() {
            if state.iter().any(|(i, _)| *i == ix) {
                continue;
            }
            let fact = plan.input_fact(ix)?;
            let name = name_of("input", ix);
            let what = format!("input {ix} {name:?}");
            let batched = batch.is_some() && symbol_on_axis_0(fact).as_ref() == batch;
            let shape = one_stream(&what, fact, batched.then_some(0))?;
            if let Some((_, value)) = loaded.fills.iter().find(|(i, _)| *i == ix) {
                if batched {
                    return Err(LoadError(format!(
                        "{what} is batched (a row per stream): a fill is for an input shared by a turn's streams"
                    )));
                }
                let len = shape.iter().product();
                let t = Tensor::from_shape(&shape, &vec![*value; len])?
                    .cast_to_dt(fact.datum_type)?
                    .into_owned();
                call.push(Source::Filled(t.into_tvalue()));
                continue;
            }
            if !batched {
                return Err(LoadError(format!(
                    "{what} {:?} is shared by a turn's streams (no batch on axis 0): give it a value, [[model.fills]] index = {ix}",
                    fact.shape
                )));
            }
            if width(fact.datum_type).is_none() {
                return Err(LoadError(format!(
                    "{what} is {:?}: only numbers and booleans go on the wire",
                    fact.datum_type
                )));
            }
            call.push(Source::Fed(inputs.len()));
            dtypes_in.push(fact.datum_type);
            inputs.push(Port {
                index: ix,
                name,
                dtype: dtype_name(fact.datum_type),
                shape,
            });
        }
        let (mut outputs, mut dtypes_out) = (vec![], vec![]);
        for ix in 0..plan.output_count() {
            if state.iter().any(|(_, o)| *o == ix) {
                continue;
            }
            let fact = plan.output_fact(ix)?;
            let name = name_of("output", ix);
            let what = format!("output {ix} {name:?}");
            let shape = one_stream(&what, fact, Some(0))?;
            if width(fact.datum_type).is_none() {
                return Err(LoadError(format!(
                    "{what} is {:?}: only numbers and booleans go on the wire",
                    fact.datum_type
                )));
            }
            dtypes_out.push(fact.datum_type);
            outputs.push(Port {
                index: ix,
                name,
                dtype: dtype_name(fact.datum_type),
                shape,
            });
        }
        if inputs.is_empty() {
            return Err(LoadError(
                "the model leaves a stream nothing to feed: every input is state or filled".into(),
            ));
        }
        if let Some(audio) = &loaded.audio {
            let fits = matches!(&inputs[..], [one] if one.dtype == "f32" && one.len() == audio.pulse_len());
            if !fits || audio.hop == 0 || audio.sample_rate == 0 {
                let fed: Vec<String> = inputs
                    .iter()
                    .map(|p| format!("{} {} {:?}", p.name, p.dtype, p.shape))
                    .collect();
                return Err(LoadError(format!(
                    "[model.audio] cuts pulses of {} f32 samples ({} of context, a hop of {}, at {} Hz): the model feeds {}",
                    audio.pulse_len(),
                    audio.context,
                    audio.hop,
                    audio.sample_rate,
                    fed.join(", ")
                )));
            }
        }
        Ok(Interface {
            inputs,
            outputs,
            audio: loaded.audio,
            dtypes_in,
            dtypes_out,
            call,
        })
    }

    /// Bytes of one stream's pulse: every fed input, in order.
    pub fn pulse_bytes(&self) -> usize {
        self.inputs
            .iter()
            .zip(&self.dtypes_in)
            .map(|(p, dt)| p.len() * dt.size_of())
            .sum()
    }

    /// Bytes of one answer: every output, in order.
    pub fn answer_len(&self) -> usize {
        self.outputs
            .iter()
            .zip(&self.dtypes_out)
            .map(|(p, dt)| p.len() * dt.size_of())
            .sum()
    }

    /// A call's inputs from one pulse's bytes (each fed input
    /// little-endian at its per-stream shape, in order), the fills in their
    /// places. Refused, naming both lengths, when `bytes` is not one pulse.
    pub fn call_inputs(&self, bytes: &[u8]) -> Result<TVec<TValue>, String> {
        if bytes.len() != self.pulse_bytes() {
            return Err(format!(
                "a pulse is {} bytes ({}), got {}",
                self.pulse_bytes(),
                self.inputs
                    .iter()
                    .map(|p| format!("{} {} {:?}", p.name, p.dtype, p.shape))
                    .collect::<Vec<_>>()
                    .join(", "),
                bytes.len()
            ));
        }
        let mut fed = Vec::with_capacity(self.inputs.len());
        let mut at = 0;
        for (port, dt) in self.inputs.iter().zip(&self.dtypes_in) {
            let n = port.len() * dt.size_of();
            fed.push(from_le(*dt, &port.shape, &bytes[at..at + n]).map_err(|e| format!("{}: {e:#}", port.name))?);
            at += n;
        }
        Ok(self
            .call
            .iter()
            .map(|s| match s {
                Source::Fed(k) => fed[*k].clone(),
                Source::Filled(v) => v.clone(),
            })
            .collect())
    }

    /// One answer's bytes: every output little-endian, in order. Refused
    /// when the runner's answer is not one stream's (never, for a runner
    /// serving this interface).
    pub fn answer_bytes(&self, outputs: &[TValue]) -> Result<Vec<u8>, String> {
        if outputs.len() != self.outputs.len() {
            return Err(format!("{} outputs, wanted {}", outputs.len(), self.outputs.len()));
        }
        let mut out = Vec::with_capacity(self.answer_len());
        for ((port, dt), t) in self.outputs.iter().zip(&self.dtypes_out).zip(outputs) {
            if t.datum_type() != *dt || t.len() != port.len() {
                return Err(format!(
                    "output {} is {:?} {:?}, wanted {:?} {:?}",
                    port.name,
                    t.datum_type(),
                    t.shape(),
                    dt,
                    port.shape
                ));
            }
            to_le(t, &mut out);
        }
        Ok(out)
    }

    /// One answer as JSON numbers: an array per output, flattened.
    pub fn answer_json(&self, outputs: &[TValue]) -> Result<Vec<Vec<f64>>, String> {
        outputs
            .iter()
            .map(|t| {
                let t = t.cast_to::<f64>().map_err(|e| format!("{e:#}"))?;
                Ok(t.to_plain_array_view::<f64>()
                    .map_err(|e| format!("{e:#}"))?
                    .iter()
                    .copied()
                    .collect())
            })
            .collect()
    }
}

/// A tensor of `dt` and `shape` from little-endian bytes (`bytes` holds
/// exactly its elements; booleans are any byte, nonzero true).
fn from_le(dt: DatumType, shape: &[usize], bytes: &[u8]) -> TractResult<TValue> {
    let mut t = Tensor::zero_dt(dt, shape)?;
    let raw = t.as_bytes_mut();
    ensure!(
        raw.len() == bytes.len(),
        "{} bytes for {dt:?} {shape:?}, wanted {}",
        bytes.len(),
        raw.len()
    );
    if dt == bool::datum_type() {
        for (to, from) in raw.iter_mut().zip(bytes) {
            *to = (*from != 0) as u8;
        }
    } else {
        raw.copy_from_slice(bytes);
        if cfg!(target_endian = "big") {
            for el in raw.chunks_mut(dt.size_of()) {
                el.reverse();
            }
        }
    }
    Ok(t.into_tvalue())
}

/// `t`'s elements little-endian onto `out`.
fn to_le(t: &Tensor, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(t.as_bytes());
    if cfg!(target_endian = "big") {
        for el in out[at..].chunks_mut(t.datum_type().size_of()) {
            el.reverse();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec file reads back as written, and unknown fields are refused
    /// naming them.
    #[test]
    fn a_spec_reads_back_and_refuses_unknown_fields() {
        let spec = Spec {
            model: ModelSpec {
                pulse: Some(4),
                inputs: vec![InputFact {
                    index: 0,
                    shape: "B,S,40".into(),
                    dtype: "f32".into(),
                }],
                fills: vec![Fill {
                    index: 1,
                    value: 16000.0,
                }],
                audio: Some(AudioFraming {
                    sample_rate: 16_000,
                    hop: 4,
                    context: 2,
                }),
                ..ModelSpec::file("gru.onnx")
            },
            runner: RunnerConfig::builder()
                .state(StateSpec::Pairs(vec![StatePair::new("h", "hn")]))
                .build(),
        };
        let text = spec.to_toml().unwrap();
        let back: Spec = toml::from_str(&text).unwrap();
        assert_eq!(back, spec, "{text}");
        let err = toml::from_str::<Spec>("[model]\nfile = \"m.onnx\"\npulze = 3\n").unwrap_err();
        assert!(err.to_string().contains("pulze"), "{err}");
    }

    /// Audio is cut as Silero's reference cuts it: each pulse starts with
    /// the previous pulse's last `context` samples (zeros before the
    /// first), then `hop` new ones; the last is padded.
    #[test]
    fn audio_is_cut_with_its_context() {
        let framing = AudioFraming {
            sample_rate: 16_000,
            hop: 3,
            context: 2,
        };
        let samples: Vec<f32> = (1..=7).map(|x| x as f32).collect();
        let pulses = framing.pulses(&samples);
        assert_eq!(
            pulses,
            vec![
                vec![0.0, 0.0, 1.0, 2.0, 3.0],
                vec![2.0, 3.0, 4.0, 5.0, 6.0],
                vec![5.0, 6.0, 7.0, 0.0, 0.0],
            ]
        );
        let plain = AudioFraming { context: 0, ..framing };
        assert_eq!(plain.pulses(&samples).concat()[..7], samples[..]);
        let toml = "[model]\nbuiltin = \"silero\"\n[model.audio]\nsample_rate = 8000\nhop = 256\n";
        let spec: Spec = toml::from_str(toml).unwrap();
        assert_eq!(
            spec.model.audio.map(|a| (a.sample_rate, a.hop, a.context)),
            Some((8000, 256, 0))
        );
    }

    /// Every built-in's name reads back as the spec's TOML names it.
    #[test]
    fn builtins_are_named_as_specs_name_them() {
        for b in Builtin::ALL {
            assert_eq!(Builtin::named(b.name()), Some(b));
            let spec: Spec = toml::from_str(&format!("[model]\nbuiltin = {:?}\n", b.name())).unwrap();
            assert_eq!(spec.model.builtin, Some(b));
        }
        assert_eq!(Builtin::named("silero-vad"), None);
    }

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

    /// Bytes in and out: a pulse's bytes become the call's tensors, the
    /// fills in their places, and a wrong length names both.
    #[test]
    fn little_endian_round_trip() {
        let t = from_le(f32::datum_type(), &[1, 2], &[0, 0, 128, 63, 0, 0, 0, 64]).unwrap();
        assert_eq!(
            t.to_plain_array_view::<f32>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            vec![1.0, 2.0]
        );
        let mut out = vec![];
        to_le(&t, &mut out);
        assert_eq!(out, vec![0, 0, 128, 63, 0, 0, 0, 64]);
        let i = from_le(i64::datum_type(), &[1], &7i64.to_le_bytes()).unwrap();
        assert_eq!(
            i.to_plain_array_view::<i64>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            vec![7]
        );
    }
}
