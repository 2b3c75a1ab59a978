//! The one checking function: every stream's outputs, call by call, equal
//! its solo run.

use std::fmt;

use tract_core::internal::*;

use crate::drive::Observed;

/// How close a laned output must be to the solo one. Exact by default; a
/// tolerance is for kernels whose summation order depends on the batch width.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tolerance {
    /// Every element bit for bit equal (f32 elements by their bits).
    Exact,
    /// `|laned - solo| <= abs + rel * |solo|`.
    Close {
        /// The absolute part of the bound.
        abs: f32,
        /// The part of the bound relative to the solo value.
        rel: f32,
    },
}

/// Where a stream first got something other than its solo run.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// The stream's index in the schedule.
    pub stream: usize,
    /// The index of the call, in the stream's order.
    pub call: usize,
    /// The index of the output, among the ones the caller gets.
    pub output: usize,
    /// The seating of the turn, where the driver knows it.
    pub seating: String,
    /// What differs: the count, the shape, or the first differing element.
    pub detail: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stream {} call {} output {}: {} (seating: {})",
            self.stream, self.call, self.output, self.detail, self.seating
        )
    }
}

impl std::error::Error for Mismatch {}

/// Compare `observed` with `expected` (from [`solo`](crate::drive::solo)).
pub fn check(expected: &[Vec<TVec<TValue>>], observed: &Observed, tolerance: Tolerance) -> Result<(), Mismatch> {
    let mismatch = |stream: usize, call: usize, output: usize, detail: String| Mismatch {
        stream,
        call,
        output,
        seating: observed.seating_of(stream, call),
        detail,
    };
    if expected.len() != observed.outputs.len() {
        return Err(mismatch(
            0,
            0,
            0,
            format!(
                "{} streams expected, {} observed",
                expected.len(),
                observed.outputs.len()
            ),
        ));
    }
    for (stream, (want, got)) in expected.iter().zip(&observed.outputs).enumerate() {
        if want.len() != got.len() {
            return Err(mismatch(
                stream,
                got.len().min(want.len()),
                0,
                format!("{} calls expected, {} answered", want.len(), got.len()),
            ));
        }
        for (call, (want, got)) in want.iter().zip(got).enumerate() {
            if want.len() != got.len() {
                return Err(mismatch(
                    stream,
                    call,
                    0,
                    format!("{} outputs expected, {} answered", want.len(), got.len()),
                ));
            }
            for (output, (want, got)) in want.iter().zip(got).enumerate() {
                if let Some(detail) = differ(want, got, tolerance) {
                    return Err(mismatch(stream, call, output, detail));
                }
            }
        }
    }
    Ok(())
}

/// The first difference between `want` and `got`, if any.
fn differ(want: &Tensor, got: &Tensor, tolerance: Tolerance) -> Option<String> {
    if want.shape() != got.shape() || want.datum_type() != got.datum_type() {
        return Some(format!(
            "shape {:?} {:?} expected, {:?} {:?} answered",
            want.datum_type(),
            want.shape(),
            got.datum_type(),
            got.shape()
        ));
    }
    if want.datum_type() != f32::datum_type() {
        return (want != got).then(|| "values differ".to_string());
    }
    let (Ok(w), Ok(g)) = (want.to_plain_array_view::<f32>(), got.to_plain_array_view::<f32>()) else {
        return (want != got).then(|| "values differ".to_string());
    };
    for (ix, (a, b)) in w.iter().zip(g).enumerate() {
        let same = match tolerance {
            Tolerance::Exact => a.to_bits() == b.to_bits(),
            Tolerance::Close { abs, rel } => (a - b).abs() <= abs + rel * a.abs(),
        };
        if !same {
            return Some(format!("element {ix} is {b:?}, solo gives {a:?}"));
        }
    }
    None
}
