use laned_testkit::fixtures;
use tract_core::internal::*;

#[test]
fn the_odd_models_build_and_run_solo() -> TractResult<()> {
    let p = fixtures::panicking()?;
    let out = p.runnable()?.spawn()?.run(p.inputs(1, 3))?;
    assert_eq!(out[0].shape(), &[1, 8, 4]);
    let scan = DefaultRuntime.prepare(fixtures::scan_cumsum()?)?;
    let out = scan.spawn()?.run(tvec!(
        tensor2(&[[1f32, 2., 3.]]).into_tvalue(),
        tensor2(&[[0f32]]).into_tvalue()
    ))?;
    assert_eq!(*out[0], tensor2(&[[1f32, 3., 6.]]));
    Ok(())
}
