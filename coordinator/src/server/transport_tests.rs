//! What the raft transport decodes from a peer: envelopes ([`decode_envelope`]) and snapshot
//! chunks ([`SnapshotAssembly`]), with arbitrary bytes and mutations of valid streams. The same
//! targets run longer under cargo-fuzz (`fuzz/`).

#![allow(clippy::unwrap_used, reason = "tests")]

use proptest::prelude::*;
use prost::Message as _;
use protobuf::{Message as _, ProtobufEnum as _};
use raft::eraftpb::{Entry, Message, MessageType, Snapshot};
use tonic::Code;

use super::*;

const CLUSTER: u64 = 7;
const ID: u64 = 2;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A raft message with every field a peer may set.
fn message() -> impl Strategy<Value = Message> {
    let entry = (
        any::<u64>(),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(index, term, data)| Entry {
            index,
            term,
            data: data.into(),
            ..Entry::default()
        });
    (
        prop::sample::select(MessageType::values()),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
        (any::<u64>(), any::<bool>(), any::<u64>()),
        prop::collection::vec(entry, 0..4),
        prop::collection::vec(any::<u8>(), 0..32),
    )
        .prop_map(
            |(
                msg_type,
                (from, term, log_term, index),
                (commit, reject, hint),
                entries,
                context,
            )| {
                let mut message = Message {
                    from,
                    to: ID,
                    term,
                    log_term,
                    index,
                    commit,
                    reject,
                    reject_hint: hint,
                    context: context.into(),
                    ..Message::default()
                };
                message.set_msg_type(msg_type);
                message.set_entries(entries.into());
                message
            },
        )
}

fn envelope(message: &Message) -> RaftEnvelope {
    RaftEnvelope {
        from: message.from,
        to: message.to,
        message: message.write_to_bytes().unwrap(),
        cluster_id: CLUSTER,
    }
}

/// `message` without the unknown fields that protobuf 2 keeps beside the known ones, at every
/// level of a raft message. They are not compared: protobuf 2 keeps them in a hash map, so they
/// encode in no fixed order, and it does not call an empty map equal to none.
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

/// What a decoded message must be: addressed here, with every known field the same after a
/// round through its own encoding.
fn check_decoded(message: &Message) -> Result<(), TestCaseError> {
    prop_assert_eq!(message.to, ID);
    let again = Message::parse_from_bytes(&message.write_to_bytes().unwrap()).unwrap();
    prop_assert_eq!(known_fields(again), known_fields(message.clone()));
    Ok(())
}

/// The chunks the sender makes of a snapshot message (`send_snapshot`): the message without
/// its data in the first, `sizes` bytes of data in each, the CRC32 in the last.
fn chunks(message: &Message, sizes: &[usize]) -> Vec<SnapshotChunk> {
    let data = message.get_snapshot().get_data().to_vec();
    let mut header = message.clone();
    header.mut_snapshot().clear_data();
    let header = header.write_to_bytes().unwrap();
    let mut out = Vec::new();
    let mut offset = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let last = i + 1 == sizes.len();
        let end = if last {
            data.len()
        } else {
            (offset + size).min(data.len())
        };
        out.push(SnapshotChunk {
            from: message.from,
            to: message.to,
            cluster_id: CLUSTER,
            message: if i == 0 { header.clone() } else { Vec::new() },
            offset: offset as u64,
            data: data[offset..end].to_vec(),
            last,
            checksum: if last { crc32fast::hash(&data) } else { 0 },
        });
        offset = end;
    }
    out
}

fn snapshot_message() -> impl Strategy<Value = (Message, Vec<usize>)> {
    (
        message(),
        prop::collection::vec(any::<u8>(), 0..4096),
        prop::collection::vec(0usize..2048, 1..5),
    )
        .prop_map(|(mut message, data, sizes)| {
            message.set_msg_type(MessageType::MsgSnapshot);
            let mut snapshot = Snapshot::default();
            snapshot.mut_metadata().index = message.index;
            snapshot.mut_metadata().term = message.term;
            snapshot.data = data.into();
            message.set_snapshot(snapshot);
            (message, sizes)
        })
}

/// What a mutated chunk stream may give.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Refused(Code),
    SameOrRefused,
    Anything,
}

/// Feeds chunks to an assembly as the service does: the message once the last chunk came,
/// or the error that ends the stream.
fn assemble(chunks: Vec<SnapshotChunk>) -> Result<Message, Status> {
    let mut assembly = SnapshotAssembly::new(CLUSTER, ID);
    for chunk in chunks {
        if let Some(message) = assembly.push(chunk)? {
            return Ok(message);
        }
    }
    Err(SnapshotAssembly::cut_short().into())
}

/// A snapshot message from replica 1 to this one with `len` bytes of data.
fn snapshot_of(len: usize) -> Message {
    let mut message = Message {
        from: 1,
        to: ID,
        term: 3,
        index: 10,
        ..Message::default()
    };
    message.set_msg_type(MessageType::MsgSnapshot);
    let mut snapshot = Snapshot::default();
    snapshot.mut_metadata().index = 10;
    snapshot.mut_metadata().term = 3;
    snapshot.data = (0..len).map(|i| i as u8).collect::<Vec<u8>>().into();
    message.set_snapshot(snapshot);
    message
}

/// Feeds `chunks` to an assembly held to `limits`: the message, or the first refusal and
/// the index of the chunk refused.
fn assemble_within(
    limits: SnapshotLimits,
    chunks: Vec<SnapshotChunk>,
) -> Result<Message, (usize, SnapshotRefusal)> {
    let mut assembly = SnapshotAssembly::with_limits(CLUSTER, ID, limits);
    for (i, chunk) in chunks.into_iter().enumerate() {
        match assembly.push(chunk) {
            Ok(Some(message)) => return Ok(message),
            Ok(None) => {}
            Err(refusal) => return Err((i, refusal)),
        }
    }
    Err((usize::MAX, SnapshotAssembly::cut_short()))
}

const SMALL: SnapshotLimits = SnapshotLimits {
    max_bytes: 100,
    max_chunks: 4,
};

#[test]
fn the_default_bounds_admit_the_largest_snapshot_the_sender_cuts() {
    let chunks_of_largest = MAX_SNAPSHOT_BYTES.div_ceil(SNAPSHOT_CHUNK_BYTES as u64);
    assert!(chunks_of_largest <= MAX_SNAPSHOT_CHUNKS);
    assert_eq!(SnapshotLimits::default().max_bytes, MAX_SNAPSHOT_BYTES);
    // What the sender really sends reassembles, here across three chunks.
    let message = snapshot_of(2 * SNAPSHOT_CHUNK_BYTES + 5);
    let chunks = snapshot_chunks(CLUSTER, &message).unwrap();
    assert_eq!(chunks.len(), 3);
    assert_eq!(assemble(chunks).unwrap(), message);
    let empty = snapshot_of(0);
    assert_eq!(
        assemble(snapshot_chunks(CLUSTER, &empty).unwrap()).unwrap(),
        empty
    );
}

#[test]
fn a_snapshot_larger_than_the_bound_is_refused_at_the_chunk_that_passes_it() {
    let message = snapshot_of(101);
    let (at, refusal) = assemble_within(SMALL, chunks(&message, &[40, 40, 21])).unwrap_err();
    assert_eq!(at, 2);
    assert_eq!(
        refusal,
        SnapshotRefusal::TooLarge {
            chunk: 2,
            total: 101,
            max: 100
        }
    );
    let status = Status::from(refusal);
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().starts_with("data: "),
        "{}",
        status.message()
    );
    // One huge chunk is refused before it is kept.
    let (at, _) = assemble_within(SMALL, chunks(&message, &[101])).unwrap_err();
    assert_eq!(at, 0);
    // Exactly at the bound passes.
    let fits = snapshot_of(100);
    assert_eq!(
        assemble_within(SMALL, chunks(&fits, &[40, 40, 20])).unwrap(),
        fits
    );
}

#[test]
fn a_stream_of_more_chunks_than_the_bound_is_refused_even_when_they_are_empty() {
    let message = snapshot_of(4);
    assert_eq!(
        assemble_within(SMALL, chunks(&message, &[1, 1, 1, 1])).unwrap(),
        message
    );
    let (at, refusal) = assemble_within(SMALL, chunks(&message, &[1, 1, 1, 1, 0])).unwrap_err();
    assert_eq!(
        (at, refusal),
        (3, SnapshotRefusal::TooManyChunks { chunk: 3, max: 4 })
    );
    // Empty chunks at one offset for ever end at the bound too.
    let mut endless = chunks(&message, &[0, 0]);
    let filler = endless[1].clone();
    endless.truncate(1);
    endless.extend(std::iter::repeat_n(filler, 1000).map(|mut c| {
        c.last = false;
        c.checksum = 0;
        c.data.clear();
        c
    }));
    let (at, refusal) = assemble_within(SMALL, endless).unwrap_err();
    assert_eq!(at, 3);
    assert!(matches!(refusal, SnapshotRefusal::TooManyChunks { .. }));
    assert_eq!(Status::from(refusal).code(), Code::ResourceExhausted);
}

#[test]
fn a_chunk_that_repeats_or_skips_an_offset_is_refused_naming_the_offset() {
    let message = snapshot_of(30);
    let mut repeated = chunks(&message, &[10, 10, 10]);
    repeated.insert(2, repeated[1].clone());
    let (at, refusal) = assemble_within(SMALL, repeated).unwrap_err();
    assert_eq!(
        (at, refusal.clone()),
        (
            2,
            SnapshotRefusal::Offset {
                chunk: 2,
                expected: 20,
                found: 10
            }
        )
    );
    assert!(Status::from(refusal).message().starts_with("offset: "));
    let mut skipped = chunks(&message, &[10, 10, 10]);
    skipped.remove(1);
    let (at, refusal) = assemble_within(SMALL, skipped).unwrap_err();
    assert_eq!(at, 1);
    assert!(matches!(
        refusal,
        SnapshotRefusal::Offset {
            expected: 10,
            found: 20,
            ..
        }
    ));
}

#[test]
fn the_header_must_be_a_snapshot_from_the_sender_to_this_replica_and_only_in_the_first_chunk() {
    let message = snapshot_of(20);
    let refused = |mutate: &dyn Fn(&mut Vec<SnapshotChunk>)| {
        let mut stream = chunks(&message, &[10, 10]);
        mutate(&mut stream);
        let refusal = assemble_within(SMALL, stream).unwrap_err();
        let status = Status::from(refusal.1.clone());
        (refusal, status.code(), status.message().to_owned())
    };
    let header_of = |edit: &dyn Fn(&mut Message)| {
        let mut header = message.clone();
        header.mut_snapshot().clear_data();
        edit(&mut header);
        header.write_to_bytes().unwrap()
    };

    let not_snapshot = header_of(&|m| m.set_msg_type(MessageType::MsgAppend));
    let (refusal, code, text) = refused(&|s| s[0].message = not_snapshot.clone());
    assert_eq!(
        refusal,
        (0, SnapshotRefusal::NotASnapshot(MessageType::MsgAppend))
    );
    assert_eq!(code, Code::InvalidArgument);
    assert!(text.starts_with("message.msg_type: "), "{text}");

    let other_sender = header_of(&|m| m.from = 3);
    let (refusal, _, text) = refused(&|s| s[0].message = other_sender.clone());
    assert_eq!(
        refusal,
        (
            0,
            SnapshotRefusal::HeaderMismatch {
                field: "from",
                expected: 1,
                found: 3
            }
        )
    );
    assert!(text.starts_with("message.from: "), "{text}");

    let elsewhere = header_of(&|m| m.to = ID + 1);
    let (refusal, _, _) = refused(&|s| s[0].message = elsewhere.clone());
    assert!(matches!(
        refusal,
        (0, SnapshotRefusal::HeaderMismatch { field: "to", .. })
    ));

    let (refusal, _, text) = refused(&|s| s[1].message = s[0].message.clone());
    assert!(matches!(
        refusal,
        (1, SnapshotRefusal::MessageAfterFirst { chunk: 1, .. })
    ));
    assert!(text.starts_with("message: only the first chunk"), "{text}");

    let (refusal, _, text) = refused(&|s| s[1].from = 9);
    assert_eq!(
        refusal,
        (
            1,
            SnapshotRefusal::SenderChanged {
                chunk: 1,
                expected: 1,
                found: 9
            }
        )
    );
    assert!(text.starts_with("from: "), "{text}");

    let (refusal, _, text) = refused(&|s| s[0].checksum = 5);
    assert!(matches!(
        refusal,
        (
            0,
            SnapshotRefusal::ChecksumBeforeLast { chunk: 0, found: 5 }
        )
    ));
    assert!(text.starts_with("checksum: "), "{text}");
}

#[test]
fn nothing_is_taken_after_the_last_chunk_or_a_refusal() {
    let message = snapshot_of(20);
    let stream = chunks(&message, &[10, 10]);
    let mut assembly = SnapshotAssembly::new(CLUSTER, ID);
    assert_eq!(assembly.push(stream[0].clone()).unwrap(), None);
    assert_eq!(
        assembly.push(stream[1].clone()).unwrap(),
        Some(message.clone())
    );
    // A second stream's first chunk on the same call is not a new snapshot.
    assert_eq!(
        assembly.push(stream[0].clone()).unwrap_err(),
        SnapshotRefusal::AfterEnd
    );

    let mut assembly = SnapshotAssembly::new(CLUSTER, ID);
    assert_eq!(assembly.push(stream[0].clone()).unwrap(), None);
    let mut bad = stream[1].clone();
    bad.offset = 3;
    assert!(matches!(
        assembly.push(bad),
        Err(SnapshotRefusal::Offset { .. })
    ));
    assert!(assembly.data.is_empty() && assembly.header.is_none());
    assert_eq!(
        assembly.push(stream[1].clone()).unwrap_err(),
        SnapshotRefusal::AfterEnd
    );
}

/// The inputs on which the fuzz target's first round-trip checks failed, though nothing was
/// lost: a snapshot field sent twice leaves an empty map of unknown fields that protobuf 2
/// does not call equal to none, and unknown fields in a snapshot encode in no fixed order.
/// Every known field survives the round trip.
/// A peer that accepts the TCP connection and never speaks: the transfer fails at its
/// timeout instead of holding the peer's queue for good.
#[tokio::test]
async fn a_snapshot_to_a_peer_that_never_answers_fails_at_its_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let endpoint = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect_timeout(Duration::from_secs(1));
    let mut client = RaftTransportClient::new(endpoint.connect_lazy());
    let message = snapshot_of(3 * SNAPSHOT_CHUNK_BYTES);
    let sent = tokio::time::timeout(
        Duration::from_secs(20),
        send_snapshot(&mut client, CLUSTER, &message, Duration::from_millis(300)),
    )
    .await
    .expect("the transfer outlived its timeout");
    assert!(!sent);
    held.abort();
}

#[test]
fn a_snapshot_is_given_time_for_its_size() {
    assert_eq!(snapshot_timeout(0), SNAPSHOT_BASE_TIMEOUT);
    let largest = snapshot_timeout(MAX_SNAPSHOT_BYTES as usize);
    assert_eq!(
        largest,
        SNAPSHOT_BASE_TIMEOUT + Duration::from_secs(MAX_SNAPSHOT_BYTES / SNAPSHOT_MIN_RATE)
    );
}

#[test]
fn messages_with_unknown_and_repeated_fields_keep_their_known_fields_over_a_round_trip() {
    let inputs: [&[u8]; 2] = [
        &[
            0x58, 0x58, 0x58, 0x68, 0x10, 0x58, 0x58, 0x68, 0x10, 0x02, 0x30, 0x68, 0x68, 0x30,
            0x30, 0x58, 0x4a, 0x02, 0x30, 0x68, 0x68, 0x30, 0x30, 0x58, 0x4a, 0x34,
        ],
        &[
            0x10, 0x02, 0x4a, 0x95, 0x6f, 0xd0, 0xcb, 0x68, 0xe3, 0x68, 0xc8, 0x7e, 0x98, 0x68,
            0xc8, 0x97, 0x3e, 0x9d, 0x09,
        ],
    ];
    for bytes in inputs {
        let envelope = RaftEnvelope {
            from: 1,
            to: ID,
            message: bytes.to_vec(),
            cluster_id: CLUSTER,
        };
        let message = decode_envelope(CLUSTER, ID, &envelope).unwrap();
        check_decoded(&message).unwrap();
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn an_envelope_decodes_to_its_message_only_at_its_addressee_in_its_cluster(message in message()) {
        let envelope = envelope(&message);
        prop_assert_eq!(decode_envelope(CLUSTER, ID, &envelope).unwrap(), message.clone());
        prop_assert_eq!(decode_envelope(CLUSTER + 1, ID, &envelope).unwrap_err().code(), Code::PermissionDenied);
        prop_assert_eq!(decode_envelope(CLUSTER, ID + 1, &envelope).unwrap_err().code(), Code::InvalidArgument);
        // An envelope addressed here around a message for another replica.
        let mut elsewhere = message;
        elsewhere.to = ID + 1;
        let mut wrapped = envelope;
        wrapped.message = elsewhere.write_to_bytes().unwrap();
        prop_assert_eq!(decode_envelope(CLUSTER, ID, &wrapped).unwrap_err().code(), Code::InvalidArgument);
    }

    /// Any bytes where the raft message goes, and any mutation of a valid one: a message
    /// addressed here that survives its own round trip, or INVALID_ARGUMENT.
    #[test]
    fn arbitrary_or_mutated_message_bytes_decode_or_are_refused(
        message in message(),
        arbitrary in prop::collection::vec(any::<u8>(), 0..256),
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let mut mutated = message.write_to_bytes().unwrap();
        mutated.truncate(cut.index(mutated.len() + 1));
        for (at, byte) in flips {
            if !mutated.is_empty() {
                let at = at.index(mutated.len());
                mutated[at] ^= byte;
            }
        }
        for bytes in [arbitrary, mutated] {
            let envelope = RaftEnvelope { from: 1, to: ID, message: bytes, cluster_id: CLUSTER };
            match decode_envelope(CLUSTER, ID, &envelope) {
                Ok(message) => check_decoded(&message)?,
                Err(status) => prop_assert_eq!(status.code(), Code::InvalidArgument),
            }
        }
    }

    /// Any bytes as an envelope on the wire (what tonic decodes before the transport sees it).
    #[test]
    fn arbitrary_envelope_bytes_decode_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(envelope) = RaftEnvelope::decode(bytes.as_slice()) {
            match decode_envelope(CLUSTER, ID, &envelope) {
                Ok(message) => check_decoded(&message)?,
                Err(status) => prop_assert!(matches!(status.code(), Code::InvalidArgument | Code::PermissionDenied)),
            }
        }
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn a_snapshot_cut_into_chunks_reassembles_into_the_same_message((message, sizes) in snapshot_message()) {
        prop_assert_eq!(assemble(chunks(&message, &sizes)).unwrap(), message);
    }

    /// One mutation of a valid chunk stream: refused with the reason the mutation calls for,
    /// or the same message when it changed nothing that matters. Only the data is checksummed,
    /// so a mutation of the first chunk's message bytes (or dropping a first chunk without
    /// data) may reassemble into another message; that must not panic either.
    #[test]
    fn a_mutated_chunk_stream_is_refused_or_reassembles_into_the_same_message(
        (message, sizes) in snapshot_message(),
        mutation in 0..9u8,
        at in any::<prop::sample::Index>(),
        value in any::<u64>(),
    ) {
        let mut chunks = chunks(&message, &sizes);
        let i = at.index(chunks.len());
        let last = chunks.len() - 1;
        let expected = match mutation {
            0 => {
                chunks.remove(i);
                if i == 0 { Expect::Anything } else { Expect::SameOrRefused }
            }
            1 => { chunks[i].offset ^= value | 1; Expect::Refused(Code::InvalidArgument) }
            2 if !chunks[i].data.is_empty() => {
                let byte = (value as usize) % chunks[i].data.len();
                chunks[i].data[byte] ^= 1;
                Expect::Refused(Code::DataLoss)
            }
            3 => { chunks[i].checksum ^= (value as u32) | 1; Expect::SameOrRefused }
            4 => { chunks[i].last = !chunks[i].last; Expect::SameOrRefused }
            5 => { chunks[i].cluster_id ^= value | 1; Expect::Refused(Code::PermissionDenied) }
            6 => { chunks[i].to ^= value | 1; Expect::Refused(Code::InvalidArgument) }
            7 => {
                let len = chunks[i].message.len();
                chunks[i].message.truncate((value as usize) % (len + 1));
                Expect::Anything
            }
            _ => { chunks.swap(i, last - i); Expect::SameOrRefused }
        };
        let refusal = |status: &Status| matches!(status.code(), Code::InvalidArgument | Code::DataLoss);
        match (assemble(chunks), expected) {
            (Ok(got), Expect::SameOrRefused) => prop_assert_eq!(got, message),
            (Err(status), Expect::SameOrRefused | Expect::Anything) => prop_assert!(refusal(&status), "{:?}", status),
            (Ok(_), Expect::Anything) => {}
            (Ok(got), Expect::Refused(code)) => prop_assert!(false, "expected {:?}, got {:?}", code, got),
            (Err(status), Expect::Refused(code)) => prop_assert_eq!(status.code(), code),
        }
    }

    /// Any bytes as a stream of chunks (length-delimited, as gRPC frames them).
    #[test]
    fn arbitrary_chunk_streams_are_refused_or_reassemble(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut rest = bytes.as_slice();
        let mut chunks = Vec::new();
        while let Ok(chunk) = SnapshotChunk::decode_length_delimited(&mut rest) {
            chunks.push(chunk);
            if rest.is_empty() { break; }
        }
        match assemble(chunks) {
            Ok(message) => prop_assert!(message.has_snapshot()),
            Err(status) => prop_assert!(matches!(
                status.code(),
                Code::InvalidArgument | Code::DataLoss | Code::PermissionDenied
            )),
        }
    }
}
