//! The collective in memory: every live site ends with the same bits,
//! excluded sites never count, and a bad frame is refused before it can
//! reach a sum.

use std::collections::BTreeMap;

use longhaul_core::rng::SeedRng;
use longhaul_core::state::LinkCodec;
use proptest::prelude::*;

use super::{config, fragment, run_in_memory, site_names};
use crate::*;

/// One of the planner's codecs, with or without error feedback and zstd.
fn random_config(rng: &mut SeedRng) -> longhaul_codec::EncoderConfig {
    let (bits, block) = [(16, 0), (8, 256), (8, 32), (4, 64), (4, 2)][rng.index(5)];
    config(bits, block, rng.chance(0.5), rng.chance(0.3))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_live_site_ends_with_the_same_bits_and_excluded_sites_never_count(
        sites in 1usize..7,
        excluded_mask in any::<u8>(),
        elements in 0u64..3000,
        chunk in 8u32..700,
        seed in any::<u64>(),
    ) {
        let mut rng = SeedRng::new(seed);
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
        // A random codec on every link.
        let mut codecs = LinkCodecs::uniform(random_config(&mut rng));
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                codecs = codecs.with_link(a, b, random_config(&mut rng));
            }
        }
        // Excluded sites hold values a thousand times larger: were any of
        // them summed, the mean below would be far off.
        let fragments: BTreeMap<String, Vec<f32>> = names
            .iter()
            .map(|s| {
                let scale = if excluded.contains(s) { 1000.0 } else { 1.0 };
                (s.clone(), fragment(&mut rng, elements, scale))
            })
            .collect();
        let assemblers = run_in_memory(&plan, &codecs, &fragments, &mut rng);
        let hashes: Vec<String> = assemblers.values().map(|a| a.hash().unwrap()).collect();
        prop_assert!(hashes.windows(2).all(|w| w[0] == w[1]), "seed {seed}: {hashes:?}");
        prop_assert_eq!(assemblers.len(), plan.live().len());

        let result = assemblers.values().next().unwrap().result().unwrap();
        let m = plan.live().len() as f64;
        for (i, value) in result.iter().enumerate() {
            let mean: f64 = plan
                .live()
                .iter()
                .map(|s| f64::from(fragments[s][i]))
                .sum::<f64>()
                / m;
            // Two 4-bit roundings in blocks of values within ±3.4: at most
            // half a step (3.4·(1 + 2⁻⁷)/7) each.
            prop_assert!((f64::from(*value) - mean).abs() < 0.5,
                "seed {seed}: element {i}: {value} against the live mean {mean}");
        }

        // The one-call reference (fresh contributors, no duplicates) and
        // every shard's completeness agree.
        let reference = reduce_in_memory(&plan, &codecs, &fragments).unwrap();
        prop_assert_eq!(longhaul_codec::fragment_hash(&reference), hashes[0].clone());
        let any = assemblers.values().next().unwrap();
        prop_assert!(plan.shards().iter().all(|s| any.shard_complete(s.index)));
        prop_assert!(!any.shard_complete(plan.shards().len() as u32));

        // The same run again gives the same bits: nothing but the inputs
        // decides the result.
        let mut again = SeedRng::new(seed ^ 1);
        let other = run_in_memory(&plan, &codecs, &fragments, &mut again);
        prop_assert_eq!(other.values().next().unwrap().hash(), Some(hashes[0].clone()));
    }
}

fn three_sites() -> (CollectivePlan, LinkCodecs, BTreeMap<String, Vec<f32>>) {
    let plan = CollectivePlan::new(&["a", "b", "c"], &[], 600, 64).unwrap();
    let codecs = LinkCodecs::uniform(config(8, 32, true, false));
    let mut rng = SeedRng::new(7);
    let fragments = ["a", "b", "c"]
        .iter()
        .map(|s| (s.to_string(), fragment(&mut rng, 600, 1.0)))
        .collect();
    (plan, codecs, fragments)
}

#[test]
fn a_corrupted_or_conflicting_frame_is_refused_and_changes_nothing() {
    let (plan, codecs, fragments) = three_sites();
    let clean = run_in_memory(&plan, &codecs, &fragments, &mut SeedRng::new(1));
    let clean_hash = clean["a"].hash().unwrap();

    let mut contributors: BTreeMap<&str, Contributor> = BTreeMap::new();
    let mut reducer = ShardReducer::new(&plan, "a", codecs.gather()).unwrap();
    let mut chunks = Vec::new();
    for site in ["a", "b", "c"] {
        let c = contributors
            .entry(site)
            .or_insert_with(|| Contributor::new(600));
        for chunk in c
            .contributions(&plan, &codecs, site, &fragments[site])
            .unwrap()
        {
            if chunk.to == "a" {
                chunks.push((site, chunk));
            }
        }
    }
    let (from, first) = chunks.iter().find(|(s, _)| *s == "b").unwrap();
    // Every byte flipped in turn: each one refused.
    for at in 0..first.frame.len() {
        let mut bad = first.frame.clone();
        bad[at] ^= 0x10;
        let error = reducer
            .accept(from, first.shard, first.offset, first.length, bad)
            .unwrap_err();
        assert!(
            matches!(error, CollectiveError::Frame { .. }),
            "byte {at}: {error}"
        );
    }
    // A frame cut short, and one for another chunk's length.
    let short = first.frame[..first.frame.len() - 1].to_vec();
    assert!(
        reducer
            .accept(from, first.shard, first.offset, first.length, short)
            .is_err()
    );
    let error = reducer
        .accept(
            from,
            first.shard,
            first.offset + 1,
            first.length,
            first.frame.clone(),
        )
        .unwrap_err();
    assert!(
        matches!(error, CollectiveError::NotAChunk { .. }),
        "{error}"
    );
    // Taken once; the same bytes again are a duplicate, other bytes a conflict.
    let accepted = reducer.accept(
        from,
        first.shard,
        first.offset,
        first.length,
        first.frame.clone(),
    );
    assert_eq!(accepted, Ok(Accepted::New));
    let again = reducer.accept(
        from,
        first.shard,
        first.offset,
        first.length,
        first.frame.clone(),
    );
    assert_eq!(again, Ok(Accepted::Duplicate));
    let (_, other) = chunks
        .iter()
        .find(|(s, c)| *s == "c" && c.offset == first.offset)
        .unwrap();
    let error = reducer
        .accept(
            from,
            first.shard,
            first.offset,
            first.length,
            other.frame.clone(),
        )
        .unwrap_err();
    assert!(matches!(error, CollectiveError::Conflict { .. }), "{error}");
    // A site outside the plan, or a shard this reducer does not own.
    let error = reducer
        .accept("z", 0, 0, 64, first.frame.clone())
        .unwrap_err();
    assert!(
        error.to_string().contains("\"z\": not a live site"),
        "{error}"
    );
    let error = reducer
        .accept("b", 1, 200, 64, first.frame.clone())
        .unwrap_err();
    assert!(
        matches!(error, CollectiveError::NotThisShard { .. }),
        "{error}"
    );

    // The rest goes in as usual, and the result is the clean run's.
    for (site, chunk) in chunks {
        reducer
            .accept(site, chunk.shard, chunk.offset, chunk.length, chunk.frame)
            .unwrap();
    }
    assert!(reducer.is_complete());
    let mut assembler = Assembler::new(&plan);
    for k in 0..reducer.chunks() {
        let (offset, length, frame) = reducer.gathered(k).unwrap();
        let mut bad = frame.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(assembler.accept("a", 0, offset, length, &bad).is_err());
        let error = assembler.accept("b", 0, offset, length, frame).unwrap_err();
        assert!(
            matches!(error, CollectiveError::NotThisShard { .. }),
            "{error}"
        );
        assembler.accept("a", 0, offset, length, frame).unwrap();
    }
    // Shard 0 is in, as the clean run has it; shards 1 and 2 are not.
    assert_eq!(
        assembler.missing(),
        plan.chunks(1).count() + plan.chunks(2).count()
    );
    let shard = plan.shard(0).unwrap().range();
    let range = shard.start as usize..shard.end as usize;
    let ours = &assembler.partial()[range.clone()];
    assert_eq!(ours, &clean["a"].result().unwrap()[range]);
    assert_eq!(clean["b"].hash().unwrap(), clean_hash);
}

#[test]
fn a_frame_from_an_excluded_site_is_refused() {
    let plan = CollectivePlan::new(&["a", "b", "c"], &["c"], 100, 50).unwrap();
    let codecs = LinkCodecs::uniform(config(4, 64, false, false));
    let mut c = Contributor::new(100);
    let values = vec![0.5; 100];
    let error = c.contributions(&plan, &codecs, "c", &values).unwrap_err();
    assert!(matches!(error, CollectiveError::NotLive { .. }), "{error}");
    let frame = c
        .encode_chunk(codecs.link("c", "a"), &values, 0..50)
        .unwrap();
    let mut reducer = ShardReducer::new(&plan, "a", codecs.gather()).unwrap();
    let error = reducer.accept("c", 0, 0, 50, frame).unwrap_err();
    assert!(
        error.to_string().contains("\"c\": not a live site"),
        "{error}"
    );
    assert_eq!(reducer.waiting_on(), ["a", "b"]);
    let error = c
        .encode_chunk(codecs.link("a", "b"), &values[..99], 0..50)
        .unwrap_err();
    assert!(matches!(
        error,
        CollectiveError::FragmentLength {
            expected: 100,
            found: 99
        }
    ));
}

#[test]
fn a_rounds_link_codecs_give_the_widest_locally_and_refuse_what_has_no_frame() {
    let link = |a: &str, b: &str, bits, block_size| LinkCodec {
        between: [a.to_string(), b.to_string()],
        bits,
        block_size,
        error_feedback: true,
        zstd: false,
    };
    let codecs = LinkCodecs::from_round(&[
        link("a", "b", 4, 64),
        link("b", "c", 8, 256),
        link("a", "c", 8, 32),
    ])
    .unwrap();
    assert_eq!(codecs.link("b", "a").codec.bits(), 4);
    assert_eq!(codecs.link("c", "b").codec.block_size(), 256);
    assert_eq!(codecs.link("a", "a").codec.block_size(), 32);
    assert!(codecs.link("a", "a").error_feedback);
    assert!(!codecs.gather().error_feedback);
    assert_eq!(codecs.gather().codec.bits(), 8);
    let error = LinkCodecs::from_round(&[link("a", "b", 0, 0)])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("between \"a\" and \"b\"") && error.contains("bits"),
        "{error}"
    );
    assert_eq!(
        LinkCodecs::from_round(&[]).unwrap().gather().codec.bits(),
        16
    );
}

/// The frames of `contributions`, in order.
fn frames(chunks: Vec<Chunk>) -> Vec<Vec<u8>> {
    chunks.into_iter().map(|c| c.frame).collect()
}

#[test]
fn a_failed_encoding_and_a_restored_checkpoint_leave_the_residuals_as_they_were() {
    let names = site_names(3);
    let n = 5_000;
    let plan = CollectivePlan::new(&names, &[], n, 700).unwrap();
    // Error feedback on, and a second codec on one link, so two residuals.
    let codecs = LinkCodecs::uniform(config(8, 256, true, false)).with_link(
        &names[0],
        &names[2],
        config(4, 64, true, false),
    );
    let mut rng = SeedRng::new(23);
    let rounds: Vec<Vec<f32>> = (0..3).map(|_| fragment(&mut rng, n, 1.0)).collect();
    let me = &names[0];

    // The reference: three rounds encoded in turn.
    let mut reference = Contributor::new(n);
    let expected: Vec<Vec<Vec<u8>>> = rounds
        .iter()
        .map(|values| frames(reference.contributions(&plan, &codecs, me, values).unwrap()))
        .collect();

    let mut contributor = Contributor::new(n);
    let first = contributor
        .contributions(&plan, &codecs, me, &rounds[0])
        .unwrap();
    assert_eq!(frames(first), expected[0]);
    // A fragment whose last element is NaN fails after the earlier chunks
    // were encoded; the residuals are put back.
    let mut bad = rounds[1].clone();
    bad[n as usize - 1] = f32::NAN;
    assert!(contributor.contributions(&plan, &codecs, me, &bad).is_err());
    // An exchange abandoned after encoding: restored from its checkpoint.
    let checkpoint = contributor.checkpoint();
    contributor
        .contributions(&plan, &codecs, me, &rounds[1])
        .unwrap();
    contributor.restore(checkpoint);
    // The same bytes as the reference from here on.
    for (values, expected) in rounds[1..].iter().zip(&expected[1..]) {
        let again = contributor
            .contributions(&plan, &codecs, me, values)
            .unwrap();
        assert_eq!(&frames(again), expected);
    }
}
