//! DTLN noise suppression, two real explicit-state models chained per
//! stream, served through two runners (one per model): eight streams of
//! different audio, staggered, reusing lanes, in both modes, on one shard
//! and on three, each getting the denoised audio of its solo run. Skipped,
//! saying why, where pip cannot fetch the models.
use crate::common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{assert_turns_shared, call, compare, model_runner};
use laned_models::dtln::{self, Denoiser, SHIFT};
use laned_models::fetch::or_skip;
use laned_models::sound::{self, Sound};
use laned_runner::{LanedRunner, LanedStateHandle, Mode, RunnerConfig, StatePair, StateSpec};
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

/// A runner over the chain: `mode`, `shards` states of `lanes` lanes, both
/// LSTM states kept per stream, lingering 2 ms.
fn chain_runner(chain: &Arc<dyn Runnable>, mode: Mode, shards: usize, lanes: usize) -> LanedRunner {
    let pairs = dtln::Chain::STATE_PAIRS
        .iter()
        .map(|(i, o)| StatePair::new(*i, *o))
        .collect();
    let config = RunnerConfig::builder()
        .mode(mode)
        .shards(shards)
        .max_lanes(lanes)
        .linger(Duration::from_millis(2))
        .state(StateSpec::Pairs(pairs))
        .build();
    LanedRunner::new(chain.clone(), config).unwrap()
}

fn chain_of(one: &Arc<dyn Runnable>, two: &Arc<dyn Runnable>) -> Arc<dyn Runnable> {
    Arc::new(dtln::Chain::new(one.clone(), two.clone()).unwrap())
}

/// One chunk of `stream`'s audio (`[1, SHIFT]`) through a chain runner's
/// stream, the denoised samples out.
fn chain_call(handle: &mut LanedStateHandle, shift: &[f32]) -> Vec<f32> {
    let chunk = Tensor::from_shape(&[1, SHIFT], shift).unwrap().into_tvalue();
    let got = call(handle, tvec!(chunk)).unwrap();
    got[0].try_as_plain_ram().unwrap().as_slice::<f32>().unwrap().to_vec()
}

/// The chain run alone (a plain state, batch 1, its four states fed back
/// by hand) denoises as the two models run solo around the frame loop.
#[test]
fn dtln_chain_alone_denoises_as_solo() {
    let Some([one, two]) = plans() else { return };
    let chain = chain_of(&one, &two);
    for s in [0, 1, 3] {
        let audio = stream_audio(s);
        let want = dtln::denoise_solo(&one, &two, &audio).unwrap();
        let mut state = chain.spawn().unwrap();
        let lstm = || Tensor::zero::<f32>(&dtln::STATE_SHAPE).unwrap().into_tvalue();
        let block = || Tensor::zero::<f32>(&[1, dtln::BLOCK]).unwrap().into_tvalue();
        let mut states: TVec<TValue> = tvec!(lstm(), lstm(), block(), block());
        let mut got = Vec::with_capacity(audio.len());
        for shift in audio.chunks(SHIFT) {
            let chunk = Tensor::from_shape(&[1, SHIFT], shift).unwrap().into_tvalue();
            let mut inputs = tvec!(chunk);
            inputs.extend(states.drain(..));
            let mut out = state.run(inputs).unwrap();
            states = out.drain(1..).collect();
            got.extend_from_slice(out[0].try_as_plain_ram().unwrap().as_slice::<f32>().unwrap());
        }
        let (max, exact) = compare(&want, &got);
        assert!(
            exact,
            "stream {s}: the chain alone differs from the solo run by up to {max:e}"
        );
    }
}

/// A chain stream's whole state (both LSTMs and the frame loop's buffers)
/// moves: exported halfway from one runner and imported into a stream of
/// another, it goes on exactly as its solo run; a stream restored to an
/// earlier snapshot repeats its audio exactly.
#[test]
fn dtln_chain_stream_moves_whole() {
    let Some([one, two]) = plans() else { return };
    let chain = chain_of(&one, &two);
    let audio = stream_audio(1);
    let want = dtln::denoise_solo(&one, &two, &audio).unwrap();
    let (from, to) = (
        chain_runner(&chain, Mode::Worker, 1, 2),
        chain_runner(&chain, Mode::Combining, 1, 2),
    );
    let mut first = from.spawn_timeout(Duration::from_secs(60)).unwrap();
    let chunks: Vec<&[f32]> = audio.chunks(SHIFT).collect();
    let half = chunks.len() / 2;
    let mut got = vec![];
    for shift in &chunks[..half] {
        got.extend(chain_call(&mut first, shift));
    }
    let moved = first.export_state().unwrap();
    let mut second = to.spawn_timeout(Duration::from_secs(60)).unwrap();
    second.import_state(&moved).unwrap();
    let snapshot = second.state_snapshot().unwrap();
    let mut again = vec![];
    for shift in &chunks[half..] {
        got.extend(chain_call(&mut second, shift));
    }
    let (max, exact) = compare(&want, &got);
    assert!(exact, "the moved stream differs from its solo run by up to {max:e}");
    second.restore_state(snapshot).unwrap();
    for shift in &chunks[half..] {
        again.extend(chain_call(&mut second, shift));
    }
    assert_eq!(again, got[half * SHIFT..], "a restored stream repeats its audio");
}

/// Eight staggered streams of the chain through one runner (a hand-off per
/// chunk, not per model), in both modes, on one shard and on three, lanes
/// reused: each stream gets its solo run's audio bit for bit.
#[test]
fn dtln_chain_streams_get_their_solo_audio() {
    let Some([one, two]) = plans() else { return };
    let chain = chain_of(&one, &two);
    let audio: Vec<Vec<f32>> = (0..8).map(stream_audio).collect();
    let want: Vec<Vec<f32>> = audio
        .iter()
        .map(|a| dtln::denoise_solo(&one, &two, a).unwrap())
        .collect();
    for mode in [Mode::Worker, Mode::Combining] {
        for (shards, lanes) in [(1, 4), (3, 2)] {
            let runner = chain_runner(&chain, mode, shards, lanes);
            let threads: Vec<_> = (0..8)
                .map(|s| {
                    let runner = runner.clone();
                    let audio = audio[s].clone();
                    thread::spawn(move || {
                        thread::sleep(Duration::from_millis(if s < 4 { 0 } else { 5 * s as u64 }));
                        let mut handle = runner.spawn_timeout(Duration::from_secs(120)).unwrap();
                        let mut out = Vec::with_capacity(audio.len());
                        for shift in audio.chunks(SHIFT) {
                            out.extend(chain_call(&mut handle, shift));
                        }
                        out
                    })
                })
                .collect();
            for (s, t) in threads.into_iter().enumerate() {
                let got = t.join().unwrap();
                let (max, exact) = compare(&want[s], &got);
                assert!(
                    exact,
                    "{mode:?}, {shards} shards: stream {s} ({:?}) differs from its solo run by up to {max:e}",
                    SOUNDS[s]
                );
            }
            assert_turns_shared(&format!("{mode:?}, {shards} shards, the chain"), &runner);
        }
    }
}

/// A chunk of the wrong length is refused for that call, naming the input
/// and both shapes; the stream goes on. Models in the wrong order are
/// refused at build, naming the port.
#[test]
fn dtln_chain_refuses_bad_input_by_name() {
    let Some([one, two]) = plans() else { return };
    let wrong = dtln::Chain::new(two.clone(), one.clone()).unwrap_err().to_string();
    assert!(wrong.contains("model_1's input 0") && wrong.contains("512"), "{wrong}");
    let runner = chain_runner(&chain_of(&one, &two), Mode::Worker, 1, 2);
    let mut handle = runner.spawn_timeout(Duration::from_secs(60)).unwrap();
    let short = Tensor::zero::<f32>(&[1, 100]).unwrap().into_tvalue();
    let refused = handle.call(tvec!(short)).unwrap_err().to_string();
    assert!(refused.contains("100") && refused.contains("128"), "{refused}");
    let chunk = Tensor::zero::<f32>(&[1, SHIFT]).unwrap().into_tvalue();
    let out = handle.call(tvec!(chunk)).unwrap();
    assert_eq!(out[0].shape(), &[1, SHIFT]);
}
