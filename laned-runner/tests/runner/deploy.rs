//! tract's deploy config switches a model to laned with no code change: a
//! TOML config written here, read through tract's own `deploy` runtime.
//! One test per process (nextest): the deploy runtime reads its config once.

use std::sync::Arc;

use laned_runner::{LanedRunner, Mode, TurnPolicy};
use tract_core::internal::*;
use tract_core::ops::math::mul;
use tract_core::unbatched::UnbatchedRunnable;

/// `input * 2`, named `name`, with `input` shaped `[B, 3]` (`batched`) or
/// `[3]`.
fn doubler(name: &str, batched: bool) -> TractResult<TypedModel> {
    let mut model = TypedModel::default();
    model.set_name(name);
    let dims: TVec<TDim> = if batched {
        tvec!(TDim::Sym(model.symbols.sym("B")), 3.into())
    } else {
        tvec!(3.into())
    };
    let input = model.add_source("input", f32::fact(&dims))?;
    let two = model.add_const("two", tensor0(2f32))?;
    let two = model.wire_node("two_b", AxisOp::Add(0), &[two])?;
    let two = if dims.len() > 1 {
        model.wire_node("two_bb", AxisOp::Add(0), &two)?
    } else {
        two
    };
    let doubled = model.wire_node("doubled", mul(), &[input, two[0]])?;
    model.select_output_outlets(&doubled)?;
    Ok(model)
}

/// Write `toml` to a file and point `TRACT_CONFIG` at it.
fn config(toml: &str) {
    let dir = std::env::temp_dir().join(format!("laned-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("deploy.toml");
    std::fs::write(&path, toml).unwrap();
    // One test per process: nothing else reads the environment meanwhile.
    unsafe { std::env::set_var("TRACT_CONFIG", &path) };
}

fn deploy() -> &'static dyn Runtime {
    runtime_for_name("deploy")
        .unwrap()
        .expect("tract registers the deploy runtime")
}

/// A section naming `runtime = "laned"` gets our runner, built from the
/// section's knobs (ours and tract's), and it serves.
#[test]
fn a_section_switches_a_model_to_laned() -> TractResult<()> {
    assert!(runtime_for_name("laned")?.is_some(), "laned is in tract's registry");
    config(
        r#"
[vad]
runtime = "laned"

[vad.knobs]
LANED_LANES = 6
LANED_SHARDS = 2
LANED_MODE = "combining"
TRACT_TURN_LINGER_US = 300
TRACT_MAX_SEATS = 4
"#,
    );
    let runnable = deploy().prepare(doubler("vad", true)?)?;
    let runner = runnable
        .downcast_ref::<LanedRunner>()
        .expect("the vad section's runtime is laned");
    assert_eq!(
        (runner.max_lanes(), runner.shards(), runner.mode()),
        (6, 2, Mode::Combining)
    );
    assert_eq!(runner.policy(), TurnPolicy::Linger { us: 300 });
    assert_eq!(runner.max_seats(), 4);
    let mut stream = runnable.spawn()?;
    let out = stream.run(tvec!(tensor2(&[[1f32, 2., 3.]]).into_tvalue()))?;
    assert_eq!(*out[0], tensor2(&[[2f32, 4., 6.]]));
    // A model without a section is prepared on tract's default, not ours.
    let other = deploy().prepare(doubler("other", true)?)?;
    assert!(other.downcast_ref::<LanedRunner>().is_none());
    Ok(())
}

/// A model the section's `batchify` transform batched is served by ours
/// behind tract's `UnbatchedRunnable`: callers keep the unbatched contract.
#[test]
fn a_batchified_model_is_served_unbatched() -> TractResult<()> {
    config(
        r#"
[enc]
runtime = "laned"
transforms = [{ name = "batchify", symbol = "B" }]

[enc.knobs]
LANED_LANES = 4
"#,
    );
    let runnable = deploy().prepare(doubler("enc", false)?)?;
    let unbatched = runnable
        .downcast_ref::<UnbatchedRunnable>()
        .expect("the batch axis batchify added is hidden");
    let runner = unbatched
        .inner()
        .downcast_ref::<LanedRunner>()
        .expect("served by laned underneath");
    assert_eq!(runner.max_lanes(), 4);
    let streams: Vec<_> = (0..3)
        .map(|s| {
            let mut stream = runnable.spawn().unwrap();
            std::thread::spawn(move || {
                let x = tensor1(&[s as f32, 1., 2.]);
                let out = stream.run(tvec!(x.into_tvalue())).unwrap();
                assert_eq!(*out[0], tensor1(&[2. * s as f32, 2., 4.]));
            })
        })
        .collect();
    for s in streams {
        s.join().unwrap();
    }
    let _: Arc<dyn Runnable> = runnable.into();
    Ok(())
}

/// tract's autobatch knob in a `laned` section is refused, saying which
/// knob to set: tract's deploy runtime would stack its runner on ours.
#[test]
fn tracts_autobatch_knob_in_a_laned_section_is_refused() -> TractResult<()> {
    config(
        r#"
[vad]
runtime = "laned"

[vad.knobs]
TRACT_AUTOBATCH_LANES = 8
"#,
    );
    let error = format!("{:#}", deploy().prepare(doubler("vad", true)?).unwrap_err());
    assert!(
        error.contains("TRACT_AUTOBATCH_LANES=8") && error.contains("LANED_LANES=8"),
        "{error}"
    );
    Ok(())
}

/// An explicit-state model served through a deploy section: `LANED_STATE`
/// names its state pair, the runner keeps the state per stream, and a
/// stream's answers are the cell's fed back by hand.
#[test]
fn a_section_names_the_explicit_state() -> TractResult<()> {
    config(
        r#"
[rnn-cell]
runtime = "laned"

[rnn-cell.knobs]
LANED_LANES = 4
LANED_STATE = "state=stateN"
"#,
    );
    let model = laned_testkit::fixtures::rnn_cell(3, 5)?;
    let plain = DefaultRuntime.prepare(model.clone())?;
    let runnable = deploy().prepare(model)?;
    assert!(runnable.downcast_ref::<LanedRunner>().is_some());
    let mut stream = runnable.spawn()?;
    let mut alone = plain.spawn()?;
    let mut state = Tensor::zero::<f32>(&[1, 1, 5])?;
    for call in 0..4 {
        let x = tensor2(&[[call as f32, 0.5, -1.]]);
        let got = stream.run(tvec!(x.clone().into_tvalue()))?;
        let want = alone.run(tvec!(x.into_tvalue(), state.clone().into_tvalue()))?;
        assert_eq!(got.len(), 1, "the state is the runner's, not the caller's");
        assert_eq!(*got[0], *want[0], "call {call}");
        state = want[1].clone().into_tensor();
    }
    Ok(())
}

/// A `LANED_STATE` that is not pairs is refused, naming the knob and what
/// it takes.
#[test]
fn a_bad_state_knob_is_refused_naming_it() -> TractResult<()> {
    config(
        r#"
[rnn-cell]
runtime = "laned"

[rnn-cell.knobs]
LANED_STATE = "state"
"#,
    );
    let refused = deploy().prepare(laned_testkit::fixtures::rnn_cell(3, 5)?);
    let Err(why) = refused else {
        panic!("a LANED_STATE of no pair was taken")
    };
    let why = format!("{why:#}");
    assert!(why.contains("LANED_STATE") && why.contains("IN=OUT"), "{why}");
    Ok(())
}
