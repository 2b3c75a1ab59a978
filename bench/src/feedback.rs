//! A state per stream for an explicit-state model, the way a user without
//! lanes runs one: a plain state, the model's state output fed back by
//! hand as its last input on the next call.

use std::sync::Arc;

use tract_core::internal::*;

/// `inner` (a model whose output 1 is its next state, taken back as its
/// last input) behind the `Runnable` interface: each spawned state starts
/// from `zeros` and keeps its own state; a call takes the other inputs and
/// answers the other outputs.
#[derive(Debug, Clone)]
pub struct FeedBack {
    inner: Arc<dyn Runnable>,
    zeros: TValue,
}

impl FeedBack {
    /// Streams of `inner`, each starting from `zeros` (one stream's state).
    pub fn new(inner: Arc<dyn Runnable>, zeros: Tensor) -> FeedBack {
        FeedBack {
            inner,
            zeros: zeros.into_tvalue(),
        }
    }
}

/// One stream of a [`FeedBack`].
#[derive(Debug, Clone)]
struct FeedBackState {
    state: Box<dyn State>,
    kept: TValue,
}

impl State for FeedBackState {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let mut all = inputs;
        all.push(self.kept.clone());
        let mut out = self.state.run(all)?;
        ensure!(out.len() > 1, "a fed-back model gives its state as output 1");
        self.kept = out.remove(1);
        Ok(out)
    }
    fn runnable(&self) -> &dyn Runnable {
        self.state.runnable()
    }
    fn input_count(&self) -> usize {
        self.state.input_count().saturating_sub(1)
    }
    fn output_count(&self) -> usize {
        self.state.output_count().saturating_sub(1)
    }
}

impl Runnable for FeedBack {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        Ok(Box::new(FeedBackState {
            state: self.inner.spawn()?,
            kept: self.zeros.clone(),
        }))
    }
    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.inner.typed_plan()
    }
    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.inner.typed_model()
    }
}
