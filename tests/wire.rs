//! The wire API as generated: its descriptor set (served by gRPC reflection)
//! names every service, and messages keep their encoding.

use longhaul_proto::v1;
use prost::Message;

#[test]
fn the_descriptor_set_describes_every_service() {
    let set = prost_types::FileDescriptorSet::decode(v1::FILE_DESCRIPTOR_SET).unwrap();
    let services: Vec<String> = set
        .file
        .iter()
        .flat_map(|file| {
            file.service
                .iter()
                .map(|s| format!("{}.{}", file.package(), s.name()))
        })
        .collect();
    for expected in [
        "longhaul.v1.Coordinator",
        "longhaul.v1.AgentService",
        "longhaul.v1.RaftTransport",
    ] {
        assert!(
            services.iter().any(|s| s == expected),
            "{expected} missing from {services:?}"
        );
    }
}

#[test]
fn raft_envelopes_carry_opaque_bytes_unchanged() {
    let envelope = v1::RaftEnvelope {
        from: 1,
        to: 2,
        message: vec![0, 255, 7, 0],
        cluster_id: 9,
    };
    let decoded = v1::RaftEnvelope::decode(envelope.encode_to_vec().as_slice()).unwrap();
    assert_eq!(decoded, envelope);
}
