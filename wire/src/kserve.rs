//! The KServe v2 (Open Inference Protocol) REST messages' format, as
//! Triton's clients (`tritonclient.http`) send and read them, with Triton's
//! sequence parameters and its binary tensor extension. What a request
//! must hold for a given model (its inputs' names, shapes, lengths) is the
//! server's check; these are the parts every model shares.
//!
//! An infer request (`POST /v2/models/NAME/infer`) is JSON: `{"id"?,
//! "parameters"?: {"sequence_id": int or string, "sequence_start": bool,
//! "sequence_end": bool, "binary_data_output": bool}, "inputs": [{"name",
//! "shape", "datatype", "data"? , "parameters"?: {"binary_data_size":
//! N}}], "outputs"?: [{"name", "parameters"?: {"binary_data": bool}}]}`.
//! With the binary extension, the header [`HEADER_LENGTH`] (`J`) says the
//! JSON is the body's first `J` bytes, and each input with a
//! `binary_data_size` takes that many bytes from what follows, in order
//! (little-endian, row-major). Each fed input of the model is given once,
//! by its name, its datatype as v2 names it ([`datatype`]: `FP32`,
//! `INT64`, ...), its shape one stream's (1 on the batch axis; [`shape`]).
//!
//! The answer: `{"model_name", "model_version": "1", "id"?, "parameters"?,
//! "outputs": [{"name", "datatype", "shape", "data"}]}`, an output's data
//! as JSON numbers ([`element`]), or binary (its
//! `parameters.binary_data_size`, the bytes after the JSON, the header
//! saying the JSON's length) where the request asked so for it or for all;
//! an output asked into shared memory has neither data nor parameters (as
//! Triton answers it). An error is `{"error": "..."}` ([`error`]).
//!
//! ```
//! use laned_wire::kserve::{self, SequenceId};
//! use serde_json::json;
//!
//! let request = json!({
//!     "parameters": {"sequence_id": 17, "sequence_start": true},
//!     "inputs": [{"name": "x", "datatype": "FP16", "shape": [1, 2], "data": [0.5, -2]}],
//! });
//! let id = SequenceId::from_json(request["parameters"].get("sequence_id")).unwrap();
//! assert_eq!(id, Some(SequenceId::Number(17)));
//! let input = &request["inputs"][0];
//! assert_eq!(kserve::shape(Some(&input["shape"])).unwrap(), [1, 2]);
//! let bytes = kserve::data_bytes(&input["data"], "f16").unwrap();
//! assert_eq!(bytes.len(), 4);
//! assert_eq!(kserve::element(&bytes[2..], "f16"), json!(-2.0));
//! ```

use half::f16;
use serde_json::{json, Value};

use crate::tensor::width;

/// The header giving the JSON part's length in a binary request or answer.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// The protocol extensions `laned serve` serves, as `GET /v2` lists them
/// (gRPC's `ServerMetadata` the same but `binary_tensor_data`, REST's
/// own).
pub const EXTENSIONS: &[&str] = &[
    "binary_tensor_data",
    "sequence",
    "statistics",
    "model_repository",
    "system_shared_memory",
];

/// A port's datatype as v2 names it, from the tensor protocol's name
/// ([`crate::tensor::DTYPES`]); `BYTES` for any other.
pub fn datatype(dtype: &str) -> &'static str {
    match dtype {
        "bool" => "BOOL",
        "u8" => "UINT8",
        "u16" => "UINT16",
        "u32" => "UINT32",
        "u64" => "UINT64",
        "i8" => "INT8",
        "i16" => "INT16",
        "i32" => "INT32",
        "i64" => "INT64",
        "f16" => "FP16",
        "f32" => "FP32",
        "f64" => "FP64",
        _ => "BYTES",
    }
}

/// A sequence's id, as Triton's are: a positive integer or a string, two
/// kinds (17 and `"17"` are two sequences; `0`, `""` or absent: none).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SequenceId {
    /// A positive integer.
    Number(u64),
    /// A non-empty string.
    Name(String),
}

impl SequenceId {
    /// The request parameter `sequence_id` (`None` where absent, `null`,
    /// `0` or `""`: no sequence).
    pub fn from_json(value: Option<&Value>) -> Result<Option<SequenceId>, SequenceIdError> {
        Ok(match value {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(0) => None,
                Some(n) => Some(SequenceId::Number(n)),
                None => return Err(SequenceIdError::NotPositive(n.to_string())),
            },
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(SequenceId::Name(s.clone())),
            Some(other) => return Err(SequenceIdError::NotAnId(other.to_string())),
        })
    }

    /// As the request gave it, for its answer's parameters.
    pub fn json(&self) -> Value {
        match self {
            SequenceId::Number(n) => json!(n),
            SequenceId::Name(s) => json!(s),
        }
    }
}

impl std::fmt::Display for SequenceId {
    /// A number as it is, a string quoted.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SequenceId::Number(n) => write!(f, "{n}"),
            SequenceId::Name(s) => write!(f, "{s:?}"),
        }
    }
}

/// Why a `sequence_id` is none ([`SequenceId::from_json`]); each names
/// the value as given.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SequenceIdError {
    /// A number that is not a positive integer (`-3`, `1.5`).
    NotPositive(String),
    /// Neither a number nor a string (`true`, `[1]`).
    NotAnId(String),
}

impl std::fmt::Display for SequenceIdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SequenceIdError::NotPositive(n) => {
                write!(f, "sequence_id {n}: wanted a positive integer or a string")
            }
            SequenceIdError::NotAnId(v) => write!(f, "sequence_id {v}: wanted an integer or a string"),
        }
    }
}

impl std::error::Error for SequenceIdError {}

/// An input's `shape`: a JSON array of integers, each entry checked (one
/// that is not an integer, `"x"` or `40.0`, is refused naming it, never
/// dropped).
pub fn shape(shape: Option<&Value>) -> Result<Vec<i64>, ShapeError> {
    let Some(shape) = shape else {
        return Err(ShapeError::Missing);
    };
    let Some(entries) = shape.as_array() else {
        return Err(ShapeError::NotAnArray(shape.to_string()));
    };
    entries
        .iter()
        .enumerate()
        .map(|(k, d)| {
            d.as_i64().ok_or_else(|| ShapeError::Entry {
                shape: shape.to_string(),
                entry: k,
                is: d.to_string(),
            })
        })
        .collect()
}

/// Why a `shape` is none ([`shape`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShapeError {
    /// The input has no `shape`.
    Missing,
    /// The shape (as given) is not an array.
    NotAnArray(String),
    /// An entry is not an integer.
    Entry {
        /// The shape as given.
        shape: String,
        /// The entry's position, from 0.
        entry: usize,
        /// The entry as given.
        is: String,
    },
}

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShapeError::Missing => write!(f, "no shape"),
            ShapeError::NotAnArray(shape) => write!(f, "shape {shape}, wanted an array of integers"),
            ShapeError::Entry { shape, entry, is } => {
                write!(f, "shape {shape}: entry {entry} is {is}, wanted an integer")
            }
        }
    }
}

impl std::error::Error for ShapeError {}

/// An input's JSON `data` (numbers or booleans, nested or flat) as the
/// little-endian bytes of `dtype` (the tensor protocol's name), row-major.
pub fn data_bytes(data: &Value, dtype: &str) -> Result<Vec<u8>, DataError> {
    let Some(w) = width(dtype) else {
        return Err(DataError::NotJson(dtype.to_string()));
    };
    let mut flat = Vec::new();
    fn walk<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        match v {
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            other => out.push(other),
        }
    }
    walk(data, &mut flat);
    let mut bytes = Vec::with_capacity(flat.len() * w);
    for v in flat {
        let x = match v {
            Value::Bool(b) => f64::from(u8::from(*b)),
            Value::Number(n) => n.as_f64().unwrap_or(0.0),
            other => return Err(DataError::NotANumber(other.to_string())),
        };
        match dtype {
            "bool" => bytes.push(u8::from(x != 0.0)),
            "u8" => bytes.push(x as u8),
            "i8" => bytes.push(x as i8 as u8),
            "u16" => bytes.extend((x as u16).to_le_bytes()),
            "i16" => bytes.extend((x as i16).to_le_bytes()),
            "u32" => bytes.extend((x as u32).to_le_bytes()),
            "i32" => bytes.extend((x as i32).to_le_bytes()),
            "u64" => bytes.extend((x as u64).to_le_bytes()),
            "i64" => bytes.extend(match v.as_i64() {
                Some(i) => i.to_le_bytes(),
                None => (x as i64).to_le_bytes(),
            }),
            "f16" => bytes.extend(f16::from_f64(x).to_le_bytes()),
            "f32" => bytes.extend((x as f32).to_le_bytes()),
            _ => bytes.extend(x.to_le_bytes()),
        }
    }
    Ok(bytes)
}

/// Why JSON `data` is no tensor's bytes ([`data_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataError {
    /// An element (as given) is neither a number nor a boolean.
    NotANumber(String),
    /// The dtype has no JSON form: its bytes go binary.
    NotJson(String),
}

impl std::fmt::Display for DataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataError::NotANumber(v) => write!(f, "a {v} in data: wanted numbers"),
            DataError::NotJson(dtype) => write!(f, "{dtype} cannot be given as JSON data: send it binary"),
        }
    }
}

impl std::error::Error for DataError {}

/// One element of `dtype` from its little-endian bytes (at least its
/// width), as an answer's JSON gives it: a number, a boolean, `null` for
/// a dtype with no JSON form.
pub fn element(bytes: &[u8], dtype: &str) -> Value {
    let b = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&bytes[..n]);
        a
    };
    match dtype {
        "bool" => json!(bytes[0] != 0),
        "u8" => json!(bytes[0]),
        "i8" => json!(bytes[0] as i8),
        "u16" => json!(u16::from_le_bytes([bytes[0], bytes[1]])),
        "i16" => json!(i16::from_le_bytes([bytes[0], bytes[1]])),
        "u32" => json!(u32::from_le_bytes(b(4)[..4].try_into().expect("4"))),
        "i32" => json!(i32::from_le_bytes(b(4)[..4].try_into().expect("4"))),
        "u64" => json!(u64::from_le_bytes(b(8))),
        "i64" => json!(i64::from_le_bytes(b(8))),
        // Every f16 is an f64 exactly, written as the shortest decimal that
        // reads back to it: read as f64 and rounded to f16, the same bits.
        "f16" => json!(f16::from_le_bytes([bytes[0], bytes[1]]).to_f64()),
        "f32" => json!(f32::from_le_bytes(b(4)[..4].try_into().expect("4"))),
        "f64" => json!(f64::from_le_bytes(b(8))),
        _ => Value::Null,
    }
}

/// An error's body.
pub fn error(why: &str) -> String {
    json!({ "error": why }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 68 row 7: a shape entry that is not an integer is refused
    /// naming the entry and what was wanted (it was dropped, and
    /// `[1, "x", 3]` read as `[1, 3]`).
    #[test]
    fn shape_entries_that_are_not_integers_are_refused() {
        let read = |text: &str| shape(Some(&serde_json::from_str(text).unwrap()));
        assert_eq!(read("[1,3]").unwrap(), [1, 3]);
        for (text, entry) in [
            ("[1,\"x\",3]", "entry 1 is \"x\""),
            ("[1,3.0]", "entry 1 is 3.0"),
            ("[null,1,3]", "entry 0 is null"),
        ] {
            let why = read(text).unwrap_err().to_string();
            assert!(
                why.contains(entry) && why.contains("wanted an integer"),
                "{text}: {why}"
            );
        }
        assert_eq!(read("\"1,3\"").unwrap_err(), ShapeError::NotAnArray("\"1,3\"".into()));
        assert_eq!(shape(None).unwrap_err().to_string(), "no shape");
    }

    /// Issue 68 row 6: every finite f16 written as a JSON number reads
    /// back, rounded to f16, as the same bits, and given back as data too.
    #[test]
    fn every_finite_f16_round_trips_through_json() {
        for bits in 0..=u16::MAX {
            let x = f16::from_bits(bits);
            if !x.is_finite() {
                continue;
            }
            let text = element(&bits.to_le_bytes(), "f16").to_string();
            let read: f64 = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{bits:#x}: {text}: {e}"));
            assert_eq!(f16::from_f64(read).to_bits(), bits, "{text}");
            assert_eq!(
                data_bytes(&serde_json::from_str(&text).unwrap(), "f16").unwrap(),
                bits.to_le_bytes()
            );
        }
    }

    /// Each dtype's elements round trip through JSON data and back.
    #[test]
    fn data_round_trips_every_dtype() {
        let data = json!([[0, 1], [true, 7]]);
        for dtype in crate::tensor::DTYPES {
            let bytes = data_bytes(&data, dtype).unwrap();
            let w = width(dtype).unwrap();
            assert_eq!(bytes.len(), 4 * w, "{dtype}");
            let back: Vec<f64> = bytes
                .chunks(w)
                .map(|e| match element(e, dtype) {
                    Value::Bool(b) => f64::from(u8::from(b)),
                    v => v.as_f64().unwrap(),
                })
                .collect();
            assert_eq!(
                back,
                [0.0, 1.0, 1.0, if *dtype == "bool" { 1.0 } else { 7.0 }],
                "{dtype}"
            );
        }
        assert_eq!(
            data_bytes(&json!([1, "2"]), "f32").unwrap_err().to_string(),
            "a \"2\" in data: wanted numbers"
        );
        assert_eq!(
            data_bytes(&json!([1]), "string").unwrap_err(),
            DataError::NotJson("string".into())
        );
    }

    /// Sequence ids: two kinds, none for 0, "" or null, the rest refused
    /// naming the value.
    #[test]
    fn sequence_ids_are_read_as_triton_reads_them() {
        let id = |v: Value| SequenceId::from_json(Some(&v));
        assert_eq!(id(json!(17)).unwrap(), Some(SequenceId::Number(17)));
        assert_eq!(id(json!("17")).unwrap(), Some(SequenceId::Name("17".into())));
        assert_ne!(id(json!(17)).unwrap(), id(json!("17")).unwrap());
        for none in [json!(0), json!(""), Value::Null] {
            assert_eq!(id(none).unwrap(), None);
        }
        assert_eq!(SequenceId::from_json(None).unwrap(), None);
        assert_eq!(
            id(json!(-3)).unwrap_err().to_string(),
            "sequence_id -3: wanted a positive integer or a string"
        );
        assert_eq!(id(json!(true)).unwrap_err(), SequenceIdError::NotAnId("true".into()));
        assert_eq!(SequenceId::Name("a".into()).to_string(), "\"a\"");
        assert_eq!(SequenceId::Number(4).json(), json!(4));
    }
}
