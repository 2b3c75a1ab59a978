//! Calls of random shapes, dtypes and widths against a model with free
//! dims, from several streams at once: each call is refused as bad input or
//! answered exactly as the stream alone would be, never a wrong answer for
//! anyone, a panic or a hang.

use std::thread;
use std::time::Duration;

use laned_runner::{LanedRunner, Mode, RunErrorKind, RunnerConfig};
use proptest::prelude::*;
use tract_core::internal::*;

use super::ops::{counter, Switch};
use super::{pulse, solo};
use crate::common::{bounded, MODES};

/// One call: its datum type, rank, rows (axis 0) and other dims.
#[derive(Debug, Clone)]
pub struct CallSpec {
    dt: DatumType,
    rows: usize,
    dims: Vec<usize>,
}

impl CallSpec {
    fn new(dt: DatumType, rows: usize, dims: &[usize]) -> CallSpec {
        CallSpec {
            dt,
            rows,
            dims: dims.to_vec(),
        }
    }

    /// The model takes f32 `[B, D0, D1]` with one row at least.
    fn valid(&self) -> bool {
        self.dt == f32::datum_type() && self.dims.len() == 2 && self.rows >= 1
    }

    /// The call's input (rows filled from `seed`), and the rows it stacks.
    fn input(&self, seed: f32) -> (Tensor, Vec<Tensor>) {
        let rows: Vec<Tensor> = (0..self.rows)
            .map(|r| pulse(&self.dims, seed + r as f32 * 10.0))
            .collect();
        let mut shape = vec![self.rows];
        shape.extend(&self.dims);
        let input = if self.rows == 0 {
            Tensor::zero::<f32>(&shape).unwrap()
        } else {
            let refs: Vec<&Tensor> = rows.iter().collect();
            Tensor::stack_tensors(0, &refs).unwrap()
        };
        (input.cast_to_dt(self.dt).unwrap().into_owned(), rows)
    }
}

fn call_spec() -> impl Strategy<Value = CallSpec> {
    (
        prop_oneof![
            6 => Just(f32::datum_type()),
            1 => Just(f64::datum_type()),
            1 => Just(i32::datum_type()),
        ],
        prop_oneof![1 => Just(0usize), 8 => 1usize..4],
        prop_oneof![
            1 => proptest::collection::vec(1usize..4, 1),
            8 => proptest::collection::vec(0usize..4, 2),
            1 => proptest::collection::vec(1usize..3, 3),
        ],
    )
        .prop_map(|(dt, rows, dims)| CallSpec { dt, rows, dims })
}

/// The checking function: each stream on a thread of its own makes its
/// calls; a valid call must be answered with exactly its solo rows (row 0
/// in the stream's own lane, the others in fresh borrowed ones), an invalid
/// one refused as bad input with its inputs handed back.
fn check_calls(mode: Mode, shards: usize, streams: Vec<Vec<CallSpec>>) {
    bounded("fuzzed calls", move || {
        let switch = Switch::new();
        let r = LanedRunner::new(
            counter(&switch, &[None, None]).unwrap(),
            RunnerConfig::builder()
                .mode(mode)
                .shards(shards)
                .max_lanes(4)
                .linger(Duration::from_micros(300))
                .build(),
        )
        .unwrap();
        let threads: Vec<_> = streams
            .into_iter()
            .enumerate()
            .map(|(s, calls)| {
                let mut h = r.try_spawn().unwrap();
                thread::spawn(move || {
                    let mut answered = 0;
                    for (c, spec) in calls.iter().enumerate() {
                        let (input, rows) = spec.input(s as f32 * 100.0 + c as f32);
                        match h.call(tvec!(input.into_tvalue())) {
                            Ok(out) => {
                                assert!(spec.valid(), "stream {s} call {c}: {spec:?} was served");
                                let want: Vec<Tensor> = rows
                                    .iter()
                                    .enumerate()
                                    .map(|(r, x)| solo(x, if r == 0 { answered } else { 0 }))
                                    .collect();
                                let want = Tensor::stack_tensors(0, &want.iter().collect::<Vec<_>>()).unwrap();
                                assert_eq!(*out[0], want, "stream {s} call {c}: {spec:?}");
                                answered += 1;
                            }
                            Err(e) => {
                                assert!(!spec.valid(), "stream {s} call {c}: {spec:?} refused: {e}");
                                assert!(
                                    matches!(e.kind(), RunErrorKind::Input { .. } | RunErrorKind::InputCount { .. }),
                                    "stream {s} call {c}: {e}"
                                );
                                assert!(e.into_inputs().is_some(), "a refused call hands its inputs back");
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    });
}

proptest! {
    #![proptest_config(laned_testkit::schedule::proptest_config(24))]

    #[test]
    fn fuzzed_call_shapes_and_dtypes(
        streams in proptest::collection::vec(proptest::collection::vec(call_spec(), 1..6), 1..4),
        mode in prop_oneof![Just(Mode::Worker), Just(Mode::Combining)],
        shards in prop_oneof![Just(1usize), Just(3usize)],
    ) {
        check_calls(mode, shards, streams);
    }
}

/// Pinned cases: the shapes defect 3 was found with (equal and unequal
/// byte counts), wide calls of different shapes, and bad dtypes beside
/// good calls.
#[test]
fn pinned_call_shapes() {
    let f = f32::datum_type();
    let cases = vec![
        vec![vec![CallSpec::new(f, 1, &[3, 4])], vec![CallSpec::new(f, 1, &[2, 6])]],
        vec![vec![CallSpec::new(f, 1, &[3, 4])], vec![CallSpec::new(f, 1, &[2, 5])]],
        vec![
            vec![CallSpec::new(f, 2, &[3, 4]), CallSpec::new(f, 1, &[3, 4])],
            vec![CallSpec::new(f, 3, &[1, 2]), CallSpec::new(f, 1, &[0, 2])],
            vec![
                CallSpec::new(f64::datum_type(), 1, &[3, 4]),
                CallSpec::new(f, 1, &[2, 6]),
            ],
        ],
    ];
    for streams in cases {
        for mode in MODES {
            for shards in [1, 3] {
                check_calls(mode, shards, streams.clone());
            }
        }
    }
}
