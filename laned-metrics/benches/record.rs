//! The cost of one turn's recording: the turn itself and a queue wait per seat.

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use laned_metrics::Metrics;

fn one_turn(c: &mut Criterion) {
    let metrics = Metrics::new(64);
    for seats in [1usize, 16, 64] {
        c.bench_function(&format!("record a turn of {seats} seats"), |b| {
            b.iter(|| {
                metrics.record_turn(black_box(seats), black_box(Duration::from_micros(250)));
                for s in 0..seats {
                    metrics.record_queue_wait(black_box(Duration::from_nanos(1000 + s as u64)));
                }
            })
        });
    }
    c.bench_function("snapshot", |b| b.iter(|| black_box(metrics.snapshot())));
}

criterion_group!(benches, one_turn);
criterion_main!(benches);
