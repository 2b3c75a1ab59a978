//! Lookup costs: a hit, a miss (building a 64 KiB buffer), and occupancy
//! alternating 3, 5, 3, 5... with a one-entry memo (rebuilds every time)
//! against the bounded multi-shape memo (builds twice, then hits).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use kernel_memo::{Memo, MemoConfig};

fn buffer(shape: &[usize], _: &()) -> Vec<f32> {
    vec![0.0; shape.iter().product()]
}

fn bench(c: &mut Criterion) {
    let mut memo: Memo<usize, (), Vec<f32>> = Memo::new(MemoConfig::default());
    memo.get_or_build(&0, &[64, 256], &(), buffer);
    c.bench_function("hit", |b| {
        b.iter(|| black_box(memo.get_or_build(&0, black_box(&[64, 256]), &(), buffer).len()))
    });

    let mut flip = 0usize;
    let mut one: Memo<usize, (), Vec<f32>> = Memo::new(MemoConfig::new(1));
    c.bench_function("miss (one-entry memo, two shapes)", |b| {
        b.iter(|| {
            flip += 1;
            black_box(one.get_or_build(&0, &[64 + flip % 2, 256], &(), buffer).len())
        })
    });

    for (name, bound) in [
        ("alternating 3,5: one-entry memo", 1),
        ("alternating 3,5: bounded memo (4 shapes)", 4),
    ] {
        let mut memo: Memo<usize, (), Vec<f32>> = Memo::new(MemoConfig::new(bound));
        let mut turn = 0usize;
        c.bench_function(name, |b| {
            b.iter(|| {
                turn += 1;
                let occupancy = if turn.is_multiple_of(2) { 3 } else { 5 };
                black_box(memo.get_or_build(&0, &[occupancy, 40, 4], &(), buffer).len())
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
