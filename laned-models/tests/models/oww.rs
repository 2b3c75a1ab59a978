//! openWakeWord, three real stateless models chained per stream (mel
//! spectrogram, embedding, "hey jarvis" classifier), served through three
//! runners batching across streams: eight streams of different audio,
//! staggered, reusing lanes, in both modes, on one shard and on three, each
//! getting the scores of its solo run. Skipped, saying why, where npm
//! cannot fetch the models (CC BY-NC-SA 4.0: fetched here, never shipped).
use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{assert_turns_shared, call, compare, model_runner};
use laned_models::fetch::or_skip;
use laned_models::oww::{self, Windows, CHUNK, THRESHOLD};
use laned_models::sound::{self, Sound};
use laned_runner::{LanedRunner, LanedStateHandle, Mode};
use tract_core::internal::*;

fn files() -> Option<oww::Files> {
    or_skip("openWakeWord", oww::fetch())
}

const SOUNDS: [Sound; 8] = [
    Sound::Buzz,
    Sound::Silence,
    Sound::Noise,
    Sound::Tone(440),
    Sound::NoisyBuzz,
    Sound::Silence,
    Sound::Tone(1800),
    Sound::Buzz,
];

/// Stream `s`'s audio: its own sound and seed, and its own length (1 to 2
/// s); `spoken` (a phrase spoken by espeak-ng, in a second of silence each
/// side) in place of stream 7's, where there is one.
fn stream_audio(s: usize, spoken: Option<&[f32]>) -> Vec<f32> {
    match spoken {
        Some(speech) if s == 7 => padded(speech),
        _ => sound::samples(SOUNDS[s], 3000 + s as u64, CHUNK * (13 + 4 * (s % 4))),
    }
}

/// `speech` in a second of silence each side, cut to whole chunks.
fn padded(speech: &[f32]) -> Vec<f32> {
    let second = sound::SAMPLE_RATE as usize;
    let mut x = vec![0.0; second];
    x.extend_from_slice(speech);
    x.resize((x.len() + second).div_ceil(CHUNK) * CHUNK, 0.0);
    x
}

fn max(scores: &[f32]) -> f32 {
    scores.iter().copied().fold(0.0, f32::max)
}

/// The batch symbol set to 1 in a loaded model.
fn batch_of_one(model: TypedModel) -> TypedModel {
    let b = model.symbols.sym("batch");
    model.set_symbols(&HashMap::from([(b, TDim::from(1))])).unwrap()
}

/// The patches (the mel spectrogram's decibel floor per row, the
/// classifier's `If` as a `Where`) change nothing for one stream: the
/// patched models with the batch set to 1 compute exactly what the
/// published files (batch 1) do, step by step on the same inputs.
///
/// With the batch symbolic the plan differs (tract picks its kernels for a
/// batch it does not know) and so do the last bits of a few values: that
/// difference is reported, and bounded; it is no concern of the runner's,
/// whose streams are checked against solo runs of the same symbolic plan.
#[test]
fn oww_patched_models_compute_as_published() {
    let Some(files) = files() else { return };
    let prepare = |m: TypedModel| -> Arc<dyn Runnable> { DefaultRuntime.prepare(m).unwrap().into() };
    let published = oww::published_plans(&files).unwrap();
    let loaded = [
        oww::load_melspectrogram(&files.melspectrogram).unwrap(),
        oww::load_embedding(&files.embedding).unwrap(),
        oww::load_classifier(&files.classifier).unwrap(),
    ];
    let one: Vec<Arc<dyn Runnable>> = loaded.iter().map(|m| prepare(batch_of_one(m.clone()))).collect();
    let symbolic: Vec<Arc<dyn Runnable>> = loaded.into_iter().map(prepare).collect();
    let names = ["melspectrogram", "embedding", "classifier"];
    let speech = sound::speak("hey jarvis").ok();
    let mut streams: Vec<Vec<f32>> = (0..8).map(|s| stream_audio(s, None)).collect();
    streams.extend(speech.as_deref().map(padded));
    let mut worst = [0.0f32; 3];
    let mut verifier = 0.0f32;
    for (s, audio) in streams.iter().enumerate() {
        let mut windows = Windows::default();
        for chunk in audio.chunks_exact(CHUNK) {
            // Each model's published output feeds the next; the patched
            // ones see the same inputs.
            let mut step = |m: usize, inputs: TVec<TValue>| -> TractResult<TVec<TValue>> {
                let want = published[m].run(inputs.clone())?;
                let exact = one[m].run(inputs.clone())?;
                if m < 2 || want[0].to_plain_array_view::<f32>()?.iter().all(|v| *v < THRESHOLD) {
                    assert_eq!(want[0], exact[0], "stream {s}: {} patched, batch 1", names[m]);
                } else {
                    // The published classifier ran its verifier: tract runs
                    // an `If`'s branch as a model of its own, unoptimised,
                    // with other matrix kernels than the inlined branch.
                    let (w, e) = (
                        want[0].to_plain_array_view::<f32>()?,
                        exact[0].to_plain_array_view::<f32>()?,
                    );
                    let diff = w.iter().zip(e.iter()).map(|(w, e)| (w - e).abs()).fold(0.0, f32::max);
                    verifier = verifier.max(diff);
                }
                let got = symbolic[m].run(inputs)?;
                let (w, g) = (
                    want[0].to_plain_array_view::<f32>()?,
                    got[0].to_plain_array_view::<f32>()?,
                );
                let diff = w.iter().zip(g.iter()).map(|(w, g)| (w - g).abs()).fold(0.0, f32::max);
                worst[m] = worst[m].max(diff);
                Ok(want)
            };
            let mel = step(0, windows.mel_input(chunk)).unwrap();
            let embedded = step(1, windows.embedding_input(&mel[0]).unwrap()).unwrap();
            step(2, windows.classifier_input(&embedded[0]).unwrap()).unwrap();
        }
    }
    for (name, diff) in names.iter().zip(worst) {
        eprintln!("{name}: symbolic batch vs published, largest difference {diff:e}");
    }
    eprintln!("classifier: verifier inlined vs run as an If's branch, largest difference {verifier:e}");
    // Log-mel decibels are tens; embeddings and scores are around one.
    assert!(worst[0] < 1e-3 && worst[1] < 1e-3 && worst[2] < 1e-5, "{worst:?}");
    assert!(verifier < 1e-5, "{verifier:e}");
}

/// Eight streams through the three runners: every score equals the solo
/// run's, bit for bit; silence scores below the threshold; "hey jarvis"
/// spoken by espeak-ng (where installed) scores the same through the
/// runners as solo, its score reported.
#[test]
fn oww_streams_get_their_solo_scores() {
    let Some(files) = files() else { return };
    let plans = oww::plans(&files).unwrap();
    let speech = match sound::speak("hey jarvis") {
        Ok(speech) => Some(speech),
        Err(why) => {
            eprintln!("no spoken stream: {why}");
            None
        }
    };
    let audio: Vec<Vec<f32>> = (0..8).map(|s| stream_audio(s, speech.as_deref())).collect();
    let want: Vec<Vec<f32>> = audio.iter().map(|a| oww::scores_solo(&plans, a).unwrap()).collect();
    for (s, w) in want.iter().enumerate() {
        let what = if s == 7 && speech.is_some() {
            "\"hey jarvis\" (espeak-ng)".to_string()
        } else {
            format!("{:?}", SOUNDS[s])
        };
        eprintln!("stream {s} ({what}): {} scores, highest {:.6}", w.len(), max(w));
    }
    for s in [1, 5] {
        assert_eq!(SOUNDS[s], Sound::Silence);
        assert!(
            max(&want[s]) < THRESHOLD,
            "silence scores below {THRESHOLD}: {:?}",
            want[s]
        );
    }
    for mode in [Mode::Worker, Mode::Combining] {
        // One shard of four lanes; three of two (six lanes for eight
        // streams): lanes are reused either way.
        for (shards, lanes) in [(1, 4), (3, 2)] {
            let runners: Vec<LanedRunner> = plans
                .iter()
                .map(|p| model_runner(p, None, mode, shards, lanes))
                .collect();
            let threads: Vec<_> = (0..8)
                .map(|s| {
                    let runners = runners.clone();
                    let audio = audio[s].clone();
                    thread::spawn(move || {
                        thread::sleep(Duration::from_millis(if s < 4 { 0 } else { 5 * s as u64 }));
                        let mut h: Vec<LanedStateHandle> = runners
                            .iter()
                            .map(|r| r.spawn_timeout(Duration::from_secs(120)).unwrap())
                            .collect();
                        let [mel, embedding, classifier] = &mut h[..] else {
                            unreachable!()
                        };
                        let mut windows = Windows::default();
                        audio
                            .chunks_exact(CHUNK)
                            .map(|chunk| {
                                windows
                                    .process(chunk, |i| call(mel, i), |i| call(embedding, i), |i| call(classifier, i))
                                    .unwrap()
                            })
                            .collect::<Vec<f32>>()
                    })
                })
                .collect();
            for (s, t) in threads.into_iter().enumerate() {
                let got = t.join().unwrap();
                let (diff, exact) = compare(&want[s], &got);
                assert!(
                    exact,
                    "{mode:?}, {shards} shards: stream {s} differs from its solo run by up to {diff:e}"
                );
                if s == 1 || s == 5 {
                    assert!(max(&got) < THRESHOLD, "{mode:?}: silence through the runners");
                }
            }
            for (name, r) in ["melspectrogram", "embedding", "classifier"].iter().zip(&runners) {
                assert_turns_shared(&format!("{mode:?}, {shards} shards, {name}"), r);
            }
        }
    }
}
