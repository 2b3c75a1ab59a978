//! The seed's bug, for real, with tract-linalg kernels: stores carry strides
//! derived from the output's shape and panel strides from the kernel's tile,
//! so a store reused across a change of either writes the wrong places. The
//! memo keyed by shape and kernel gets every product right; deliberately
//! blind memos (test-only) get them wrong, proving the test can fail.

use std::collections::HashMap;

use kernel_memo::linalg::{Axes, KernelId, StoreMemo};
use kernel_memo::MemoConfig;
use tract_data::internal::*;
use tract_linalg::mmm::{AsInputValue, FusedSpec, MatMatMul, OutputStore};

/// The f32 kernels this machine runs, with distinct tiles first.
fn f32_kernels() -> Vec<Box<dyn MatMatMul>> {
    let mut kernels: Vec<Box<dyn MatMatMul>> = tract_linalg::mmm_routines::declared()
        .map(|r| (r.make)())
        .filter(|k| {
            k.runnable()
                && !k.emulated()
                && k.internal_type() == f32::datum_type()
                && k.stores().contains(&f32::datum_type())
        })
        .filter(|k| {
            let (a, b) = &k.packings()[0];
            a.to_string().contains("F32") && b.to_string().contains("F32")
        })
        .collect();
    kernels.sort_by_key(|k| (k.mr(), k.nr()));
    kernels.dedup_by_key(|k| (k.mr(), k.nr()));
    kernels
}

/// Seeded values in [-1, 1): what the bug needs is any matrices whose
/// products differ where a stale layout writes, not particular values.
fn random(shape: &[usize], seed: u64) -> Tensor {
    let mut rng = fastrand::Rng::with_seed(seed);
    let values: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| rng.f32() * 2.0 - 1.0)
        .collect();
    Tensor::from_shape(shape, &values).unwrap()
}

/// a [m, k] x b [k, n], naively, as [n, m]: the output keeps m on axis 1, so
/// its column stride is m: the extent that changes from turn to turn.
fn reference(a: &Tensor, b: &Tensor) -> Vec<f32> {
    let (a, b) = (
        a.to_plain_array_view::<f32>().unwrap(),
        b.to_plain_array_view::<f32>().unwrap(),
    );
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let mut c = vec![0f32; n * m];
    for i in 0..m {
        for j in 0..n {
            c[j * m + i] = (0..k).map(|l| a[[i, l]] * b[[l, j]]).sum();
        }
    }
    c
}

/// Runs a x b with `mmm` into a fresh [n, m] output, its store from `store`.
fn product(mmm: &dyn MatMatMul, a: &Tensor, b: &Tensor, store: &mut dyn FnMut(&TensorView) -> OutputStore) -> Vec<f32> {
    let (m, n) = (a.shape()[0], b.shape()[1]);
    let (pack_a, pack_b) = &mmm.packings()[0];
    let pa = pack_a.prepare_one(a, 1, 0).unwrap();
    let pb = pack_b.prepare_one(b, 0, 1).unwrap();
    let mut c = Tensor::zero::<f32>(&[n, m]).unwrap();
    unsafe {
        let view = c.view_mut();
        let ops = [
            FusedSpec::AddMatMul {
                a: AsInputValue::Borrowed(&*pa),
                b: AsInputValue::Borrowed(&*pb),
                packing: 0,
            },
            FusedSpec::Store(store(&view)),
        ];
        mmm.run(m, n, &ops).unwrap();
    }
    c.to_plain_array_view::<f32>().unwrap().iter().copied().collect()
}

fn close(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= 1e-4 * (1.0 + w.abs()))
}

const AXES: Axes = Axes { m: 1, n: 0 };

/// Occupancy 3, then 5, then 3 again, through one memo: right every time;
/// through a memo blind to the shape: wrong once the extent changes.
#[test]
fn a_turn_of_another_extent_never_reads_an_old_layout() {
    let kernels = f32_kernels();
    let mmm = &*kernels[0];
    let (k, n) = (7, 6);
    let b = random(&[k, n], 1);
    let mut memo: StoreMemo<&str> = StoreMemo::new(MemoConfig::new(2));
    let mut blind: HashMap<&str, OutputStore> = HashMap::new();
    let mut blind_was_wrong = false;
    for (turn, m) in [3usize, 5, 3, 5].into_iter().enumerate() {
        let a = random(&[m, k], 10 + turn as u64);
        let want = reference(&a, &b);
        let got = product(mmm, &a, &b, &mut |view| unsafe {
            memo.store(&"matmul", view, AXES, mmm, 0)
        });
        assert!(close(&got, &want), "memo, turn {turn} (m = {m}): {got:?} vs {want:?}");
        let got = product(mmm, &a, &b, &mut |view| unsafe {
            let built = *blind
                .entry("matmul")
                .or_insert_with(|| mmm.c_view(Some(AXES.m), Some(AXES.n)).wrap(view));
            built.with_tensor(view)
        });
        blind_was_wrong |= !close(&got, &want);
    }
    assert!(
        blind_was_wrong,
        "a shape-blind memo should have written the wrong layout"
    );
    assert_eq!(memo.builds(), 2, "3 and 5 each built once, then reused");
}

/// Two kernels of different tiles at the same shape: right through the memo,
/// wrong through a memo blind to the kernel.
#[test]
fn a_kernel_change_at_the_same_shape_rebuilds_the_store() {
    // Two tiles, the second larger in both mr and nr, so both panel strides
    // differ; in this order a stale store writes wrong places *inside* the
    // output (the other order would write past it).
    let kernels = f32_kernels();
    let pair = kernels.iter().find_map(|small| {
        kernels
            .iter()
            .find(|big| big.mr() > small.mr() && big.nr() > small.nr())
            .map(|big| (&**small, &**big))
    });
    let Some((first, second)) = pair else {
        eprintln!("no two f32 kernel tiles differ in both mr and nr on this machine: nothing to switch between");
        return;
    };
    // Several panels each way for both.
    let (m, k, n) = (
        3 * first.mr().max(second.mr()) + 1,
        5,
        3 * first.nr().max(second.nr()) + 1,
    );
    let b = random(&[k, n], 2);
    let mut memo: StoreMemo<&str> = StoreMemo::new(MemoConfig::new(2));
    let mut blind: Option<OutputStore> = None;
    let mut blind_was_wrong = false;
    for (turn, mmm) in [first, second, first].into_iter().enumerate() {
        let a = random(&[m, k], 20 + turn as u64);
        let want = reference(&a, &b);
        let got = product(mmm, &a, &b, &mut |view| unsafe {
            memo.store(&"matmul", view, AXES, mmm, 0)
        });
        assert!(close(&got, &want), "memo, {} ({:?})", mmm.name(), KernelId::of(mmm, 0));
        let got = product(mmm, &a, &b, &mut |view| unsafe {
            let built = *blind.get_or_insert_with(|| mmm.c_view(Some(AXES.m), Some(AXES.n)).wrap(view));
            built.with_tensor(view)
        });
        blind_was_wrong |= !close(&got, &want);
    }
    assert!(
        blind_was_wrong,
        "a kernel-blind memo should have used the wrong panel strides"
    );
}
