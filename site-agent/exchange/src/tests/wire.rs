//! The wire's messages: every kind round-trips; random bytes, every
//! flipped byte and every truncation are refused without a panic; each
//! field out of bounds is refused by name.

use proptest::prelude::*;

use crate::plan::MAX_CHUNK_ELEMENTS;
use crate::wire::*;

fn header(kind: Kind) -> Header {
    Header {
        kind,
        job: "job-1".to_string(),
        round: 7,
        plan: 0xDEAD_BEEF,
        chunk: ChunkId {
            phase: Phase::AllGather,
            fragment: 3,
            shard: 2,
            offset: 1 << 20,
            length: if matches!(kind, Kind::Hello | Kind::Welcome) {
                0
            } else {
                100
            },
        },
    }
}

/// A codec frame of 100 elements, as a data message carries.
fn codec_frame() -> Vec<u8> {
    let config = longhaul_codec::EncoderConfig::new(8, 32, false, false).unwrap();
    let values: Vec<f32> = (0..100).map(|k| k as f32 / 10.0).collect();
    longhaul_codec::Encoder::new(config, 100)
        .encode(&values)
        .unwrap()
        .into_bytes()
}

fn data_message() -> Vec<u8> {
    encode_to_vec(&header(Kind::Data), &codec_frame()).unwrap()
}

/// Recomputes both checksums after a field was changed by hand.
fn reseal(bytes: &mut [u8]) {
    let job = bytes[7] as usize;
    let payload_crc = crc32c::crc32c(&bytes[FIXED_LEN + job + 4..]);
    bytes[44..48].copy_from_slice(&payload_crc.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..FIXED_LEN + job]);
    bytes[FIXED_LEN + job..FIXED_LEN + job + 4].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn every_kind_round_trips() {
    let cases: Vec<(Kind, Vec<u8>)> = vec![
        (Kind::Hello, b"site-a".to_vec()),
        (Kind::Welcome, 42u64.to_le_bytes().to_vec()),
        (Kind::Data, codec_frame()),
        (Kind::Ack, Vec::new()),
        (Kind::Refused, "payload_crc32c: wrong".as_bytes().to_vec()),
    ];
    for (kind, payload) in cases {
        let bytes = encode_to_vec(&header(kind), &payload).unwrap();
        assert_eq!(message_length(&bytes), Ok(bytes.len()), "{kind:?}");
        let message = decode(&bytes).unwrap();
        assert_eq!(message.header, header(kind));
        assert_eq!(message.payload, &payload[..]);
    }
}

#[test]
fn every_flipped_byte_and_every_truncation_is_refused() {
    let bytes = data_message();
    for at in 0..bytes.len() {
        for bit in [0x01, 0x80] {
            let mut bad = bytes.clone();
            bad[at] ^= bit;
            assert!(decode(&bad).is_err(), "byte {at} bit {bit:#x} passed");
        }
    }
    for len in 0..bytes.len() {
        let error = decode(&bytes[..len]).unwrap_err();
        assert!(
            matches!(error, WireError::Truncated { .. }),
            "{len} bytes: {error}"
        );
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(matches!(
        decode(&long),
        Err(WireError::TrailingBytes { .. })
    ));
}

#[test]
fn each_field_out_of_bounds_is_refused_by_name() {
    let good = data_message();
    let with = |at: usize, value: &[u8]| {
        let mut bytes = good.clone();
        bytes[at..at + value.len()].copy_from_slice(value);
        reseal(&mut bytes);
        decode(&bytes).unwrap_err().to_string()
    };
    let cases: Vec<(String, &str)> = vec![
        (with(0, b"LHPG"), "magic"),
        (with(4, &[2]), "version: 2 is not supported"),
        (with(5, &[9]), "kind: 9"),
        (with(6, &[2]), "phase: 2"),
        (with(7, &[0]), "job_length: 0"),
        (with(7, &[64]), "job_length: 64"),
        (
            with(36, &0u32.to_le_bytes()),
            "length: 0 elements in a data message",
        ),
        (
            with(36, &(MAX_CHUNK_ELEMENTS + 1).to_le_bytes()),
            "length: 16777217",
        ),
        (with(36, &10u32.to_le_bytes()), "payload_length"),
        (
            with(40, &u32::MAX.to_le_bytes()),
            "payload_length: 4294967295",
        ),
        (with(48, &[0xFF]), "job: not UTF-8"),
    ];
    for (error, expected) in cases {
        assert!(
            error.contains(expected),
            "{error:?} should say {expected:?}"
        );
    }
    // A header checksum or payload checksum that does not match.
    let mut bytes = good.clone();
    bytes[8] ^= 1;
    assert!(matches!(
        decode(&bytes),
        Err(WireError::HeaderChecksum { .. })
    ));
    let mut bytes = good.clone();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    assert!(matches!(
        decode(&bytes),
        Err(WireError::PayloadChecksum { .. })
    ));
    // A hello whose site id is not one; a welcome with a chunk length.
    let mut hello = encode_to_vec(&header(Kind::Hello), b"site-a").unwrap();
    let at = hello.len() - 6;
    hello[at] = 0;
    reseal(&mut hello);
    let error = decode(&hello).unwrap_err().to_string();
    assert!(error.contains("site id is holding a NUL"), "{error}");
    let mut welcome = header(Kind::Welcome);
    welcome.chunk.length = 1;
    let error = encode_to_vec(&welcome, &[0; 8]).unwrap_err().to_string();
    assert!(
        error.contains("length: 1 elements in a welcome message, must be 0"),
        "{error}"
    );
    let error = encode_to_vec(&header(Kind::Hello), b"")
        .unwrap_err()
        .to_string();
    assert!(error.contains("hello"), "{error}");
}

#[test]
fn no_message_exceeds_the_bound() {
    let mut fixed = data_message()[..FIXED_LEN].to_vec();
    fixed[7] = 63;
    fixed[36..40].copy_from_slice(&MAX_CHUNK_ELEMENTS.to_le_bytes());
    let most = 28 + 2 * MAX_CHUNK_ELEMENTS;
    fixed[40..44].copy_from_slice(&most.to_le_bytes());
    assert_eq!(message_length(&fixed), Ok(MAX_MESSAGE_BYTES));
    fixed[40..44].copy_from_slice(&(most + 1).to_le_bytes());
    assert!(message_length(&fixed).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_are_refused_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = message_length(&bytes);
        let _ = decode(&bytes);
    }

    #[test]
    fn random_bytes_after_a_valid_fixed_header_are_refused_without_a_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..300),
        keep in 0usize..FIXED_LEN,
    ) {
        let mut bytes = data_message()[..keep.max(8)].to_vec();
        bytes.extend_from_slice(&tail);
        let _ = message_length(&bytes);
        prop_assert!(decode(&bytes).is_err() || bytes == data_message());
    }

    #[test]
    fn headers_round_trip(
        round in any::<u64>(),
        fragment in any::<u32>(),
        shard in any::<u32>(),
        plan in any::<u32>(),
        offset in any::<u64>(),
        length in 1u32..=MAX_CHUNK_ELEMENTS,
        job in "[a-z0-9-]{1,63}",
        gather in any::<bool>(),
    ) {
        let header = Header {
            kind: Kind::Ack,
            job,
            round,
            plan,
            chunk: ChunkId {
                phase: if gather { Phase::AllGather } else { Phase::ReduceScatter },
                fragment,
                shard,
                offset,
                length,
            },
        };
        let bytes = encode_to_vec(&header, &[]).unwrap();
        prop_assert_eq!(decode(&bytes).unwrap().header, header);
    }
}
