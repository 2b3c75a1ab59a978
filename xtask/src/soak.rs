//! `cargo xtask soak --minutes N --seed S [--cluster]`: the seeded soak of
//! `laned/tests/laned/soak/` run long. The suite runs 75 s of it with seed
//! 69; this runs the same test with the length and seed given (through
//! `LANED_SOAK_SECONDS` and `LANED_SOAK_SEED`; `--cluster`: the store on
//! a Redis Cluster, `LANED_SOAK_STORE=cluster`), its output shown, its
//! figures written to `target/laned-soak.json`. A red run names the seed
//! to replay.

use std::path::Path;

/// The task; false on bad flags or a red soak.
pub fn task(args: &[String]) -> bool {
    let (mut seconds, mut seed, mut cluster) = (None::<u64>, 69u64, false);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--cluster" {
            cluster = true;
            continue;
        }
        let value = it.next().map(|v| v.parse::<u64>());
        match (arg.as_str(), value) {
            ("--minutes", Some(Ok(m))) if m > 0 => seconds = Some(m * 60),
            ("--seconds", Some(Ok(s))) if s > 0 => seconds = Some(s),
            ("--seed", Some(Ok(s))) => seed = s,
            (other, _) => {
                eprintln!(
                    "cargo xtask soak: {other:?} wants a whole number (usage: cargo xtask soak \
                     [--minutes N | --seconds N] [--seed S] [--cluster])"
                );
                return false;
            }
        }
    }
    let seconds = seconds.unwrap_or(30 * 60);
    let json = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/laned-soak.json");
    let mut command = super::cargo();
    command
        .args(["test", "-p", "laned", "--all-features", "--test", "laned", "--"])
        .args([
            "--exact",
            "soak::a_seeded_soak_under_faults_answers_every_stream_exactly_and_loses_none_silently",
        ])
        .arg("--nocapture")
        .env("LANED_SOAK_SECONDS", seconds.to_string())
        .env("LANED_SOAK_SEED", seed.to_string())
        .env("LANED_SOAK_JSON", &json)
        .env("LANED_SOAK_STORE", if cluster { "cluster" } else { "redis" });
    let ok = super::run(command);
    eprintln!(
        "soak of {seconds} s, seed {seed}: {}; the figures in {}",
        if ok { "green" } else { "RED" },
        json.display()
    );
    ok
}
