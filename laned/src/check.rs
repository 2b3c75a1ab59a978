//! `laned check`: load, pulsify if asked, describe what the runner will
//! see (the batch symbol, each input and output batched or shared, the
//! pulse and delay), then build a runner of two lanes on it: the runner's
//! own checks (one batch symbol on axis 0, outputs that keep streams
//! apart, op states that take a lane reset, explicit-state pairs) either
//! pass, and a config to start from is printed, or fail with the reason
//! the runner gives, which names the input, op or shape.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use laned_runner::{LanedRunner, PortRef, RunnerConfig, StatePair, StateSpec};
use tract_core::internal::*;
use tract_onnx::prelude::InferenceModelExt;
use tract_pulse::internal::tract_nnef;
use tract_pulse::model::{PulsedModel, PulsedModelExt};

/// What `laned check` was asked.
pub struct Args {
    pub model: PathBuf,
    pub pulse: Option<usize>,
    pub symbol: String,
    /// `IN=OUT` pairs of explicit state, by index or name.
    pub states: Vec<String>,
    /// `IX=DIMS` facts of ONNX inputs (f32).
    pub inputs: Vec<String>,
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

/// What a check found.
pub struct Report {
    /// The facts, a line each.
    pub facts: Vec<String>,
    /// `Ok(config)`: it can be laned, with this config to start from;
    /// `Err(why)`: what blocks it.
    pub verdict: Result<String, String>,
}

impl Report {
    /// The report as printed.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for fact in &self.facts {
            let _ = writeln!(out, "{fact}");
        }
        match &self.verdict {
            Ok(config) => {
                let _ = writeln!(out, "\ncan be laned. A RunnerConfig to start from (TOML):\n\n{config}");
            }
            Err(why) => {
                let _ = writeln!(out, "\ncannot be laned: {why}");
            }
        }
        out
    }
}

pub fn run(args: &Args) -> ExitCode {
    match check(args) {
        Ok(report) => {
            print!("{}", report.text());
            if report.verdict.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("laned check: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Load `path` as ONNX (its inputs' facts set from `inputs`) or NNEF, typed.
fn load(path: &std::path::Path, inputs: &[(usize, Vec<String>)]) -> TractResult<TypedModel> {
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

/// The check, printed by [`run`].
pub fn check(args: &Args) -> TractResult<Report> {
    let pairs = args.states.iter().map(|s| pair(s)).collect::<TractResult<Vec<_>>>()?;
    let inputs = args
        .inputs
        .iter()
        .map(|s| input_fact(s))
        .collect::<TractResult<Vec<_>>>()?;
    let model = load(&args.model, &inputs)?.into_decluttered()?;
    let mut facts = vec![format!("model: {}", args.model.display())];
    let model = match args.pulse {
        None => model,
        Some(pulse) => {
            ensure!(pulse > 0, "--pulse: got 0, wanted a positive number of frames");
            let stream = model.symbols.sym(&args.symbol);
            let pulsed = PulsedModel::new(&model, stream, &pulse.to_dim())
                .with_context(|| format!("pulsifying on {} by {pulse} frames", args.symbol))?;
            let delay = pulsed.output_fact(0)?.stream.as_ref().map(|s| s.delay).unwrap_or(0);
            facts.push(format!(
                "pulse: {pulse} frames on {}; delay {delay} frames (the outputs lag the inputs so much)",
                args.symbol
            ));
            pulsed.into_typed()?
        }
    };
    let symbol_of = |fact: &TypedFact| match fact.shape.dims().first() {
        Some(TDim::Sym(s)) => Some(s.clone()),
        _ => None,
    };
    let batch = (0..model.inputs.len()).find_map(|ix| symbol_of(model.input_fact(ix).ok()?));
    facts.push(match &batch {
        Some(b) => format!("batch symbol: {b} (axis 0)"),
        None => "batch symbol: none on axis 0 of any input".into(),
    });
    for (what, outlets) in [("input", &model.inputs), ("output", &model.outputs)] {
        for (ix, outlet) in outlets.iter().enumerate() {
            let fact = model.outlet_fact(*outlet)?;
            let batched = batch.is_some() && symbol_of(fact) == batch;
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
    let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(model)?.into();
    // The runner's own checks decide: explicit state detected where the
    // names say so, else none; it refuses what it cannot serve, naming why.
    let attempt = |state: StateSpec| {
        let config = RunnerConfig::builder().shards(1).max_lanes(2).state(state).build();
        LanedRunner::new(plan.clone(), config.clone()).map(|runner| {
            drop(runner);
            config
        })
    };
    let verdict = if !pairs.is_empty() {
        let named = pairs.len();
        attempt(StateSpec::Pairs(pairs))
            .inspect(|_| {
                facts.push(format!(
                    "explicit state: {named} pairs as given (kept per lane by the runner)"
                ))
            })
            .map_err(|e| e.to_string())
    } else {
        match attempt(StateSpec::Detect) {
            Ok(config) => {
                facts.push("explicit state: pairs detected by name (kept per lane by the runner)".into());
                Ok(config)
            }
            Err(detected) => match attempt(StateSpec::None) {
                Ok(config) => {
                    facts.push("explicit state: none (every input and output is the caller's)".into());
                    Ok(config)
                }
                // Detection's own refusal is said only where it found pairs
                // it could not serve (finding none is what `None` tried).
                Err(plain) if detected.to_string().contains("no state pair detected") => Err(plain.to_string()),
                Err(plain) => Err(format!("{plain} (with explicit state detected by name: {detected})")),
            },
        }
    };
    let verdict = match verdict {
        Ok(mut config) => {
            config.max_lanes = 64;
            config.shards = None;
            Ok(toml::to_string(&config).map_err(|e| format_err!("writing the config: {e}"))?)
        }
        Err(why) => Err(why),
    };
    Ok(Report { facts, verdict })
}
