//! `vad-server`'s protocol, [`Vad`]: binary frames of 16 kHz mono PCM
//! (little-endian `f32`, or `i16` with `?format=i16`) of any length, cut
//! into Silero's 512-sample chunks (keeping the model's 64 samples of
//! context), each answered `{"chunk": n, "probability": p}`, plus
//! `{"event": "speech_start" | "speech_end", "chunk": n}` by
//! [`Hysteresis`].

use axum::extract::ws::Message;
use laned_models::silero::{Context, CHUNK, CONTEXT};
use serde_json::{Map, Value};
use tract_core::internal::*;

use crate::protocol::{query_value, Conversation, Opened, Protocol};

/// Speech starts at a probability at or above this.
pub const START_THRESHOLD: f32 = 0.5;
/// Speech may end below this.
pub const END_THRESHOLD: f32 = 0.35;
/// Speech ends after this much audio below [`END_THRESHOLD`].
pub const MIN_SILENCE_MS: u64 = 100;

/// The sample format of a connection's binary frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Little-endian `f32`.
    F32,
    /// Little-endian `i16`, scaled by 1/32768.
    I16,
}

impl Format {
    pub(crate) fn parse(s: Option<&str>) -> Result<Format, String> {
        match s {
            None | Some("f32") | Some("f32le") => Ok(Format::F32),
            Some("i16") | Some("s16le") | Some("i16le") => Ok(Format::I16),
            Some(other) => Err(format!("unknown format {other:?}: f32 or i16")),
        }
    }

    fn width(self) -> usize {
        match self {
            Format::F32 => 4,
            Format::I16 => 2,
        }
    }

    pub(crate) fn decode(self, bytes: &[u8], out: &mut Vec<f32>) {
        match self {
            Format::F32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            Format::I16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0),
            ),
        }
    }
}

/// The sample format a query string asks for (`format=`).
pub(crate) fn format_of_query(query: Option<&str>) -> Result<Format, String> {
    let value = query_value(query, "format").map_err(|_| "format given more than once: give it once, f32 or i16")?;
    Format::parse(value)
}

/// Speech start / end with hysteresis, over per-chunk probabilities.
#[derive(Debug, Clone, Default)]
pub struct Hysteresis {
    pub(crate) speaking: bool,
    pub(crate) silence_from: Option<u64>,
}

/// A speech event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Speech started at this chunk.
    Start(u64),
    /// Speech ended: silence started at this chunk (and lasted long enough).
    End(u64),
}

impl Hysteresis {
    /// Feeds chunk `n`'s probability; the event it triggers, if any.
    pub fn feed(&mut self, n: u64, p: f32) -> Option<Event> {
        let min_silence_chunks = (MIN_SILENCE_MS * 16).div_ceil(CHUNK as u64);
        if p >= START_THRESHOLD {
            self.silence_from = None;
            if !self.speaking {
                self.speaking = true;
                return Some(Event::Start(n));
            }
        } else if self.speaking && p < END_THRESHOLD {
            let from = *self.silence_from.get_or_insert(n);
            if n + 1 - from >= min_silence_chunks {
                self.speaking = false;
                self.silence_from = None;
                return Some(Event::End(from));
            }
        }
        None
    }
}

/// Silero VAD over PCM: `vad-server`'s protocol.
#[derive(Debug, Clone, Copy, Default)]
pub struct Vad;

impl Protocol for Vad {
    fn name(&self) -> &'static str {
        "vad"
    }

    fn open(&self, query: Option<&str>) -> Result<Box<dyn Conversation>, String> {
        Ok(Box::new(VadStream {
            format: format_of_query(query)?,
            context: Context::default(),
            pending: Vec::new(),
            hysteresis: Hysteresis::default(),
        }))
    }
}

/// One connection's audio: samples not yet a chunk, the context, the
/// hysteresis.
struct VadStream {
    format: Format,
    context: Context,
    pending: Vec<f32>,
    hysteresis: Hysteresis,
}

impl Conversation for VadStream {
    fn hello(&self, _id: Option<&str>, opened: &Opened) -> Option<String> {
        let mut hello = serde_json::json!({ "resume": opened.resume });
        if let Some(generation) = opened.generation {
            hello["generation"] = generation.into();
        }
        if let Some(why) = opened.restarted {
            hello["restarted"] = why.into();
        }
        opened.handing.then(|| hello.to_string())
    }

    fn take(&mut self, frame: &[u8]) -> Result<(), String> {
        if !frame.len().is_multiple_of(self.format.width()) {
            return Err(format!(
                "{} bytes is not a whole number of {:?} samples",
                frame.len(),
                self.format
            ));
        }
        self.format.decode(frame, &mut self.pending);
        Ok(())
    }

    fn next_call(&mut self) -> Option<TVec<TValue>> {
        if self.pending.len() < CHUNK {
            return None;
        }
        let chunk: Vec<f32> = self.pending.drain(..CHUNK).collect();
        Some(self.context.inputs(&chunk))
    }

    fn answer(&mut self, n: u64, outputs: TVec<TValue>) -> Result<Vec<Message>, String> {
        let p = outputs[0]
            .to_plain_array_view::<f32>()
            .ok()
            .and_then(|a| a.iter().next().copied())
            .unwrap_or(f32::NAN);
        let mut replies = vec![Message::Text(format!("{{\"chunk\":{n},\"probability\":{p}}}").into())];
        match self.hysteresis.feed(n, p) {
            Some(Event::Start(c)) => replies.push(Message::Text(
                format!("{{\"event\":\"speech_start\",\"chunk\":{c}}}").into(),
            )),
            Some(Event::End(c)) => replies.push(Message::Text(
                format!("{{\"event\":\"speech_end\",\"chunk\":{c}}}").into(),
            )),
            None => {}
        }
        Ok(replies)
    }

    fn text_refused(&self) -> &'static str {
        "text frames are not audio: send binary PCM"
    }

    fn save(&self) -> Map<String, Value> {
        let mut m = Map::new();
        let context: Vec<u32> = self.context.samples().iter().map(|s| s.to_bits()).collect();
        m.insert("context".into(), context.into());
        m.insert("speaking".into(), self.hysteresis.speaking.into());
        m.insert("silence_from".into(), self.hysteresis.silence_from.into());
        m
    }

    fn restore(&mut self, saved: &Map<String, Value>, at: u64) -> Result<(), String> {
        let (context, hysteresis) = restored(saved, at)?;
        self.context = context;
        self.hysteresis = hysteresis;
        Ok(())
    }
}

/// The context and hysteresis a record keeps, checked: the samples (as
/// `f32` bits, exact) finite and [`CONTEXT`] of them, silence only in
/// speech and not past the position `at`, no other field.
fn restored(saved: &Map<String, Value>, at: u64) -> Result<(Context, Hysteresis), String> {
    if let Some(other) = saved
        .keys()
        .find(|k| !matches!(k.as_str(), "context" | "speaking" | "silence_from"))
    {
        return Err(format!("an unknown field {other:?}"));
    }
    let bits: Vec<u32> = saved
        .get("context")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .ok_or("no context of f32 bits")?;
    if bits.len() != CONTEXT {
        return Err(format!("a context of {} samples, {CONTEXT} expected", bits.len()));
    }
    let samples: Vec<f32> = bits.iter().map(|b| f32::from_bits(*b)).collect();
    if samples.iter().any(|s| !s.is_finite()) {
        return Err("a context sample that is not a finite number".into());
    }
    let speaking = saved
        .get("speaking")
        .and_then(Value::as_bool)
        .ok_or("no speaking flag")?;
    let silence_from = match saved.get("silence_from") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or("a silence_from that is not a position")?),
    };
    match silence_from {
        Some(from) if !speaking => return Err(format!("silence from chunk {from} while not in speech")),
        Some(from) if from > at => {
            return Err(format!("silence from chunk {from}, past the position (chunk {at})"));
        }
        _ => (),
    }
    let context = Context::from_samples(samples).expect("the length is checked");
    Ok((context, Hysteresis { speaking, silence_from }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `format=` read from a raw query: absent, given once, unknown,
    /// repeated.
    #[test]
    fn the_format_comes_from_the_query_once() {
        assert_eq!(format_of_query(None), Ok(Format::F32));
        assert_eq!(format_of_query(Some("format=i16")), Ok(Format::I16));
        assert_eq!(format_of_query(Some("x=1&format=i16&y")), Ok(Format::I16));
        assert!(format_of_query(Some("format=u8"))
            .unwrap_err()
            .contains("unknown format"));
        let twice = format_of_query(Some("format=i16&format=i16")).unwrap_err();
        assert!(twice.contains("more than once"), "{twice}");
    }

    #[test]
    fn hysteresis_starts_at_half_and_ends_after_100ms_below_035() {
        let mut h = Hysteresis::default();
        let ps = [0.1, 0.6, 0.4, 0.3, 0.3, 0.45, 0.3, 0.2, 0.1, 0.1, 0.9];
        let events: Vec<Event> = ps
            .iter()
            .enumerate()
            .filter_map(|(n, p)| h.feed(n as u64, *p))
            .collect();
        // 0.45 (between the thresholds) does not reset the silence: it
        // started at chunk 3, and 4 chunks (128 ms >= 100 ms) end it at 6.
        assert_eq!(events, vec![Event::Start(1), Event::End(3), Event::Start(10)]);
    }

    #[test]
    fn formats() {
        assert_eq!(Format::parse(None), Ok(Format::F32));
        assert_eq!(Format::parse(Some("i16")), Ok(Format::I16));
        assert!(Format::parse(Some("mp3")).is_err());
        let mut out = Vec::new();
        Format::I16.decode(&[0, 0x80, 0, 0x40], &mut out);
        assert_eq!(out, vec![-1.0, 0.5]);
    }

    /// What a record keeps of a stream's audio reads back exactly, and a
    /// field missing, unknown or out of range is refused naming it, the
    /// stream left as it was.
    #[test]
    fn the_context_and_hysteresis_travel_and_are_checked() {
        let mut a = Vad.open(None).unwrap();
        a.take(&[0x00, 0x00, 0x80, 0x3e].repeat(CHUNK)).unwrap();
        a.next_call().unwrap();
        let saved = a.save();
        let mut b = Vad.open(None).unwrap();
        b.restore(&saved, 1).unwrap();
        assert_eq!(b.save(), saved);
        let refused = |change: &dyn Fn(&mut Map<String, Value>), at: u64, words: &str| {
            let mut m = saved.clone();
            change(&mut m);
            let mut c = Vad.open(None).unwrap();
            let e = c.restore(&m, at).unwrap_err();
            assert!(e.contains(words), "{e:?} should say {words:?}");
            assert_eq!(c.save(), Vad.open(None).unwrap().save(), "left as it was");
        };
        refused(&|m| m["silence_from"] = 0.into(), 5, "while not in speech");
        refused(
            &|m| {
                m["speaking"] = true.into();
                m["silence_from"] = (1u64 << 60).into();
            },
            5,
            "past the position",
        );
        refused(&|m| m["context"][0] = f32::NAN.to_bits().into(), 5, "finite");
        refused(&|m| drop(m["context"].as_array_mut().unwrap().pop()), 5, "63 samples");
        refused(&|m| drop(m.insert("extra".into(), 1.into())), 5, "unknown field");
        refused(&|m| drop(m.remove("speaking")), 5, "speaking");
    }
}
