//! A refused spawn says the runner's end the same way on every path
//! (`try_spawn`, `spawn_timeout`, `spawn_async`), and the streams of the
//! runner are told that same end.

use laned_runner::{EndReason, LanedStateHandle, RunError};

use super::*;

/// The three ways to spawn, each as its caller sees it.
fn spawns(r: &LanedRunner) -> [(&'static str, Result<LanedStateHandle, SpawnError>); 3] {
    [
        ("try_spawn", r.try_spawn()),
        ("spawn_timeout", r.spawn_timeout(Duration::from_millis(20))),
        ("spawn_async", current_thread().block_on(r.spawn_async())),
    ]
}

/// Every spawn path refused with `want`, converting into `reason`: the end
/// `live`, a stream of the runner, is told.
fn refused_alike(
    r: &LanedRunner,
    want: fn(&SpawnError) -> bool,
    reason: EndReason,
    live: &LanedStateHandle,
    when: &str,
) {
    for (path, got) in spawns(r) {
        let e = got.err().unwrap_or_else(|| panic!("{when}: {path} was admitted"));
        assert!(want(&e), "{when}: {path} refused {e:?}");
        assert_eq!(RunError::from(e).end_reason(), Some(reason), "{when}: {path}");
    }
    assert_eq!(live.end_reason(), Some(reason), "{when}: the stream's end");
}

/// Defect 2 (issue 47): one answer per runner state for every spawn path, the end
/// its streams are told: `Draining` while admission stops and after a drain
/// (streams `Drained`), `Closed` after a close (streams `Closed`). On main
/// `try_spawn` was refused `Closed` after a drain, and `spawn_timeout` and
/// `spawn_async` `Draining` after a close.
#[test]
fn a_refused_spawn_names_the_runners_end_on_every_path() {
    let switch = Switch::new();
    let plan = counter(&switch, &[Some(3)]).unwrap();
    for (mode, shards) in SETUPS {
        let config = || RunnerConfig::builder().mode(mode).shards(shards).max_lanes(2);
        let when = format!("{mode:?}/{shards}");
        // Stopped admitting: no end marked yet, every path `Draining`.
        let r = runner_on(plan.clone(), config());
        let live = r.try_spawn().unwrap();
        r.stop_admitting();
        for (path, got) in spawns(&r) {
            assert!(
                matches!(got, Err(SpawnError::Draining)),
                "{when}, stopped: {path}: {got:?}"
            );
        }
        assert_eq!(live.end_reason(), None, "{when}: a live stream serves on");
        // Drained, a straggler left: `Draining` / `Drained` everywhere.
        let drained = r.drain(Instant::now() + Duration::from_millis(10));
        assert_eq!(drained.stragglers, 1);
        refused_alike(
            &r,
            |e| matches!(e, SpawnError::Draining),
            EndReason::Drained,
            &live,
            &format!("{when}, drained"),
        );
        // Closed: `Closed` everywhere.
        let r = runner_on(plan.clone(), config());
        let live = r.try_spawn().unwrap();
        r.close();
        refused_alike(
            &r,
            |e| matches!(e, SpawnError::Closed),
            EndReason::Closed,
            &live,
            &format!("{when}, closed"),
        );
        assert!(
            !SpawnError::Closed.to_string().contains("dropped"),
            "the runner was closed, not dropped"
        );
        // Dropped (its last owning clone): `Closed` through a detached clone.
        let r = runner_on(plan.clone(), config());
        let detached = r.detached();
        let live = r.try_spawn().unwrap();
        drop(r);
        refused_alike(
            &detached,
            |e| matches!(e, SpawnError::Closed),
            EndReason::Closed,
            &live,
            &format!("{when}, dropped"),
        );
    }
}
