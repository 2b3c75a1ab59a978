//! `laned serve`'s single-stream protocol (`GET /v1/models/NAME/stream`):
//! any model, a binary frame a pulse, a frame an answer. Protocol version
//! [`PROTOCOL_VERSION`]:
//!
//! 1. After the upgrade the server sends one text message, the hello:
//!    `{"protocol": 1, "model": NAME, "stream": ID or null, "resume": N,
//!    "format": "binary" | "json", "inputs": [PORT...], "outputs":
//!    [PORT...]}`, each port `{"index", "name", "dtype", "shape"}` (one
//!    stream's shape, 1 on the batch axis). A client resends from pulse
//!    `resume` (0 for a fresh stream). With a store and an id, also
//!    `"generation": G` (sent back as `x-resume-generation` when
//!    reconnecting) and, for a stream restarted at 0 though its client
//!    claimed a generation, `"restarted": WHY`. A model fed audio (its spec's
//!    `[model.audio]`, or a built-in's) adds `"audio": {"sample_rate",
//!    "hop", "context"}`: pulse `k` is the `context` samples before sample
//!    `k * hop` (zeros before the first), then `hop` new samples.
//! 2. The client sends one binary frame a pulse: every input of `inputs`
//!    in order, each its `shape`'s elements in row-major order,
//!    little-endian, of its `dtype` ([`width`] bytes each; booleans one
//!    byte). A frame longer than one pulse is refused 1009 (too big); a
//!    shorter non-empty one 1003, naming both lengths; an empty frame is
//!    no pulse: it is skipped and spent from the control-frame budget, as
//!    a ping is.
//! 3. The server answers each pulse, in order, with one binary frame:
//!    every output of `outputs` likewise. With `?format=json`, a text
//!    message `{"pulse": n, "outputs": [[...], ...]}` instead, each output
//!    flattened, each element a JSON number where it is finite and else
//!    one of the strings `"NaN"`, `"Infinity"`, `"-Infinity"`
//!    ([`json_number`]: JSON has no number for them; these are the names
//!    JavaScript's `Number()` and Python's `float()` read back). Integers
//!    and booleans are numbers.
//!
//! Close codes ([`crate::close`]), limits and the hand-over are the
//! server's session's, the same on every WebSocket front.
//!
//! ```
//! use laned_wire::tensor;
//!
//! // A pulse of a model fed one f32 [1, 40] and one i64 [1]: 168 bytes.
//! let inputs = [("f32", 40), ("i64", 1)];
//! let pulse: usize = inputs.iter().map(|(dtype, n)| n * tensor::width(dtype).unwrap()).sum();
//! assert_eq!(pulse, 168);
//! assert_eq!(tensor::json_number(f64::NEG_INFINITY), "-Infinity");
//! ```

use serde_json::Value;

/// The version of the protocol the hello announces.
pub const PROTOCOL_VERSION: u32 = 1;

/// The element types a port may have, by the name the hello gives them
/// (`"dtype"`).
pub const DTYPES: &[&str] = &[
    "bool", "u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64", "f16", "f32", "f64",
];

/// The bytes of one element of `dtype` (one of [`DTYPES`]); `None` for a
/// name that is none of them.
pub fn width(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "bool" | "u8" | "i8" => 1,
        "u16" | "i16" | "f16" => 2,
        "u32" | "i32" | "f32" => 4,
        "u64" | "i64" | "f64" => 8,
        _ => return None,
    })
}

/// One answer element in JSON: a number where it is finite, else the name
/// `float()` and `Number()` read back (serde_json would write `null` for
/// all three, and they would be one).
pub fn json_number(x: f64) -> Value {
    if x.is_finite() {
        Value::from(x)
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
    use super::*;

    /// NaN and both infinities stay three values, and finite ones numbers.
    #[test]
    fn non_finite_answers_keep_their_names() {
        assert_eq!(json_number(f64::NAN), "NaN");
        assert_eq!(json_number(f64::INFINITY), "Infinity");
        assert_eq!(json_number(f64::NEG_INFINITY), "-Infinity");
        assert_eq!(json_number(-0.5), serde_json::json!(-0.5));
        assert!(json_number(3.0).is_number());
    }

    /// Every dtype has a width, and nothing else does.
    #[test]
    fn every_dtype_has_a_width() {
        for d in DTYPES {
            assert!(width(d).is_some(), "{d}");
        }
        assert_eq!(width("string"), None);
        assert_eq!(width(""), None);
    }
}
