//! Record payloads behind valid headers, so that the fuzzer reaches the decoder and the log's
//! replay past the checksums: the input is cut into payloads (a length byte, then that many
//! bytes), each framed as the log frames a record (`[length][crc32][payload]`), the last one
//! torn when the input says so. Each payload decodes to ops whose known fields survive a round
//! trip through their encoding, or is refused; the segment replays or is refused; never a panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use longhaul_coordinator::consensus::storage::wal::{LogOp, decode_ops, encode_record, replay};
use protobuf::{Message as _, UnknownFields};

/// `ops` without the unknown fields protobuf 2 keeps beside the known ones, at every level: it
/// keeps them in a hash map, so they encode in no fixed order, and it does not call an empty
/// map equal to none (a nested message met twice in the input is merged into one whose map is
/// empty, and comes back from its encoding with none).
fn known_fields(mut ops: Vec<LogOp>) -> Vec<LogOp> {
    for op in &mut ops {
        match op {
            LogOp::Append(entries) => {
                for entry in entries {
                    *entry.mut_unknown_fields() = UnknownFields::new();
                }
            }
            LogOp::HardState(hard_state) => *hard_state.mut_unknown_fields() = UnknownFields::new(),
            LogOp::Snapshot(meta) => {
                *meta.mut_unknown_fields() = UnknownFields::new();
                if meta.has_conf_state() {
                    *meta.mut_conf_state().mut_unknown_fields() = UnknownFields::new();
                }
            }
            LogOp::Compact { .. } | LogOp::Reset { .. } => {}
        }
    }
    ops
}

fuzz_target!(|input: &[u8]| {
    let Some((&flags, mut rest)) = input.split_first() else {
        return;
    };
    let mut segment = Vec::new();
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len).min(tail.len());
        let (payload, tail) = tail.split_at(len);
        rest = tail;
        if let Ok(ops) = decode_ops(payload) {
            let again = encode_record(&ops).expect("decoded ops encode");
            let back = decode_ops(&again[8..]).expect("encoded ops decode");
            assert_eq!(known_fields(back), known_fields(ops));
        }
        segment.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        segment.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        segment.extend_from_slice(payload);
    }
    if flags & 1 == 1 {
        // A torn last record: its end lost.
        let cut = usize::from(flags >> 1).min(segment.len());
        segment.truncate(segment.len() - cut);
    }
    if let Ok(replayed) = replay(Path::new("fuzz.wal"), &segment) {
        assert!(replayed.end <= segment.len());
    }
});
