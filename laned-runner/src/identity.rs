//! How a model's identity is computed: what identifies its explicit state
//! on the wire, so that a state exported by one runner is imported only by
//! a runner whose model computes the state the same way. The computation
//! only: the `wire` module calls it once, when the runner is built, keeps
//! the result and is its one reader (stamping exports, checking imports).
//!
//! The identity reads `name|pairs|weights W|graph G`:
//!
//! - `name`: the model's name (`unnamed` without one);
//! - `pairs`: each state input's name, datum type and shape;
//! - `W`: a digest of the weights: every `Const` node's tensor, every
//!   constant operand of an optimized matmul (unpacked, so that kernels of
//!   other machines pack the same value alike) and the weights of scan
//!   bodies;
//! - `G`: a digest of the graph: per node, its op's name and parameters,
//!   its inputs and its outputs' datum types and shapes, nested bodies
//!   (scans, if-then-else branches) walked the same way, so that the
//!   digest is the same in every process (a nested graph's printed form
//!   is not: its labels come in a hash map's order). Two models alike but for one op (`tanh` where the other has
//!   `sigmoid`) differ here. The ops that carry a kernel of this machine
//!   (an optimized matmul, the convolution's packing) are digested by what
//!   they compute, not by the kernel, so that the same model typed on
//!   another machine of the same architecture agrees; where the optimizer
//!   itself builds another graph, the identities differ and the state is
//!   refused (a fresh start), never taken wrongly.
//!
//! The graph digest joined the identity with [`STREAM_STATE_VERSION`] 2:
//! states of version 1 are refused by their version.
//!
//! [`STREAM_STATE_VERSION`]: crate::STREAM_STATE_VERSION

use tract_core::internal::*;

use crate::iface::{Port, StateIo};

/// The identity of `model`'s explicit state (this module's doc), its
/// inputs and state pairs as the runner's interface has them.
pub(crate) fn state_identity(model: Option<&TypedModel>, inputs: &[Port], state: &[StateIo]) -> String {
    let pairs: Vec<String> = state
        .iter()
        .map(|io| {
            let port = &inputs[io.input];
            let dims: Vec<String> = port.fact.shape.iter().map(|d| d.to_string()).collect();
            format!("{} {:?} {}", port.name, port.fact.datum_type, dims.join(","))
        })
        .collect();
    let (weights, graph) = match model {
        Some(m) => (weights_digest(m), graph_digest(m)),
        None => (Fnv1a::new().0, Fnv1a::new().0),
    };
    format!(
        "{}|{}|weights {weights:016x}|graph {graph:016x}",
        model.and_then(|m| m.name()).unwrap_or("unnamed"),
        pairs.join(";"),
    )
}

/// A digest of `model`'s graph: what computes, not the values it holds
/// (those are [`weights_digest`]'s).
fn graph_digest(model: &TypedModel) -> u64 {
    let mut h = Fnv1a::new();
    digest_graph(model, &mut h);
    h.0
}

/// [`graph_digest`]'s walk, in node order, nested bodies included.
fn digest_graph(model: &TypedModel, h: &mut Fnv1a) {
    use tract_core::ops::matmul::optimized::OptMatMul;
    h.u64(model.nodes().len() as u64);
    for node in model.nodes() {
        h.field(node.op.name().as_bytes());
        h.u64(node.inputs.len() as u64);
        for input in &node.inputs {
            h.u64(input.node as u64);
            h.u64(input.slot as u64);
        }
        for output in &node.outputs {
            h.field(format!("{:?}", output.fact.datum_type).as_bytes());
            let dims: Vec<String> = output.fact.shape.iter().map(|d| d.to_string()).collect();
            h.field(dims.join(",").as_bytes());
        }
        if node.op_is::<tract_core::ops::konst::Const>() {
            // Its value is the weights digest's.
        } else if let Some(mm) = node.op_as::<OptMatMul>() {
            digest_matmul(mm, h);
        } else if let Some(gru) = node.op_as::<tract_core::ops::gru_seq::GruSeq>() {
            // Its settings; its packed recurrent weights are the weights
            // digest's.
            h.field(
                format!(
                    "hidden {} bias {} chunk {} y {} reset {} projected {}",
                    gru.hidden, gru.has_bias, gru.chunk, gru.emit_y, gru.reset_every_turn, gru.projected
                )
                .as_bytes(),
            );
        } else if let Some(scan) = node.op_as::<tract_core::ops::scan::OptScan>() {
            digest_graph(scan.plan.model(), h);
        } else if let Some(scan) = node.op_as::<tract_core::ops::scan::Scan>() {
            digest_graph(&scan.body, h);
        } else if let Some(ite) = node.op_as::<tract_core::ops::logic::IfThenElse>() {
            h.field(format!("{:?} {:?}", ite.then_input_mapping, ite.else_input_mapping).as_bytes());
            digest_graph(&ite.then_body, h);
            digest_graph(&ite.else_body, h);
        } else if !KERNEL_OPS.contains(&&*node.op.name()) {
            // The op's parameters, as tract prints them; not a nested
            // graph's print, whose labels come in a hash map's order (a
            // different one in every process).
            let text = format!("{:?}", node.op);
            if !text.contains("outlet_labels") {
                h.field(text.as_bytes());
            }
        }
    }
}

/// Ops whose printed form names this machine's kernels or packing: their
/// name, inputs and outputs are digested, not their text.
const KERNEL_OPS: [&str; 5] = ["Im2col", "LazyIm2col", "OptMatMulPack", "OptSimpleMatMulPack", "QSumB"];

/// An optimized matmul by what it computes: its output fact and each fused
/// step (the product's depth, the element-wise ops fused after it), not
/// the kernel picked for this machine.
fn digest_matmul(mm: &tract_core::ops::matmul::optimized::OptMatMul, h: &mut Fnv1a) {
    use tract_core::ops::matmul::optimized::ProtoFusedSpec;
    h.field(format!("{:?}", mm.c_fact).as_bytes());
    for op in &mm.micro_ops {
        let text = match op {
            ProtoFusedSpec::AddMatMul { geo, .. } => format!(
                "matmul k={} a{:?} b{:?}",
                geo.k, geo.c_to_a_axis_mapping, geo.c_to_b_axis_mapping
            ),
            ProtoFusedSpec::Store(_) => "store".to_string(),
            other => format!("{other:?}"),
        };
        h.field(text.as_bytes());
    }
}

/// FNV-1a over 64 bits: small, and the same in every process, build and
/// Rust version (std's `DefaultHasher` promises none of these).
pub(crate) struct Fnv1a(u64);

impl Fnv1a {
    /// The digest of nothing yet.
    fn new() -> Fnv1a {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    /// `n` as eight little-endian bytes, whatever the machine.
    fn u64(&mut self, n: u64) {
        std::hash::Hasher::write(self, &n.to_le_bytes());
    }

    /// `bytes` behind their length, so that fields never run together.
    fn field(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        std::hash::Hasher::write(self, bytes);
    }
}

impl std::hash::Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A digest of `model`'s weights, in node order: every `Const` node's
/// tensor, every constant operand of an optimized matmul and the weights of
/// scan bodies, so that two models alike but for their weights differ.
fn weights_digest(model: &TypedModel) -> u64 {
    let mut h = Fnv1a::new();
    digest_model(model, &mut h);
    h.0
}

/// [`weights_digest`]'s walk, nested models included.
fn digest_model(model: &TypedModel, h: &mut Fnv1a) {
    use tract_core::ops::matmul::optimized::{MatMulOperand, OptMatMul, ProtoFusedSpec};
    for node in model.nodes() {
        if let Some(konst) = node.op_as::<tract_core::ops::konst::Const>() {
            digest_tensor(konst.val(), h);
        } else if let Some(mm) = node.op_as::<OptMatMul>() {
            for op in &mm.micro_ops {
                if let ProtoFusedSpec::AddMatMul { a, b, .. } = op {
                    for operand in [a, b] {
                        if let MatMulOperand::Const(value) = operand {
                            digest_packed(&**value, h);
                        }
                    }
                }
            }
        } else if let Some(gru) = node.op_as::<tract_core::ops::gru_seq::GruSeq>() {
            if let Some((_, _, packed)) = &gru.packed_r {
                digest_packed(&**packed, h);
            }
        } else if let Some(ite) = node.op_as::<tract_core::ops::logic::IfThenElse>() {
            digest_model(&ite.then_body, h);
            digest_model(&ite.else_body, h);
        } else if let Some(scan) = node.op_as::<tract_core::ops::scan::OptScan>() {
            digest_model(scan.plan.model(), h);
        } else if let Some(scan) = node.op_as::<tract_core::ops::scan::Scan>() {
            digest_model(&scan.body, h);
        }
    }
}

/// A tensor's datum type, shape and elements (numbers as little-endian
/// bytes, dims and strings as text, packed weights unpacked).
fn digest_tensor(t: &Tensor, h: &mut Fnv1a) {
    use std::hash::{Hash, Hasher};
    let dt = t.datum_type();
    h.field(format!("{dt:?}").as_bytes());
    h.u64(t.rank() as u64);
    t.shape().iter().for_each(|d| h.u64(*d as u64));
    if let Some(packed) = t.storage_as::<tract_core::tract_linalg::mmm::PackedMatrixStorage>() {
        packed.values().iter().for_each(|v| digest_packed(&**v, h));
        return;
    }
    let Ok(plain) = t.try_as_plain_ram() else {
        t.hash(h);
        return;
    };
    match dt {
        DatumType::TDim => plain
            .as_slice::<TDim>()
            .unwrap_or_default()
            .iter()
            .for_each(|d| h.field(d.to_string().as_bytes())),
        DatumType::String => plain
            .as_slice::<String>()
            .unwrap_or_default()
            .iter()
            .for_each(|s| h.field(s.as_bytes())),
        DatumType::Blob => plain
            .as_slice::<Blob>()
            .unwrap_or_default()
            .iter()
            .for_each(|b| h.field(b)),
        _ if cfg!(target_endian = "big") => plain
            .as_bytes()
            .chunks(dt.size_of().max(1))
            .for_each(|c| c.iter().rev().for_each(|b| h.write(&[*b]))),
        _ => h.write(plain.as_bytes()),
    }
}

/// Packed weights by their values, unpacked to `f32` row by row: kernels
/// of other machines pack other layouts of the same weights.
fn digest_packed(value: &dyn tract_core::tract_linalg::mmm::MMMInputValue, h: &mut Fnv1a) {
    use std::hash::{Hash, Hasher};
    h.u64(value.mn() as u64);
    h.u64(value.k() as u64);
    let mut row = vec![0f32; value.k()];
    for mn in 0..value.mn() {
        if value.extract_at_mn_f32(mn, &mut row).is_err() {
            // A format that cannot unpack: as tract hashes it.
            value.hash(h);
            return;
        }
        row.iter().for_each(|x| h.write(&x.to_le_bytes()));
    }
}
