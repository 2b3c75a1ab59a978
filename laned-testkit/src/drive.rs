//! Running a schedule: solo (the reference), by hand on one laned state, and
//! through any runner, one thread per stream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tract_core::internal::*;
use tract_core::plan::{LaneId, Seating};

use crate::fixtures::Fixture;
use crate::schedule::{Schedule, StreamPlan};

/// Each stream's outputs, call by call (a wide call's rows stacked), and what
/// is known of the seating that produced them.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Per stream, per call, the outputs the caller got.
    pub outputs: Vec<Vec<TVec<TValue>>>,
    /// By-hand runs only: per stream and call, the turn that served its first
    /// row, and per turn its seating as `(stream, call, row, lane)` per seat.
    pub turn_of: Vec<Vec<usize>>,
    /// By-hand runs only: per turn, its seating as `(stream, call, row, lane)`
    /// per seat.
    pub seatings: Vec<Vec<(usize, usize, usize, usize)>>,
}

impl Observed {
    /// The seating of the turn that served `stream`'s call `call`, as text.
    pub fn seating_of(&self, stream: usize, call: usize) -> String {
        let Some(turn) = self.turn_of.get(stream).and_then(|t| t.get(call)) else {
            return "unknown (seated by a runner)".into();
        };
        let seats: Vec<String> = self.seatings[*turn]
            .iter()
            .enumerate()
            .map(|(seat, (s, c, r, lane))| format!("seat {seat}: stream {s} call {c} row {r} in lane {lane}"))
            .collect();
        format!("turn {turn}: {}", seats.join("; "))
    }
}

/// Which outputs a caller of `fixture` gets (its data outputs) carry the
/// batch axis.
fn batched_outputs(fixture: &Fixture) -> Vec<bool> {
    fixture
        .data_outputs()
        .into_iter()
        .map(|o| {
            let fact = fixture.model.outlet_fact(fixture.model.outputs[o]).unwrap();
            matches!(fact.shape.dims().first(), Some(TDim::Sym(s)) if *s == fixture.batch)
        })
        .collect()
}

/// One stream run alone on a plain state, its explicit state (if the
/// fixture has any) fed back by hand: what a user without lanes writes.
struct SoloStream {
    state: Box<dyn State>,
    explicit: TVec<Tensor>,
}

impl SoloStream {
    fn new(fixture: &Fixture, runnable: &Arc<dyn Runnable>) -> TractResult<SoloStream> {
        Ok(SoloStream {
            state: runnable.spawn()?,
            explicit: fixture.initial_state(),
        })
    }

    /// Run one call's data inputs; the data outputs come back.
    fn run(&mut self, fixture: &Fixture, data: TVec<TValue>) -> TractResult<TVec<TValue>> {
        if fixture.state.is_empty() {
            return self.state.run(data);
        }
        let mut data = data.into_iter();
        let inputs: TVec<TValue> = (0..fixture.model.inputs.len())
            .map(|ix| match fixture.state.iter().position(|s| s.input == ix) {
                Some(pair) => Ok(self.explicit[pair].clone().into_tvalue()),
                None => data.next().context("fewer data inputs than the model takes"),
            })
            .collect::<TractResult<_>>()?;
        let outputs = self.state.run(inputs)?;
        for (pair, port) in fixture.state.iter().enumerate() {
            self.explicit[pair] = outputs[port.output].clone().into_tensor();
        }
        Ok(fixture.data_outputs().into_iter().map(|o| outputs[o].clone()).collect())
    }
}

/// Row `row` of a call's inputs: batched inputs sliced, shared ones whole.
fn row_of(fixture: &Fixture, inputs: &TVec<TValue>, row: usize) -> TractResult<TVec<TValue>> {
    inputs
        .iter()
        .zip(&fixture.inputs)
        .map(|(t, spec)| {
            if spec.batched {
                Ok(t.slice(0, row, row + 1)?.into_tvalue())
            } else {
                Ok(t.clone())
            }
        })
        .collect()
}

/// A turn's inputs from its seats' rows: batched inputs stacked in seat
/// order, shared ones as the first seat feeds them.
fn stack_turn(fixture: &Fixture, rows: &[TVec<TValue>]) -> TractResult<TVec<TValue>> {
    fixture
        .inputs
        .iter()
        .enumerate()
        .map(|(ix, spec)| {
            if spec.batched {
                let parts: TVec<&Tensor> = rows.iter().map(|r| &*r[ix]).collect();
                Ok(Tensor::stack_tensors(0, &parts)?.into_tvalue())
            } else {
                Ok(rows[0][ix].clone())
            }
        })
        .collect()
}

/// The stream length `plan` resolves for call `call`: its true length on
/// its last call when it ends on a partial pulse, nothing otherwise.
fn resolved_end(plan: &StreamPlan, call: usize) -> Option<i64> {
    plan.end.filter(|_| call + 1 == plan.calls.len())
}

/// A call's rows' outputs stacked back into the call's answer.
fn stack_rows(batched: &[bool], rows: Vec<TVec<TValue>>) -> TractResult<TVec<TValue>> {
    if rows.len() == 1 {
        return Ok(rows.into_iter().next().unwrap());
    }
    (0..rows[0].len())
        .map(|ix| {
            if batched[ix] {
                let parts: TVec<&Tensor> = rows.iter().map(|r| &*r[ix]).collect();
                Ok(Tensor::stack_tensors(0, &parts)?.into_tvalue())
            } else {
                Ok(rows[0][ix].clone())
            }
        })
        .collect()
}

/// The reference: each stream run alone on one unbatched state, each later
/// row of a wide call on a fresh state of its own.
pub fn solo(
    fixture: &Fixture,
    runnable: &Arc<dyn Runnable>,
    schedule: &Schedule,
) -> TractResult<Vec<Vec<TVec<TValue>>>> {
    let batched = batched_outputs(fixture);
    schedule
        .streams
        .iter()
        .map(|stream| solo_stream(fixture, runnable, stream, &batched))
        .collect()
}

fn solo_stream(
    fixture: &Fixture,
    runnable: &Arc<dyn Runnable>,
    stream: &StreamPlan,
    batched: &[bool],
) -> TractResult<Vec<TVec<TValue>>> {
    let mut solo = SoloStream::new(fixture, runnable)?;
    let mut outputs = vec![];
    for (call, rows) in stream.calls.iter().enumerate() {
        let inputs = fixture.inputs(*rows, stream.call_seed(call));
        if let Some(end) = resolved_end(stream, call) {
            solo.state.resolve_symbol(&fixture.stream, end)?;
        }
        let mut answers = vec![solo.run(fixture, row_of(fixture, &inputs, 0)?)?];
        for row in 1..*rows {
            answers.push(SoloStream::new(fixture, runnable)?.run(fixture, row_of(fixture, &inputs, row)?)?);
        }
        outputs.push(stack_rows(batched, answers)?);
    }
    Ok(outputs)
}

/// A deliberately broken by-hand runner, for the checker's negative controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// A correct runner.
    None,
    /// Seats 0 and 1 of a turn get each other's outputs.
    SwapSeats,
    /// A borrowed lane is used as the previous row left it.
    NoResetBorrowed,
    /// A lane handed to a new stream keeps the previous stream's history.
    NoResetOnSpawn,
}

/// Run `schedule` by hand on one laned state of `runnable`: `seat()` and
/// `reset_lanes()` called exactly as the schedule says. Deterministic.
pub fn by_hand(
    fixture: &Fixture,
    runnable: &Arc<dyn Runnable>,
    schedule: &Schedule,
    sabotage: Sabotage,
) -> TractResult<Observed> {
    ensure!(
        fixture.state.is_empty(),
        "{} carries explicit state: the by-hand driver seats op state only; drive it through a runner",
        fixture.name
    );
    let max_lanes = schedule.max_lanes;
    let batched = batched_outputs(fixture);
    let mut state = runnable.spawn()?;
    let every: Vec<LaneId> = (0..max_lanes).map(LaneId).collect();
    state.reset_lanes(&every)?;
    let n = schedule.streams.len();
    let mut observed = Observed {
        outputs: vec![vec![]; n],
        turn_of: vec![vec![]; n],
        seatings: vec![],
    };
    // Per stream: its lane once spawned, the next call, and whether it ended.
    let mut lane_of: Vec<Option<usize>> = vec![None; n];
    let mut next_call = vec![0usize; n];
    let mut taken = vec![false; max_lanes];
    let mut done = 0;
    let mut turn = 0;
    let bound = 4 * schedule
        .streams
        .iter()
        .map(|s| s.calls.len() + s.arrive + 1)
        .sum::<usize>()
        + 16;
    while done < n {
        ensure!(turn < bound, "the schedule did not finish in {bound} turns");
        // Spawn arrivals in order while a lane (besides the borrowing one) is free.
        for s in 0..n {
            let held = taken.iter().filter(|t| **t).count();
            if lane_of[s].is_none() && next_call[s] == 0 && schedule.streams[s].arrive <= turn && held + 1 < max_lanes {
                let lane = taken.iter().position(|t| !t).unwrap();
                taken[lane] = true;
                if sabotage != Sabotage::NoResetOnSpawn {
                    state.reset_lanes(&[LaneId(lane)])?;
                }
                lane_of[s] = Some(lane);
            }
        }
        let live: Vec<usize> = (0..n)
            .filter(|s| lane_of[*s].is_some() && next_call[*s] < schedule.streams[*s].calls.len())
            .collect();
        if live.is_empty() {
            turn += 1;
            continue;
        }
        let pick = schedule.picks[turn % schedule.picks.len()];
        let mut chosen: Vec<usize> = live
            .iter()
            .enumerate()
            .filter(|(i, _)| pick >> (i % 64) & 1 == 1)
            .map(|(_, s)| *s)
            .collect();
        if chosen.is_empty() {
            chosen.push(live[0]);
        }
        let rotate = (pick >> 40) as usize % chosen.len();
        chosen.rotate_left(rotate);
        // A stream resolving its length sits alone: a turn has one value of
        // each symbol.
        let resolving = |s: &usize| {
            let plan = &schedule.streams[*s];
            plan.end.is_some() && next_call[*s] + 1 == plan.calls.len()
        };
        if let Some(s) = chosen.iter().find(|s| resolving(s)).copied() {
            chosen = vec![s];
        }
        // Seat the chosen streams whose rows fit in the free lanes.
        let mut free: Vec<usize> = (0..max_lanes).filter(|l| !taken[*l]).collect();
        free.reverse();
        let mut seats: Vec<(usize, usize, usize, usize)> = vec![]; // (stream, call, row, lane)
        let mut borrowed: Vec<usize> = vec![];
        for s in chosen {
            let rows = schedule.streams[s].calls[next_call[s]];
            if rows - 1 > free.len() {
                continue;
            }
            seats.push((s, next_call[s], 0, lane_of[s].unwrap()));
            for row in 1..rows {
                let lane = free.pop().unwrap();
                borrowed.push(lane);
                seats.push((s, next_call[s], row, lane));
            }
        }
        if !borrowed.is_empty() && sabotage != Sabotage::NoResetBorrowed {
            state.reset_lanes(&borrowed.iter().map(|l| LaneId(*l)).collect::<Vec<_>>())?;
        }
        // Stack the seats' rows.
        let mut rows: Vec<TVec<TValue>> = vec![];
        let mut shared: Option<TVec<TValue>> = None;
        for (s, call, row, _) in &seats {
            let plan = &schedule.streams[*s];
            let inputs = fixture.inputs(plan.calls[*call], plan.call_seed(*call));
            if shared.is_none() {
                shared = Some(inputs.clone());
            }
            rows.push(row_of(fixture, &inputs, *row)?);
        }
        let mut turn_inputs = stack_turn(fixture, &rows)?;
        // Seats disagreeing on a shared input cannot share this turn: keep
        // the first seat's value and only the seats agreeing with it.
        let agree: Vec<bool> = rows
            .iter()
            .map(|r| {
                fixture
                    .inputs
                    .iter()
                    .enumerate()
                    .all(|(ix, spec)| spec.batched || r[ix] == rows[0][ix])
            })
            .collect();
        if agree.iter().any(|a| !a) {
            let keep_streams: Vec<usize> = seats
                .iter()
                .zip(&agree)
                .filter(|(_, a)| **a)
                .map(|(s, _)| s.0)
                .collect();
            let keep: Vec<usize> = (0..seats.len())
                .filter(|i| keep_streams.contains(&seats[*i].0))
                .collect();
            seats = keep.iter().map(|i| seats[*i]).collect();
            let rows_kept: Vec<TVec<TValue>> = keep.iter().map(|i| rows[*i].clone()).collect();
            turn_inputs = stack_turn(fixture, &rows_kept)?;
        }
        if seats.is_empty() {
            turn += 1;
            continue;
        }
        if let Some(s) = seats.iter().map(|s| s.0).find(|s| resolving(s)) {
            state.resolve_symbol(&fixture.stream, schedule.streams[s].end.unwrap())?;
        }
        state.seat(Seating::new(max_lanes, seats.iter().map(|s| LaneId(s.3)))?)?;
        let outputs = state.run(turn_inputs)?;
        // Slice per seat.
        let mut per_seat: Vec<TVec<TValue>> = (0..seats.len())
            .map(|seat| {
                outputs
                    .iter()
                    .zip(&batched)
                    .map(|(o, b)| {
                        if *b {
                            Ok(o.slice(0, seat, seat + 1)?.into_tvalue())
                        } else {
                            Ok(o.clone())
                        }
                    })
                    .collect::<TractResult<TVec<TValue>>>()
            })
            .collect::<TractResult<_>>()?;
        if sabotage == Sabotage::SwapSeats && per_seat.len() >= 2 {
            per_seat.swap(0, 1);
        }
        // Assemble each stream's call.
        let mut i = 0;
        while i < seats.len() {
            let s = seats[i].0;
            let rows = schedule.streams[s].calls[next_call[s]];
            let answer = stack_rows(&batched, per_seat[i..i + rows].to_vec())?;
            observed.outputs[s].push(answer);
            observed.turn_of[s].push(observed.seatings.len());
            next_call[s] += 1;
            if next_call[s] == schedule.streams[s].calls.len() {
                taken[lane_of[s].unwrap()] = false;
                lane_of[s] = None;
                done += 1;
            }
            i += rows;
        }
        observed.seatings.push(seats);
        turn += 1;
    }
    Ok(observed)
}

/// Run `schedule` through `runnable` (any laned runner), one thread per
/// stream; the seating is whatever the runner finds queued. Stream `i`
/// asks for its lane `arrive` steps of `stagger` after the start, retrying
/// while every lane is taken.
pub fn through_runner(
    fixture: &Fixture,
    runnable: Arc<dyn Runnable>,
    schedule: &Schedule,
    stagger: Duration,
) -> TractResult<Observed> {
    let started = Instant::now();
    let threads: Vec<_> = schedule
        .streams
        .iter()
        .cloned()
        .map(|plan| {
            let runnable = runnable.clone();
            let fixture = fixture.clone();
            std::thread::spawn(move || -> TractResult<Vec<TVec<TValue>>> {
                std::thread::sleep((started + stagger * plan.arrive as u32).saturating_duration_since(Instant::now()));
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut handle = loop {
                    match runnable.spawn() {
                        Ok(h) => break h,
                        Err(e) if Instant::now() < deadline => {
                            let _ = e;
                            std::thread::sleep(Duration::from_micros(200));
                        }
                        Err(e) => return Err(e.context("no lane within 30 s")),
                    }
                };
                let mut outputs = vec![];
                for (call, rows) in plan.calls.iter().enumerate() {
                    let inputs = fixture.inputs(*rows, plan.call_seed(call));
                    if let Some(end) = resolved_end(&plan, call) {
                        handle.resolve_symbol(&fixture.stream, end)?;
                    }
                    outputs.push(handle.run(inputs)?);
                }
                Ok(outputs)
            })
        })
        .collect();
    let mut observed = Observed::default();
    for (s, t) in threads.into_iter().enumerate() {
        let outputs = t
            .join()
            .map_err(|_| format_err!("stream {s}'s thread panicked"))?
            .with_context(|| format!("stream {s}"))?;
        observed.outputs.push(outputs);
    }
    Ok(observed)
}

/// A boxed future that may move between threads, as the async driver
/// hands them out.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What the async driver needs of a runner whose streams are tasks. The
/// testkit knows no runner: a test implements it for its own (a wrapper
/// around the runner it checks).
pub trait AsyncRunner: Send + Sync + 'static {
    /// One stream's handle.
    type Stream: AsyncStream;
    /// A new stream, waiting for a lane as long as it takes.
    fn spawn(&self) -> BoxFuture<'_, TractResult<Self::Stream>>;
}

/// One stream of an [`AsyncRunner`].
pub trait AsyncStream: Send + 'static {
    /// Pin `symbol` for the next call only.
    fn resolve(&mut self, symbol: &Symbol, value: i64) -> TractResult<()>;
    /// One call, answered to the task.
    fn call(&mut self, inputs: TVec<TValue>) -> BoxFuture<'_, TractResult<TVec<TValue>>>;
}

/// Sleeps a task for a while, on whatever runtime the test picked.
pub type Sleep = Arc<dyn Fn(Duration) -> BoxFuture<'static, ()> + Send + Sync>;

/// [`through_runner`] with a task per stream instead of a thread: one future
/// per stream of `schedule`, in order, for the caller to run on the runtime
/// it picks; collect their results with [`observed_from`]. Stream `i` asks
/// for its lane after `arrive` steps of `stagger` (slept through `sleep`).
pub fn through_runner_async<R: AsyncRunner>(
    fixture: &Fixture,
    runner: Arc<R>,
    schedule: &Schedule,
    stagger: Duration,
    sleep: Sleep,
) -> Vec<BoxFuture<'static, TractResult<Vec<TVec<TValue>>>>> {
    schedule
        .streams
        .iter()
        .cloned()
        .map(|plan| {
            let (runner, fixture, sleep) = (runner.clone(), fixture.clone(), sleep.clone());
            let stream: BoxFuture<'static, TractResult<Vec<TVec<TValue>>>> = Box::pin(async move {
                sleep(stagger * plan.arrive as u32).await;
                let mut handle = runner.spawn().await?;
                let mut outputs = vec![];
                for (call, rows) in plan.calls.iter().enumerate() {
                    let inputs = fixture.inputs(*rows, plan.call_seed(call));
                    if let Some(end) = resolved_end(&plan, call) {
                        handle.resolve(&fixture.stream, end)?;
                    }
                    outputs.push(handle.call(inputs).await?);
                }
                Ok(outputs)
            });
            stream
        })
        .collect()
}

/// What the streams of [`through_runner_async`] got, as the checker reads
/// it; the first stream that failed fails it all, named.
pub fn observed_from(results: Vec<TractResult<Vec<TVec<TValue>>>>) -> TractResult<Observed> {
    let mut observed = Observed::default();
    for (s, result) in results.into_iter().enumerate() {
        observed.outputs.push(result.with_context(|| format!("stream {s}"))?);
    }
    Ok(observed)
}
