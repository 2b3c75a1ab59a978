//! Silero VAD, a real explicit-state model, served through the runner:
//! eight streams of different audio, staggered, reusing lanes, in both
//! modes, each getting exactly the probabilities of its solo run. Skipped,
//! saying why, where pip cannot fetch the model.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use laned_models::fetch::or_skip;
use laned_models::silero::{self, Context, Sound};
use laned_runner::{LanedRunner, Mode, RunnerConfig, StatePair, StateSpec};
use tract_core::internal::*;

fn plan() -> Option<Arc<dyn Runnable>> {
    let path = or_skip("Silero VAD", silero::fetch())?;
    Some(DefaultRuntime.prepare(silero::load(&path).unwrap()).unwrap().into())
}

const SOUNDS: [Sound; 8] = [
    Sound::Buzz,
    Sound::Tone(440),
    Sound::Noise,
    Sound::Silence,
    Sound::Tone(1800),
    Sound::Buzz,
    Sound::Noise,
    Sound::Tone(220),
];

/// Stream `s`'s audio: its own sound and seed, and its own length.
fn stream_audio(s: usize) -> Vec<Vec<f32>> {
    silero::audio(SOUNDS[s], 1000 + s as u64, 6 + s % 4)
}

/// The reference: one plain state, the state fed back by hand.
fn solo(plan: &Arc<dyn Runnable>, chunks: &[Vec<f32>]) -> Vec<Tensor> {
    let mut state = plan.spawn().unwrap();
    let mut context = Context::default();
    let mut h = Tensor::zero::<f32>(&[2, 1, 128]).unwrap();
    chunks
        .iter()
        .map(|chunk| {
            let mut inputs = context.inputs(chunk);
            inputs.push(h.clone().into_tvalue());
            let out = state.run(inputs).unwrap();
            h = out[1].clone().into_tensor();
            out[0].clone().into_tensor()
        })
        .collect()
}

/// Eight streams on four lanes, the first four at once (turns shared by
/// streams of different audio and state), the others taking the lanes the
/// first ones leave: every probability equals the solo run's, bit for bit.
#[test]
fn silero_streams_get_their_solo_probabilities() {
    let Some(plan) = plan() else { return };
    let want: Vec<Vec<Tensor>> = (0..8).map(|s| solo(&plan, &stream_audio(s))).collect();
    for mode in [Mode::Worker, Mode::Combining] {
        let config = RunnerConfig::builder()
            .state(StateSpec::Pairs(vec![StatePair::new("state", 1)]))
            .mode(mode)
            .shards(1)
            .max_lanes(4)
            // Long: a turn starts when every held lane has a chunk queued.
            .linger(Duration::from_secs(3600))
            .build();
        let runner = LanedRunner::new(plan.clone(), config).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|s| {
                let runner = runner.clone();
                thread::spawn(move || {
                    thread::sleep(Duration::from_millis(if s < 4 { 0 } else { 5 * s as u64 }));
                    let mut handle = runner.spawn_timeout(Duration::from_secs(60)).unwrap();
                    let mut context = Context::default();
                    stream_audio(s)
                        .iter()
                        .map(|chunk| handle.call(context.inputs(chunk)).unwrap()[0].clone().into_tensor())
                        .collect::<Vec<Tensor>>()
                })
            })
            .collect();
        for (s, t) in threads.into_iter().enumerate() {
            let got = t.join().unwrap();
            assert_eq!(got, want[s], "{mode:?}: stream {s} ({:?})", SOUNDS[s]);
        }
        let m = runner.metrics();
        let shared: u64 = m.occupancy.iter().skip(2).sum();
        assert!(
            shared > 0,
            "{mode:?}: some turns seat several streams: {:?}",
            m.occupancy
        );
        eprintln!(
            "{mode:?}: {} chunks in {} turns, occupancy {:?}",
            m.seats, m.turns, m.occupancy
        );
    }
    // The streams' audio differs, and so do their probabilities.
    assert_ne!(want[0], want[3]);
}
