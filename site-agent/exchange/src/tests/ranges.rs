//! Range sets against a bitmap, and the receiver's ledger.

use proptest::prelude::*;

use crate::plan::{MAX_CHUNK_ELEMENTS, Phase};
use crate::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_range_set_holds_what_a_bitmap_holds(
        inserts in proptest::collection::vec((0u64..200, 0u64..40), 0..40),
        probes in proptest::collection::vec((0u64..240, 0u64..60), 0..20),
    ) {
        let mut set = RangeSet::new();
        let mut model = vec![false; 320];
        for (start, len) in inserts {
            let end = start + len;
            let new = (start..end).filter(|&k| !model[k as usize]).count() as u64;
            prop_assert_eq!(set.insert(start..end), new);
            for k in start..end {
                model[k as usize] = true;
            }
            // Disjoint, sorted, never touching: merged as they fill.
            let ranges: Vec<_> = set.iter().collect();
            prop_assert!(ranges.iter().all(|r| r.start < r.end));
            prop_assert!(ranges.windows(2).all(|w| w[0].end < w[1].start));
        }
        prop_assert_eq!(set.covered(), model.iter().filter(|&&b| b).count() as u64);
        for (start, len) in probes {
            let end = start + len;
            let held = (start..end).filter(|&k| model[k as usize]).count() as u64;
            prop_assert_eq!(set.covered_within(start..end), held);
            prop_assert_eq!(set.contains(start..end), held == len);
        }
    }
}

fn chunk(shard: u32, offset: u64, length: u32) -> ChunkId {
    ChunkId {
        phase: Phase::ReduceScatter,
        fragment: 0,
        shard,
        offset,
        length,
    }
}

#[test]
fn the_ledger_holds_per_site_and_transfer_and_replays_in_wire_sized_pieces() {
    let mut ledger = AckLedger::new();
    assert!(ledger.record("a", &chunk(0, 0, 10)));
    assert!(
        !ledger.record("a", &chunk(0, 0, 10)),
        "a duplicate is not new"
    );
    assert!(ledger.record("a", &chunk(0, 10, 10)));
    assert!(ledger.holds("a", &chunk(0, 5, 10)));
    assert!(!ledger.holds("b", &chunk(0, 0, 10)), "per site");
    assert!(!ledger.holds("a", &chunk(1, 0, 10)), "per transfer");
    let replay = ledger.replay("a");
    assert_eq!(replay, [chunk(0, 0, 20)]);
    assert!(ledger.replay("b").is_empty());
    // A run longer than a wire ack can name is cut.
    let big = u64::from(MAX_CHUNK_ELEMENTS);
    for k in 0..3 {
        ledger.record("b", &chunk(2, k * big, MAX_CHUNK_ELEMENTS));
    }
    ledger.record("b", &chunk(2, 3 * big, 5));
    let replay = ledger.replay("b");
    assert_eq!(replay.len(), 4);
    assert_eq!(replay[3], chunk(2, 3 * big, 5));
}
