//! `laned check`: read the model (see [`crate::model`]), list what the
//! runner will see, then ask the runner itself: a runner of two lanes is
//! built on it, and its checks (one batch symbol on axis 0, outputs that
//! keep streams apart, op states that take a lane reset, explicit-state
//! pairs) pass or fail with the reason it gives, which names the input, op
//! or shape. Where they pass, the model is run (see [`crate::probe`]) to
//! see that a stream's row stays its own beside another's, and a config to
//! start from is printed.

use std::fmt::Write;
use std::process::ExitCode;
use std::sync::Arc;

use laned_models::spec::{Fill, Spec};
use laned_runner::{LanedRunner, RunnerConfig, StateSpec};
use tract_core::internal::*;

use crate::feed::{self, Feed};
use crate::model::{self, Candidate, Source};
use crate::probe::{self, Apart};

/// What `laned check` was asked.
#[derive(Debug, Clone, clap::Args)]
#[group(skip)]
pub struct Args {
    #[command(flatten)]
    pub source: Source,
    /// A model input's value for every call, for inputs noise would not
    /// suit (Silero's sample rate: `--fill 1=16000`); repeat for several.
    #[arg(long = "fill", value_name = "IX=VALUE")]
    pub fills: Vec<String>,
}

/// How the runner will serve a model.
#[derive(Debug, Clone)]
pub struct Laned {
    /// A config that starts a runner on it (two lanes, one shard).
    pub config: RunnerConfig,
    /// The explicit state the runner keeps: model (input, output) pairs.
    pub state: Vec<(usize, usize)>,
    /// The state the model keeps inside its ops, op by op, and how the
    /// runner lanes it.
    pub implicit: Vec<laned_runner::ImplicitState>,
}

/// The lines `laned check` prints on a model's implicit state: each op
/// keeping state across calls, how it is laned, and whether a stream can
/// be handed over.
pub fn implicit_facts(implicit: &[laned_runner::ImplicitState]) -> Vec<String> {
    if implicit.is_empty() {
        return vec!["implicit state: none (no op keeps state across calls)".into()];
    }
    let mut facts: Vec<String> = implicit.iter().map(|s| format!("implicit state: {s}")).collect();
    let stays = implicit.iter().filter(|s| !s.travels()).count();
    facts.push(if stays == 0 {
        format!(
            "hand-over: every op's state travels ({} read out per stream, exported with it)",
            implicit.len()
        )
    } else {
        format!(
            "hand-over: not possible ({stays} of {} ops keep state that cannot be read out): on a restart a stream starts again at 0",
            implicit.len()
        )
    });
    facts
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
                let _ = writeln!(
                    out,
                    "\ncan be laned. A spec to start from, as `laned serve NAME=FILE` reads it (TOML):\n\n{config}"
                );
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

/// The runner's verdict on `loaded`: explicit state as given, else
/// detected by name, else none; the state found is added to `facts`.
pub fn verdict(loaded: &Candidate, plan: &Arc<dyn Runnable>, facts: &mut Vec<String>) -> Result<Laned, String> {
    let attempt = |state: StateSpec| {
        let config = RunnerConfig::builder().shards(1).max_lanes(2).state(state).build();
        LanedRunner::new(plan.clone(), config.clone()).map(|runner| Laned {
            config,
            state: runner.explicit_state(),
            implicit: runner.implicit_state().to_vec(),
        })
    };
    if !loaded.pairs.is_empty() {
        let named = loaded.pairs.len();
        return attempt(StateSpec::Pairs(loaded.pairs.clone()))
            .inspect(|_| {
                facts.push(format!(
                    "explicit state: {named} pairs as given (kept per lane by the runner)"
                ))
            })
            .map_err(|e| e.to_string());
    }
    match attempt(StateSpec::Detect) {
        Ok(laned) => {
            facts.push(format!(
                "explicit state: pairs detected by name, (input, output) {:?} (kept per lane by the runner)",
                laned.state
            ));
            Ok(laned)
        }
        Err(detected) => match attempt(StateSpec::None) {
            Ok(laned) => {
                facts.push("explicit state: none (every input and output is the caller's)".into());
                Ok(laned)
            }
            // Detection's own refusal is said only where it found pairs it
            // could not serve (finding none is what `None` tried).
            Err(plain) if detected.to_string().contains("no state pair detected") => Err(plain.to_string()),
            Err(plain) => Err(format!("{plain} (with explicit state detected by name: {detected})")),
        },
    }
}

/// The fills `--fill` gave.
pub fn fills(texts: &[String]) -> TractResult<Vec<(usize, f64)>> {
    texts.iter().map(|t| feed::fill(t)).collect()
}

/// The verdict of [`verdict`], then, where the runner takes the model,
/// the probe's (see [`crate::probe`]): what `laned check` says and what
/// `laned bench` times only where it passes. Facts found are added.
pub fn judge(
    loaded: &Candidate,
    plan: &Arc<dyn Runnable>,
    fills: &[(usize, f64)],
    facts: &mut Vec<String>,
) -> Result<Laned, String> {
    let laned = verdict(loaded, plan, facts)?;
    // The runner's checks passed: run it, one stream and then two.
    let found = Feed::of(loaded, &laned.state, fills).and_then(|feed| probe::probe(loaded, plan, &feed));
    match found {
        Ok(Apart::Exact) => {
            facts.push("rows: a stream's rows are the same beside another stream's, bit for bit".into());
            Ok(laned)
        }
        Ok(Apart::Rounding { output, diff, scale }) => {
            facts.push(format!(
                "rows: beside another stream's, a stream's row of output {output} moves by up to {diff:e} (values up to {scale:e}): float rounding of kernels chosen by batch size, so streams served together are close to, not bit for bit, what they get alone"
            ));
            Ok(laned)
        }
        Ok(Apart::Mixed { output, diff, scale }) => {
            let suspects = probe::reducers_over_the_batch(loaded);
            Err(format!(
                "output {output} mixes the streams: a stream's row of it moves by up to {diff:e} (values up to {scale:e}) when another stream's row is beside it; an op reduces or normalises across axis 0 (the batch) and broadcasts back{}",
                if suspects.is_empty() {
                    String::new()
                } else {
                    format!("; reducing over the batch: {}", suspects.join(", "))
                }
            ))
        }
        // A model never run is never said to be laneable: its rows may mix.
        Err(e) => {
            facts.push(format!("rows: not probed: {e}"));
            Err(format!(
                "not run, so not known to serve each stream its own rows: {e} (`--fill IX=VALUE` sets an input noise does not suit)"
            ))
        }
    }
}

/// The check, printed by [`run`].
pub fn check(args: &Args) -> TractResult<Report> {
    let fills = fills(&args.fills)?;
    let loaded = model::load(&args.source)?;
    let plan = loaded.plan()?;
    let mut facts = loaded.facts.clone();
    let verdict = judge(&loaded, &plan, &fills, &mut facts);
    let verdict = match verdict {
        Ok(Laned {
            mut config,
            state,
            implicit,
        }) => {
            facts.extend(implicit_facts(&implicit));
            // What a row costs by turn width, on the model's own plain state.
            let costs = Feed::of(&loaded, &state, &fills)
                .and_then(|feed| crate::widths::per_row(&plan, &feed, &crate::widths::widths(64)));
            facts.push(match costs {
                Ok(costs) => crate::widths::fact(&costs),
                Err(e) => format!("width: not timed: {e}"),
            });
            config.max_lanes = 64;
            config.shards = None;
            let mut model = loaded.spec.clone();
            // The path as typed is relative to where `laned check` ran; a
            // spec's relative path is read against the spec's own folder
            // (`laned check models/gru.onnx > models/gru.toml` would name
            // `models/models/gru.onnx`): the spec names the file absolute.
            if let Some(file) = &model.file {
                let absolute = std::fs::canonicalize(file)
                    .with_context(|| format!("{}: making the spec's path absolute", file.display()))?;
                model.file = Some(absolute);
            }
            model.fills = fills
                .iter()
                .map(|(index, value)| Fill {
                    index: *index,
                    value: *value,
                })
                .collect();
            let spec = Spec { model, runner: config };
            Ok(spec.to_toml().map_err(|e| format_err!("writing the spec: {e}"))?)
        }
        Err(why) => Err(why),
    };
    Ok(Report { facts, verdict })
}
