//! The log's decoding of bytes from disk ([`replay`], [`decode_ops`]) under arbitrary bytes
//! and mutations of valid segments. The same targets run longer under cargo-fuzz (`fuzz/`).

#![allow(clippy::unwrap_used, reason = "tests")]

use proptest::prelude::*;
use raft::eraftpb::{ConfState, Entry, HardState, SnapshotMetadata};

use super::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// An index anywhere, with the ends of the range (where arithmetic overflows) likely.
fn index() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..100, (u64::MAX - 8)..=u64::MAX, any::<u64>()]
}

fn op() -> impl Strategy<Value = LogOp> {
    let entries = (
        index(),
        any::<u64>(),
        0usize..4,
        prop::collection::vec(any::<u8>(), 0..48),
    )
        .prop_map(|(first, term, count, data)| {
            (0..count as u64)
                .map(|i| Entry {
                    index: first.wrapping_add(i),
                    term,
                    data: data.clone().into(),
                    ..Entry::default()
                })
                .collect::<Vec<_>>()
        });
    prop_oneof![
        entries.prop_map(LogOp::Append),
        (index(), any::<u64>()).prop_map(|(index, term)| LogOp::Compact { index, term }),
        (index(), any::<u64>()).prop_map(|(index, term)| LogOp::Reset { index, term }),
        (any::<u64>(), any::<u64>(), index()).prop_map(|(term, vote, commit)| {
            LogOp::HardState(HardState {
                term,
                vote,
                commit,
                ..HardState::default()
            })
        }),
        (
            index(),
            any::<u64>(),
            prop::collection::vec(any::<u64>(), 0..4)
        )
            .prop_map(|(index, term, voters)| {
                let mut meta = SnapshotMetadata {
                    index,
                    term,
                    ..SnapshotMetadata::default()
                };
                meta.set_conf_state(ConfState {
                    voters,
                    ..ConfState::default()
                });
                LogOp::Snapshot(meta)
            }),
    ]
}

/// A segment as the log writes it: a base, then records of ops that fit the log, each kept
/// only if it applies (as `Batch` checks before it records). Returns the bytes, where each
/// record ends, and the log after each record.
fn segment(records: Vec<Vec<LogOp>>) -> (Vec<u8>, Vec<usize>, Vec<MemLog>) {
    let mut mem = MemLog::default();
    let mut bytes = Vec::new();
    let (mut ends, mut logs) = (Vec::new(), Vec::new());
    let base = vec![LogOp::Reset { index: 5, term: 1 }];
    for ops in std::iter::once(base).chain(records) {
        let mut next = mem.clone();
        if ops.iter().all(|op| next.apply(op.clone()).is_ok()) {
            bytes.extend(record(&ops).unwrap());
            ends.push(bytes.len());
            logs.push(next.clone());
            mem = next;
        }
    }
    (bytes, ends, logs)
}

fn records() -> impl Strategy<Value = Vec<Vec<LogOp>>> {
    let append = (
        1u64..4,
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..300),
    );
    // Mostly appends that follow on, so that segments grow long.
    let ops = prop_oneof![
        4 => append.prop_map(|(count, term, data)| {
            vec![LogOp::Append(
                (0..count)
                    .map(|i| Entry { index: i, term, data: data.clone().into(), ..Entry::default() })
                    .collect(),
            )]
        }),
        1 => prop::collection::vec(op(), 1..3),
    ];
    prop::collection::vec(ops, 1..12)
}

/// Renumbers appends so that they follow the log: an append's entries are given as offsets.
fn follow_on(records: Vec<Vec<LogOp>>) -> Vec<Vec<LogOp>> {
    let mut last = 5;
    records
        .into_iter()
        .map(|ops| {
            ops.into_iter()
                .map(|op| match op {
                    LogOp::Append(entries) if entries.first().is_some_and(|e| e.index < 4) => {
                        let entries: Vec<Entry> = entries
                            .into_iter()
                            .map(|mut e| {
                                e.index += last + 1;
                                e
                            })
                            .collect();
                        last = entries.last().map_or(last, |e| e.index);
                        LogOp::Append(entries)
                    }
                    other => other,
                })
                .collect()
        })
        .collect()
}

fn path() -> &'static Path {
    Path::new("segment")
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn a_record_of_any_ops_decodes_to_the_same_ops(ops in prop::collection::vec(op(), 1..5)) {
        let bytes = encode_record(&ops).unwrap();
        let (payloads, end, tail) = scan(&bytes).unwrap();
        prop_assert_eq!((payloads.len(), end, tail), (1, bytes.len(), Tail::Clean));
        prop_assert_eq!(decode_ops(payloads[0].1).unwrap(), ops);
    }

    /// Any payload that decodes encodes back to itself; applying its ops to a log does not
    /// panic, whatever indexes they carry.
    #[test]
    fn arbitrary_payloads_decode_to_ops_that_round_trip_or_are_refused(
        payload in prop::collection::vec(any::<u8>(), 0..256),
        ops in prop::collection::vec(op(), 1..4),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut mutated = record(&ops).unwrap().split_off(HEADER_BYTES);
        for (at, byte) in flips {
            let at = at.index(mutated.len());
            mutated[at] ^= byte;
        }
        for payload in [payload, mutated] {
            if let Ok(decoded) = decode_ops(&payload) {
                let again = encode_record(&decoded).unwrap();
                prop_assert_eq!(decode_ops(&again[HEADER_BYTES..]).unwrap(), decoded.clone());
                let mut log = MemLog::default();
                for op in decoded {
                    let _ = log.apply(op);
                }
            }
        }
    }

    /// Any bytes as a segment: a log, or a refusal naming the segment; never a panic.
    #[test]
    fn arbitrary_segment_bytes_replay_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        match replay(path(), &bytes) {
            Ok(replayed) => prop_assert_eq!(replayed.torn, replayed.end < bytes.len()),
            Err(error) => prop_assert!(matches!(error, StorageError::CorruptSegment { .. }), "{}", error),
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn a_segment_replays_to_the_log_its_records_build(records in records()) {
        let (bytes, _, logs) = segment(follow_on(records));
        let replayed = replay(path(), &bytes).unwrap();
        prop_assert_eq!(replayed, Replayed { log: logs.last().unwrap().clone(), end: bytes.len(), torn: false });
    }

    /// A segment cut anywhere (a crash during an append) replays to the log as of its last
    /// whole record, and says the rest is torn.
    #[test]
    fn a_segment_cut_anywhere_replays_its_whole_records(records in records(), cut in any::<prop::sample::Index>()) {
        let (bytes, ends, logs) = segment(follow_on(records));
        let cut = cut.index(bytes.len() + 1);
        let whole = ends.iter().filter(|&&end| end <= cut).count();
        match replay(path(), &bytes[..cut]) {
            Ok(replayed) => {
                prop_assert!(whole > 0);
                prop_assert_eq!(&replayed.log, &logs[whole - 1]);
                prop_assert_eq!((replayed.end, replayed.torn), (ends[whole - 1], ends[whole - 1] < cut));
            }
            Err(_) => prop_assert_eq!(whole, 0, "refused a segment with whole records"),
        }
    }

    /// Bytes of a segment changed in one stretch (corruption, or a torn write that zeroed
    /// them): replay keeps exactly the records before the damage, and only if no whole record
    /// follows it; otherwise it refuses. Never silently another log.
    #[test]
    fn a_segment_damaged_in_one_stretch_replays_what_precedes_it_or_is_refused(
        records in records(),
        at in any::<prop::sample::Index>(),
        len in 1usize..600,
        zero in any::<bool>(),
        noise in any::<u8>(),
    ) {
        let (bytes, ends, logs) = segment(follow_on(records));
        let start = at.index(bytes.len());
        let mut damaged = bytes.clone();
        for (i, byte) in damaged.iter_mut().enumerate().skip(start).take(len) {
            *byte = if zero { 0 } else { *byte ^ noise.wrapping_add(i as u8) | 1 };
        }
        let changed: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] != damaged[i]).collect();
        let (Some(&first), Some(&last)) = (changed.first(), changed.last()) else {
            return Ok(());
        };
        // Records wholly before the damage, and whether a whole one follows it.
        let intact_before = ends.iter().filter(|&&end| end <= first).count();
        let starts: Vec<usize> = std::iter::once(0).chain(ends.iter().copied()).collect();
        let whole_after = starts[..ends.len()].iter().any(|&s| s > last);
        match replay(path(), &damaged) {
            Ok(replayed) => {
                prop_assert!(!whole_after, "cut off whole records after the damage");
                prop_assert!(intact_before > 0);
                prop_assert_eq!(&replayed.log, &logs[intact_before - 1]);
            }
            Err(error) => {
                prop_assert!(matches!(error, StorageError::CorruptSegment { .. }), "{}", error);
                prop_assert!(whole_after || intact_before == 0, "refused a torn tail: {}", error);
            }
        }
    }
}
