//! Load as tasks: streams on a tokio multi-thread runtime, the way a server
//! holds them. Ours through `spawn_async` and `call_async`; tract's runner
//! the only way a tokio user can drive it, a `spawn_blocking` per call.
//! Closed loop and real time, measured as the thread-per-stream generators
//! of [`crate::threads`] measure (warm-up call excluded; CPU over the timed
//! part), but for real-time latency, counted from the send. Stream `s`
//! sends `inputs(s)` every time, so one driver serves every model.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use laned_runner::LanedRunner;
use tract_core::internal::*;

use crate::{process_cpu_time, Latencies, Throughput};

/// A stream driven as a task: ours natively, tract's behind spawn_blocking.
#[derive(Clone)]
pub enum TaskSystem {
    /// Ours: `spawn_async`, `call_async`.
    Ours(LanedRunner),
    /// Any runnable (tract's runner): a `spawn_blocking` per call.
    TractBlocking(Arc<dyn Runnable>),
    /// Streams with their own async call: a pipeline of several runners.
    Streams(Arc<dyn AsyncStreams>),
}

/// A boxed future, as [`AsyncStreams`] and [`AsyncStream`] give them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where [`TaskSystem::Streams`] gets its streams.
pub trait AsyncStreams: Send + Sync {
    /// A new stream.
    fn spawn(&self) -> BoxFuture<'_, TractResult<Box<dyn AsyncStream>>>;
}

/// One stream of [`TaskSystem::Streams`].
pub trait AsyncStream: Send {
    /// One call with the stream's inputs, answered.
    fn call(&mut self, inputs: TVec<TValue>) -> BoxFuture<'_, TractResult<()>>;
}

enum Stream {
    Ours(laned_runner::LanedStateHandle),
    /// `None` only while a call holds it on a blocking thread.
    Tract(Option<Box<dyn State>>),
    Custom(Box<dyn AsyncStream>),
}

impl TaskSystem {
    async fn spawn(&self) -> TractResult<Stream> {
        Ok(match self {
            TaskSystem::Ours(runner) => Stream::Ours(runner.spawn_async().await?),
            TaskSystem::TractBlocking(runnable) => {
                let runnable = runnable.clone();
                let state = tokio::task::spawn_blocking(move || runnable.spawn()).await??;
                Stream::Tract(Some(state))
            }
            TaskSystem::Streams(streams) => Stream::Custom(streams.spawn().await?),
        })
    }
}

impl Stream {
    async fn call(&mut self, inputs: TVec<TValue>) -> TractResult<()> {
        match self {
            Stream::Ours(h) => {
                h.call_async(inputs).await?;
            }
            Stream::Tract(slot) => {
                let mut state = slot.take().expect("one call at a time");
                let (state, out) = tokio::task::spawn_blocking(move || {
                    let out = state.run(inputs);
                    (state, out)
                })
                .await?;
                *slot = Some(state);
                out?;
            }
            Stream::Custom(stream) => stream.call(inputs).await?,
        }
        Ok(())
    }
}

/// Closed loop: `n` tasks, each calling with `inputs(s)` as soon as
/// answered, for `duration`; pulses per second and the process's CPU per
/// pulse.
pub fn closed_loop(
    rt: &tokio::runtime::Runtime,
    system: &TaskSystem,
    n: usize,
    duration: Duration,
    inputs: impl Fn(usize) -> TVec<TValue>,
) -> TractResult<Throughput> {
    rt.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let total = Arc::new(AtomicU64::new(0));
        let ready = Arc::new(tokio::sync::Barrier::new(n + 1));
        let tasks: Vec<_> = (0..n)
            .map(|s| {
                let (system, stop, total, ready) = (system.clone(), stop.clone(), total.clone(), ready.clone());
                let inputs = inputs(s);
                tokio::spawn(async move {
                    let stream = system.spawn().await;
                    ready.wait().await;
                    // One untimed call to warm caches and buffers. A stream
                    // that failed still reaches the second barrier, or the
                    // others and the timer would wait for it forever.
                    let warm = match stream {
                        Ok(mut stream) => stream.call(inputs.clone()).await.map(|_| stream),
                        Err(e) => Err(e),
                    };
                    ready.wait().await;
                    let mut stream = warm?;
                    let mut served = 0;
                    while !stop.load(Ordering::Relaxed) {
                        stream.call(inputs.clone()).await?;
                        served += 1;
                    }
                    total.fetch_add(served, Ordering::Relaxed);
                    TractResult::Ok(())
                })
            })
            .collect();
        ready.wait().await;
        ready.wait().await;
        let (started, cpu_before) = (Instant::now(), process_cpu_time());
        tokio::time::sleep(duration).await;
        let cpu = cpu_before.zip(process_cpu_time()).map(|(a, b)| b.saturating_sub(a));
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await??;
        }
        // After the last call in flight at the stop has landed, since those
        // count: as the threads' closed loop counts.
        let elapsed = started.elapsed();
        let pulses = total.load(Ordering::Relaxed);
        Ok(Throughput {
            per_sec: pulses as f64 / elapsed.as_secs_f64(),
            cpu_per_pulse: cpu.map(|c| c / pulses.max(1) as u32),
        })
    })
}

/// Real time: `n` tasks, each due to send a pulse every `period` from its
/// [`phase`](crate::phase) within the first (seeded `seed`), for
/// `duration`; a late answer delays the stream's next pulse. Latency counts from when the task sent the pulse (not from when
/// it was due, as the thread generator counts: tokio's timer has a
/// millisecond's grain, which says nothing of the runner).
pub fn real_time(
    rt: &tokio::runtime::Runtime,
    system: &TaskSystem,
    n: usize,
    period: Duration,
    duration: Duration,
    seed: u64,
    inputs: impl Fn(usize) -> TVec<TValue>,
) -> TractResult<Latencies> {
    real_time_phased(
        rt,
        system,
        (n, period, duration),
        |s| crate::phase(seed, s, period),
        inputs,
    )
}

/// [`real_time`] with stream `s` first due `phase(s)` after the start
/// (within the period): streams given one phase arrive together, as the
/// calls a gateway carries on one connection and one clock do.
pub fn real_time_phased(
    rt: &tokio::runtime::Runtime,
    system: &TaskSystem,
    (n, period, duration): (usize, Duration, Duration),
    phase: impl Fn(usize) -> Duration,
    inputs: impl Fn(usize) -> TVec<TValue>,
) -> TractResult<Latencies> {
    rt.block_on(async {
        let ready = Arc::new(tokio::sync::Barrier::new(n + 1));
        let start_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
        let tasks: Vec<_> = (0..n)
            .map(|s| {
                let (system, ready, start_at) = (system.clone(), ready.clone(), start_at.clone());
                let inputs = inputs(s);
                let offset = phase(s);
                tokio::spawn(async move {
                    let stream = system.spawn().await;
                    ready.wait().await;
                    let mut stream = stream?;
                    let t0 = start_at.lock().unwrap().expect("set before the barrier");
                    let (mut due, end) = (t0 + offset, t0 + duration);
                    let mut latencies = vec![];
                    while due < end {
                        tokio::time::sleep_until(due.into()).await;
                        // From the send: tokio's timer wakes a task up to a
                        // millisecond late, which a server (its pulses
                        // arrive by IO, not by timer) never pays; a pulse
                        // answered late still delays the next one.
                        let sent = Instant::now().max(due);
                        stream.call(inputs.clone()).await?;
                        latencies.push(sent.elapsed().as_micros() as u64);
                        due += period;
                    }
                    TractResult::Ok(latencies)
                })
            })
            .collect();
        *start_at.lock().unwrap() = Some(Instant::now() + Duration::from_millis(50));
        ready.wait().await;
        let mut all = vec![];
        for t in tasks {
            all.extend(t.await??);
        }
        Ok(Latencies::new(all))
    })
}
