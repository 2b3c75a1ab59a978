//! DTLN noise suppression, two real explicit-state models chained per
//! stream, served through two runners (one per model): eight streams of
//! different audio, staggered, reusing lanes, in both modes, on one shard
//! and on three, each getting the denoised audio of its solo run. Skipped,
//! saying why, where pip cannot fetch the models.
use crate::common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{assert_turns_shared, call, compare, model_runner, or_skip};
use laned_models::dtln::{self, Denoiser, SHIFT};
use laned_models::sound::{self, Sound};
use laned_runner::Mode;
use tract_core::internal::*;

fn plans() -> Option<[Arc<dyn Runnable>; 2]> {
    let files = or_skip("DTLN", dtln::fetch())?;
    let prepare = |m: TypedModel| -> Arc<dyn Runnable> { DefaultRuntime.prepare(m).unwrap().into() };
    Some([
        prepare(dtln::load_model_1(&files.model_1).unwrap()),
        prepare(dtln::load_model_2(&files.model_2).unwrap()),
    ])
}

const SOUNDS: [Sound; 8] = [
    Sound::NoisyBuzz,
    Sound::Tone(440),
    Sound::Noise,
    Sound::Silence,
    Sound::Tone(1800),
    Sound::Buzz,
    Sound::NoisyBuzz,
    Sound::Tone(220),
];

/// Stream `s`'s audio: its own sound and seed, and its own length (0.4 to
/// 0.8 s).
fn stream_audio(s: usize) -> Vec<f32> {
    sound::samples(SOUNDS[s], 2000 + s as u64, SHIFT * (48 + 16 * (s % 4)))
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32).sqrt()
}

/// The patch (`model_2`'s reshapes to -1) and the symbolic batch change
/// nothing for one stream: the loaded models denoise exactly as the
/// published files, batch fixed at 1, do.
#[test]
fn dtln_patched_models_denoise_as_published() {
    let Some([one, two]) = plans() else { return };
    let files = dtln::fetch().unwrap();
    let prepare = |m: TypedModel| -> Arc<dyn Runnable> { DefaultRuntime.prepare(m).unwrap().into() };
    let published_1 = prepare(dtln::load_as_published(&files.model_1).unwrap());
    let published_2 = prepare(dtln::load_as_published(&files.model_2).unwrap());
    for s in 0..8 {
        let audio = stream_audio(s);
        let want = dtln::denoise_solo(&published_1, &published_2, &audio).unwrap();
        let got = dtln::denoise_solo(&one, &two, &audio).unwrap();
        let (max, exact) = compare(&want, &got);
        assert!(exact, "stream {s}: the patched models differ by up to {max:e}");
    }
}

/// One stream's state kept by each model's runner: the whole frame loop of
/// a batch equals its rows run alone (the models' only cross-row ops are
/// the LSTMs' matrix products).
#[test]
fn dtln_streams_get_their_solo_audio() {
    let Some([one, two]) = plans() else { return };
    let audio: Vec<Vec<f32>> = (0..8).map(stream_audio).collect();
    let want: Vec<Vec<f32>> = audio
        .iter()
        .map(|a| dtln::denoise_solo(&one, &two, a).unwrap())
        .collect();
    for (s, (a, w)) in audio.iter().zip(&want).enumerate() {
        assert!(w.iter().all(|v| v.is_finite()), "stream {s}: finite output");
        eprintln!("stream {s} ({:?}): rms in {:.4}, out {:.4}", SOUNDS[s], rms(a), rms(w));
    }
    // The streams' audio differs, and so does what comes out.
    assert_ne!(want[0], want[1]);
    // Silence in, silence (or nearly) out.
    assert!(rms(&want[3]) < 1e-3, "silence stays quiet: {}", rms(&want[3]));
    let mut worst = 0.0f32;
    for mode in [Mode::Worker, Mode::Combining] {
        // One shard of four lanes; three of two (six lanes for eight
        // streams): lanes are reused either way.
        for (shards, lanes) in [(1, 4), (3, 2)] {
            let runner_1 = model_runner(&one, Some(dtln::STATE_1), mode, shards, lanes);
            let runner_2 = model_runner(&two, Some(dtln::STATE_2), mode, shards, lanes);
            let threads: Vec<_> = (0..8)
                .map(|s| {
                    let (runner_1, runner_2) = (runner_1.clone(), runner_2.clone());
                    let audio = audio[s].clone();
                    thread::spawn(move || {
                        thread::sleep(Duration::from_millis(if s < 4 { 0 } else { 5 * s as u64 }));
                        let mut h1 = runner_1.spawn_timeout(Duration::from_secs(120)).unwrap();
                        let mut h2 = runner_2.spawn_timeout(Duration::from_secs(120)).unwrap();
                        let mut denoiser = Denoiser::default();
                        let mut out = Vec::with_capacity(audio.len());
                        for shift in audio.chunks(SHIFT) {
                            out.extend(
                                denoiser
                                    .process(shift, |i| call(&mut h1, i), |i| call(&mut h2, i))
                                    .unwrap(),
                            );
                        }
                        out
                    })
                })
                .collect();
            for (s, t) in threads.into_iter().enumerate() {
                let got = t.join().unwrap();
                let (max, exact) = compare(&want[s], &got);
                worst = worst.max(max);
                assert!(
                    exact,
                    "{mode:?}, {shards} shards: stream {s} ({:?}) differs from its solo run by up to {max:e}",
                    SOUNDS[s]
                );
            }
            for (name, r) in [("model_1", &runner_1), ("model_2", &runner_2)] {
                assert_turns_shared(&format!("{mode:?}, {shards} shards, {name}"), r);
            }
        }
    }
    eprintln!("dtln: largest difference from the solo runs {worst:e}");
}
