//! The link's random numbers: the project's seeded family
//! ([`longhaul_core::rng::SeedRng`], ChaCha8 keyed by the user's seed), with
//! one stream per kind of decision.
//!
//! Loss, jitter and duplication each read their own ChaCha stream (0, 1 and
//! 2), so switching jitter on does not change which packets are lost: two
//! runs that differ in one impairment are compared on common random numbers.

use longhaul_core::rng::SeedRng;

/// Which decision a stream feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Loss = 0,
    Jitter = 1,
    Duplicate = 2,
}

/// The stream of `seed` that feeds `stream`'s decisions.
pub(crate) fn stream(seed: u64, stream: Stream) -> SeedRng {
    SeedRng::with_stream(seed, stream as u64)
}
