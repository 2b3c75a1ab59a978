//! The KServe v2 (Open Inference Protocol) REST front's requests checked
//! against a model, and their answers: what an infer request asks
//! (`Request::parse`, the whole request checked before any model runs)
//! and its answer's bytes (`answer`). The format every model shares (the
//! datatypes, sequence ids, shapes, JSON data, the binary extension's
//! header) is [`laned_wire::kserve`]'s; the routes and the sequences' life
//! are the server's and the session's.

use laned_models::spec::{Interface, Port};
use laned_wire::kserve::{data_bytes, datatype, element, SequenceId, HEADER_LENGTH};
use laned_wire::tensor::width;
use serde_json::{json, Map, Value};

/// A port's pulse in bytes: its elements times its dtype's width (8 for
/// a dtype the wire has no width for, as `BYTES`).
pub fn port_bytes(port: &Port) -> usize {
    port.len() * width(&port.dtype).unwrap_or(8)
}

/// A port as model metadata lists it: the batch axis `-1`.
pub fn metadata(port: &Port) -> Value {
    let mut shape: Vec<i64> = port.shape.iter().map(|d| *d as i64).collect();
    if let Some(first) = shape.first_mut() {
        *first = -1;
    }
    json!({ "name": port.name, "datatype": datatype(&port.dtype), "shape": shape })
}

/// Sequence `id`'s id among the model's streams (its records' key, the
/// one live stream an id may have): a string as it is (a WebSocket
/// stream's id is one), checked as stream ids are; a number `#N` (no
/// string id holds `#`).
pub fn stream_id(id: &SequenceId) -> Result<String, String> {
    match id {
        SequenceId::Name(s) => crate::handover::check_id(s).map(|()| s.clone()),
        SequenceId::Number(n) => Ok(format!("#{n}")),
        other => Err(format!("sequence id {other}: not a kind this server keeps")),
    }
}

/// What an infer request asks.
#[derive(Debug)]
pub struct Request {
    /// Its `id`, echoed.
    pub id: Option<Value>,
    /// Its sequence, where it names one.
    pub sequence: Option<SequenceId>,
    /// `sequence_start`.
    pub start: bool,
    /// `sequence_end`.
    pub end: bool,
    /// One pulse's bytes: every fed input, in the model's order.
    pub pulse: Vec<u8>,
    /// The outputs answered in binary (by index in the interface's outputs).
    pub binary: Vec<bool>,
    /// The outputs asked for (all where the request names none).
    pub wanted: Vec<bool>,
    /// The outputs asked into a shared memory region, checked (by index).
    pub(crate) shm_out: Vec<Option<crate::shm::Place>>,
}

/// A tensor's shared memory parameters (`shared_memory_region`,
/// `shared_memory_byte_size`, `shared_memory_offset`), where it has them:
/// its place, checked.
fn shm_place(
    regions: &crate::shm::Regions,
    what: &str,
    params: Option<&Map<String, Value>>,
) -> Result<Option<crate::shm::Place>, Refused> {
    let Some(p) = params else { return Ok(None) };
    let Some(region) = p.get("shared_memory_region") else {
        return Ok(None);
    };
    let region = region
        .as_str()
        .ok_or_else(|| Refused(format!("{what}: shared_memory_region {region}: wanted a string")))?;
    let number = |key: &str, default: Option<u64>| -> Result<u64, Refused> {
        match p.get(key) {
            None => default.ok_or_else(|| Refused(format!("{what}: shared_memory_region without {key}"))),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| Refused(format!("{what}: {key} {v}: wanted a non-negative integer"))),
        }
    };
    let byte_size = number("shared_memory_byte_size", None)?;
    let offset = number("shared_memory_offset", Some(0))?;
    regions
        .place(what, region, byte_size, offset)
        .map(Some)
        .map_err(Refused)
}

/// A refused request: why (the answer's `error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl Request {
    /// The request in `body` (its JSON the first `json_len` bytes where the
    /// binary extension's header says so) for a model fed `interface`.
    pub(crate) fn parse(
        body: &[u8],
        json_len: Option<usize>,
        interface: &Interface,
        regions: &crate::shm::Regions,
    ) -> Result<Request, Refused> {
        let refuse = |why: String| Refused(why);
        let json_len = json_len.unwrap_or(body.len());
        if json_len > body.len() {
            return Err(refuse(format!(
                "{HEADER_LENGTH} is {json_len}, the body {} bytes",
                body.len()
            )));
        }
        let (head, mut binary) = body.split_at(json_len);
        let head: Value = serde_json::from_slice(head).map_err(|e| refuse(format!("the request's JSON: {e}")))?;
        let params = head
            .get("parameters")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let flag = |m: &Map<String, Value>, name: &str| m.get(name).and_then(Value::as_bool).unwrap_or(false);
        let sequence = SequenceId::from_json(params.get("sequence_id")).map_err(|e| refuse(e.to_string()))?;
        let inputs = head
            .get("inputs")
            .and_then(Value::as_array)
            .ok_or_else(|| refuse("the request has no \"inputs\" array".into()))?;
        let mut pulse = Pulse::new(interface);
        for input in inputs {
            let name = input.get("name").and_then(Value::as_str).unwrap_or("");
            let got_type = input.get("datatype").and_then(Value::as_str).unwrap_or("");
            let shape =
                laned_wire::kserve::shape(input.get("shape")).map_err(|e| refuse(format!("input {name:?}: {e}")))?;
            let k = pulse.port(name, got_type, &shape)?;
            let in_params = input.get("parameters").and_then(Value::as_object);
            let shm = shm_place(regions, &format!("input {name:?}"), in_params)?;
            let bytes = match shm {
                Some(place) => {
                    let port = &interface.inputs[k];
                    place
                        .input(&format!("input {name:?}"), port_bytes(port))
                        .map_err(Refused)?
                }
                None => match in_params
                    .and_then(|p| p.get("binary_data_size"))
                    .and_then(Value::as_u64)
                {
                    Some(n) => {
                        let n = n as usize;
                        if n > binary.len() {
                            return Err(refuse(format!(
                                "input {name:?}: binary_data_size {n}, {} bytes left in the body",
                                binary.len()
                            )));
                        }
                        let (mine, rest) = binary.split_at(n);
                        binary = rest;
                        mine.to_vec()
                    }
                    None => {
                        let data = input
                            .get("data")
                            .ok_or_else(|| refuse(format!("input {name:?}: no data and no binary_data_size")))?;
                        let dtype = &interface.inputs[k].dtype;
                        data_bytes(data, dtype).map_err(|why| refuse(format!("input {name:?}: {why}")))?
                    }
                },
            };
            pulse.give(k, bytes)?;
        }
        let pulse = pulse.finish()?;
        let all_binary = flag(&params, "binary_data_output");
        let mut binary = vec![all_binary; interface.outputs.len()];
        let mut wanted = vec![true; interface.outputs.len()];
        let mut shm_out = vec![None; interface.outputs.len()];
        if let Some(outputs) = head.get("outputs").and_then(Value::as_array) {
            wanted = vec![false; interface.outputs.len()];
            for o in outputs {
                let name = o.get("name").and_then(Value::as_str).unwrap_or("");
                let k = output(interface, name)?;
                wanted[k] = true;
                let what = format!("output {name:?}");
                if let Some(place) = shm_place(regions, &what, o.get("parameters").and_then(Value::as_object))? {
                    let port = &interface.outputs[k];
                    place.check_output(&what, port_bytes(port)).map_err(Refused)?;
                    shm_out[k] = Some(place);
                }
                if let Some(b) = o
                    .get("parameters")
                    .and_then(|p| p.get("binary_data"))
                    .and_then(Value::as_bool)
                {
                    binary[k] = b;
                }
            }
        }
        Ok(Request {
            id: head.get("id").cloned(),
            sequence,
            start: flag(&params, "sequence_start"),
            end: flag(&params, "sequence_end"),
            pulse,
            binary,
            wanted,
            shm_out,
        })
    }
}

/// The output `name` of the model (by its index), or a refusal naming it
/// and the model's outputs: every front checks a request's outputs by it,
/// before its pulse is called.
pub fn output(interface: &Interface, name: &str) -> Result<usize, Refused> {
    interface.outputs.iter().position(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = interface.outputs.iter().map(|p| p.name.as_str()).collect();
        Refused(format!(
            "unknown output {name:?}: the model's outputs are {}",
            names.join(", ")
        ))
    })
}

/// One pulse's inputs as a request gives them, each checked against the
/// model's fed inputs: its name, datatype and shape, then its bytes'
/// length; every input once. Shared by the REST and gRPC fronts.
#[derive(Debug)]
pub struct Pulse<'a> {
    interface: &'a Interface,
    given: Vec<Option<Vec<u8>>>,
}

impl<'a> Pulse<'a> {
    /// No input given yet.
    pub fn new(interface: &'a Interface) -> Pulse<'a> {
        Pulse {
            interface,
            given: vec![None; interface.inputs.len()],
        }
    }

    /// The fed input `name` is (by its index), once its datatype and shape
    /// are the model's.
    pub fn port(&self, name: &str, got_type: &str, shape: &[i64]) -> Result<usize, Refused> {
        let inputs = &self.interface.inputs;
        let Some(k) = inputs.iter().position(|p| p.name == name) else {
            let names: Vec<&str> = inputs.iter().map(|p| p.name.as_str()).collect();
            return Err(Refused(format!(
                "unknown input {name:?}: the model's inputs are {}",
                names.join(", ")
            )));
        };
        let port = &inputs[k];
        if self.given[k].is_some() {
            return Err(Refused(format!("input {name:?} given twice")));
        }
        let wanted_type = datatype(&port.dtype);
        if got_type != wanted_type {
            return Err(Refused(format!(
                "input {name:?}: datatype {got_type:?}, wanted {wanted_type:?}"
            )));
        }
        let want_shape: Vec<i64> = port.shape.iter().map(|d| *d as i64).collect();
        if shape != want_shape {
            return Err(Refused(format!(
                "input {name:?}: shape {shape:?}, wanted {want_shape:?} (one sequence's pulse, 1 on the batch axis)"
            )));
        }
        Ok(k)
    }

    /// Input `k`'s bytes (little-endian, row-major), checked by length.
    pub fn give(&mut self, k: usize, bytes: Vec<u8>) -> Result<(), Refused> {
        let port = &self.interface.inputs[k];
        let wanted = port_bytes(port);
        if bytes.len() != wanted {
            return Err(Refused(format!(
                "input {:?}: {} bytes of {}, wanted {wanted} ({:?})",
                port.name,
                bytes.len(),
                datatype(&port.dtype),
                port.shape
            )));
        }
        self.given[k] = Some(bytes);
        Ok(())
    }

    /// The pulse's bytes, every fed input in order; `Err` naming one not
    /// given.
    pub fn finish(self) -> Result<Vec<u8>, Refused> {
        if let Some(k) = self.given.iter().position(Option::is_none) {
            return Err(Refused(format!("input {:?} is missing", self.interface.inputs[k].name)));
        }
        Ok(self.given.into_iter().flatten().flatten().collect())
    }
}

/// The answer to `request` of model `model`: its JSON, and the binary part
/// (empty where every output is JSON); an output asked into shared memory
/// written there, its answer no data and no parameters (`Err` where the
/// region can no longer hold it).
pub(crate) fn answer(
    model: &str,
    request: &Request,
    interface: &Interface,
    answer_bytes: &[u8],
) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut outputs = Vec::new();
    let mut binary = Vec::new();
    let mut at = 0;
    for (k, port) in interface.outputs.iter().enumerate() {
        let n = port_bytes(port);
        let bytes = &answer_bytes[at..at + n];
        at += n;
        if !request.wanted[k] {
            continue;
        }
        let mut o = json!({ "name": port.name, "datatype": datatype(&port.dtype), "shape": port.shape });
        if let Some(place) = &request.shm_out[k] {
            // Its name, datatype and shape alone, as Triton answers it:
            // Triton's C++ client (perf_analyzer's) reads an output's
            // `parameters` as its binary data's and fails on one without
            // `binary_data_size`.
            place.region.write(place.offset, bytes)?;
        } else if request.binary[k] {
            o["parameters"] = json!({ "binary_data_size": n });
            binary.extend_from_slice(bytes);
        } else {
            let w = width(&port.dtype).unwrap_or(8);
            o["data"] = Value::Array(bytes.chunks(w).map(|e| element(e, &port.dtype)).collect());
        }
        outputs.push(o);
    }
    let mut head = json!({ "model_name": model, "model_version": "1", "outputs": outputs });
    if let Some(id) = &request.id {
        head["id"] = id.clone();
    }
    if let Some(s) = &request.sequence {
        head["parameters"] = json!({ "sequence_id": s.json() });
    }
    Ok((head.to_string().into_bytes(), binary))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use laned_models::spec::Loaded;
    use laned_runner::StateSpec;
    use tract_core::internal::*;

    use super::*;

    /// A model fed `x`, f32 [B, 3], answering `y`, its cast to f16, as
    /// `laned serve` serves it.
    fn interface() -> Interface {
        let mut model = TypedModel::default();
        let b = model.symbols.sym("B");
        let x = model.add_source("x", f32::fact(dims!(b.clone(), 3))).unwrap();
        let y = model
            .wire_node("y", tract_core::ops::cast::cast(f16::datum_type()), &[x])
            .unwrap();
        model.select_output_outlets(&y).unwrap();
        let plan: Arc<dyn Runnable> = DefaultRuntime.prepare(model.clone()).unwrap().into();
        let loaded = Loaded {
            plan,
            model: Some(model),
            batch: Some(b),
            facts: vec![],
            state: StateSpec::Pairs(vec![]),
            fills: vec![],
            audio: None,
        };
        Interface::of(&loaded, &[]).unwrap()
    }

    fn parse(json: &str) -> Result<Request, Refused> {
        Request::parse(json.as_bytes(), None, &interface(), &Default::default())
    }

    /// Issue 68 row 7: a shape entry that is not an integer is refused
    /// naming the input, the entry and what was wanted (it was dropped,
    /// and `[1, "x", 3]` read as `[1, 3]`).
    #[test]
    fn shape_entries_that_are_not_integers_are_refused() {
        let request =
            |shape: &str| format!(r#"{{"inputs":[{{"name":"x","datatype":"FP32","shape":{shape},"data":[1,2,3]}}]}}"#);
        parse(&request("[1,3]")).unwrap();
        for (shape, entry) in [
            ("[1,\"x\",3]", "entry 1 is \"x\""),
            ("[1,3.0]", "entry 1 is 3.0"),
            ("[null,1,3]", "entry 0 is null"),
        ] {
            let Refused(why) = parse(&request(shape)).unwrap_err();
            assert!(
                why.contains("input \"x\"") && why.contains(entry) && why.contains("wanted an integer"),
                "{shape}: {why}"
            );
        }
        let Refused(why) = parse(&request("\"1,3\"")).unwrap_err();
        assert!(why.contains("wanted an array of integers"), "{why}");
    }

    /// Issue 68 row 6: an FP16 output answered as JSON numbers (it was
    /// `null`), each read back as a number and rounded to f16 the same
    /// bits as the binary answer (every finite f16: `laned_wire::kserve`'s
    /// tests).
    #[test]
    fn fp16_answers_are_json_numbers_that_read_back_exactly() {
        let i = interface();
        let request =
            parse(r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[0.1,-2.5,65504]}]}"#).unwrap();
        let answer: Vec<u8> = [0.1f32, -2.5, 65504.0]
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect();
        let (head, binary) = answer_of(&request, &i, &answer);
        assert!(binary.is_empty());
        let data = &head["outputs"][0]["data"];
        assert_eq!(head["outputs"][0]["datatype"], "FP16", "{head}");
        let back: Vec<u8> = data
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|v| f16::from_f64(v.as_f64().unwrap_or_else(|| panic!("{head}"))).to_le_bytes())
            .collect();
        assert_eq!(back, answer, "{head}");
    }

    fn answer_of(request: &Request, i: &Interface, bytes: &[u8]) -> (Value, Vec<u8>) {
        let (head, binary) = answer("m", request, i, bytes).unwrap();
        (serde_json::from_slice(&head).unwrap(), binary)
    }
}
