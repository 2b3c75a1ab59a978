//! A state per stream for an explicit-state model, the way a user without
//! lanes runs one: a plain state, the model's state outputs fed back by
//! hand as its state inputs on the next call.

use std::sync::Arc;

use tract_core::internal::*;

/// One state fed back: model output `output` is the next value of model
/// input `input` (`None`: the last one), starting from `zeros`.
#[derive(Debug, Clone)]
struct Kept {
    input: Option<usize>,
    output: usize,
    zeros: TValue,
}

/// `inner` behind the `Runnable` interface with its explicit state kept:
/// each spawned state starts every state from its initial value and keeps
/// its own; a call takes the other inputs and answers the other outputs,
/// both in the model's order.
#[derive(Debug, Clone)]
pub struct FeedBack {
    inner: Arc<dyn Runnable>,
    kept: Vec<Kept>,
}

impl FeedBack {
    /// Streams of `inner` (a model whose output 1 is its next state, taken
    /// back as its last input), each starting from `zeros` (one stream's
    /// state).
    pub fn new(inner: Arc<dyn Runnable>, zeros: Tensor) -> FeedBack {
        FeedBack {
            inner,
            kept: vec![Kept {
                input: None,
                output: 1,
                zeros: zeros.into_tvalue(),
            }],
        }
    }

    /// Streams of `inner` whose state pairs are `(input, output, initial)`:
    /// model output `output` is fed back as model input `input`, starting
    /// from `initial`. The pairs are model indices, each input and output
    /// in one pair at most.
    pub fn pairs(inner: Arc<dyn Runnable>, pairs: Vec<(usize, usize, Tensor)>) -> FeedBack {
        let mut kept: Vec<Kept> = pairs
            .into_iter()
            .map(|(input, output, zeros)| Kept {
                input: Some(input),
                output,
                zeros: zeros.into_tvalue(),
            })
            .collect();
        kept.sort_by_key(|k| k.input);
        FeedBack { inner, kept }
    }
}

/// One stream of a [`FeedBack`].
#[derive(Debug, Clone)]
struct FeedBackState {
    state: Box<dyn State>,
    /// Model input indices (ascending), output indices and the values now.
    kept: Vec<(usize, usize, TValue)>,
}

impl State for FeedBackState {
    fn run(&mut self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let mut all = inputs;
        // Ascending: each insert lands where the model has it.
        for (input, _, value) in &self.kept {
            ensure!(
                *input <= all.len(),
                "state input {input} is past the model's {} inputs",
                all.len() + 1
            );
            all.insert(*input, value.clone());
        }
        let mut out: Vec<Option<TValue>> = self.state.run(all)?.into_iter().map(Some).collect();
        for (_, output, value) in &mut self.kept {
            *value = out
                .get_mut(*output)
                .and_then(Option::take)
                .with_context(|| format!("the model gives no state output {output}"))?;
        }
        Ok(out.into_iter().flatten().collect())
    }
    fn runnable(&self) -> &dyn Runnable {
        self.state.runnable()
    }
    fn input_count(&self) -> usize {
        self.state.input_count().saturating_sub(self.kept.len())
    }
    fn output_count(&self) -> usize {
        self.state.output_count().saturating_sub(self.kept.len())
    }
}

impl Runnable for FeedBack {
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        let state = self.inner.spawn()?;
        let last = state.input_count().saturating_sub(1);
        Ok(Box::new(FeedBackState {
            kept: self
                .kept
                .iter()
                .map(|k| (k.input.unwrap_or(last), k.output, k.zeros.clone()))
                .collect(),
            state,
        }))
    }
    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.inner.typed_plan()
    }
    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.inner.typed_model()
    }
}
