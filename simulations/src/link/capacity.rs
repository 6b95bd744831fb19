//! When a packet's last bit leaves the link: serialisation at a (possibly
//! changing) rate, or delivery opportunities from a mahimahi trace.

use super::config::{DeliveryTrace, LinkConfig, MAHIMAHI_OPPORTUNITY_BYTES, RateChange};

/// `ceil(bits × 10⁹ / rate)` ns, saturating.
pub(crate) fn serialisation_ns(wire_bytes: u64, bits_per_second: u64) -> u64 {
    let bits = u128::from(wire_bytes) * 8;
    let rate = u128::from(bits_per_second.max(1));
    u64::try_from((bits * 1_000_000_000).div_ceil(rate)).unwrap_or(u64::MAX)
}

#[derive(Debug, Clone)]
pub(crate) enum Capacity {
    Rate {
        schedule: Vec<RateChange>,
        /// Number of schedule entries already in force; start times only
        /// grow, so this only moves forward.
        applied: usize,
        current: u64,
    },
    Trace {
        /// Opportunity times within one period, ns.
        offsets_ns: Vec<u64>,
        period_ns: u64,
        /// The last opportunity used, and the bytes it still had free.
        last_used: Option<u64>,
        leftover: u64,
    },
}

impl Capacity {
    pub(crate) fn new(config: &LinkConfig) -> Self {
        match (&config.rate, &config.delivery_trace) {
            (_, Some(trace)) => Self::from_trace(trace),
            (rate, None) => {
                let base = rate.map_or(1, |r| r.bits_per_second().max(1));
                Self::Rate {
                    schedule: config.rate_schedule.clone(),
                    applied: 0,
                    current: base,
                }
            }
        }
    }

    fn from_trace(trace: &DeliveryTrace) -> Self {
        Self::Trace {
            offsets_ns: trace
                .opportunities_ms
                .iter()
                .map(|ms| ms.saturating_mul(1_000_000))
                .collect(),
            period_ns: trace.period_ms().saturating_mul(1_000_000).max(1),
            last_used: None,
            leftover: 0,
        }
    }

    /// The rate in force at `at` (for a trace, `None`).
    pub(crate) fn rate_at(&mut self, at: u64) -> Option<u64> {
        match self {
            Self::Rate {
                schedule,
                applied,
                current,
                ..
            } => {
                while let Some(change) = schedule.get(*applied).filter(|c| c.at.as_nanos() <= at) {
                    *current = change.rate.bits_per_second().max(1);
                    *applied += 1;
                }
                Some(*current)
            }
            Self::Trace { .. } => None,
        }
    }

    /// Replaces the rate from now on (a runtime change, like a schedule
    /// entry); ignored for a trace-driven link.
    pub(crate) fn set_rate(&mut self, bits_per_second: u64) {
        if let Self::Rate {
            schedule,
            applied,
            current,
            ..
        } = self
        {
            *current = bits_per_second.max(1);
            *applied = schedule.len();
        }
    }

    /// When the last bit of a packet of `wire_bytes` leaves, given that it
    /// arrived at `arrival` and the transmitter is free from `free_at`
    /// (`free_at` and the returned times never decrease between calls).
    ///
    /// At a rate: the packet starts at `max(arrival, free_at)` and takes
    /// `ceil(bits × 10⁹ / rate)` ns at the rate in force when its first bit
    /// goes out (a change during the packet applies to the next one).
    ///
    /// On a trace: opportunity `k` is at `(k / n) × period + offset[k % n]`.
    /// Each carries 1500 bytes, split across packets as mahimahi does; bytes
    /// left over by one packet serve the next only if it had arrived by that
    /// opportunity. The packet leaves at the opportunity that carries its
    /// last byte (a zero-byte packet needs one byte of an opportunity).
    pub(crate) fn finish(&mut self, arrival: u64, free_at: u64, wire_bytes: u64) -> u64 {
        let start = arrival.max(free_at);
        match self {
            Self::Rate { .. } => {
                let rate = self.rate_at(start).unwrap_or(1);
                start.saturating_add(serialisation_ns(wire_bytes, rate))
            }
            Self::Trace {
                offsets_ns,
                period_ns,
                last_used,
                leftover,
            } => {
                let time_of = |k: u64| opportunity_time(offsets_ns, *period_ns, k);
                let mut need = wire_bytes.max(1);
                let mut next = first_opportunity_at_or_after(offsets_ns, *period_ns, arrival);
                if let Some(last) = *last_used {
                    if *leftover > 0 && time_of(last) >= arrival {
                        if *leftover >= need {
                            *leftover -= need;
                            return time_of(last);
                        }
                        need -= *leftover;
                    }
                    next = next.max(last.saturating_add(1));
                }
                let used = need.div_ceil(MAHIMAHI_OPPORTUNITY_BYTES);
                let final_opportunity = next.saturating_add(used - 1);
                *last_used = Some(final_opportunity);
                let carried = u128::from(used) * u128::from(MAHIMAHI_OPPORTUNITY_BYTES);
                *leftover = u64::try_from(carried - u128::from(need)).unwrap_or(0);
                time_of(final_opportunity)
            }
        }
    }
}

fn opportunity_time(offsets_ns: &[u64], period_ns: u64, k: u64) -> u64 {
    let n = offsets_ns.len().max(1) as u64;
    let offset = offsets_ns.get((k % n) as usize).copied().unwrap_or(0);
    let time = u128::from(k / n) * u128::from(period_ns) + u128::from(offset);
    u64::try_from(time).unwrap_or(u64::MAX)
}

/// The smallest `k` whose opportunity is at or after `at`. Period `r` holds
/// times up to `(r + 1) × period`, so the answer lies in period
/// `(at - 1) / period` (period 0 for `at = 0`).
fn first_opportunity_at_or_after(offsets_ns: &[u64], period_ns: u64, at: u64) -> u64 {
    let n = offsets_ns.len() as u64;
    let repetition = at.saturating_sub(1) / period_ns;
    let within = at - repetition * period_ns;
    let index = offsets_ns.partition_point(|&offset| offset < within) as u64;
    repetition.saturating_mul(n).saturating_add(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(ms: &[u64]) -> Capacity {
        Capacity::from_trace(&DeliveryTrace {
            opportunities_ms: ms.to_vec(),
        })
    }

    #[test]
    fn serialisation_rounds_up() {
        assert_eq!(serialisation_ns(1500, 1_000_000_000), 12_000);
        // 800 bits at 7 Mbit/s is 114 285.7 ns.
        assert_eq!(serialisation_ns(100, 7_000_000), 114_286);
        assert_eq!(serialisation_ns(0, 7_000_000), 0);
        assert_eq!(serialisation_ns(u64::MAX, 1), u64::MAX);
    }

    #[test]
    fn trace_opportunities_repeat_with_the_last_timestamp_as_period() {
        let offsets = [2_000_000, 5_000_000];
        assert_eq!(opportunity_time(&offsets, 5_000_000, 0), 2_000_000);
        assert_eq!(opportunity_time(&offsets, 5_000_000, 1), 5_000_000);
        assert_eq!(opportunity_time(&offsets, 5_000_000, 2), 7_000_000);
        assert_eq!(first_opportunity_at_or_after(&offsets, 5_000_000, 0), 0);
        assert_eq!(
            first_opportunity_at_or_after(&offsets, 5_000_000, 2_000_000),
            0
        );
        assert_eq!(
            first_opportunity_at_or_after(&offsets, 5_000_000, 2_000_001),
            1
        );
        assert_eq!(
            first_opportunity_at_or_after(&offsets, 5_000_000, 5_000_000),
            1
        );
        assert_eq!(
            first_opportunity_at_or_after(&offsets, 5_000_000, 5_000_001),
            2
        );
    }

    #[test]
    fn trace_packets_share_and_span_opportunities() {
        // One opportunity per millisecond.
        let mut link = trace(&[1]);
        // 1000 bytes at t=0 leave at 1 ms, leaving 500 bytes of it unused.
        assert_eq!(link.finish(0, 0, 1000), 1_000_000);
        // Queued behind it (arrived before 1 ms): uses the 500 left, then
        // needs one more opportunity for its other 500.
        assert_eq!(link.finish(500_000, 1_000_000, 1000), 2_000_000);
        // 3000 bytes arriving at 5.5 ms: the 2 ms leftover is gone; 6 and 7 ms.
        assert_eq!(link.finish(5_500_000, 2_000_000, 3000), 7_000_000);
        // A packet that arrives exactly at an opportunity can use it.
        assert_eq!(link.finish(9_000_000, 7_000_000, 1500), 9_000_000);
    }

    #[test]
    fn schedule_applies_at_the_first_bit() {
        let mut config = LinkConfig::new(
            longhaul_core::units::DataRate::from_gbit_per_second(1),
            longhaul_core::units::Distance::default(),
        );
        config.rate_schedule = vec![RateChange {
            at: longhaul_core::units::Duration::from_millis(1),
            rate: longhaul_core::units::DataRate::from_bits_per_second(100_000_000),
        }];
        let mut capacity = Capacity::new(&config);
        // Starts 1 ns before the change: the whole packet goes at 1 Gbit/s.
        assert_eq!(capacity.finish(999_999, 0, 1500), 999_999 + 12_000);
        // Starts at the change: 100 Mbit/s.
        assert_eq!(capacity.finish(2_000_000, 0, 1500), 2_000_000 + 120_000);
    }
}
