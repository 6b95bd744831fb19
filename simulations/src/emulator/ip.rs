//! The few IPv4 header fields the packet-level mode reads or writes: the
//! destination (to pick the link) and the ECN bits (to mark rather than
//! drop). Nothing else of a packet is looked at or changed.

use std::net::Ipv4Addr;

/// Bytes of an IPv4 header without options.
const MIN_HEADER: usize = 20;

/// The length of a well-formed IPv4 header at the start of `packet`.
fn header_len(packet: &[u8]) -> Option<usize> {
    let first = *packet.first()?;
    if first >> 4 != 4 {
        return None;
    }
    let len = usize::from(first & 0x0f) * 4;
    (len >= MIN_HEADER && packet.len() >= len).then_some(len)
}

/// The destination of an IPv4 packet; `None` for anything else (IPv6, a
/// truncated header).
pub fn destination(packet: &[u8]) -> Option<Ipv4Addr> {
    header_len(packet)?;
    let bytes: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
    Some(Ipv4Addr::from(bytes))
}

/// Whether an IPv4 packet says it is ECN-capable (ECT(0), ECT(1), or
/// already CE).
pub fn ecn_capable(packet: &[u8]) -> bool {
    header_len(packet).is_some() && packet[1] & 0b11 != 0
}

/// Sets Congestion Experienced on an ECN-capable IPv4 packet and updates
/// its header checksum; leaves anything else alone.
pub fn set_congestion_experienced(packet: &mut [u8]) {
    let Some(len) = header_len(packet) else {
        return;
    };
    if packet[1] & 0b11 == 0 {
        return;
    }
    packet[1] |= 0b11;
    packet[10..12].copy_from_slice(&[0, 0]);
    let checksum = checksum(&packet[..len]);
    packet[10..12].copy_from_slice(&checksum.to_be_bytes());
}

/// The Internet checksum of a header (RFC 1071): 0 over a header whose
/// checksum field is right.
fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks_exact(2)
        .map(|word| u32::from(u16::from_be_bytes([word[0], word[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 20-byte TCP header with ECT(0), 198.18.0.1 → 198.18.0.2.
    fn header() -> Vec<u8> {
        let mut packet = vec![
            0x45, 0x02, 0x00, 0x3c, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x06, 0, 0, 198, 18, 0, 1, 198,
            18, 0, 2,
        ];
        set_checksum(&mut packet);
        packet
    }

    fn set_checksum(packet: &mut [u8]) {
        packet[10..12].copy_from_slice(&[0, 0]);
        let sum = checksum(&packet[..20]);
        packet[10..12].copy_from_slice(&sum.to_be_bytes());
    }

    #[test]
    fn reads_the_destination_and_marks_with_a_correct_checksum() {
        let mut packet = header();
        assert_eq!(destination(&packet), Some(Ipv4Addr::new(198, 18, 0, 2)));
        assert!(ecn_capable(&packet));
        set_congestion_experienced(&mut packet);
        assert_eq!(packet[1] & 0b11, 0b11);
        assert_eq!(checksum(&packet[..20]), 0);
    }

    #[test]
    fn leaves_packets_that_are_not_ecn_capable_or_not_ipv4_alone() {
        let mut packet = header();
        packet[1] = 0;
        set_checksum(&mut packet);
        let before = packet.clone();
        set_congestion_experienced(&mut packet);
        assert_eq!(packet, before);
        let mut ipv6 = vec![0x60; 40];
        assert_eq!(destination(&ipv6), None);
        assert!(!ecn_capable(&ipv6));
        set_congestion_experienced(&mut ipv6);
        assert_eq!(ipv6, vec![0x60; 40]);
        assert_eq!(destination(&[0x45, 0, 0]), None);
    }
}
