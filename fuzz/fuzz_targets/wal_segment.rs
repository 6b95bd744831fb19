//! A log segment's bytes as open reads them (`wal::replay`): a log or a `CorruptSegment`
//! error, never a panic; a log says where its whole records end.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use longhaul_coordinator::consensus::storage::wal::replay;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(replayed) = replay(Path::new("fuzz.wal"), bytes) {
        assert!(replayed.end <= bytes.len());
        assert_eq!(replayed.torn, replayed.end < bytes.len());
    }
});
