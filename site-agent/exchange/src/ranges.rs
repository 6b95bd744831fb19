//! Acknowledged ranges: what a receiver holds, so that a chunk sent again
//! is harmless and a sender that reconnects skips what arrived.
//!
//! A receiver records every chunk it took (checked, handed to its reducer
//! or assembler) in an [`AckLedger`], per sending site and transfer, as
//! element ranges, and answers each with an ack. When a site connects
//! again, the receiver first replays the acks of everything it holds from
//! that site ([`AckLedger::replay`], in ranges of at most 2²⁴ elements,
//! the wire's bound), then welcomes it: the sender marks those chunks
//! acknowledged before it sends anything ([`crate::outbox`]). A duplicate
//! that arrives anyway is acknowledged again and changes nothing.
//!
//! Memory: one entry per maximal run of held elements, so at most one per
//! chunk, and usually one per transfer (chunks arrive out of order on a
//! pool of connections, and merge as the gaps fill).

use std::collections::BTreeMap;
use std::ops::Range;

use crate::plan::{MAX_CHUNK_ELEMENTS, Phase};
use crate::wire::ChunkId;

/// Disjoint, non-adjacent half-open ranges of u64, merged on insert.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start → end.
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Adds `range`; returns how many of its elements were not held before.
    pub fn insert(&mut self, range: Range<u64>) -> u64 {
        if range.start >= range.end {
            return 0;
        }
        let (mut start, mut end) = (range.start, range.end);
        let before = self.covered_within(start..end);
        // A range that starts before `start` and reaches it merges.
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back()
            && e >= start
        {
            start = s;
            end = end.max(e);
        }
        // Every range that starts within [start, end] merges.
        let inside: Vec<(u64, u64)> = self
            .ranges
            .range(start..=end)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in inside {
            self.ranges.remove(&s);
            end = end.max(e);
        }
        self.ranges.insert(start, end);
        (range.end - range.start) - before
    }

    /// Whether every element of `range` is held (true for an empty range).
    pub fn contains(&self, range: Range<u64>) -> bool {
        if range.start >= range.end {
            return true;
        }
        matches!(
            self.ranges.range(..=range.start).next_back(),
            Some((_, &e)) if e >= range.end
        )
    }

    /// How many elements of `range` are held.
    pub fn covered_within(&self, range: Range<u64>) -> u64 {
        if range.start >= range.end {
            return 0;
        }
        let mut total = 0;
        let first = self
            .ranges
            .range(..=range.start)
            .next_back()
            .map(|(&s, _)| s)
            .unwrap_or(range.start);
        for (&s, &e) in self.ranges.range(first..range.end) {
            let (s, e) = (s.max(range.start), e.min(range.end));
            if s < e {
                total += e - s;
            }
        }
        total
    }

    /// Elements held in all.
    pub fn covered(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.ranges.iter().map(|(&s, &e)| s..e)
    }

    /// Number of maximal ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// One transfer between two sites: a phase of a shard of a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferKey {
    pub phase: Phase,
    pub fragment: u32,
    pub shard: u32,
}

impl From<&ChunkId> for TransferKey {
    fn from(chunk: &ChunkId) -> TransferKey {
        TransferKey {
            phase: chunk.phase,
            fragment: chunk.fragment,
            shard: chunk.shard,
        }
    }
}

fn range_of(chunk: &ChunkId) -> Range<u64> {
    chunk.offset..chunk.offset.saturating_add(u64::from(chunk.length))
}

/// A receiver's record of the chunks it holds, per sending site and
/// transfer.
#[derive(Debug, Clone, Default)]
pub struct AckLedger {
    held: BTreeMap<(String, TransferKey), RangeSet>,
}

impl AckLedger {
    pub fn new() -> AckLedger {
        AckLedger::default()
    }

    /// Whether `chunk` from `site` is held whole.
    pub fn holds(&self, site: &str, chunk: &ChunkId) -> bool {
        self.held
            .get(&(site.to_string(), TransferKey::from(chunk)))
            .is_some_and(|set| set.contains(range_of(chunk)))
    }

    /// Records `chunk` from `site`; returns whether any of it is new.
    pub fn record(&mut self, site: &str, chunk: &ChunkId) -> bool {
        self.held
            .entry((site.to_string(), TransferKey::from(chunk)))
            .or_default()
            .insert(range_of(chunk))
            > 0
    }

    /// The acks to replay to `site`: every range held from it, cut into
    /// pieces of at most 2²⁴ elements.
    pub fn replay(&self, site: &str) -> Vec<ChunkId> {
        let step = u64::from(MAX_CHUNK_ELEMENTS);
        let mut out = Vec::new();
        for ((from, key), set) in &self.held {
            if from != site {
                continue;
            }
            for range in set.iter() {
                let mut at = range.start;
                while at < range.end {
                    let length = step.min(range.end - at);
                    out.push(ChunkId {
                        phase: key.phase,
                        fragment: key.fragment,
                        shard: key.shard,
                        offset: at,
                        length: length as u32,
                    });
                    at += length;
                }
            }
        }
        out
    }
}
