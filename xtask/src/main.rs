//! `cargo xtask`: the project's tasks. It only drives cargo; the heavy code it
//! runs lives elsewhere (the bench binaries in `bench`, package
//! `laned-bench`; the fuzz example with the testkit), so this crate builds
//! in seconds and has no dependency.

mod against;
#[cfg(test)]
mod codemap;
mod cpus;
mod links;
#[cfg(test)]
mod readme;
mod soak;
mod test;

use std::env;
use std::path::PathBuf;
use std::process::{exit, Command};

const TASKS: &str = "\
cargo xtask <task> [args]

tasks:
  test [--allow-skip] [--no-install]
                           the README's test command: checks (and, as root with apt-get,
                           installs) what the tests need, naming what is missing; runs
                           the whole suite and the doc tests; fails on any SKIPPED test
                           unless --allow-skip (then prints the count)
  bench [--quick] [args]   side-by-side report: ours vs tract's LanedRunnable vs the
                           ideal loop (the model as given on one plain batched tract
                           state) vs a state per stream, on the built-in models;
                           report.md, report.json and SVG plots in target/laned-bench/
                           (bench/src/bin/laned-bench/; --help for its flags)
  bench --compare A.json B.json
                           every figure two reports share, with its ratio B / A
  bench --against REV [--rounds 3] [args] [-- args ...]
                           before/after in one sitting: REV's laned-bench (built in a
                           worktree, target/against/) and the working tree's run the same
                           scenarios (args, split at --) interleaved for R rounds; after /
                           before per row with the spread of the rounds, also in
                           target/laned-bench-against.json (xtask/src/against.rs)
  bench --model silero [--cores N] [--streams 64] [--quick]
                           Silero VAD (fetched with pip): a state per stream vs the
                           ideal loop vs ours, pinned to N cores (default 1)
                           (bench/src/bin/silero-bench.rs)
  bench --model dtln|oww [--cores N] [--streams 64] [--quick]
                           DTLN noise suppression (pip) or openWakeWord (npm): a
                           pipeline of models per stream; a state per stream, the
                           ideal loop, ours (threads, tasks), tract's LanedRunnable,
                           pinned to N cores (default 1)
                           (bench/src/bin/audio-bench.rs)
  bench --scenario serve [--model silero|gru] [--server-cores N] [--quick]
        [--streams 64,256,512] [--rounds 3] [--no-search] [--no-fixed]
        [--fronts stream,mux,grpc] [--per-connection 64]
                           the vad-server binary (or, --model gru, `laned serve` on a GRU
                           the bench writes) (pinned to N cores, default 1) driven by
                           real WebSocket clients on the other cores, against the same
                           model in-process on the server's cores and the transport's
                           floor (a minimal WebSocket echo, pinned as the server is) and
                           laned serve's multiplexed and KServe v2 gRPC fronts (64 streams
                           a connection): server CPU per answer at fixed counts side by
                           side, then capacity at p99 <= 50 ms (bench/src/bin/serve-bench/)
  fuzz [--cases N] [--seed S] [--model PATH --pulse P [--symbol S]]
                           the property tests with many cases (default 2000); with
                           --model, the seating property on your NNEF model
  ci                       what CI runs, in short: fmt check, clippy, the test suite, doc
                           tests, cargo doc warning-free, the loom model checks
                           (.ci/run adds cargo deny, packaging, MSRV, downstream smoke)
  links                    every relative link and #anchor of the workspace's markdown
                           resolves (xtask/src/links.rs; CI runs it)
  soak [--minutes N | --seconds N] [--seed S] [--cluster]
                           the seeded soak (default 30 minutes, seed 69): three `laned
                           serve` replicas behind HAProxy with Redis (--cluster: a Redis
                           Cluster, masters killed), clients on every
                           front, faults drawn from the seed, every answer checked against
                           its stream alone; figures in target/laned-soak.json
                           (laned/tests/laned/soak/; the suite runs 75 s of it)
  loom                     model-check the answer slot and the inbox's sleeper rule
                           with loom (laned-runner built with --cfg loom, in
                           target/loom so the main build is left alone)
  device [--smoke]         prepare the 16-core device measurements (.device/measure.sh):
                           stripped release bench binaries and the Silero model in
                           target/device/, to carry; --smoke then runs the script here,
                           tiny, into target/device-smoke/

criterion benches of the crates (cargo bench -p CRATE):
  kernel-memo              memo: hit, miss, alternating occupancies (one-entry vs bounded)
  laned-metrics            record: the cost of one turn's recording
  laned-runner             turns: time per pulse, solo vs ideal vs tract vs ours, light TDNN
";

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let Some(task) = args.first() else {
        print!("{TASKS}");
        return;
    };
    let rest = &args[1..];
    let ok = match task.as_str() {
        "test" => test::test(rest),
        "bench" => bench(rest),
        "fuzz" => fuzz(rest),
        "ci" => ci(),
        "loom" => loom(),
        "links" => links::task(rest),
        "soak" => soak::task(rest),
        "device" => device(rest),
        "help" | "--help" | "-h" => {
            print!("{TASKS}");
            true
        }
        other => {
            eprintln!("unknown task {other:?}\n\n{TASKS}");
            false
        }
    };
    if !ok {
        exit(1);
    }
}

fn cargo() -> Command {
    Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run(mut command: Command) -> bool {
    eprintln!("$ {command:?}");
    match command.status() {
        Ok(status) => status.success(),
        Err(e) => {
            eprintln!("cannot run {command:?}: {e}");
            false
        }
    }
}

fn bench(args: &[String]) -> bool {
    if args.iter().any(|a| a == "--against") {
        return against::against(args);
    }
    if args.windows(2).any(|w| w[0] == "--scenario" && w[1] == "serve") {
        return bench_serve(args);
    }
    if let Some(w) = args.windows(2).find(|w| w[0] == "--scenario") {
        eprintln!("bench: unknown scenario {:?} (expected serve)", w[1]);
        return false;
    }
    if args.windows(2).any(|w| w[0] == "--model" && w[1] == "silero") {
        return bench_silero(args);
    }
    if args
        .windows(2)
        .any(|w| w[0] == "--model" && (w[1] == "dtln" || w[1] == "oww"))
    {
        return bench_audio(args);
    }
    let mut command = cargo();
    command.args(["run", "--release", "-p", "laned-bench", "--bin", "laned-bench", "--"]);
    command.args(args);
    run(command)
}

/// `cargo build --release -p package --bin bin`.
fn build_release(package: &str, bin: &str) -> bool {
    let mut build = cargo();
    build.args(["build", "--release", "-p", package, "--bin", bin]);
    run(build)
}

fn build_silero_bench() -> bool {
    build_release("laned-bench", "silero-bench")
}

/// Silero VAD: built in release, then run pinned
/// to `--cores N` CPUs (default 1) with `taskset`, where the machine has it.
fn bench_silero(args: &[String]) -> bool {
    build_silero_bench() && run_pinned("silero-bench", args, false)
}

/// DTLN or openWakeWord (`--model dtln|oww`, passed on): the audio bench,
/// built in release, run pinned as Silero's is.
fn bench_audio(args: &[String]) -> bool {
    build_release("laned-bench", "audio-bench") && run_pinned("audio-bench", args, true)
}

/// The serve scenario: `vad-server` and `serve-bench` built in release;
/// the server pinned to the first `--server-cores N` CPUs this process may
/// run on (default 1), the clients to the rest (all of them on a one-CPU
/// machine).
fn bench_serve(args: &[String]) -> bool {
    let mut server_cores = 1usize;
    let mut rest = vec![];
    let mut gru = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--scenario" => {
                it.next();
            }
            "--model" => match it.next().map(String::as_str) {
                Some("gru") => gru = true,
                Some("silero") => (),
                other => {
                    eprintln!("bench: --scenario serve serves --model silero (vad-server) or gru (laned serve), not {other:?}");
                    return false;
                }
            },
            "--server-cores" => match it.next().map(|n| n.parse()) {
                Some(Ok(n)) if n > 0 => server_cores = n,
                other => {
                    eprintln!("bench: --server-cores needs a positive number, got {other:?}");
                    return false;
                }
            },
            _ => rest.push(arg.clone()),
        }
    }
    let (package, server_bin) = if gru {
        ("laned", "laned")
    } else {
        ("laned-server", "vad-server")
    };
    // laned serves the multiplexed and gRPC fronts (and, for Silero, its
    // single-stream front beside vad-server's).
    if !(build_release(package, server_bin)
        && build_release("laned", "laned")
        && build_release("laned-bench", "serve-bench"))
    {
        return false;
    }
    let allowed = cpus::allowed();
    let (server, clients) = allowed.split_at(server_cores.min(allowed.len()));
    let server_cpus = cpus::to_list(server);
    let client_cpus = if clients.is_empty() {
        eprintln!("bench: no CPU left for the clients: they share the server's");
        cpus::to_list(&allowed)
    } else {
        cpus::to_list(clients)
    };
    let release = target_dir().join("release");
    let mut command = Command::new("taskset");
    command
        .args(["-c", &client_cpus])
        .arg(release.join("serve-bench"))
        .arg("--server")
        .arg(release.join(server_bin))
        .args(["--server-cpus", &server_cpus])
        .arg("--laned")
        .arg(release.join("laned"))
        .args(gru.then_some("--gru"))
        .args(rest);
    run(command)
}

/// Runs the release binary `name` with `args`, pinned to `--cores N` CPUs
/// (default 1) with `taskset` where the machine has it; `--model M` is
/// passed on when `keep_model`.
fn run_pinned(name: &str, args: &[String], keep_model: bool) -> bool {
    let mut cores = "1".to_string();
    let mut rest = vec![];
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--model" => {
                let model = it.next();
                if keep_model {
                    rest.push(arg.clone());
                    rest.extend(model.cloned());
                }
            }
            "--cores" => cores = it.next().cloned().unwrap_or(cores),
            _ => rest.push(arg.clone()),
        }
    }
    let binary = target_dir().join("release").join(name);
    let Ok(n) = cores.parse::<usize>() else {
        eprintln!("bench: --cores {cores:?} is not a number");
        return false;
    };
    let pinned = Command::new("taskset").arg("--version").output().is_ok();
    let mut command = if pinned {
        let mut c = Command::new("taskset");
        let allowed = cpus::allowed();
        let chosen = &allowed[..n.clamp(1, allowed.len())];
        if chosen.len() < n {
            eprintln!("bench: only {} CPU(s) allowed here, not {n}", chosen.len());
        }
        c.args(["-c", &cpus::to_list(chosen)]).arg(&binary);
        c
    } else {
        eprintln!("bench: taskset is missing: running on every core, not {n}");
        Command::new(&binary)
    };
    command.args(rest);
    run(command)
}

fn fuzz(args: &[String]) -> bool {
    let mut cases = "2000".to_string();
    let (mut seed, mut model, mut pulse, mut symbol) = (None, None, None, "S".to_string());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let value = it.next().cloned();
        match arg.as_str() {
            "--cases" => cases = value.unwrap_or(cases),
            "--seed" => seed = value,
            "--model" => model = value,
            "--pulse" => pulse = value,
            "--symbol" => symbol = value.unwrap_or(symbol),
            other => {
                eprintln!("fuzz: unknown argument {other:?} (expected --cases N, --seed S, --model PATH --pulse P --symbol S)");
                return false;
            }
        }
    }
    let mut command = cargo();
    match model {
        // A user's model: the seating property on it alone.
        Some(model) => {
            let Some(pulse) = pulse else {
                eprintln!("fuzz: --model needs --pulse P");
                return false;
            };
            command.args([
                "run",
                "--release",
                "-p",
                "laned-testkit",
                "--example",
                "fuzz-model",
                "--",
            ]);
            command.args([model.as_str(), "--pulse", pulse.as_str(), "--symbol", symbol.as_str()]);
        }
        // The built-in fixtures: every property test of the testkit and the runner.
        None => {
            command.args([
                "test",
                "--release",
                "-p",
                "laned-testkit",
                "-p",
                "laned-runner",
                "--",
                "--nocapture",
                "prop_",
            ]);
        }
    }
    command.env("LANED_PROPTEST_CASES", &cases);
    if let Some(seed) = seed {
        command.env("LANED_PROPTEST_SEED", seed);
    }
    run(command)
}

/// The most a device run may carry (the tool's limit is 64 MiB, the
/// working tree included).
const CARRY_LIMIT: u64 = 60 << 20;

/// Build the bench binaries in release, strip them into `target/device/`
/// with the Silero model beside them, and check they fit what a device run
/// carries. The device machine has no registry, so nothing is built there.
fn device(args: &[String]) -> bool {
    let smoke = match args {
        [] => false,
        [flag] if flag == "--smoke" => true,
        other => {
            eprintln!("device: unknown arguments {other:?} (expected nothing or --smoke)");
            return false;
        }
    };
    if !(build_release("laned-bench", "laned-bench") && build_silero_bench()) {
        return false;
    }
    let target = target_dir();
    let pack = target.join("device");
    if let Err(e) = std::fs::create_dir_all(&pack) {
        eprintln!("device: creating {}: {e}", pack.display());
        return false;
    }
    for name in ["laned-bench", "silero-bench"] {
        let built = target.join("release").join(name);
        let packed = pack.join(name);
        let _ = std::fs::remove_file(&packed);
        let mut strip = Command::new("strip");
        strip.arg("-o").arg(&packed).arg(&built);
        if !run(strip) {
            eprintln!("device: cannot strip {}; copying it whole", built.display());
            if let Err(e) = std::fs::copy(&built, &packed) {
                eprintln!("device: copying {}: {e}", built.display());
                return false;
            }
        }
    }
    // The model, fetched and checked by the bench itself (laned-models
    // knows where its cache is).
    let model = Command::new(target.join("release").join("silero-bench"))
        .arg("--model-path")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    match model {
        Some(model) => {
            if let Err(e) = std::fs::copy(&model, pack.join("silero_vad_op18_ifless.onnx")) {
                eprintln!("device: copying {}: {e}", model.display());
                return false;
            }
        }
        None => eprintln!("device: the Silero model cannot be fetched here; the Silero steps will be skipped"),
    }
    let size: u64 = std::fs::read_dir(&pack)
        .map(|dir| dir.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0);
    eprintln!("device: {} holds {} MiB", pack.display(), size >> 20);
    if size > CARRY_LIMIT {
        eprintln!("device: over the {} MiB a device run carries", CARRY_LIMIT >> 20);
        return false;
    }
    if smoke {
        let mut script = Command::new("bash");
        script
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.device/measure.sh"))
            .env("LANED_DEVICE_SMOKE", "1")
            .env("OUT", target.join("device-smoke"));
        return run(script);
    }
    eprintln!(
        "device: ready. On the device machine, once:\n  \
         run(command=\"bash .device/measure.sh\", carry=[\"target/device\"], timeout_s=330)"
    );
    true
}

fn target_dir() -> PathBuf {
    env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("target"))
}

fn ci() -> bool {
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ]);
    let mut tests = cargo();
    tests.args(["nextest", "run", "--workspace", "--all-features"]);
    let mut doc = cargo();
    doc.args(["test", "--workspace", "--doc", "--all-features"]);
    let mut rustdoc = cargo();
    rustdoc
        .args(["doc", "--workspace", "--no-deps", "--all-features"])
        .env("RUSTDOCFLAGS", "-D warnings");
    [fmt, clippy, tests, doc, rustdoc].into_iter().all(run) && loom()
}

/// The loom model checks: the runner's library built with `--cfg loom`
/// (its slot and inbox then run on loom's primitives), only the
/// `loom_tests` modules run. A target directory of its own, since the flag
/// rebuilds every crate.
fn loom() -> bool {
    let mut command = cargo();
    command
        .args(["test", "-p", "laned-runner", "--lib", "loom_tests"])
        .env("RUSTFLAGS", "--cfg loom")
        .env("CARGO_TARGET_DIR", target_dir().join("loom"))
        .env("LOOM_MAX_PREEMPTIONS", "3");
    run(command)
}
