//! `laned serve`'s protocol, [`Tensors`]: any model, a binary frame a
//! pulse, a frame an answer. The format (the hello, the frames, the JSON
//! answers, the version) is [`laned_wire::tensor`]'s; this is the server's
//! side of it, a frame turned into a call and an answer into a frame.
//!
//! Close codes, limits and the hand-over are the session's, the same as
//! `vad-server`'s ([`laned_wire::close`]).

use std::sync::Arc;

use axum::extract::ws::Message;
use laned_models::spec::Interface;
use laned_wire::tensor::{json_number, PROTOCOL_VERSION};
use serde_json::{json, Map, Value};
use tract_core::internal::*;

use crate::protocol::{query_value, Conversation, Opened, Protocol};

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
