//! Streams churning (spawning, calling, ending, being evicted) while
//! cancels fire at random moments, racing queueing, seating and answering.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fastrand::Rng;
use laned_runner::{CancelToken, RunErrorKind, RunnerConfig};
use laned_testkit::fixtures;

use crate::common::{bounded, runner_with, SETUPS};

/// Every call ends answered or `Cancelled`, and a cancelled call never ran:
/// each stream's answers equal its solo run fed exactly the calls that were
/// answered (the one history its outcomes allow), and no lane leaks.
#[test]
fn churn_with_cancels_at_random_moments() {
    for (mode, shards) in SETUPS {
        bounded("churn with cancels", move || {
            let f = fixtures::small_tdnn();
            let r = runner_with(
                &f,
                RunnerConfig::builder()
                    .shards(shards)
                    .max_lanes(3)
                    .mode(mode)
                    .idle_timeout(Duration::from_millis(20)),
            );
            let deadline = Instant::now() + Duration::from_millis(1200);
            let workers: Vec<_> = (0..4u64)
                .map(|w| {
                    let (r, f) = (r.clone(), f.clone());
                    thread::spawn(move || {
                        let plan = f.runnable().unwrap();
                        let mut rng = Rng::with_seed(w + 17);
                        // The token of the call in flight, for the canceller.
                        let current: Arc<Mutex<Option<CancelToken>>> = Arc::default();
                        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
                        let canceller = {
                            let (current, done) = (current.clone(), done.clone());
                            thread::spawn(move || {
                                let mut rng = Rng::with_seed(w + 99);
                                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                                    thread::sleep(Duration::from_micros(rng.u64(..400)));
                                    if let Some(token) = current.lock().unwrap().take() {
                                        token.cancel();
                                    }
                                }
                            })
                        };
                        let (mut answered, mut cancelled) = (0usize, 0usize);
                        while Instant::now() < deadline {
                            let Ok(mut h) = r.spawn_timeout(Duration::from_secs(10)) else {
                                continue;
                            };
                            let mut solo = plan.spawn().unwrap();
                            let seed = rng.u64(..);
                            for c in 0..1 + rng.u64(..6) {
                                let inputs = f.inputs(1, seed + c);
                                let token = CancelToken::new();
                                *current.lock().unwrap() = Some(token.clone());
                                let out = h.call_with(inputs.clone(), &token);
                                current.lock().unwrap().take();
                                match out {
                                    Ok(out) => {
                                        let want = solo.run(inputs).unwrap();
                                        assert_eq!(out, want, "{mode:?}, {shards} shards: an answered call");
                                        answered += 1;
                                    }
                                    Err(e) if matches!(e.kind(), RunErrorKind::Cancelled) => cancelled += 1,
                                    Err(e) => {
                                        assert!(matches!(e.kind(), RunErrorKind::Evicted(_)), "{e}");
                                        break;
                                    }
                                }
                            }
                        }
                        done.store(true, std::sync::atomic::Ordering::Relaxed);
                        canceller.join().unwrap();
                        (answered, cancelled)
                    })
                })
                .collect();
            let (mut answered, mut cancelled) = (0, 0);
            for t in workers {
                let (a, c) = t.join().unwrap();
                answered += a;
                cancelled += c;
            }
            assert!(answered > 20, "{mode:?}, {shards} shards: only {answered} answered");
            assert!(cancelled > 0, "{mode:?}, {shards} shards: no cancel landed in time");
            let start = Instant::now();
            while r.metrics().lanes_taken != 0 {
                assert!(start.elapsed() < Duration::from_secs(20), "a lane leaked");
                thread::sleep(Duration::from_millis(1));
            }
        });
    }
}
