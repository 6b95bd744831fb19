//! The plan: shards partition the fragment, chunks partition the shards,
//! transfers and weights as the module docs state, inputs refused by name.

use proptest::prelude::*;

use super::site_names;
use crate::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn shards_and_chunks_partition_the_fragment_exactly(
        sites in 1usize..12,
        excluded_mask in any::<u16>(),
        elements in 0u64..5000,
        chunk in 1u32..300,
    ) {
        let names = site_names(sites);
        let mut excluded: Vec<String> = names
            .iter()
            .enumerate()
            .filter(|(k, _)| excluded_mask & (1 << k) != 0)
            .map(|(_, s)| s.clone())
            .collect();
        if excluded.len() == sites {
            excluded.pop();
        }
        let plan = CollectivePlan::new(&names, &excluded, elements, chunk).unwrap();
        let m = plan.live().len() as u64;
        prop_assert_eq!(m as usize, sites - excluded.len());
        prop_assert!(plan.live().windows(2).all(|w| w[0] < w[1]));
        let (q, r) = (elements / m, elements % m);
        let mut next = 0;
        for (k, shard) in plan.shards().iter().enumerate() {
            prop_assert_eq!(shard.index as usize, k);
            prop_assert_eq!(&shard.owner, &plan.live()[k]);
            prop_assert!(!excluded.contains(&shard.owner));
            prop_assert_eq!(shard.start, next);
            prop_assert_eq!(shard.len, q + u64::from((k as u64) < r));
            let mut at = shard.start;
            for range in plan.chunks(shard.index) {
                prop_assert_eq!(range.start, at);
                let length = (range.end - range.start) as u32;
                prop_assert!(length >= 1 && length <= chunk);
                prop_assert!(plan.is_chunk(shard.index, range.start, length));
                prop_assert!(!plan.is_chunk(shard.index, range.start, length + 1));
                // Off the chunk grid (with chunks of 1 every element starts one).
                prop_assert!(chunk == 1 || !plan.is_chunk(shard.index, range.start + 1, length));
                at = range.end;
            }
            prop_assert_eq!(at, shard.start + shard.len);
            next += shard.len;
        }
        prop_assert_eq!(next, elements);

        // 2 (M − 1) transfers per non-empty shard; each site sends and
        // receives M − 1 per phase over the non-empty shards.
        let nonempty = plan.shards().iter().filter(|s| s.len > 0).count() as u64;
        prop_assert_eq!(plan.transfers().len() as u64, 2 * (m - 1) * nonempty);
        for site in &excluded {
            prop_assert!(plan.sends(site).is_empty() && plan.receives(site).is_empty());
        }
        for site in plan.live() {
            for transfer in plan.sends(site) {
                prop_assert!(transfer.from != transfer.to);
                let shard = plan.shard(transfer.shard).unwrap();
                match transfer.phase {
                    Phase::ReduceScatter => prop_assert_eq!(&transfer.to, &shard.owner),
                    Phase::AllGather => prop_assert_eq!(&transfer.from, &shard.owner),
                }
            }
        }
    }
}

#[test]
fn the_first_shards_take_the_remainder() {
    let plan = CollectivePlan::new(&["c", "a", "b"], &[], 10, 3).unwrap();
    let shards: Vec<_> = plan
        .shards()
        .iter()
        .map(|s| (s.owner.as_str(), s.range()))
        .collect();
    assert_eq!(shards, [("a", 0..4), ("b", 4..7), ("c", 7..10)]);
    let chunks: Vec<_> = plan.chunks(0).collect();
    assert_eq!(chunks, [0..3, 3..4]);
    // Fewer elements than sites: the last shards are empty.
    let plan = CollectivePlan::new(&["a", "b", "c"], &[], 2, 8).unwrap();
    assert_eq!(plan.shard_of("c").unwrap().len, 0);
    assert_eq!(plan.chunks(2).count(), 0);
}

#[test]
fn excluded_sites_own_nothing_and_the_weight_is_over_the_live_ones() {
    let plan = CollectivePlan::new(&["a", "b", "c", "d"], &["b"], 9, 4).unwrap();
    assert_eq!(plan.live(), ["a", "c", "d"]);
    assert_eq!(plan.excluded(), ["b"]);
    assert!(plan.shard_of("b").is_none());
    assert_eq!(plan.weight(), f32::from_bits((1.0f32 / 3.0).to_bits() - 1));
    assert!(f64::from(plan.weight()) * 3.0 <= 1.0);
}

#[test]
fn weights_never_sum_past_one() {
    for m in 1..=1024usize {
        let names: Vec<String> = (0..m).map(|k| format!("s{k:04}")).collect();
        let w = CollectivePlan::new(&names, &[], 0, 1).unwrap().weight();
        let exact = 1.0 / m as f64;
        assert!(f64::from(w) * m as f64 <= 1.0, "M = {m}: {w}");
        // At most one ulp below the exact 1/M.
        assert!(
            f64::from(f32::from_bits(w.to_bits() + 1)) >= exact,
            "M = {m}: {w}"
        );
    }
}

#[test]
fn the_digest_names_the_live_set_the_size_and_the_chunks() {
    let digest = |sites: &[&str], excluded: &[&str], n, chunk| {
        CollectivePlan::new(sites, excluded, n, chunk)
            .unwrap()
            .digest()
    };
    let base = digest(&["a", "b", "c"], &[], 100, 10);
    assert_eq!(base, digest(&["c", "b", "a"], &[], 100, 10));
    assert_eq!(
        digest(&["a", "b"], &[], 100, 10),
        digest(&["a", "b", "c"], &["c"], 100, 10)
    );
    assert_ne!(base, digest(&["a", "b", "c"], &["c"], 100, 10));
    assert_ne!(base, digest(&["a", "b", "c"], &[], 101, 10));
    assert_ne!(base, digest(&["a", "b", "c"], &[], 100, 11));
    assert_ne!(
        digest(&["ab", "c"], &[], 1, 1),
        digest(&["a", "bc"], &[], 1, 1)
    );
}

#[test]
fn bad_inputs_are_refused_by_name() {
    let none: [&str; 0] = [];
    let cases: Vec<(Result<CollectivePlan, PlanError>, &str)> = vec![
        (
            CollectivePlan::new(&none, &none, 1, 1),
            "participants: none",
        ),
        (
            CollectivePlan::new(&["a", "a"], &[], 1, 1),
            "\"a\" is listed twice",
        ),
        (CollectivePlan::new(&[""], &[], 1, 1), "is empty"),
        (CollectivePlan::new(&["a\0b"], &[], 1, 1), "NUL"),
        (
            CollectivePlan::new(&["x".repeat(64).as_str()], &[], 1, 1),
            "longer than 63",
        ),
        (
            CollectivePlan::new(&["a"], &["b"], 1, 1),
            "excluded: site \"b\" is not a participant",
        ),
        (
            CollectivePlan::new(&["a"], &["a"], 1, 1),
            "every participant is excluded",
        ),
        (
            CollectivePlan::new(&["a"], &[], MAX_FRAGMENT_ELEMENTS + 1, 1),
            "elements:",
        ),
        (CollectivePlan::new(&["a"], &[], 1, 0), "chunk_elements: 0"),
        (
            CollectivePlan::new(&["a"], &[], 1, MAX_CHUNK_ELEMENTS + 1),
            "chunk_elements:",
        ),
    ];
    for (result, expected) in cases {
        let error = result.unwrap_err().to_string();
        assert!(
            error.contains(expected),
            "{error:?} should say {expected:?}"
        );
    }
    let many: Vec<String> = (0..1025).map(|k| format!("s{k}")).collect();
    let error = CollectivePlan::new(&many, &[], 1, 1).unwrap_err();
    assert!(matches!(
        error,
        PlanError::TooManySites {
            found: 1025,
            max: 1024
        }
    ));
}
