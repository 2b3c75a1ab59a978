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
//! Three files, a job each: `format.rs` the TOML and its types, `load.rs`
//! the loader and [`Loaded`], `interface.rs` the [`Interface`] and the
//! codecs of its bytes.
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

mod format;
mod interface;
mod load;

pub use format::{AudioFraming, Builtin, Fill, InputFact, ModelSpec, Protocol, Spec, SpecError};
pub use interface::{dtype_name, one_stream_shape, Interface, Port};
pub use load::{symbol_on_axis_0, LoadError, Loaded};
