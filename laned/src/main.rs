//! `laned`, the command line.
//!
//! - `laned check MODEL` says whether a tract model (ONNX or NNEF,
//!   streaming, optionally pulsified here) can be served through lanes,
//!   what the runner sees in it, and a `RunnerConfig` to start from; or
//!   exactly what blocks it. Exit status: 0 it can, 1 it cannot, 2 the
//!   model could not be read or the arguments are wrong.
//! - `laned bench MODEL` checks it the same way, then measures a state per
//!   stream, the ideal loop and ours side by side on it and says from how
//!   many streams laning pays. Exit status: 0 measured, 1 it cannot be
//!   laned or ours was not exact, 2 as for check.
//! - `laned serve NAME=SPEC...` serves the models over WebSocket until
//!   SIGTERM, then drains (handing streams over where a store is set).
//!   Exit status: 0 drained, 1 a model could not be served (named), 2 the
//!   arguments or config are wrong.
//! - `laned client URL IN OUT` sends one stream's pulses (a raw file or a
//!   WAV) and writes every answer; exit status as `vad-client`'s.
//! - `laned fetch NAME...` puts built-in models in the cache ahead of time,
//!   checked: 0 fetched, 1 not, 2 no such built-in.

mod bench;
mod check;
mod client;
mod compare;
mod feed;
mod fetch;
mod model;
mod probe;
mod serve;
mod widths;

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
    Check(check::Args),
    /// Does laning pay on MODEL, and from how many streams: a state per
    /// stream, the ideal loop and ours side by side.
    Bench(bench::Args),
    /// Serve models over WebSocket: `NAME=SPEC.toml` each (the spec as
    /// `laned check` prints it), every limit and the hand-over of
    /// vad-server.
    Serve(serve::Args),
    /// One stream of a model `laned serve` serves: a raw file of pulses
    /// or a WAV in, every answer's bytes out, resumed across restarts.
    Client(client::Args),
    /// Put built-in models in the cache ahead of time (for an image, or a
    /// host without python3 and pip): `silero`, `dtln-chain`,
    /// `deepfilternet3`, `all`.
    Fetch(fetch::Args),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Check(args) => check::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Client(args) => client::run(&args),
        Command::Fetch(args) => fetch::run(&args),
    }
}
