//! `cargo xtask fuzz --model PATH --pulse P --symbol S`: the by-hand seating
//! property on a user's NNEF model, with many cases. A failure prints the
//! shrunk schedule and how to replay it.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use laned_testkit::fixtures::Fixture;
use laned_testkit::schedule::{proptest_config, schedule, ScheduleConfig};
use laned_testkit::{verify_by_hand, Sabotage, Tolerance};
use proptest::test_runner::{TestCaseError, TestRunner};

const HELP: &str = "fuzz-model PATH --pulse P [--symbol S] [--tolerance ABS]
  PATH        a streaming model in tract's NNEF format, batch symbol on axis 0
  --pulse     frames per pulse
  --symbol    the streaming symbol (default S)
  --tolerance absolute tolerance (default: exact)
cases and seed: LANED_PROPTEST_CASES, LANED_PROPTEST_SEED (cargo xtask fuzz sets them)";

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut path, mut pulse, mut symbol, mut tolerance) = (None, None, "S".to_string(), Tolerance::Exact);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pulse" => pulse = args.next().and_then(|p| p.parse::<usize>().ok()),
            "--symbol" => symbol = args.next().unwrap_or(symbol),
            "--tolerance" => {
                let abs: f32 = args.next().and_then(|t| t.parse().ok()).unwrap_or(0.0);
                tolerance = Tolerance::Close { abs, rel: 0.0 };
            }
            "--help" | "-h" => {
                println!("{HELP}");
                return;
            }
            other => path = Some(PathBuf::from(other)),
        }
    }
    let (Some(path), Some(pulse)) = (path, pulse) else {
        eprintln!("{HELP}");
        std::process::exit(2);
    };
    let fixture = match Fixture::from_file(&path, &symbol, pulse) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot use {}: {e:#}", path.display());
            std::process::exit(2);
        }
    };
    let mut config = proptest_config(500);
    config.failure_persistence = None;
    // Always a known seed, so that any failure can be replayed.
    let seed = std::env::var("LANED_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    config.rng_seed = proptest::test_runner::RngSeed::Fixed(seed);
    eprintln!("seed {seed}");
    let cases = config.cases;
    let done = AtomicU64::new(0);
    let mut runner = TestRunner::new(config);
    let result = runner.run(&schedule(ScheduleConfig::default()), |s| {
        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
        eprint!("\r{} cases run (of {cases}, plus shrinking)", n);
        let _ = std::io::stderr().flush();
        verify_by_hand(&fixture, &s, Sabotage::None, tolerance).map_err(|e| TestCaseError::fail(format!("{e:#}")))
    });
    eprintln!();
    match result {
        Ok(()) => println!(
            "{}: every stream matched its solo run over {cases} schedules",
            fixture.name
        ),
        Err(e) => {
            println!("{}: FAILED\n{e}", fixture.name);
            println!(
                "replay: cargo xtask fuzz --model {} --pulse {pulse} --symbol {symbol} --cases {cases} --seed {seed}",
                path.display()
            );
            std::process::exit(1);
        }
    }
}
