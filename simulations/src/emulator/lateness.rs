//! A fixed-size histogram of release lateness in microseconds.
//!
//! Values below 128 µs are counted exactly; above, each power of two is cut
//! into 64 buckets, so a reported percentile is at most 1/64 (1.6%) below
//! the true value. The maximum is kept exactly. Recording is O(1) and never
//! allocates, so the release thread can record every packet.

/// Exact buckets below this value.
const LINEAR: u64 = 128;
/// Sub-buckets per power of two above `LINEAR`.
const SUB_BUCKETS: u64 = 64;
/// log2(LINEAR).
const LINEAR_BITS: u32 = 7;
const BUCKETS: usize = (LINEAR + (64 - LINEAR_BITS as u64) * SUB_BUCKETS) as usize;

/// Counts of lateness samples, in µs.
#[derive(Debug, Clone)]
pub struct LatenessHistogram {
    counts: Box<[u64]>,
    samples: u64,
    max_us: u64,
}

/// Percentiles of a [`LatenessHistogram`], µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatenessSummary {
    pub samples: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl LatenessHistogram {
    pub fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            samples: 0,
            max_us: 0,
        }
    }

    pub fn record(&mut self, us: u64) {
        let index = bucket_of(us);
        if let Some(count) = self.counts.get_mut(index) {
            *count += 1;
        }
        self.samples += 1;
        self.max_us = self.max_us.max(us);
    }

    /// The smallest recorded bucket value below which `fraction` of the
    /// samples lie (0 when empty).
    pub fn quantile(&self, fraction: f64) -> u64 {
        if self.samples == 0 {
            return 0;
        }
        let rank = ((fraction.clamp(0.0, 1.0) * self.samples as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return lower_bound(index).min(self.max_us);
            }
        }
        self.max_us
    }

    pub fn summary(&self) -> LatenessSummary {
        LatenessSummary {
            samples: self.samples,
            p50_us: self.quantile(0.5),
            p99_us: self.quantile(0.99),
            max_us: self.max_us,
        }
    }
}

impl Default for LatenessHistogram {
    fn default() -> Self {
        Self::new()
    }
}

fn bucket_of(us: u64) -> usize {
    if us < LINEAR {
        return us as usize;
    }
    let exponent = 63 - us.leading_zeros(); // ≥ LINEAR_BITS
    let mantissa = (us >> (exponent - 6)) & (SUB_BUCKETS - 1);
    (LINEAR + u64::from(exponent - LINEAR_BITS) * SUB_BUCKETS + mantissa) as usize
}

fn lower_bound(index: usize) -> u64 {
    let index = index as u64;
    if index < LINEAR {
        return index;
    }
    let exponent = (index - LINEAR) / SUB_BUCKETS + u64::from(LINEAR_BITS);
    let mantissa = (index - LINEAR) % SUB_BUCKETS;
    (1 << exponent) | (mantissa << (exponent - 6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_trip_within_one_sixty_fourth() {
        for us in [0, 1, 127, 128, 129, 1_000, 65_535, 1 << 40, u64::MAX] {
            let low = lower_bound(bucket_of(us));
            assert!(low <= us, "{us}: {low}");
            assert!(us - low <= us / 64, "{us}: {low}");
            assert!(bucket_of(us) < BUCKETS);
        }
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut histogram = LatenessHistogram::new();
        assert_eq!(histogram.summary(), LatenessSummary::default());
        for us in 1..=100 {
            histogram.record(us);
        }
        let summary = histogram.summary();
        assert_eq!(summary.samples, 100);
        assert_eq!(summary.p50_us, 50);
        assert_eq!(summary.p99_us, 99);
        assert_eq!(summary.max_us, 100);
        histogram.record(10_000);
        assert_eq!(histogram.summary().max_us, 10_000);
        assert!(histogram.quantile(1.0) >= 10_000 - 10_000 / 64);
    }
}
