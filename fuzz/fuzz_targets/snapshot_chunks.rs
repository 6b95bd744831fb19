//! What a peer's `InstallSnapshot` stream delivers: the input as length-delimited chunks (as
//! gRPC frames them), fed to `transport::SnapshotAssembly` until it refuses one or the last
//! arrives. A snapshot message or a refusal; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use longhaul_coordinator::server::transport::SnapshotAssembly;
use longhaul_proto::v1::SnapshotChunk;
use prost::Message as _;

fuzz_target!(|bytes: &[u8]| {
    let mut rest = bytes;
    let mut assembly = SnapshotAssembly::new(7, 2);
    while !rest.is_empty() {
        let Ok(chunk) = SnapshotChunk::decode_length_delimited(&mut rest) else {
            return;
        };
        let (checksum, last) = (chunk.checksum, chunk.last);
        match assembly.push(chunk) {
            Ok(Some(message)) => {
                assert!(last);
                assert_eq!(crc32fast::hash(message.get_snapshot().get_data()), checksum);
                return;
            }
            Ok(None) => {}
            Err(_) => return,
        }
    }
});
