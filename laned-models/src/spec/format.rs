//! The spec's format: the TOML a [`Spec`] is written in and read from,
//! its `[model]` table ([`ModelSpec`]: a file or a [`Builtin`], the
//! digest, the inputs' facts, the pulse, the fills, `[model.audio]`) and
//! its `[runner]` table. Reading a spec checks only its form; loading the
//! model it names is `load`'s job.

use std::fmt;
use std::path::{Path, PathBuf};

use laned_runner::RunnerConfig;
use serde::{Deserialize, Serialize};

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
    /// The wire protocol `laned serve` speaks for it (`protocol = "vad"`:
    /// the built-in `silero` with `vad-server`'s audio protocol; the
    /// default, `tensor`, a binary frame a pulse).
    #[serde(default, skip_serializing_if = "Protocol::is_tensor")]
    pub protocol: Protocol,
}

/// The wire protocol a served model speaks (`[model] protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Protocol {
    /// The model's tensors as they are: a binary frame a pulse, every fed
    /// input in order, little-endian; an answer a frame (and the
    /// multiplexed and KServe v2 fronts).
    #[default]
    Tensor,
    /// Silero VAD over PCM, as `vad-server` speaks it: frames of 16 kHz
    /// samples of any length, cut into chunks with their context, each
    /// answered with a speech probability and speech events. The built-in
    /// `silero` only; `laned serve` also answers it at `/v1/vad`.
    Vad,
}

impl Protocol {
    /// Whether it is the default, `tensor`.
    pub fn is_tensor(&self) -> bool {
        *self == Protocol::Tensor
    }
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
            protocol: Protocol::Tensor,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use laned_runner::{StatePair, StateSpec};

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
}
