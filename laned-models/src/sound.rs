//! Generated audio at 16 kHz for the real-model tests: distinct, seeded
//! (`fastrand`'s generator: the same sounds on every machine), cheap.

use fastrand::Rng;

/// Uniform in [-1, 1).
fn uniform(rng: &mut Rng) -> f32 {
    rng.f32() * 2.0 - 1.0
}

/// The sample rate of every generated sound.
pub const SAMPLE_RATE: u32 = 16_000;

/// What a stream sounds like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sound {
    /// Zeros.
    Silence,
    /// A sine of this many hertz.
    Tone(u32),
    /// White noise.
    Noise,
    /// A voice-like buzz: a 120 Hz pulse train through a few formants,
    /// switched on and off every half second.
    Buzz,
    /// The buzz in loud white noise: what a noise suppressor is for.
    NoisyBuzz,
}

/// `len` samples of `sound`, seeded.
pub fn samples(sound: Sound, seed: u64, len: usize) -> Vec<f32> {
    let mut rng = Rng::with_seed(seed);
    let sr = SAMPLE_RATE as f32;
    let buzz = |t: f32, rng: &mut Rng| {
        let on = ((t * 2.0) as u32).is_multiple_of(2);
        let phase = (t * 120.0).fract();
        let pulse = if phase < 0.1 { 1.0 } else { 0.0 };
        let formants: f32 = [700.0f32, 1200.0, 2500.0]
            .iter()
            .map(|f| (std::f32::consts::TAU * f * t).sin() * (-phase * 8.0).exp())
            .sum();
        if on {
            0.2 * (pulse + 0.3 * formants) + 0.01 * uniform(rng)
        } else {
            0.01 * uniform(rng)
        }
    };
    (0..len)
        .map(|i| {
            let t = i as f32 / sr;
            match sound {
                Sound::Silence => 0.0,
                Sound::Tone(hz) => 0.3 * (std::f32::consts::TAU * hz as f32 * t).sin(),
                Sound::Noise => 0.2 * uniform(&mut rng),
                Sound::Buzz => buzz(t, &mut rng),
                Sound::NoisyBuzz => {
                    let b = buzz(t, &mut rng);
                    b + 0.1 * uniform(&mut rng)
                }
            }
        })
        .collect()
}

/// `text` spoken by `espeak-ng` (when installed: Debian's `espeak-ng`
/// package), at [`SAMPLE_RATE`], in [-1, 1]. `Err` says why not (no
/// espeak-ng, an unreadable file).
///
/// espeak-ng writes 16-bit mono WAV at 22 050 Hz; it is brought to 16 kHz
/// by linear interpolation (speech has little above 8 kHz to alias).
pub fn speak(text: &str) -> Result<Vec<f32>, String> {
    speak_at(text, SAMPLE_RATE)
}

/// [`speak`] at `rate` samples a second (48 kHz for DeepFilterNet3).
pub fn speak_at(text: &str, rate: u32) -> Result<Vec<f32>, String> {
    let dir = std::env::temp_dir().join(format!("laned-speak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let wav = dir.join(format!(
        "{:x}.wav",
        text.bytes().fold(0u64, |h, b| h.wrapping_mul(31) ^ b as u64)
    ));
    let out = std::process::Command::new("espeak-ng")
        .arg("-w")
        .arg(&wav)
        .arg(text)
        .output()
        .map_err(|e| format!("cannot run espeak-ng: {e}"));
    let read = out.and_then(|out| {
        if !out.status.success() {
            return Err(format!("espeak-ng failed ({})", out.status));
        }
        std::fs::read(&wav).map_err(|e| format!("reading {}: {e}", wav.display()))
    });
    let _ = std::fs::remove_dir_all(&dir);
    let (from, samples) = parse_wav(&read?)?;
    Ok(resample(&samples, from, rate))
}

/// The rate and samples (in [-1, 1]) of a 16-bit mono PCM WAV file.
fn parse_wav(bytes: &[u8]) -> Result<(u32, Vec<f32>), String> {
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err("not a WAV file".into());
    }
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let (mut at, mut rate) = (12, None);
    while at + 8 <= bytes.len() {
        let (id, len) = (&bytes[at..at + 4], u32_at(at + 4) as usize);
        let body = at + 8;
        if id == b"fmt " && body + 16 <= bytes.len() {
            let (format, channels, bits) = (u16_at(body), u16_at(body + 2), u16_at(body + 14));
            if (format, channels, bits) != (1, 1, 16) {
                return Err(format!(
                    "WAV of format {format}, {channels} channels, {bits} bits: not 16-bit mono PCM"
                ));
            }
            rate = Some(u32_at(body + 4));
        } else if id == b"data" {
            let rate = rate.ok_or("WAV data before its format")?;
            // A writer that could not seek back may leave the length open.
            let end = body.saturating_add(len).min(bytes.len());
            let samples = bytes[body..end]
                .chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0)
                .collect();
            return Ok((rate, samples));
        }
        at = body + len + (len & 1);
    }
    Err("WAV without data".into())
}

/// `x` at `from` Hz brought to `to` Hz by linear interpolation.
fn resample(x: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || x.is_empty() {
        return x.to_vec();
    }
    let n = (x.len() as u64 * to as u64 / from as u64) as usize;
    (0..n)
        .map(|i| {
            let t = i as f64 * from as f64 / to as f64;
            let (k, frac) = (t.floor() as usize, (t - t.floor()) as f32);
            let a = x[k.min(x.len() - 1)];
            let b = x[(k + 1).min(x.len() - 1)];
            a + (b - a) * frac
        })
        .collect()
}
