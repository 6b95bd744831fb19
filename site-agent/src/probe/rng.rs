//! The probes' seeded randomness: SplitMix64, small and stable across
//! releases, so a seed replays the same jitter and payload bytes.

#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(crate) fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

/// Mixes a seed with a name and a counter (FNV-1a of the name, then
/// SplitMix64), so derived seeds differ per peer and per round.
pub(crate) fn derive(seed: u64, name: &str, counter: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let mut rng = SplitMix64::new(seed ^ hash ^ counter.rotate_left(32));
    rng.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = SplitMix64::new(5);
        let mut b = SplitMix64::new(5);
        assert_eq!(a.bytes(37), b.bytes(37));
        let x = a.next_f64();
        assert!((0.0..1.0).contains(&x));
        assert_ne!(derive(1, "b", 0), derive(1, "c", 0));
        assert_ne!(derive(1, "b", 0), derive(1, "b", 1));
        assert_eq!(derive(1, "b", 2), derive(1, "b", 2));
    }
}
