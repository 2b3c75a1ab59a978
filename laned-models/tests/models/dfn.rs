//! DeepFilterNet3, three real pulsified models whose state lives in their
//! ops, joined with its glue as one model and served through one runner:
//! the runner lifts the convolutions' delay buffers and the GRUs' hidden
//! states to lanes; sixteen streams, staggered, reusing lanes, in both
//! modes, each get the audio of the three models run alone on plain tract
//! states; a stream's whole state (lifted and glue) moves to another
//! runner and goes on exactly; and noisy speech comes out cleaner.
use crate::common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{assert_turns_shared, compare};
use laned_models::dfn::{self, graph, Plans, HOP};
use laned_models::fetch::or_skip;
use laned_models::sound::{self, Sound};
use laned_runner::{LanedRunner, LanedStateHandle, Mode, RunnerConfig, StateSpec, StreamState};
use tract_core::internal::*;

/// The models pulsified, their solo plans, and the joined model's plan.
fn models() -> Option<(Plans, Arc<dyn Runnable>)> {
    let files = or_skip("DeepFilterNet3", dfn::fetch())?;
    let pulsed = dfn::load_pulsed(&files).unwrap();
    let plans = Plans::new(&pulsed).unwrap();
    let joined = graph::build(&pulsed).unwrap();
    Some((plans, DefaultRuntime.prepare(joined).unwrap().into()))
}

fn runner(plan: &Arc<dyn Runnable>, mode: Mode, shards: usize, lanes: usize) -> LanedRunner {
    let config = RunnerConfig::builder()
        .mode(mode)
        .shards(shards)
        .max_lanes(lanes)
        .linger(Duration::from_millis(2))
        .state(StateSpec::Pairs(graph::state_pairs()))
        .build();
    LanedRunner::new(plan.clone(), config).unwrap()
}

const SOUNDS: [Sound; 4] = [Sound::NoisyBuzz, Sound::Tone(440), Sound::Noise, Sound::Buzz];

/// Stream `s`'s audio: its own sound and seed, 10 to 25 frames.
fn stream_audio(s: usize) -> Vec<f32> {
    sound::samples(SOUNDS[s % 4], 5000 + s as u64, HOP * (10 + 5 * (s % 4)))
}

fn frame_call(handle: &mut LanedStateHandle, frame: &[f32]) -> Vec<f32> {
    let input = Tensor::from_shape(&[1, HOP], frame).unwrap().into_tvalue();
    let got = handle.call(tvec!(input)).unwrap();
    got[0].try_as_plain_ram().unwrap().as_slice::<f32>().unwrap().to_vec()
}

/// The runner lifts every op's state (nothing left in place), so a stream
/// of the joined model travels.
#[test]
fn dfn_every_op_state_is_lifted() {
    let Some((_, plan)) = models() else { return };
    let r = runner(&plan, Mode::Worker, 1, 2);
    let implicit = r.implicit_state();
    for s in implicit {
        eprintln!("{s}");
    }
    // Two delayed convolutions in enc and one in df_dec (a Delay and a
    // PulsePad each), and five GRUs (enc 1, erb_dec 2, df_dec 2).
    assert_eq!(implicit.iter().filter(|s| s.op == "Scan").count(), 5, "{implicit:?}");
    assert!(implicit.iter().filter(|s| s.op == "Delay").count() >= 3, "{implicit:?}");
    assert!(r.state_travels(), "{implicit:?}");
}

/// Sixteen streams through five lanes (one shard) or three of two (both
/// modes): each stream's audio is its solo run's, bit for bit.
#[test]
fn dfn_sixteen_streams_get_their_solo_audio() {
    let Some((plans, plan)) = models() else { return };
    let audio: Vec<Vec<f32>> = (0..16).map(stream_audio).collect();
    let want: Vec<Vec<f32>> = audio.iter().map(|a| dfn::denoise_solo(&plans, a).unwrap()).collect();
    assert!(want.iter().flatten().all(|v| v.is_finite()));
    assert_ne!(want[0], want[4], "two streams of one sound, other seeds, differ");
    for (mode, shards, lanes) in [(Mode::Worker, 1, 5), (Mode::Combining, 3, 2)] {
        let r = runner(&plan, mode, shards, lanes);
        let threads: Vec<_> = (0..16)
            .map(|s| {
                let (r, audio) = (r.clone(), audio[s].clone());
                thread::spawn(move || {
                    thread::sleep(Duration::from_millis(3 * s as u64));
                    let mut h = r.spawn_timeout(Duration::from_secs(300)).unwrap();
                    audio
                        .chunks(HOP)
                        .flat_map(|f| frame_call(&mut h, f))
                        .collect::<Vec<f32>>()
                })
            })
            .collect();
        for (s, t) in threads.into_iter().enumerate() {
            let got = t.join().unwrap();
            let (max, exact) = compare(&want[s], &got);
            assert!(
                exact,
                "{mode:?}, {shards} shards: stream {s} differs from its solo run by up to {max:e}"
            );
        }
        assert_turns_shared(&format!("dfn {mode:?}, {shards} shards"), &r);
    }
}

/// A stream exported (as JSON) after 3, 7 or 12 frames and imported on a
/// second runner, into a lane another stream used, goes on exactly as its
/// solo run; resumed without its state it does not.
#[test]
fn dfn_stream_state_travels_exactly() {
    let Some((plans, plan)) = models() else { return };
    let (a, b) = (runner(&plan, Mode::Worker, 1, 2), runner(&plan, Mode::Combining, 1, 2));
    // The lane the imports land in has served a stream already.
    let mut other = b.try_spawn().unwrap();
    for f in stream_audio(5).chunks(HOP).take(4) {
        frame_call(&mut other, f);
    }
    drop(other);
    for (s, at) in [(0, 3), (2, 7), (3, 12)] {
        let audio = stream_audio(s);
        let want = dfn::denoise_solo(&plans, &audio).unwrap();
        let frames: Vec<&[f32]> = audio.chunks(HOP).collect();
        let mut h = a.try_spawn().unwrap();
        let mut got: Vec<f32> = frames[..at].iter().flat_map(|f| frame_call(&mut h, f)).collect();
        let json = serde_json::to_string(&h.export_state().unwrap()).unwrap();
        eprintln!("dfn: a stream's state is {} bytes of JSON", json.len());
        drop(h);
        let state: StreamState = serde_json::from_str(&json).unwrap();
        let mut moved = b.try_spawn().unwrap();
        moved.import_state(&state).unwrap();
        got.extend(frames[at..].iter().flat_map(|f| frame_call(&mut moved, f)));
        let (max, exact) = compare(&want, &got);
        assert!(exact, "stream {s} moved after {at} frames differs by up to {max:e}");
        // Negative control: the rest on a fresh stream is not the same.
        let mut fresh = b.try_spawn().unwrap();
        let rest: Vec<f32> = frames[at..].iter().flat_map(|f| frame_call(&mut fresh, f)).collect();
        assert_ne!(
            rest,
            want[at * HOP..],
            "stream {s}: a fresh stream gave the moved one's audio"
        );
    }
}

/// The signal-to-noise ratio of `got` against `clean`, in dB, `got`
/// aligned by `delay` samples.
fn snr_db(clean: &[f32], got: &[f32], delay: usize) -> f32 {
    let n = clean.len().min(got.len().saturating_sub(delay));
    let (mut signal, mut noise) = (0.0f64, 0.0f64);
    for i in 0..n {
        let (c, g) = (clean[i] as f64, got[i + delay] as f64);
        signal += c * c;
        noise += (g - c) * (g - c);
    }
    (10.0 * (signal / noise.max(1e-20)).log10()) as f32
}

/// Speech (espeak-ng at 48 kHz) in white noise at 5 dB SNR: the served
/// stream's audio is the solo pipeline's bit for bit, and cleaner.
#[test]
fn dfn_noisy_speech_comes_out_cleaner() {
    let Some((plans, plan)) = models() else { return };
    let speech = sound::speak_at("the quick brown fox jumps over the lazy dog, twice over", 48_000)
        .expect("espeak-ng speaks (the test command installs it)");
    let len = speech.len() / HOP * HOP;
    let clean = &speech[..len];
    let power = clean.iter().map(|x| x * x).sum::<f32>() / len as f32;
    let noise = sound::samples(Sound::Noise, 77, len);
    let noise_power = noise.iter().map(|x| x * x).sum::<f32>() / len as f32;
    // White noise scaled to 5 dB under the speech.
    let scale = (power / noise_power / 10f32.powf(0.5)).sqrt();
    let noisy: Vec<f32> = clean.iter().zip(&noise).map(|(c, n)| c + n * scale).collect();
    let want = dfn::denoise_solo(&plans, &noisy).unwrap();
    let r = runner(&plan, Mode::Combining, 1, 2);
    let mut h = r.try_spawn().unwrap();
    let got: Vec<f32> = noisy.chunks(HOP).flat_map(|f| frame_call(&mut h, f)).collect();
    let (max, exact) = compare(&want, &got);
    assert!(exact, "served differs from the solo pipeline by up to {max:e}");
    let before = snr_db(clean, &noisy, 0);
    let after = snr_db(clean, &got, dfn::DELAY);
    eprintln!(
        "dfn: noisy speech {before:.1} dB SNR in, {after:.1} dB out ({} s)",
        len as f32 / 48_000.0
    );
    assert!(after > before + 3.0, "no cleaner: {before:.1} dB in, {after:.1} dB out");
}
