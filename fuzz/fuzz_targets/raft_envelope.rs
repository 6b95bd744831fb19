//! What a peer's `Send` stream delivers: the input as an envelope on the wire, and as the raft
//! message inside one (`transport::decode_envelope`). A message addressed here whose known
//! fields survive a round trip through its encoding, or a refusal; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use longhaul_coordinator::server::transport::decode_envelope;
use longhaul_proto::v1::RaftEnvelope;
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::Message;

const CLUSTER: u64 = 7;
const ID: u64 = 2;

/// `message` without the unknown fields protobuf 2 keeps beside the known ones, at every level
/// of a raft message: it keeps them in a hash map, so they encode in no fixed order, and it
/// does not call an empty map equal to none.
fn known_fields(mut message: Message) -> Message {
    *message.mut_unknown_fields() = protobuf::UnknownFields::new();
    for entry in message.mut_entries() {
        *entry.mut_unknown_fields() = protobuf::UnknownFields::new();
    }
    let snapshot = message.mut_snapshot();
    *snapshot.mut_unknown_fields() = protobuf::UnknownFields::new();
    let metadata = snapshot.mut_metadata();
    *metadata.mut_unknown_fields() = protobuf::UnknownFields::new();
    *metadata.mut_conf_state().mut_unknown_fields() = protobuf::UnknownFields::new();
    message
}

fn check(envelope: &RaftEnvelope) {
    if let Ok(message) = decode_envelope(CLUSTER, ID, envelope) {
        assert_eq!(message.to, ID);
        let bytes = message.write_to_bytes().expect("a decoded message encodes");
        let again = Message::parse_from_bytes(&bytes).expect("and decodes");
        assert_eq!(known_fields(again), known_fields(message));
    }
}

fuzz_target!(|bytes: &[u8]| {
    if let Ok(envelope) = RaftEnvelope::decode(bytes) {
        check(&envelope);
    }
    check(&RaftEnvelope {
        from: 1,
        to: ID,
        message: bytes.to_vec(),
        cluster_id: CLUSTER,
    });
});
