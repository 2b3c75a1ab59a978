//! Silero VAD (MIT), the real explicit-state model: fetched from its PyPI
//! package with pip (no other download), cached under `target/`, loaded with
//! tract-onnx. Only with the `silero` feature.
//!
//! The model takes `input [B, 64 + 512]` (a 32 ms chunk at 16 kHz after the
//! last 64 samples of the one before, which the caller keeps), `sr` (a
//! shared scalar, 16000) and `state [2, B, 128]`; it returns `output [B, 1]`
//! (the speech probability) and `stateN [2, B, 128]`.

use std::path::{Path, PathBuf};
use std::process::Command;

use tract_core::internal::*;
use tract_onnx::prelude::{Framework, InferenceFact, InferenceModelExt};

/// The package and version the model comes from.
pub const PACKAGE: &str = "silero-vad==6.2.3";
/// The file inside the package: the variant tract 0.23.9 loads.
pub const FILE_IN_PACKAGE: &str = "silero_vad/data/silero_vad_op18_ifless.onnx";
/// Samples per chunk at 16 kHz (32 ms).
pub const CHUNK: usize = 512;
/// Samples of the previous chunk fed before each chunk.
pub const CONTEXT: usize = 64;
/// The sample rate fed as `sr`.
pub const SAMPLE_RATE: i64 = 16_000;

/// Where the model is cached: `$CARGO_TARGET_DIR` or the workspace's
/// `target/`, under `silero/`.
pub fn cache_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"));
    target.join("silero")
}

/// The model file: `LANED_SILERO_ONNX` if set, else the cached copy, else
/// fetched into the cache with `python3 -m pip download`. `Err` says why it
/// is unavailable (no pip, no registry), for a visible skip.
pub fn fetch() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("LANED_SILERO_ONNX") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("LANED_SILERO_ONNX={} is not a file", path.display()))
        };
    }
    let dir = cache_dir();
    let model = dir.join("silero_vad_op18_ifless.onnx");
    if model.is_file() {
        return Ok(model);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // Each process downloads into its own folder and renames the model into
    // place: concurrent test processes never see a half-written file.
    let scratch = dir.join(format!("download-{}", std::process::id()));
    let result = download(&scratch, &model);
    let _ = std::fs::remove_dir_all(&scratch);
    result.map(|_| model)
}

fn download(scratch: &Path, model: &Path) -> Result<(), String> {
    let run = |cmd: &mut Command, what: &str| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{what}: cannot run python3: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr.lines().last().unwrap_or("").to_string();
            Err(format!("{what} failed ({}): {last}", out.status))
        }
    };
    run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                PACKAGE,
                "-d",
            ])
            .arg(scratch),
        &format!("pip download {PACKAGE}"),
    )?;
    let part = scratch.join("model.onnx.part");
    let script = "import sys, glob, zipfile\n\
                  wheel = glob.glob(sys.argv[1] + '/silero_vad-*.whl')[0]\n\
                  open(sys.argv[3], 'wb').write(zipfile.ZipFile(wheel).read(sys.argv[2]))\n";
    run(
        Command::new("python3")
            .args(["-c", script])
            .arg(scratch)
            .arg(FILE_IN_PACKAGE)
            .arg(&part),
        &format!("extracting {FILE_IN_PACKAGE}"),
    )?;
    std::fs::rename(&part, model).map_err(|e| format!("moving the model into {}: {e}", model.display()))
}

/// The model, typed with the batch symbol `batch` on axis 0 of `input` and
/// `output` and axis 1 of the state, decluttered (not optimised: the caller
/// prepares it).
pub fn load(path: &Path) -> TractResult<TypedModel> {
    let mut model = tract_onnx::onnx()
        .model_for_path(path)
        .with_context(|| format!("loading {} with tract-onnx", path.display()))?;
    // The branches of its `If` name the batch `batch`: the same symbol.
    let b = model.symbols.sym("batch");
    model.set_input_fact(0, f32::fact(dims!(b.clone(), CONTEXT + CHUNK)).into())?;
    model.set_input_fact(1, InferenceFact::from(i64::scalar_fact()))?;
    model.set_input_fact(2, f32::fact(dims!(2, b, 128)).into())?;
    model.into_typed()?.into_decluttered()
}

/// A stream's caller-side half: the last samples of its previous chunk.
#[derive(Debug, Clone)]
pub struct Context(Vec<f32>);

impl Default for Context {
    fn default() -> Context {
        Context(vec![0.0; CONTEXT])
    }
}

impl Context {
    /// The data inputs for one chunk (`input`, `sr`), the context moved on.
    ///
    /// Panics unless `chunk` holds [`CHUNK`] samples.
    pub fn inputs(&mut self, chunk: &[f32]) -> TVec<TValue> {
        assert_eq!(chunk.len(), CHUNK, "a chunk is {CHUNK} samples");
        let mut x = std::mem::take(&mut self.0);
        x.extend_from_slice(chunk);
        self.0 = x[x.len() - CONTEXT..].to_vec();
        tvec!(
            Tensor::from_shape(&[1, CONTEXT + CHUNK], &x).unwrap().into_tvalue(),
            tensor0(SAMPLE_RATE).into_tvalue()
        )
    }
}

pub use crate::sound::Sound;

/// `chunks` chunks of `sound`, seeded.
pub fn audio(sound: Sound, seed: u64, chunks: usize) -> Vec<Vec<f32>> {
    crate::sound::samples(sound, seed, chunks * CHUNK)
        .chunks(CHUNK)
        .map(|c| c.to_vec())
        .collect()
}
