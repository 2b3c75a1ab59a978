//! `laned check` as a user runs it: the built binary on model files
//! written here (tract's NNEF), one that can be laned and ones that cannot,
//! each verdict and its exit status.

use std::path::Path;
use std::process::{Command, Output};

mod first_hour;
mod image;
mod js;
mod kserve;
mod mux;
mod serve;
mod soak;

use laned_models::fetch::or_skip;
use laned_server::testing::free_port;
use laned_testkit::fixtures::{self, Layout, TdnnConfig};
use tract_core::internal::*;
use tract_pulse::internal::tract_nnef;

fn laned(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_laned")).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What Silero VAD's published ONNX needs told: its state pair, its
/// chunk's length, its sample rate.
const SILERO_FACTS: [&str; 6] = ["--state", "2=1", "--input", "0=batch,576", "--fill", "1=16000"];

fn save(model: &TypedModel, dir: &Path, name: &str) -> String {
    let path = dir.join(name);
    tract_nnef::nnef()
        .write_to_tar(model, std::fs::File::create(&path).unwrap())
        .unwrap();
    path.to_string_lossy().into_owned()
}

/// A model whose rows mix: each row less the maximum over the whole batch.
fn max_over_batch() -> TypedModel {
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let x = model.add_source("x", f32::fact(dims!(b, 3))).unwrap();
    let reduce = tract_core::ops::nn::Reduce::new(tvec![0], tract_core::ops::nn::Reducer::Max);
    let max = model.wire_node("max_over_streams", reduce, &[x]).unwrap();
    let y = model
        .wire_node("minus_max", tract_core::ops::math::sub(), &[x, max[0]])
        .unwrap();
    model.select_output_outlets(&y).unwrap();
    model
}

/// A streaming TDNN, pulsified by the tool: it can be laned; the facts
/// name the batch symbol, the pulse and delay (the testkit's own figures),
/// the batched input and output; the config printed is one the runner reads.
#[test]
fn a_streaming_tdnn_can_be_laned_and_gets_a_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = TdnnConfig {
        width: 8,
        pulse: 4,
        layout: Layout::Nchw,
    };
    let path = save(&fixtures::tdnn_streaming(config).unwrap(), dir.path(), "tdnn.nnef.tar");
    let out = laned(&["check", &path, "--pulse", "4", "--symbol", "S"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let reference = fixtures::tdnn(config).unwrap();
    assert!(said.contains("batch symbol: B (axis 0)"), "{said}");
    assert!(
        said.contains(&format!("pulse: 4 frames on S; delay {} frames", reference.delay)),
        "{said}"
    );
    assert!(
        said.contains("input 0") && said.contains("batched (a row per stream)"),
        "{said}"
    );
    assert!(said.contains("can be laned"), "{said}");
    let toml_text = said.split("(TOML):").nth(1).unwrap();
    let parsed: laned_models::spec::Spec = toml::from_str(toml_text).unwrap();
    assert_eq!(parsed.runner.max_lanes, 64);
    assert_eq!(parsed.model.pulse, Some(4), "{toml_text}");
    assert_eq!(parsed.model.file.as_deref(), Some(std::path::Path::new(&path)));
}

/// The same model left unpulsified has its streaming dim free: it is a
/// fact, and the runner still lanes it (a whole utterance per call).
#[test]
fn without_a_pulse_the_free_dim_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = TdnnConfig {
        width: 8,
        pulse: 4,
        layout: Layout::Nchw,
    };
    let path = save(&fixtures::tdnn_streaming(config).unwrap(), dir.path(), "tdnn.nnef.tar");
    let out = laned(&["check", &path]);
    let said = text(&out);
    assert!(said.contains("free dims S"), "{said}");
}

/// A sum over the batch mixes the streams: its output has no row per
/// stream, and the runner refuses it, saying so; exit status 1.
#[test]
fn an_output_mixing_streams_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = TypedModel::default();
    let b = model.symbols.sym("B");
    let x = model.add_source("x", f32::fact(dims!(b, 3))).unwrap();
    let reduce = tract_core::ops::nn::Reduce::new(tvec![0], tract_core::ops::nn::Reducer::Sum);
    let y = model.wire_node("sum_over_streams", reduce, &[x]).unwrap();
    model.select_output_outlets(&y).unwrap();
    let path = save(&model, dir.path(), "mixing.nnef.tar");
    let out = laned(&["check", &path]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("batch symbol: B (axis 0)"), "{said}");
    assert!(
        said.contains("output 0 \"sum_over_streams\"") && said.contains("shared"),
        "{said}"
    );
    assert!(said.contains("cannot be laned: "), "{said}");
    assert!(said.contains("output"), "{said}");
}

/// A model whose outputs carry no batch symbol cannot be laned: the runner's
/// reason, exit 1.
#[test]
fn a_model_without_a_batch_symbol_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = TypedModel::default();
    let x = model.add_source("x", f32::fact([1, 3])).unwrap();
    let two = model.add_const("two", tensor2(&[[2f32]])).unwrap();
    let y = model.wire_node("y", tract_core::ops::math::mul(), &[x, two]).unwrap();
    model.select_output_outlets(&y).unwrap();
    let path = save(&model, dir.path(), "fixed.nnef.tar");
    let out = laned(&["check", &path]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("batch symbol: none"), "{said}");
    assert!(said.contains("cannot be laned: "), "{said}");
}

/// A file that is no model, and a bad pulse: exit status 2, the file named.
#[test]
fn unreadable_input_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nothing.onnx");
    std::fs::write(&path, b"not a model").unwrap();
    let path = path.to_string_lossy().into_owned();
    let out = laned(&["check", &path]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("nothing.onnx"), "{}", text(&out));
    let config = TdnnConfig {
        width: 8,
        pulse: 4,
        layout: Layout::Nchw,
    };
    let tdnn = save(&fixtures::tdnn_streaming(config).unwrap(), dir.path(), "tdnn.nnef.tar");
    let out = laned(&["check", &tdnn, "--pulse", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--pulse: got 0"), "{}", text(&out));
}

/// Silero VAD's ONNX, as its registry package ships it: its state output
/// is not named after its input, so detection finds no pair and the runner
/// refuses (the state output would mix streams); the facts point at the
/// state (the batch symbol on axis 1). With `--state 2=1` but its chunk's
/// length free, it is not run and not passed; with the length and the
/// sample rate given, it can be laned, the config carrying the pair.
#[test]
fn silero_vad_needs_its_state_pair_and_then_can_be_laned() {
    let Some(path) = or_skip("Silero VAD", laned_models::silero::fetch()) else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let out = laned(&["check", &path]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("input 2 \"state\"") && said.contains("the batch symbol on axis 1"),
        "{said}"
    );
    assert!(said.contains("cannot be laned: output 1"), "{said}");
    // Paired, but its chunk's length left free: not run, so not passed.
    let out = laned(&["check", &path, "--state", "2=1"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("cannot be laned: not run") && said.contains("sequence"),
        "{said}"
    );
    let out = laned(&[["check", path.as_str()].as_slice(), &SILERO_FACTS].concat());
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let toml_text = said.split("(TOML):").nth(1).unwrap();
    let parsed: laned_models::spec::Spec = toml::from_str(toml_text).unwrap();
    assert_eq!(
        parsed.runner.state,
        laned_runner::StateSpec::Pairs(vec![laned_runner::StatePair::new(2, 1)])
    );
    let out = laned(&["check", &path, "--state", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("wanted IN=OUT"), "{}", text(&out));
}

/// DTLN's two ONNX files as published (their batch fixed at 1): as they
/// are, no batch symbol (refused); model 1 with its inputs' facts given a
/// batch symbol and its LSTM state paired can be laned; model 2 cannot,
/// and the reason names the Reshape whose constant shape spells the batch
/// as 1 (what `laned_models::dtln::load_model_2` patches).
#[test]
fn dtln_model_1_can_be_laned_and_model_2_names_its_fixed_reshape() {
    let Some(files) = or_skip("DTLN", laned_models::dtln::fetch()) else {
        return;
    };
    let (one, two) = (
        files.model_1.to_string_lossy().into_owned(),
        files.model_2.to_string_lossy().into_owned(),
    );
    let out = laned(&["check", &one]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("no usable batch axis"), "{}", text(&out));
    let state = ["--input", "1=batch,2,128,2", "--state", "1=1"];
    let out = laned(&[&["check", &one, "--input", "0=batch,1,257"][..], &state[..]].concat());
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("batch symbol: batch (axis 0)") && said.contains("1 pairs as given"),
        "{said}"
    );
    let out = laned(&[&["check", &two, "--input", "0=batch,1,512"][..], &state[..]].concat());
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("Reshape") && said.contains("volume mismatch"), "{said}");
    let out = laned(&["check", &one, "--input", "zero=batch"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("wanted a number"), "{}", text(&out));
}

/// A model that keeps the batch axis yet mixes the streams (each row minus
/// the maximum over the whole batch): the runner's static checks let it
/// through, running it shows the mix; the verdict names the output and the
/// reducing node, exit 1.
#[test]
fn a_reduction_over_the_batch_broadcast_back_is_refused_by_running_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = save(&max_over_batch(), dir.path(), "max.nnef.tar");
    let out = laned(&["check", &path]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("batched (a row per stream)"), "{said}");
    assert!(
        said.contains("cannot be laned: output 0 mixes the streams") && said.contains("\"max_over_streams\""),
        "{said}"
    );
    let out = laned(&["bench", &path, "--streams", "1", "--seconds", "0.05", "--repeats", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        !text(&out).contains("| streams |"),
        "timed a model it refuses: {}",
        text(&out)
    );
}

/// openWakeWord's three files: the mel spectrogram as published takes its
/// decibel floor from the maximum over the whole batch: refused, the
/// ReduceMax named; patched as `laned_models::oww` patches it (per row), it
/// can be laned and its rows stay their own bit for bit; the embedding can
/// be laned as it is; the classifier's `If` on its score cannot even be
/// typed with a batch (exit 2), and patched (a per-row `Where`) can be laned.
#[test]
fn oww_the_published_mel_spectrogram_mixes_streams_and_the_patched_one_does_not() {
    let Some(files) = or_skip("openWakeWord", laned_models::oww::fetch()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mel = files.melspectrogram.to_string_lossy().into_owned();
    let out = laned(&["check", &mel, "--input", "0=batch,1760"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("output 0 mixes the streams") && said.contains("ReduceMax"),
        "{said}"
    );
    let patched = save(
        &laned_models::oww::load_melspectrogram(&files.melspectrogram).unwrap(),
        dir.path(),
        "mel.nnef.tar",
    );
    let out = laned(&["check", &patched]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("bit for bit"), "{said}");
    let embedding = files.embedding.to_string_lossy().into_owned();
    let out = laned(&["check", &embedding, "--input", "0=batch,76,32,1"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("bit for bit"), "{said}");
    let classifier = files.classifier.to_string_lossy().into_owned();
    let out = laned(&["check", &classifier, "--input", "0=batch,16,96"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("If"), "{}", text(&out));
    let patched = save(
        &laned_models::oww::load_classifier(&files.classifier).unwrap(),
        dir.path(),
        "classifier.nnef.tar",
    );
    let out = laned(&["check", &patched]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// `laned bench` on a streaming TDNN: checked, ours found exact against a
/// state per stream, a row per stream count asked with the references' and
/// ours' four ways' figures, and a verdict either way naming the best way.
#[test]
fn bench_measures_the_three_side_by_side_and_says_whether_laning_pays() {
    let dir = tempfile::tempdir().unwrap();
    let config = TdnnConfig {
        width: 8,
        pulse: 4,
        layout: Layout::Nchw,
    };
    let path = save(&fixtures::tdnn_streaming(config).unwrap(), dir.path(), "tdnn.nnef.tar");
    let out = laned(&[
        "bench",
        &path,
        "--pulse",
        "4",
        "--streams",
        "1,3",
        "--seconds",
        "0.1",
        "--repeats",
        "1",
    ]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("exact: 3 streams through ours"), "{said}");
    assert!(said.contains("cores: 1 (pinned to CPUs ["), "{said}");
    for n in [1, 3] {
        let row = said
            .lines()
            .find(|l| l.starts_with(&format!("| {n} |")))
            .unwrap_or_else(|| panic!("no row for {n} streams: {said}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).filter(|c| !c.is_empty()).collect();
        // The count, a state per stream, the ideal loop, ours four ways,
        // two ratios (every one a positive figure), and the learned width.
        assert_eq!(cells.len(), 10, "{row}");
        let figures: Vec<f64> = cells[..9].iter().map(|c| c.parse().unwrap()).collect();
        assert!(figures.iter().all(|f| *f > 0.0), "{row}");
        assert!(cells[9] == "-" || cells[9].parse::<usize>().is_ok(), "{row}");
    }
    for way in [
        "threads, worker",
        "threads, combining, the default",
        "tasks, worker",
        "tasks, combining, the default",
    ] {
        assert!(said.contains(&format!("ours ({way})")), "{way}: {said}");
    }
    // The verdict names the way that won.
    assert!(
        said.contains("laning pays from") && said.contains("ours (t")
            || said.contains("laning does not pay here") && said.contains("at its best (t"),
        "{said}"
    );
    let out = laned(&["bench", &path, "--pulse", "4", "--streams", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--streams: got [0]"), "{}", text(&out));
}

/// `laned bench` on Silero VAD with its state pair, its sample rate filled
/// in and its chunk's length given: ours is exact against the state fed
/// back by hand, and it measures.
#[test]
fn bench_on_silero_vad_keeps_its_state_exact() {
    let Some(path) = or_skip("Silero VAD", laned_models::silero::fetch()) else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let out = laned(
        &[
            ["bench", path.as_str()].as_slice(),
            &SILERO_FACTS,
            &["--streams", "4", "--seconds", "0.1", "--repeats", "1"],
        ]
        .concat(),
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("exact: 4 streams through ours"), "{said}");
    assert!(said.lines().any(|l| l.starts_with("| 4 |")), "{said}");
}

/// A model `laned check` cannot run (a dim besides the batch left free: no
/// input can be made for it) is never said to be laneable: the verdict says
/// it was not run and why, and the exit is 1; with the dim a number, it runs.
#[test]
fn check_never_says_laneable_without_running_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let doubler = |free: bool| {
        let mut model = TypedModel::default();
        let b = model.symbols.sym("B");
        let f: TDim = if free { model.symbols.sym("F").into() } else { 3.into() };
        let x = model.add_source("x", f32::fact(dims!(b, f))).unwrap();
        let y = model.wire_node("y", tract_core::ops::math::add(), &[x, x]).unwrap()[0];
        model.select_output_outlets(&[y]).unwrap();
        model
    };
    let path = save(&doubler(true), dir.path(), "free.nnef.tar");
    let out = laned(&["check", &path]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("rows: not probed"), "{said}");
    assert!(said.contains("cannot be laned: not run"), "{said}");
    assert!(!said.contains("can be laned."), "{said}");
    // The same model with the dim a number runs, and passes.
    let path = save(&doubler(false), dir.path(), "fixed.nnef.tar");
    let out = laned(&["check", &path]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("bit for bit"), "{said}");
    // What a row costs by turn width, timed on the model's own state.
    let width = said
        .lines()
        .find(|l| l.starts_with("width: "))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(width.contains("(1: ") && width.contains(", 64: "), "{width}");
    assert!(width.contains("cheapest per row at "), "{width}");
}
