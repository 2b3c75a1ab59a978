//! Several laned states behind one runner: placement, admission across
//! shards, per-shard metrics, shutdown of every shard.

use std::thread;
use std::time::{Duration, Instant};

use crate::common;

use common::{runner, MODES};
use laned_runner::{LanedRunner, RunErrorKind, RunnerConfig, SpawnError};
use laned_testkit::fixtures;

/// A stream goes to the shard with the most free lanes, the lowest index on
/// ties, so spawns spread evenly.
#[test]
fn placement_balances_the_shards() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner(&f, mode, 3, 2);
        assert_eq!(r.shards(), 3);
        let handles: Vec<_> = (0..6).map(|_| r.try_spawn().unwrap()).collect();
        let placed: Vec<usize> = handles.iter().map(|h| h.shard()).collect();
        assert_eq!(placed, vec![0, 1, 2, 0, 1, 2], "{mode:?}");
        let taken: Vec<u64> = r.shard_metrics().iter().map(|m| m.lanes_taken).collect();
        assert_eq!(taken, vec![2, 2, 2]);
        // A freed lane on shard 1 is where the next stream goes.
        let mut handles = handles;
        drop(handles.remove(4));
        assert_eq!(r.try_spawn().unwrap().shard(), 1);
    }
}

/// A full shard does not refuse a stream another shard can take; only all
/// shards full does, counting every shard's lanes.
#[test]
fn a_full_shard_does_not_block_a_spawn_that_fits_another() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner(&f, mode, 2, 1);
        let a = r.try_spawn().unwrap();
        let b = r.try_spawn().unwrap();
        assert_ne!(a.shard(), b.shard());
        let err = r.try_spawn().unwrap_err();
        assert_eq!(
            err,
            SpawnError::Full {
                total_lanes: 2,
                waiting: 0
            },
            "{mode:?}"
        );
    }
}

/// A waiting stream gets a lane freed on any shard.
#[test]
fn admission_waits_for_a_lane_on_any_shard() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner(&f, mode, 2, 1);
        let a = r.try_spawn().unwrap();
        let b = r.try_spawn().unwrap();
        let r2 = r.clone();
        let waiter = thread::spawn(move || r2.spawn_timeout(Duration::from_secs(20)).map(|h| h.shard()));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(r.try_spawn(), Err(SpawnError::Full { waiting: 1, .. })) {
            assert!(Instant::now() < deadline, "the waiter never queued");
            thread::sleep(Duration::from_millis(1));
        }
        let freed = b.shard();
        drop(b);
        assert_eq!(waiter.join().unwrap().unwrap(), freed, "{mode:?}");
        drop(a);
    }
}

/// Each shard runs its own turns; the total is the sum of the shards'.
#[test]
fn metrics_per_shard_sum_to_the_total() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let r = runner(&f, mode, 3, 2);
        let mut handles: Vec<_> = (0..6).map(|_| r.try_spawn().unwrap()).collect();
        for (s, h) in handles.iter_mut().enumerate() {
            for c in 0..3 {
                h.call(f.inputs(1, (s * 10 + c) as u64)).unwrap();
            }
        }
        let shards = r.shard_metrics();
        let total = r.metrics();
        assert_eq!(shards.iter().map(|m| m.seats).sum::<u64>(), 18);
        assert_eq!(total.seats, 18);
        assert_eq!(total.turns, shards.iter().map(|m| m.turns).sum::<u64>());
        assert!(
            shards.iter().all(|m| m.seats == 6),
            "{mode:?}: {:?}",
            shards.iter().map(|m| m.seats).collect::<Vec<_>>()
        );
    }
}

/// Dropping the runner closes every shard: a call queued on any of them is
/// answered, later calls fail at once.
#[test]
fn dropping_the_runner_closes_every_shard() {
    let f = fixtures::small_tdnn();
    for mode in MODES {
        let config = RunnerConfig::builder()
            .shards(3)
            .max_lanes(2)
            .mode(mode)
            .linger(Duration::from_secs(3600))
            .build();
        let r = LanedRunner::new(f.runnable().unwrap(), config).unwrap();
        let mut handles: Vec<_> = (0..6).map(|_| r.try_spawn().unwrap()).collect();
        let mut queued = handles.pop().unwrap();
        let inputs = f.inputs(1, 1);
        let t = thread::spawn(move || queued.call(inputs));
        thread::sleep(Duration::from_millis(50));
        drop(r);
        assert!(
            matches!(t.join().unwrap().unwrap_err().kind(), RunErrorKind::Closed),
            "{mode:?}"
        );
        for h in &mut handles {
            assert!(matches!(
                h.call(f.inputs(1, 2)).unwrap_err().kind(),
                RunErrorKind::Closed
            ));
        }
    }
}
