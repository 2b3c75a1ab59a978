//! `laned`, the command line: `laned check MODEL` says whether a tract
//! model (ONNX or NNEF, streaming, optionally pulsified here) can be served
//! through lanes, what the runner sees in it, and a `RunnerConfig` to start
//! from; or exactly what blocks it. Exit status: 0 it can, 1 it cannot, 2
//! the model could not be read or the arguments are wrong.

mod check;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "laned",
    version,
    about = "Serve many streams through one batched tract state"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Can MODEL be served through lanes, and how.
    Check {
        /// The model: an `.onnx` file, or tract's NNEF (`.nnef.tgz`,
        /// `.nnef.tar`, or a directory).
        model: PathBuf,
        /// Pulsify the model by this many frames first (a streaming model
        /// on --symbol); without it, the model is taken as it is.
        #[arg(long)]
        pulse: Option<usize>,
        /// The streaming symbol the pulse applies to.
        #[arg(long, default_value = "S")]
        symbol: String,
        /// An explicit state: the input it is fed through and the output
        /// its next value comes out of, by index or name (`2=1`,
        /// `state=stateN`); repeat for several. Without it, pairs are
        /// detected by name where they can be.
        #[arg(long = "state", value_name = "IN=OUT")]
        states: Vec<String>,
        /// An ONNX input's fact, f32: `0=batch,1,257` (each dim a number or
        /// a symbol); repeat for several. For files whose inputs say a
        /// fixed batch of 1, or nothing; their output shapes are then
        /// ignored and inferred.
        #[arg(long = "input", value_name = "IX=DIMS")]
        inputs: Vec<String>,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Check {
            model,
            pulse,
            symbol,
            states,
            inputs,
        } => check::run(&check::Args {
            model,
            pulse,
            symbol,
            states,
            inputs,
        }),
    }
}
