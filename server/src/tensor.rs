//! `laned serve`'s protocol, [`Tensors`]: any model, a binary frame a
//! pulse, a frame an answer. Protocol version [`PROTOCOL_VERSION`]:
//!
//! 1. After the upgrade the server sends one text message, the hello:
//!    `{"protocol": 1, "model": NAME, "stream": ID or null, "resume": N,
//!    "format": "binary" | "json", "inputs": [PORT...], "outputs":
//!    [PORT...]}`, each port `{"index", "name", "dtype", "shape"}` (one
//!    stream's shape, 1 on the batch axis). A client resends from pulse
//!    `resume` (0 for a fresh stream). A model fed audio (its spec's
//!    `[model.audio]`, or a built-in's) adds `"audio": {"sample_rate",
//!    "hop", "context"}`: pulse `k` is the `context` samples before sample
//!    `k * hop` (zeros before the first), then `hop` new samples.
//! 2. The client sends one binary frame a pulse: every input of `inputs`
//!    in order, each its `shape`'s elements in row-major order,
//!    little-endian, of its `dtype` (booleans one byte). A frame longer
//!    than one pulse is refused 1009 (too big); a shorter non-empty one
//!    1003, naming both lengths; an empty frame is no pulse: it is
//!    skipped and spent from the control-frame budget, as a ping is.
//! 3. The server answers each pulse, in order, with one binary frame:
//!    every output of `outputs` likewise. With `?format=json`, a text
//!    message `{"pulse": n, "outputs": [[...], ...]}` instead, each output
//!    flattened, each element a JSON number where it is finite and else
//!    one of the strings `"NaN"`, `"Infinity"`, `"-Infinity"` (JSON has
//!    no number for them; these are the names JavaScript's `Number()` and
//!    Python's `float()` read back). Integers and booleans are numbers.
//!
//! Close codes, limits and the hand-over are the session's, the same as
//! `vad-server`'s ([`crate::close`]).

use std::sync::Arc;

use axum::extract::ws::Message;
use laned_models::spec::Interface;
use serde_json::{json, Map, Value};
use tract_core::internal::*;

use crate::protocol::{query_value, Conversation, Opened, Protocol};

/// The version of the protocol the hello announces.
pub const PROTOCOL_VERSION: u32 = 1;

/// Any model's pulses as tensor bytes.
#[derive(Debug, Clone)]
pub struct Tensors {
    name: String,
    interface: Arc<Interface>,
}

impl Tensors {
    /// The protocol of model `name`, whose streams feed and get what
    /// `interface` says.
    pub fn new(name: &str, interface: Interface) -> Tensors {
        Tensors {
            name: name.to_string(),
            interface: Arc::new(interface),
        }
    }

    /// What a stream feeds and gets.
    pub fn interface(&self) -> &Interface {
        &self.interface
    }
}

impl Protocol for Tensors {
    fn name(&self) -> &'static str {
        "tensor"
    }

    fn open(&self, query: Option<&str>) -> Result<Box<dyn Conversation>, String> {
        let json = match query_value(query, "format")? {
            None | Some("binary") => false,
            Some("json") => true,
            Some(other) => return Err(format!("unknown format {other:?}: binary or json")),
        };
        Ok(Box::new(TensorStream {
            protocol: self.clone(),
            json,
            pending: None,
        }))
    }

    fn interface(&self) -> Option<&Interface> {
        Some(&self.interface)
    }

    fn max_frame_bytes(&self) -> Option<usize> {
        Some(self.interface.pulse_bytes())
    }
}

/// One connection: the pulse taken and not yet called.
struct TensorStream {
    protocol: Tensors,
    json: bool,
    pending: Option<TVec<TValue>>,
}

impl Conversation for TensorStream {
    fn hello(&self, id: Option<&str>, opened: &Opened) -> Option<String> {
        let i = &self.protocol.interface;
        let mut hello = json!({
            "protocol": PROTOCOL_VERSION,
            "model": self.protocol.name,
            "stream": id,
            "resume": opened.resume,
            "format": if self.json { "json" } else { "binary" },
            "inputs": i.inputs,
            "outputs": i.outputs,
        });
        if let Some(audio) = &i.audio {
            hello["audio"] = json!(audio);
        }
        if let Some(generation) = opened.generation {
            hello["generation"] = json!(generation);
        }
        if let Some(why) = opened.restarted {
            hello["restarted"] = json!(why);
        }
        Some(hello.to_string())
    }

    fn take(&mut self, frame: &[u8]) -> Result<(), String> {
        // One frame, one pulse: the session calls between frames.
        debug_assert!(self.pending.is_none());
        self.pending = Some(self.protocol.interface.call_inputs(frame)?);
        Ok(())
    }

    fn next_call(&mut self) -> Option<TVec<TValue>> {
        self.pending.take()
    }

    fn answer(&mut self, n: u64, outputs: TVec<TValue>) -> Result<Vec<Message>, String> {
        let i = &self.protocol.interface;
        Ok(vec![if self.json {
            let outputs: Vec<Vec<Value>> = i
                .answer_json(&outputs)?
                .into_iter()
                .map(|o| o.into_iter().map(json_number).collect())
                .collect();
            Message::Text(json!({ "pulse": n, "outputs": outputs }).to_string().into())
        } else {
            Message::Binary(i.answer_bytes(&outputs)?.into())
        }])
    }

    fn text_refused(&self) -> &'static str {
        "text frames are not pulses: send one binary frame a pulse"
    }

    fn save(&self) -> Map<String, Value> {
        Map::new()
    }

    fn restore(&mut self, saved: &Map<String, Value>, _at: u64) -> Result<(), String> {
        match saved.keys().next() {
            Some(other) => Err(format!("an unknown field {other:?}")),
            None => Ok(()),
        }
    }
}

/// One answer element in JSON: a number where it is finite, else the name
/// `float()` and `Number()` read back (serde_json would write `null` for
/// all three, and they would be one).
fn json_number(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else if x.is_nan() {
        Value::from("NaN")
    } else if x > 0.0 {
        Value::from("Infinity")
    } else {
        Value::from("-Infinity")
    }
}

#[cfg(test)]
mod tests {
    use super::json_number;

    /// NaN and both infinities stay three values, and finite ones numbers.
    #[test]
    fn non_finite_answers_keep_their_names() {
        assert_eq!(json_number(f64::NAN), "NaN");
        assert_eq!(json_number(f64::INFINITY), "Infinity");
        assert_eq!(json_number(f64::NEG_INFINITY), "-Infinity");
        assert_eq!(json_number(-0.5), serde_json::json!(-0.5));
        assert!(json_number(3.0).is_number());
    }
}
