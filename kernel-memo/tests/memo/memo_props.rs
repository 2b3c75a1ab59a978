//! Any sequence of lookups returns an entry built for exactly the shape and
//! kernel asked, builds only on a miss, and keeps at most the bound per key.

use kernel_memo::{Memo, MemoConfig};
use proptest::prelude::*;

type Lookup = (u8, Vec<usize>, u8);

fn check(bound: usize, lookups: &[Lookup]) -> Result<(), TestCaseError> {
    let mut memo: Memo<u8, u8, (Vec<usize>, u8)> = Memo::new(MemoConfig::new(bound));
    // Reference: per key, the (shape, kernel) pairs kept, most recent last.
    let mut kept: std::collections::HashMap<u8, Vec<(Vec<usize>, u8)>> = Default::default();
    for (key, shape, kernel) in lookups {
        let entry = (shape.clone(), *kernel);
        let list = kept.entry(*key).or_default();
        let hit = list.iter().position(|e| *e == entry);
        let builds_before = memo.builds();
        let mut built = false;
        let got = memo.get_or_build(key, shape, kernel, |s, k| {
            built = true;
            (s.to_vec(), *k)
        });
        prop_assert_eq!(&*got, &entry, "the entry was built for another shape or kernel");
        prop_assert_eq!(built, hit.is_none(), "built on a hit, or reused on a miss");
        prop_assert_eq!(memo.builds() - builds_before, built as u64);
        match hit {
            Some(ix) => {
                let e = list.remove(ix);
                list.push(e);
            }
            None => {
                if list.len() == bound {
                    list.remove(0);
                }
                list.push(entry);
            }
        }
        prop_assert!(memo.len_for(key) <= bound);
        let mut ours: Vec<(Vec<usize>, u8)> = memo
            .shapes_for(key)
            .into_iter()
            .map(|(s, k)| (s.to_vec(), *k))
            .collect();
        let mut theirs = list.clone();
        ours.sort();
        theirs.sort();
        prop_assert_eq!(
            ours,
            theirs,
            "the memo keeps other entries than least-recently-used eviction would"
        );
    }
    Ok(())
}

fn lookup() -> impl Strategy<Value = Lookup> {
    (0..3u8, prop::collection::vec(1..4usize, 1..3), 0..2u8)
}

proptest! {
    #[test]
    fn lookups_are_exact_and_bounded(bound in 1..4usize, lookups in prop::collection::vec(lookup(), 0..80)) {
        check(bound, &lookups)?;
    }
}

/// Pinned: occupancy alternating 3, 5, 3, 5 with a bound of 2 builds twice.
#[test]
fn pinned_alternating_occupancy() {
    let lookups: Vec<Lookup> = [3, 5, 3, 5].iter().map(|&o| (0, vec![o, 40], 0)).collect();
    check(2, &lookups).unwrap();
}
