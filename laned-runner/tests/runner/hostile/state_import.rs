//! A stream state from elsewhere: checked against the model's per-stream
//! state fact before tract sees it (defect 7 of issue 30), a state from
//! another model (another name, state facts or weights, or a graph alike
//! but for one op: defect 3 of issue 47) or of an older format refused,
//! and a state handed over by tasks continued exactly.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use laned_runner::{RunErrorKind, StreamState};
use laned_testkit::fixtures::{self, Fixture};
use tract_core::internal::*;
use tract_core::ops::konst::Const;

use super::{feed, state_runner};

/// Inputs and hidden units of the GRU cell.
const F: usize = 5;
const H: usize = 4;

fn gru() -> Fixture {
    fixtures::gru_cell(F, H).unwrap()
}

/// `state` with its first tensor's datum type, shape and bytes replaced,
/// built through serde (the struct is non-exhaustive).
fn crafted(state: &StreamState, datum_type: &str, shape: &[usize], data: &[u8]) -> StreamState {
    let mut json = serde_json::to_value(state).unwrap();
    json["tensors"][0] = serde_json::json!({ "datum_type": datum_type, "shape": shape, "data": data });
    serde_json::from_value(json).unwrap()
}

/// Zero-element shapes whose dims overflow (and a wrong datum type or
/// shape) are refused as `State` errors naming the tensor, what it is and
/// what the model takes, without a panic; the stream serves on unharmed.
#[test]
fn overflowing_zero_element_shapes_are_refused() {
    let fixture = gru();
    let r = state_runner(fixture.runnable().unwrap());
    let mut a = r.try_spawn().unwrap();
    let first = feed(&fixture, &mut a, 1);
    let exported = a.export_state().unwrap();
    let mut b = r.try_spawn().unwrap();
    let wrong: [(&str, Vec<usize>); 5] = [
        ("F32", vec![0, 1 << 40, 1 << 40]),
        ("F32", vec![0, usize::MAX, 2]),
        ("F32", vec![0, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20]),
        ("I32", vec![1, 1, H]),
        ("F32", vec![1, H, 1]),
    ];
    for (dt, shape) in wrong {
        let bytes = vec![0u8; shape.iter().try_fold(4usize, |n, d| n.checked_mul(*d)).unwrap_or(0)];
        let state = crafted(&exported, dt, &shape, &bytes);
        let got = catch_unwind(AssertUnwindSafe(|| b.import_state(&state)))
            .unwrap_or_else(|_| panic!("import_state of {dt} {shape:?} panicked"));
        let e = got.expect_err(&format!("{dt} {shape:?} was accepted"));
        let RunErrorKind::State(why) = e.kind() else {
            panic!("{dt} {shape:?}: not a state error: {e}");
        };
        for word in [
            "state tensor 0",
            dt,
            &format!("{shape:?}"),
            &format!("F32 {:?}", [1, 1, H]),
        ] {
            assert!(why.contains(word), "{why:?} should say {word:?}");
        }
    }
    // Untouched: b goes on from zeros as a fresh stream would.
    assert_eq!(feed(&fixture, &mut b, 1), first);
}

/// A state exported from a model of the same name and state facts but
/// other weights is refused, naming both identities; the same model
/// prepared apart (another process) takes it.
#[test]
fn another_models_weights_are_told_apart() {
    let fixture = gru();
    let mut other = fixture.model.clone();
    let konst = other
        .nodes
        .iter()
        .position(|n| {
            n.op_as::<Const>()
                .is_some_and(|k| k.val().datum_type() == f32::datum_type())
        })
        .expect("the cell has weights");
    let weights = other.nodes[konst].op_as::<Const>().unwrap().val().clone();
    let changed: Vec<f32> = weights
        .to_plain_array_view::<f32>()
        .unwrap()
        .iter()
        .map(|w| w + 0.5)
        .collect();
    let changed = Arc::new(Tensor::from_shape(weights.shape(), &changed).unwrap());
    // The op and its output's fact both carry the value.
    let op = Const::new(changed).unwrap();
    other.nodes[konst].outputs[0].fact = op.output_facts(&[]).unwrap().remove(0);
    other.nodes[konst].op = Box::new(op);
    let mine = state_runner(fixture.runnable().unwrap());
    let same = state_runner(fixture.runnable().unwrap());
    let theirs = state_runner(DefaultRuntime.prepare(other).unwrap().into());

    let mut a = mine.try_spawn().unwrap();
    feed(&fixture, &mut a, 3);
    let exported = a.export_state().unwrap();
    let mut t = theirs.try_spawn().unwrap();
    let mut fresh = mine.try_spawn().unwrap();
    assert_ne!(
        feed(&fixture, &mut t, 3),
        feed(&fixture, &mut fresh, 3),
        "the weights differ"
    );
    let their_identity = t.export_state().unwrap().model;
    assert_ne!(exported.model, their_identity, "the identities differ");
    let e = t
        .import_state(&exported)
        .expect_err("another model's weights were accepted");
    assert!(matches!(e.kind(), RunErrorKind::State(_)), "{e}");
    let msg = e.to_string();
    for identity in [&exported.model, &their_identity] {
        assert!(
            msg.contains(&format!("{identity:?}")),
            "{msg:?} should name {identity:?}"
        );
    }
    let mut s = same.try_spawn().unwrap();
    s.import_state(&exported).unwrap();
    assert_eq!(feed(&fixture, &mut s, 4), feed(&fixture, &mut a, 4));
}

/// Defect 14: a stream handed over by tasks (`export_state_async`, then
/// `import_state_async` on another stream) continues exactly, no thread
/// waiting.
#[test]
fn a_state_handed_over_by_tasks_continues_exactly() {
    let fixture = gru();
    let r = state_runner(fixture.runnable().unwrap());
    let (mut a, mut b) = (r.try_spawn().unwrap(), r.try_spawn().unwrap());
    feed(&fixture, &mut a, 1);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let state = a.export_state_async().await.unwrap();
        b.import_state_async(&state).await.unwrap();
    });
    assert_eq!(feed(&fixture, &mut b, 2), feed(&fixture, &mut a, 2));
}

/// The GRU cell with its candidate's `tanh` made a `sigmoid`: another graph,
/// the same name, state facts and weights.
fn sigmoid_gru(f: &Fixture) -> TypedModel {
    let mut other = f.model.clone();
    let n = other
        .nodes
        .iter()
        .position(|n| n.name == "n")
        .expect("the candidate's tanh");
    assert!(
        format!("{:?}", other.nodes[n].op).contains("Tanh"),
        "{:?}",
        other.nodes[n].op
    );
    other.nodes[n].op = Box::new(tract_core::ops::nn::sigmoid());
    other
}

/// Defect 3 (issue 47): two models alike but for one op (`tanh` and `sigmoid`) have
/// different identities, and each refuses the other's state naming both
/// (on main each imported the other's); the same model prepared twice
/// agrees, and its state continues exactly.
#[test]
fn another_graphs_state_is_refused_naming_both() {
    let f = fixtures::gru_cell(5, 4).unwrap();
    let tanh = state_runner(f.runnable().unwrap());
    let sigmoid = state_runner(DefaultRuntime.prepare(sigmoid_gru(&f)).unwrap().into());
    let again = state_runner(f.runnable().unwrap());
    let (mut a, mut b) = (tanh.try_spawn().unwrap(), sigmoid.try_spawn().unwrap());
    assert_ne!(feed(&f, &mut a, 1), feed(&f, &mut b, 1), "the graphs compute apart");
    let (ours, theirs) = (a.export_state().unwrap(), b.export_state().unwrap());
    assert_ne!(ours.model, theirs.model, "the identities differ");
    for (to, state, own) in [(&mut b, &ours, &theirs), (&mut a, &theirs, &ours)] {
        let e = to.import_state(state).expect_err("another graph's state was taken");
        assert!(matches!(e.kind(), RunErrorKind::State(_)), "{e}");
        let text = e.to_string();
        for identity in [&state.model, &own.model] {
            assert!(
                text.contains(&format!("{identity:?}")),
                "{text:?} should name {identity:?}"
            );
        }
    }
    let mut c = again.try_spawn().unwrap();
    c.import_state(&ours).unwrap();
    assert_eq!(
        feed(&f, &mut c, 2),
        feed(&f, &mut a, 2),
        "the same model continues exactly"
    );
}

/// Defect 3 (issue 47): a state written before the identity covered the graph
/// (version 1) is refused by its version, naming both versions.
#[test]
fn a_state_of_the_old_format_is_refused_by_version() {
    let f = fixtures::gru_cell(5, 4).unwrap();
    let r = state_runner(f.runnable().unwrap());
    let mut h = r.try_spawn().unwrap();
    let mut json = serde_json::to_value(h.export_state().unwrap()).unwrap();
    json["version"] = 1.into();
    let old: StreamState = serde_json::from_value(json).unwrap();
    let e = h.import_state(&old).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("version 1") && text.contains(&format!("version {}", laned_runner::STREAM_STATE_VERSION)),
        "{text}"
    );
}
