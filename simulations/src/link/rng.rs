//! The link's random numbers: ChaCha8, keyed by the user's seed, with one
//! stream per kind of decision.
//!
//! The key is the seed as 8 little-endian bytes followed by 24 zero bytes.
//! Loss, jitter and duplication each read their own ChaCha stream (0, 1 and
//! 2), so switching jitter on does not change which packets are lost: two
//! runs that differ in one impairment are compared on common random numbers.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// Which decision a stream feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Loss = 0,
    Jitter = 1,
    Duplicate = 2,
}

/// One ChaCha8 stream.
#[derive(Debug, Clone)]
pub(crate) struct StreamRng(ChaCha8Rng);

impl StreamRng {
    pub(crate) fn new(seed: u64, stream: Stream) -> Self {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        let mut rng = ChaCha8Rng::from_seed(key);
        rng.set_stream(stream as u64);
        Self(rng)
    }

    /// Uniform in [0, 1): the top 53 bits of one `u64`, times 2⁻⁵³.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`; always draws, so the stream advances by one
    /// word per call whatever `p` is.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `[0, max]`: the high word of `next_u64 × (max + 1)`
    /// (Lemire's multiply-shift; bias below 2⁻⁶⁴ · max, and never a retry, so
    /// each call takes exactly one word).
    pub(crate) fn up_to(&mut self, max: u64) -> u64 {
        let range = u128::from(max) + 1;
        ((u128::from(self.0.next_u64()) * range) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_distinct_and_reproducible() {
        let mut a = StreamRng::new(7, Stream::Loss);
        let mut b = StreamRng::new(7, Stream::Loss);
        let mut c = StreamRng::new(7, Stream::Jitter);
        let xs: Vec<u64> = (0..8).map(|_| a.up_to(u64::MAX)).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.up_to(u64::MAX)).collect();
        let zs: Vec<u64> = (0..8).map(|_| c.up_to(u64::MAX)).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn bounded_draws_stay_in_range() {
        let mut rng = StreamRng::new(1, Stream::Jitter);
        for _ in 0..1000 {
            assert!(rng.up_to(3) <= 3);
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(rng.up_to(0), 0);
    }
}
