//! Defect 10 of issue 30: garbage in a knob's environment variable is
//! refused, naming the knob and the value, never silently replaced by the
//! next source or the default. Tests run under nextest, one process per
//! test, so setting the environment here races no other test.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use laned_runner::{LanedRunner, LanedRuntime, NewRunnerError, RunnerConfig};

use super::ops::{counter, Switch};

/// Runs `body` with the environment variable `name` set to `value`, and
/// removes it afterwards, whatever `body` did.
fn with_env<T>(name: &str, value: &[u8], body: impl FnOnce() -> T) -> T {
    struct Unset<'a>(&'a str);
    impl Drop for Unset<'_> {
        fn drop(&mut self) {
            std::env::remove_var(self.0);
        }
    }
    // One process per test (nextest): nothing else reads it meanwhile.
    std::env::set_var(name, OsStr::from_bytes(value));
    let _unset = Unset(name);
    body()
}

/// How a message names `name` set to `value`: `NAME="value"`, bytes that
/// are not UTF-8 escaped.
fn named(name: &str, value: &[u8]) -> String {
    format!("{name}={:?}", OsStr::from_bytes(value))
}

/// Garbage in `TRACT_MAX_SEATS` or `TRACT_TURN_LINGER_US` fails
/// `LanedRunner::new` with a config error naming the knob and its value.
#[test]
fn garbage_in_tract_knobs_is_refused() {
    let switch = Switch::new();
    let plan = counter(&switch, &[Some(3)]).unwrap();
    let config = || RunnerConfig::builder().max_lanes(2).build();
    let garbage: [&[u8]; 6] = [b"lots", b"soon", b"-1", b"1.5", b"\xff", b"4\xff"];
    for knob in ["TRACT_MAX_SEATS", "TRACT_TURN_LINGER_US"] {
        for value in garbage {
            let got = with_env(knob, value, || LanedRunner::new(plan.clone(), config()));
            let want = named(knob, value);
            match got {
                Err(NewRunnerError::Config(msg)) => assert!(msg.contains(&want), "{msg:?} should name {want}"),
                Err(e) => panic!("{want}: refused, but not as config: {e}"),
                Ok(r) => panic!("{want} was accepted: {} seats, {:?}", r.max_seats(), r.policy()),
            }
        }
    }
    // A value tract parses is taken, blanks around it as tract allows.
    let r = with_env("TRACT_MAX_SEATS", b" 2 ", || LanedRunner::new(plan.clone(), config())).unwrap();
    assert_eq!(r.max_seats(), 2);
    // A knob the config sets itself is not read, so not checked.
    let set = RunnerConfig::builder().max_lanes(2).max_seats(1).build();
    let r = with_env("TRACT_MAX_SEATS", b"lots", || LanedRunner::new(plan.clone(), set)).unwrap();
    assert_eq!(r.max_seats(), 1);
}

/// Garbage in any `LANED_*` knob's environment variable (or in
/// `TRACT_AUTOBATCH_LANES`, which the laned runtime reads too) fails
/// `LanedRuntime::config_from_knobs` naming the knob and its value.
#[test]
fn garbage_in_laned_knobs_is_refused() {
    let cases: [(&str, &[&[u8]]); 5] = [
        (
            "LANED_LANES",
            &[
                b"lots",
                b"-1",
                b"1.5",
                b"64k",
                b"0x40",
                b"99999999999999999999999",
                b"\xff",
            ],
        ),
        ("LANED_SHARDS", &[b"two", b"-1", b"\xff"]),
        ("LANED_LATENCY_BUDGET_US", &[b"5ms", b"1e3", b"-5", b"\xff"]),
        ("LANED_MODE", &[b"\xff", b"turbo"]),
        ("TRACT_AUTOBATCH_LANES", &[b"lots", b"\xff"]),
    ];
    for (knob, values) in cases {
        for value in values {
            let want = named(knob, value);
            match with_env(knob, value, LanedRuntime::config_from_knobs) {
                Err(e) => {
                    let msg = format!("{e:#}");
                    assert!(msg.contains(&want), "{msg:?} should name {want}");
                }
                Ok(config) => panic!("{want} was accepted: {config:?}"),
            }
        }
    }
    // Values tract parses are taken.
    let config = with_env("LANED_LANES", b" 8 ", LanedRuntime::config_from_knobs).unwrap();
    assert_eq!(config.max_lanes, 8);
    let config = with_env("LANED_SHARDS", b"3", LanedRuntime::config_from_knobs).unwrap();
    assert_eq!(config.shards, Some(3));
}
