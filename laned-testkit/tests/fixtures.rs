use laned_testkit::fixtures;
use tract_core::internal::*;

#[test]
fn every_fixture_builds_and_runs_a_batch() -> TractResult<()> {
    for f in fixtures::all()? {
        let runnable = f.runnable()?;
        let mut state = runnable.spawn()?;
        let out = state.run(f.inputs(3, 1))?;
        eprintln!("{}: delay {} inputs {:?} out {:?}", f.name, f.delay, f.inputs, out.iter().map(|o| o.shape().to_vec()).collect::<Vec<_>>());
    }
    Ok(())
}
