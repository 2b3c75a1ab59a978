//! A user's model from an NNEF file goes through the same checks.

use laned_testkit::fixtures::{self, Fixture, TdnnConfig};
use laned_testkit::schedule::{Schedule, StreamPlan};
use laned_testkit::{verify_by_hand, Sabotage, Tolerance};
use tract_core::internal::*;
use tract_pulse::internal::tract_nnef;

#[test]
fn an_nnef_model_round_trips_and_passes_the_checker() -> TractResult<()> {
    let dir = std::env::temp_dir().join(format!("laned-nnef-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("tdnn.nnef.tar");
    let model = fixtures::tdnn_streaming(TdnnConfig {
        width: 8,
        pulse: 4,
        layout: fixtures::Layout::Nchw,
    })?;
    tract_nnef::nnef().write_to_tar(&model, std::fs::File::create(&path)?)?;
    let fixture = Fixture::from_file(&path, "S", 4)?;
    assert_eq!(fixture.inputs[0].shape, vec![1, 40, 4]);
    let schedule = Schedule {
        max_lanes: 3,
        streams: (0..3)
            .map(|s| StreamPlan {
                seed: s,
                calls: vec![1, 1, 2],
                arrive: s as usize,
                end: None,
            })
            .collect(),
        picks: vec![0b111, 0b101],
    };
    verify_by_hand(&fixture, &schedule, Sabotage::None, Tolerance::Exact)?;
    assert!(verify_by_hand(&fixture, &schedule, Sabotage::SwapSeats, Tolerance::Exact).is_err());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
