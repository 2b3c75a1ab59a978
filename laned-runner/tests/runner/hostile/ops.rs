//! Test ops that fail on demand: a stateful counter whose state creation,
//! lane resets and evaluation err, panic or stall at a chosen call.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tract_core::internal::*;
use tract_core::plan::LaneId;

/// Where a fault can be planted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// The op's state is created (a state spawned).
    Spawn,
    /// The op state resets lanes.
    Reset,
    /// The op state evaluates a turn.
    Eval,
}

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Err,
    Panic,
}

#[derive(Debug, Default)]
struct Armed {
    /// (hook, calls of that hook to let through first, fault)
    faults: Vec<(Hook, usize, Fault)>,
    stall: Option<Duration>,
}

/// The remote control of the [`Hostile`] ops built with it.
#[derive(Debug, Default)]
pub struct Switch {
    armed: Mutex<Armed>,
    /// Calls of each hook so far (spawn, reset, eval).
    calls: [AtomicU64; 3],
}

impl Switch {
    pub fn new() -> Arc<Switch> {
        Arc::new(Switch::default())
    }

    /// Fail the `skip + 1`-th call of `hook` from now, once.
    pub fn arm(&self, hook: Hook, skip: usize, fault: Fault) {
        self.armed.lock().unwrap().faults.push((hook, skip, fault));
    }

    /// Every evaluation sleeps this long (a slow op holding a turn open).
    pub fn stall(&self, stall: Option<Duration>) {
        self.armed.lock().unwrap().stall = stall;
    }

    /// Calls of `hook` so far.
    pub fn calls(&self, hook: Hook) -> u64 {
        self.calls[hook as usize].load(Ordering::SeqCst)
    }

    fn hit(&self, hook: Hook) -> TractResult<()> {
        self.calls[hook as usize].fetch_add(1, Ordering::SeqCst);
        let (fault, stall) = {
            let mut armed = self.armed.lock().unwrap();
            let mut fault = None;
            if let Some(ix) = armed.faults.iter().position(|(h, _, _)| *h == hook) {
                if armed.faults[ix].1 == 0 {
                    fault = Some(armed.faults.remove(ix).2);
                } else {
                    armed.faults[ix].1 -= 1;
                }
            }
            (fault, armed.stall.filter(|_| hook == Hook::Eval))
        };
        if let Some(stall) = stall {
            std::thread::sleep(stall);
        }
        match fault {
            None => Ok(()),
            Some(Fault::Err) => bail!("planted {hook:?} error"),
            Some(Fault::Panic) => panic!("planted {hook:?} panic"),
        }
    }
}

/// `y = x + n`, where `n` counts the calls the stream made before this one:
/// per-lane state a runner must keep apart, reset and carry, with faults on
/// demand through its [`Switch`].
#[derive(Debug, Clone)]
pub struct Hostile(pub Arc<Switch>);

impl PartialEq for Hostile {
    fn eq(&self, other: &Hostile) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Hostile {}
impl Hash for Hostile {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.0) as usize).hash(state)
    }
}

impl Op for Hostile {
    fn name(&self) -> StaticName {
        "Hostile".into()
    }
    op_as_typed_op!();
}

impl EvalOp for Hostile {
    not_out_of_plan!();

    fn state(&self, _ctx: &EvalContext) -> TractResult<Option<Box<dyn OpState>>> {
        self.0.hit(Hook::Spawn)?;
        Ok(Some(Box::new(Counts {
            switch: self.0.clone(),
            per_lane: vec![],
        })))
    }
}

impl TypedOp for Hostile {
    as_op!();

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        Ok(tvec!(inputs[0].without_value()))
    }

    fn axes_mapping(&self, inputs: &[&TypedFact], outputs: &[&TypedFact]) -> TractResult<AxesMapping> {
        AxesMapping::natural(inputs, outputs)
    }
}

/// The state of a [`Hostile`]: calls made, per lane.
#[derive(Debug, Clone)]
struct Counts {
    switch: Arc<Switch>,
    per_lane: Vec<f32>,
}

impl OpState for Counts {
    fn eval(&mut self, ctx: &EvalContext, _op: &dyn Op, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        self.switch.hit(Hook::Eval)?;
        let lanes = ctx.seating.lanes();
        if self.per_lane.len() < ctx.seating.max_lanes() {
            self.per_lane.resize(ctx.seating.max_lanes(), 0.0);
        }
        let x = &inputs[0];
        let seats = x.shape()[0];
        ensure!(seats == lanes.len(), "{seats} rows for {} seats", lanes.len());
        let per_row = x.len() / seats.max(1);
        let mut values: Vec<f32> = x.to_plain_array_view::<f32>()?.iter().copied().collect();
        for (seat, lane) in lanes.iter().enumerate() {
            let n = self.per_lane[lane.0];
            values[seat * per_row..(seat + 1) * per_row]
                .iter_mut()
                .for_each(|v| *v += n);
        }
        for lane in lanes {
            self.per_lane[lane.0] += 1.0;
        }
        Ok(tvec!(Tensor::from_shape(x.shape(), &values)?.into_tvalue()))
    }

    fn reset_lanes(&mut self, lanes: &[LaneId]) -> TractResult<()> {
        self.switch.hit(Hook::Reset)?;
        for lane in lanes {
            if let Some(n) = self.per_lane.get_mut(lane.0) {
                *n = 0.0;
            }
        }
        Ok(())
    }
}

/// `y = Hostile(x) * 2` for `x: f32 [B, dims...]` (dims concrete, or free
/// symbols where `None`), prepared on tract's default runtime.
pub fn counter(switch: &Arc<Switch>, dims: &[Option<usize>]) -> TractResult<Arc<dyn Runnable>> {
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let mut shape: TVec<TDim> = tvec!(b.into());
    for (ix, d) in dims.iter().enumerate() {
        shape.push(match d {
            Some(d) => (*d).into(),
            None => model.symbols.sym(&format!("D{ix}")).into(),
        });
    }
    let x = model.add_source("x", f32::fact(&shape))?;
    let counted = model.wire_node("count", Hostile(switch.clone()), &[x])?;
    let two = model.add_const("two", tensor0(2f32).broadcast_into_rank(shape.len())?)?;
    let y = model.wire_node("y", tract_core::ops::math::mul(), &[counted[0], two])?;
    model.select_output_outlets(&y)?;
    Ok(DefaultRuntime.prepare(model)?.into())
}
