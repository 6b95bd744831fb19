//! The catch-up messages: both round-trip; every truncation, every
//! flipped byte and random bytes are refused without a panic; a response
//! of another round or size than the request's is refused by field.

use proptest::prelude::*;

use crate::catchup::*;

fn request() -> CatchUpRequest {
    CatchUpRequest {
        job: "chars-diloco".to_string(),
        site: "south".to_string(),
        round: 12,
        elements: 100_992,
    }
}

#[test]
fn a_request_round_trips_and_its_bounds_are_refused_by_field() {
    let bytes = encode_request(&request()).unwrap();
    assert_eq!(
        bytes.len(),
        REQUEST_FIXED_LEN + "chars-diloco".len() + "south".len() + 4
    );
    assert_eq!(request_length(&bytes).unwrap(), bytes.len());
    assert_eq!(decode_request(&bytes).unwrap(), request());
    for (bad, field) in [
        (
            CatchUpRequest {
                job: String::new(),
                ..request()
            },
            "job_length",
        ),
        (
            CatchUpRequest {
                job: "j".repeat(MAX_JOB_BYTES + 1),
                ..request()
            },
            "job_length",
        ),
        (
            CatchUpRequest {
                site: "a\0b".to_string(),
                ..request()
            },
            "site",
        ),
        (
            CatchUpRequest {
                elements: 0,
                ..request()
            },
            "elements",
        ),
        (
            CatchUpRequest {
                elements: MAX_STATE_ELEMENTS + 1,
                ..request()
            },
            "elements",
        ),
    ] {
        let error = encode_request(&bad).unwrap_err().to_string();
        assert!(error.starts_with(field), "{error}");
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(matches!(
        decode_request(&trailing),
        Err(CatchUpWireError::TrailingBytes { .. })
    ));
}

#[test]
fn every_truncation_and_every_flipped_byte_of_a_request_is_refused() {
    let bytes = encode_request(&request()).unwrap();
    for end in 0..bytes.len() {
        assert!(decode_request(&bytes[..end]).is_err(), "truncated at {end}");
    }
    for at in 0..bytes.len() {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x40;
        assert!(decode_request(&flipped).is_err(), "byte {at} flipped");
    }
}

#[test]
fn a_state_response_is_the_size_and_round_requested_and_checked() {
    let state: Vec<u8> = (0..request().elements * 4).map(|k| k as u8).collect();
    let header = ResponseHeader::State {
        round: 12,
        elements: request().elements,
        crc32c: crc32c::crc32c(&state),
    };
    let bytes = encode_response_header(&header).unwrap();
    let decoded = decode_response_header(&bytes, &request()).unwrap();
    assert_eq!(decoded, header);
    assert_eq!(decoded.payload_bytes(), state.len() as u64);
    check_payload(&decoded, &state).unwrap();
    let mut corrupt = state.clone();
    corrupt[1000] ^= 1;
    let error = check_payload(&decoded, &corrupt).unwrap_err().to_string();
    assert!(error.starts_with("payload_crc32c"), "{error}");
    assert!(check_payload(&decoded, &state[..state.len() - 4]).is_err());
    // A peer cannot make the requester read more (or other) than it asked.
    let bigger = CatchUpRequest {
        elements: request().elements - 1,
        ..request()
    };
    let error = decode_response_header(&bytes, &bigger)
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("elements"), "{error}");
    let other_round = CatchUpRequest {
        round: 11,
        ..request()
    };
    let error = decode_response_header(&bytes, &other_round)
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("round"), "{error}");
    for end in 0..bytes.len() {
        assert!(decode_response_header(&bytes[..end], &request()).is_err());
    }
    for at in 0..bytes.len() {
        let mut flipped = bytes;
        flipped[at] ^= 0x02;
        assert!(
            decode_response_header(&flipped, &request()).is_err(),
            "byte {at} flipped"
        );
    }
}

#[test]
fn a_refusal_carries_its_reason_shortened_at_a_character() {
    let (header, reason) = refusal(12, "no state after round 12 here");
    let decoded = decode_response_header(&header, &request()).unwrap();
    assert!(matches!(decoded, ResponseHeader::Refused { .. }));
    check_payload(&decoded, &reason).unwrap();
    assert_eq!(reason, b"no state after round 12 here");
    let long = "é".repeat(MAX_REASON_BYTES);
    let (header, reason) = refusal(12, &long);
    assert!(reason.len() <= MAX_REASON_BYTES && std::str::from_utf8(&reason).is_ok());
    let decoded = decode_response_header(&header, &request()).unwrap();
    check_payload(&decoded, &reason).unwrap();
    let (_, reason) = refusal(12, "");
    assert_eq!(reason, b"refused");
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
        let _ = decode_request(&bytes);
        let _ = request_length(&bytes);
        if let Ok(header) = decode_response_header(&bytes, &request()) {
            let _ = check_payload(&header, &bytes);
        }
    }
}
