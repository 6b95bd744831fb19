//! The exchange's tests, a file per concern: the plan (shards, chunks,
//! transfers, weights, refused inputs) and the collective run in memory
//! (bit identity, exclusions, refused frames), the wire's messages
//! (random and mutated bytes refused by field), the acknowledged ranges and
//! the sender's outbox against models. Helpers more than one file
//! uses are here.

mod catchup;
mod collective;
mod outbox;
mod plan;
mod ranges;
mod wire;

use std::collections::BTreeMap;

use longhaul_codec::EncoderConfig;
use longhaul_core::rng::SeedRng;

use crate::*;

pub(crate) fn config(
    bits: u32,
    block_size: u32,
    error_feedback: bool,
    zstd: bool,
) -> EncoderConfig {
    EncoderConfig::new(bits, block_size, error_feedback, zstd).unwrap()
}

pub(crate) fn site_names(count: usize) -> Vec<String> {
    // Not in id order, so that the plan has to sort them.
    (0..count).rev().map(|k| format!("site-{k:02}")).collect()
}

/// A seeded fragment of roughly standard normal values.
pub(crate) fn fragment(rng: &mut SeedRng, n: u64, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let sum: f64 = (0..4).map(|_| rng.unit() - 0.5).sum();
            (sum * 1.7) as f32 * scale
        })
        .collect()
}

/// The whole collective in memory: every live site's contributions to
/// their owners, then every owner's averages to every live site, each
/// delivery in a seeded order with some sent twice. Returns each live
/// site's assembler, all complete.
pub(crate) fn run_in_memory(
    plan: &CollectivePlan,
    codecs: &LinkCodecs,
    fragments: &BTreeMap<String, Vec<f32>>,
    rng: &mut SeedRng,
) -> BTreeMap<String, Assembler> {
    let mut contributors: BTreeMap<&str, Contributor> = BTreeMap::new();
    let mut chunks = Vec::new();
    for site in plan.live() {
        let contributor = contributors
            .entry(site)
            .or_insert_with(|| Contributor::new(plan.elements()));
        for chunk in contributor
            .contributions(plan, codecs, site, &fragments[site])
            .unwrap()
        {
            chunks.push((site.clone(), chunk));
        }
    }
    let mut reducers: BTreeMap<String, ShardReducer> = plan
        .live()
        .iter()
        .map(|s| {
            (
                s.clone(),
                ShardReducer::new(plan, s, codecs.gather()).unwrap(),
            )
        })
        .collect();
    with_duplicates(&mut chunks, rng);
    for (from, chunk) in chunks {
        let reducer = reducers.get_mut(&chunk.to).unwrap();
        reducer
            .accept(&from, chunk.shard, chunk.offset, chunk.length, chunk.frame)
            .unwrap();
    }
    let mut gathered = Vec::new();
    for (owner, reducer) in &reducers {
        assert!(
            reducer.is_complete(),
            "{owner} waits on {:?}",
            reducer.waiting_on()
        );
        for k in 0..reducer.chunks() {
            let (offset, length, frame) = reducer.gathered(k).unwrap();
            for to in plan.live() {
                gathered.push((
                    to.clone(),
                    owner.clone(),
                    reducer.shard().index,
                    offset,
                    length,
                    frame.to_vec(),
                ));
            }
        }
    }
    with_duplicates(&mut gathered, rng);
    let mut assemblers: BTreeMap<String, Assembler> = plan
        .live()
        .iter()
        .map(|s| (s.clone(), Assembler::new(plan)))
        .collect();
    for (to, from, shard, offset, length, frame) in gathered {
        assemblers
            .get_mut(&to)
            .unwrap()
            .accept(&from, shard, offset, length, &frame)
            .unwrap();
    }
    for (site, assembler) in &assemblers {
        assert!(
            assembler.is_complete(),
            "{site}: {} chunks missing",
            assembler.missing()
        );
    }
    assemblers
}

/// Shuffles `items` after sending about one in five a second time.
fn with_duplicates<T: Clone>(items: &mut Vec<T>, rng: &mut SeedRng) {
    let again: Vec<T> = items.iter().filter(|_| rng.chance(0.2)).cloned().collect();
    items.extend(again);
    rng.shuffle(items);
}
