//! Streams as tasks churning: thousands of tasks spawning and calling,
//! their futures dropped at random poll points, a drain racing them; and
//! the same under the testkit's strict executor, which fails on a lost
//! wake-up.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use fastrand::Rng;
use laned_runner::{LanedStateHandle, Settled};
use laned_testkit::exec::Strict;
use laned_testkit::fixtures::{self, Fixture};

use super::*;

/// `inner`, dropped where it stands after `polls` polls that left it
/// pending (`None` then).
struct DropAfter<F> {
    inner: Option<Pin<Box<F>>>,
    polls: usize,
}

impl<F: Future> Future for DropAfter<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(out) = inner.as_mut().poll(cx) {
            self.inner = None;
            return Poll::Ready(Some(out));
        }
        if self.polls == 0 {
            self.inner = None;
            return Poll::Ready(None);
        }
        self.polls -= 1;
        Poll::Pending
    }
}

fn drop_after<F: Future>(inner: F, polls: usize) -> DropAfter<F> {
    DropAfter {
        inner: Some(Box::pin(inner)),
        polls,
    }
}

/// A runner of `f` with about `lanes` lanes over `shards` shards.
fn churn_runner(f: &Fixture, mode: Mode, shards: usize, lanes: usize, max_waiting: usize) -> LanedRunner {
    let config = RunnerConfig::builder()
        .mode(mode)
        .shards(shards)
        .max_lanes(lanes / shards + 1)
        .max_waiting(max_waiting);
    crate::common::runner_with(f, config)
}

/// A stream's reference: the fixture run alone, fed exactly the calls of
/// the stream that ran.
struct Solo {
    state: Box<dyn State>,
}

impl Solo {
    fn new(f: &Fixture) -> Solo {
        Solo {
            state: f.runnable().unwrap().spawn().unwrap(),
        }
    }

    /// The call ran and answered `got`: it must be the solo run's answer.
    fn ran(&mut self, inputs: &TVec<TValue>, got: &TVec<TValue>, what: &str) {
        let want = self.state.run(inputs.clone()).unwrap();
        assert_eq!(&want, got, "{what}: an answer differs from the solo run's");
    }
}

/// Whether an error ends the churn for this stream (the runner going away,
/// a stream evicted) rather than being a defect.
fn ends_stream(e: &laned_runner::RunError) -> bool {
    e.stream_is_gone()
}

/// One stream of the churn: calls with futures dropped at random poll
/// points, each dropped call settled, every answer checked against `solo`.
async fn churn_stream(mut h: LanedStateHandle, f: &Fixture, rng: &mut Rng, what: &str) -> usize {
    let mut solo = Solo::new(f);
    let mut ran = 0;
    for c in 0..1 + rng.u64(..6) {
        let inputs = f.inputs(1, rng.u64(..) ^ c);
        let polls = rng.usize(..4);
        let drop_it = rng.u64(..3) == 0;
        let out = if drop_it {
            drop_after(h.call_async(inputs.clone()), polls).await
        } else {
            Some(h.call_async(inputs.clone()).await)
        };
        match out {
            Some(Ok(out)) => {
                solo.ran(&inputs, &out, what);
                ran += 1;
            }
            Some(Err(e)) if ends_stream(&e) => return ran,
            Some(Err(e)) => panic!("{what}: {e}"),
            // Dropped: settled, so whether it ran is known exactly.
            None => match h.settle_async().await {
                Some(Settled::Ran(out)) => {
                    solo.ran(&inputs, &out, what);
                    ran += 1;
                }
                Some(Settled::NotRun) | None => (),
                Some(Settled::Failed(e)) if ends_stream(&e) => return ran,
                Some(other) => panic!("{what}: {other:?}"),
            },
        }
    }
    ran
}

/// 3,000 tasks on 8 lanes, on a 2-worker runtime: spawns dropped while
/// waiting, calls dropped at random poll points and settled, a drain racing
/// the last of them. Every answer (a settled one included) is the solo
/// run's of exactly the calls that ran, no lane leaks past the close, and
/// the runtime's 1 ms timer keeps firing.
#[test]
fn thousands_of_tasks_churn_exactly() {
    for (mode, shards) in SETUPS {
        bounded("task churn", move || {
            let f = fixtures::small_tdnn();
            let r = churn_runner(&f, mode, shards, 8, 4096);
            let watch = r.detached();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_time()
                .build()
                .unwrap();
            let what = format!("{mode:?}, {shards} shards");
            let calls_ran = Arc::new(AtomicUsize::new(0));
            let worst_timer = rt.block_on(async {
                let started = Instant::now();
                let timer = tokio::spawn(async move {
                    let mut worst = Duration::ZERO;
                    while started.elapsed() < Duration::from_millis(1500) {
                        let asked = Instant::now();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        worst = worst.max(asked.elapsed());
                    }
                    worst
                });
                let tasks: Vec<_> = (0..3000u64)
                    .map(|t| {
                        let (r, f, what, ran) = (r.clone(), f.clone(), what.clone(), calls_ran.clone());
                        tokio::spawn(async move {
                            let mut rng = Rng::with_seed(t + 1);
                            // A spawn given up on at a random poll point.
                            let polls = rng.usize(..8);
                            let spawned = if rng.u64(..4) == 0 {
                                drop_after(r.spawn_async(), polls).await
                            } else {
                                Some(r.spawn_async().await)
                            };
                            match spawned {
                                Some(Ok(h)) => {
                                    let n = churn_stream(h, &f, &mut rng, &what).await;
                                    ran.fetch_add(n, Ordering::Relaxed);
                                }
                                Some(Err(SpawnError::Draining | SpawnError::Closed)) | None => (),
                                Some(Err(e)) => panic!("{what}: spawn refused: {e}"),
                            }
                        })
                    })
                    .collect();
                // The drain races the last tasks.
                tokio::time::sleep(Duration::from_millis(600)).await;
                let drained = r.drain_async(Instant::now() + Duration::from_millis(100)).await;
                for t in tasks {
                    t.await.unwrap();
                }
                drop(drained);
                timer.await.unwrap()
            });
            drop(r);
            eprintln!(
                "{what}: {} calls ran; the 1 ms timer's worst wait {worst_timer:?}",
                calls_ran.load(Ordering::Relaxed)
            );
            assert!(calls_ran.load(Ordering::Relaxed) > 0, "{what}: nothing ran");
            assert_eq!(
                watch.capacity().lanes_free,
                watch.total_lanes(),
                "{what}: a lane leaked"
            );
            // A bound against starvation (seconds when a task holds its
            // thread), not a latency claim: the figure is in the bench
            // records.
            assert!(
                worst_timer < Duration::from_millis(250),
                "{what}: the timer waited {worst_timer:?}"
            );
        });
    }
}

/// Under the strict executor (one thread, every wake-up accounted for):
/// 200 tasks spawning, calling and dropping their futures at every poll
/// point from 0 to 3 on 4 lanes all finish; a lost wake-up would leave one
/// pending and fail the run.
#[test]
fn no_wake_up_is_lost_under_the_strict_executor() {
    for (mode, shards) in SETUPS {
        let f = fixtures::small_tdnn();
        let r = churn_runner(&f, mode, shards, 4, 1024);
        let mut exec = Strict::new();
        let what = format!("{mode:?}, {shards} shards");
        let joins: Vec<_> = (0..200u64)
            .map(|t| {
                let (r, f, what) = (r.clone(), f.clone(), what.clone());
                exec.spawn(async move {
                    let mut rng = Rng::with_seed(t + 7);
                    let polls = (t % 4) as usize;
                    let Some(spawned) = drop_after(r.spawn_async(), polls + 2).await else {
                        return 0;
                    };
                    churn_stream(spawned.unwrap(), &f, &mut rng, &what).await
                })
            })
            .collect();
        exec.run(Duration::from_secs(30))
            .unwrap_or_else(|stall| panic!("{what}: {stall}"));
        let ran: usize = joins.iter().map(|j| j.take().expect("finished")).sum();
        assert!(ran > 0, "{what}: nothing ran");
        let start = Instant::now();
        while r.capacity().lanes_free != r.total_lanes() {
            assert!(start.elapsed() < Duration::from_secs(20), "{what}: a lane leaked");
            thread::sleep(Duration::from_millis(1));
        }
    }
}
