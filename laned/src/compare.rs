//! Comparing two answers, as `laned check`'s probe and `laned bench`'s
//! exactness check do: bit for bit, or by how much they differ.

use tract_core::internal::*;

/// `None` where `a` and `b` are the same bit for bit; else the largest
/// absolute difference of their values (infinite where they are not both
/// f32 or their shapes differ) and the largest magnitude in `a`.
pub fn difference(a: &Tensor, b: &Tensor) -> Option<(f32, f32)> {
    let floats = |t: &Tensor| -> Option<Vec<f32>> {
        (t.datum_type() == f32::datum_type())
            .then(|| t.try_as_plain_ram().ok()?.as_slice::<f32>().ok().map(<[f32]>::to_vec))
            .flatten()
    };
    match (floats(a), floats(b)) {
        (Some(x), Some(y)) if a.shape() == b.shape() => {
            if x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()) {
                return None;
            }
            let diff = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
            let scale = x.iter().map(|p| p.abs()).fold(0f32, f32::max);
            Some((diff, scale))
        }
        _ if a == b => None,
        _ => Some((f32::INFINITY, f32::NAN)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One bit off in one value is a difference, and by how much; the same
    /// values are none; another type or shape is an infinite one.
    #[test]
    fn a_bit_off_is_a_difference() {
        let a = tensor1(&[1f32, -2.0, 3.0]);
        assert_eq!(difference(&a, &a.clone()), None);
        let off = f32::from_bits(3f32.to_bits() + 1);
        let b = tensor1(&[1f32, -2.0, off]);
        assert_eq!(difference(&a, &b), Some((off - 3.0, 3.0)));
        assert_eq!(
            difference(&a, &tensor1(&[1f32, -2.0])).map(|d| d.0),
            Some(f32::INFINITY)
        );
        assert_eq!(difference(&tensor1(&[1i64]), &tensor1(&[1i64])), None);
        assert_eq!(
            difference(&tensor1(&[1i64]), &tensor1(&[2i64])).map(|d| d.0),
            Some(f32::INFINITY)
        );
    }
}
