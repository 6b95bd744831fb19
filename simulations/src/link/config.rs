//! What a link is configured with, and the checks that make a configuration
//! safe to run: after [`LinkConfig::validate`] succeeds, nothing the model
//! computes from it can divide by zero, overflow or panic.

use longhaul_core::topology::{FIBRE_SECONDS_PER_KM, WanLink};
use longhaul_core::units::{ByteSize, DataRate, Distance, Duration};
use serde::Deserialize;

/// The bytes one mahimahi delivery opportunity carries.
pub const MAHIMAHI_OPPORTUNITY_BYTES: u64 = 1500;

/// The smallest buffer the default (one BDP) may shrink to, so that a link
/// with almost no delay still holds one full-size packet.
pub const MIN_DEFAULT_BUFFER_BYTES: u64 = 1500;

/// Longest fixed one-way delay accepted: a day. Anything longer is a typo,
/// and the bound keeps every later time computation far from `u64::MAX`.
const MAX_ONE_WAY_NS: u64 = 86_400 * 1_000_000_000;

/// One direction of a link.
///
/// Keys are snake_case like the topology's; quantities are unit strings
/// (`"80 km"`, `"10 Gbit/s"`, `"64 KiB"`, `"20 us"`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    /// Fibre route length; propagation is `distance × fibre_delay_per_km`.
    #[serde(default)]
    pub distance: Distance,
    /// One-way delay per kilometre of fibre; 5 µs unless overridden (hollow-core
    /// fibre is about 3.5 µs).
    #[serde(default = "default_fibre_delay_per_km")]
    pub fibre_delay_per_km: Duration,
    /// Fixed one-way delay added to propagation (transponders, switching).
    #[serde(default)]
    pub overhead: Duration,
    /// Line rate. Exactly one of `rate` and `delivery_trace` is set.
    #[serde(default)]
    pub rate: Option<DataRate>,
    /// Changes of `rate` over time, in increasing order of `at`.
    #[serde(default)]
    pub rate_schedule: Vec<RateChange>,
    /// A mahimahi trace that replaces `rate`.
    #[serde(default)]
    pub delivery_trace: Option<DeliveryTrace>,
    /// Bytes added to every packet on the wire (framing, preamble, gap): they
    /// take serialisation time but no buffer space.
    #[serde(default)]
    pub per_packet_overhead: ByteSize,
    /// Egress buffer; one bandwidth-delay product (rate × RTT) when unset,
    /// and never less than [`MIN_DEFAULT_BUFFER_BYTES`].
    #[serde(default)]
    pub buffer: Option<ByteSize>,
    /// Step marking threshold K: a packet that would take the backlog above K
    /// is marked if ECN-capable and dropped otherwise (RED with min = max = K).
    #[serde(default)]
    pub ecn_threshold: Option<ByteSize>,
    #[serde(default)]
    pub loss: LossModel,
    #[serde(default)]
    pub jitter: Option<Jitter>,
    /// Probability that a delivered packet is delivered twice.
    #[serde(default)]
    pub duplicate: f64,
    /// Scheduled outages, in increasing order, not overlapping.
    #[serde(default)]
    pub outages: Vec<Outage>,
}

fn default_fibre_delay_per_km() -> Duration {
    Duration::from_nanos((FIBRE_SECONDS_PER_KM * 1e9).round() as u64)
}

/// From `at` on, the link runs at `rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateChange {
    /// Time since the link's origin (virtual time 0).
    pub at: Duration,
    pub rate: DataRate,
}

/// The link is down in `[from, until)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    pub from: Duration,
    pub until: Duration,
}

/// How packets are lost on the wire.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(tag = "model", rename_all = "snake_case", deny_unknown_fields)]
pub enum LossModel {
    #[default]
    None,
    /// Each packet is lost independently with probability `p`.
    Bernoulli { p: f64 },
    /// netem's `gemodel p r 1-h 1-k`: a good and a bad state.
    GilbertElliott {
        /// P(good → bad), drawn per packet.
        p: f64,
        /// P(bad → good), drawn per packet.
        r: f64,
        /// Loss probability in the bad state (netem's `1-h`); 1 by default.
        #[serde(rename = "1-h", alias = "loss_in_bad", default = "one")]
        loss_in_bad: f64,
        /// Loss probability in the good state (netem's `1-k`); 0 by default.
        #[serde(rename = "1-k", alias = "loss_in_good", default)]
        loss_in_good: f64,
    },
    /// Drop exactly the packets with these indices (0-based, counting every
    /// packet offered to the link), in increasing order.
    Trace { drop: Vec<u64> },
}

fn one() -> f64 {
    1.0
}

impl LossModel {
    /// The long-run fraction of packets lost: for Gilbert-Elliott
    /// `π_bad·(1-h) + π_good·(1-k)` with `π_bad = p / (p + r)`. `None` for a
    /// trace, whose rate depends on how many packets are sent.
    pub fn stationary_loss(&self) -> Option<f64> {
        match *self {
            Self::None => Some(0.0),
            Self::Bernoulli { p } => Some(p),
            Self::GilbertElliott {
                p,
                r,
                loss_in_bad,
                loss_in_good,
            } => {
                let bad = if p + r > 0.0 { p / (p + r) } else { 0.0 };
                Some(bad * loss_in_bad + (1.0 - bad) * loss_in_good)
            }
            Self::Trace { .. } => None,
        }
    }
}

/// Extra delay drawn uniformly from `[0, max]` ns for every delivered packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Jitter {
    pub max: Duration,
    #[serde(default)]
    pub mode: JitterMode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JitterMode {
    /// A packet is never delivered before the one sent ahead of it.
    #[default]
    Fifo,
    /// Each packet gets its own delay; packets can overtake each other.
    Reorder,
}

/// A mahimahi link trace: each entry is a millisecond timestamp at which
/// 1500 bytes can leave the link; the trace repeats with a period equal to
/// its last timestamp.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct DeliveryTrace {
    pub opportunities_ms: Vec<u64>,
}

impl DeliveryTrace {
    /// Parses a mahimahi trace file: one whole number of milliseconds per
    /// line; blank lines are skipped.
    pub fn from_mahimahi(text: &str) -> Result<Self, LinkConfigError> {
        let mut opportunities_ms = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let ms = line.parse().map_err(|_| LinkConfigError::TraceLine {
                line: number + 1,
                found: line.to_string(),
            })?;
            opportunities_ms.push(ms);
        }
        let trace = Self { opportunities_ms };
        trace.validate()?;
        Ok(trace)
    }

    /// The trace's period in milliseconds (its last timestamp).
    pub fn period_ms(&self) -> u64 {
        self.opportunities_ms.last().copied().unwrap_or(0)
    }

    /// Mean rate over one period, bits per second.
    pub fn mean_bits_per_second(&self) -> u64 {
        let bits = self.opportunities_ms.len() as u128 * u128::from(MAHIMAHI_OPPORTUNITY_BYTES) * 8;
        let period_ms = u128::from(self.period_ms().max(1));
        u64::try_from(bits * 1000 / period_ms).unwrap_or(u64::MAX)
    }

    fn validate(&self) -> Result<(), LinkConfigError> {
        if self.opportunities_ms.is_empty() {
            return Err(LinkConfigError::EmptyDeliveryTrace);
        }
        for (index, pair) in self.opportunities_ms.windows(2).enumerate() {
            if pair[1] < pair[0] {
                return Err(LinkConfigError::UnsortedDeliveryTrace {
                    index: index + 1,
                    value: pair[1],
                    previous: pair[0],
                });
            }
        }
        let period_ms = self.period_ms();
        if period_ms == 0 {
            return Err(LinkConfigError::ZeroTracePeriod);
        }
        if period_ms > MAX_ONE_WAY_NS / 1_000_000 {
            return Err(LinkConfigError::TooLong {
                field: "delivery_trace",
            });
        }
        Ok(())
    }
}

/// Why a link configuration was rejected. Each message names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LinkConfigError {
    #[error("set `rate` or `delivery_trace`: a link needs a capacity")]
    NoCapacity,
    #[error("set only one of `rate` and `delivery_trace`, not both")]
    RateAndTrace,
    #[error("`rate_schedule` changes `rate`; it cannot be combined with `delivery_trace`")]
    ScheduleWithTrace,
    #[error("`{field}` must be a positive data rate, found 0")]
    ZeroRate { field: String },
    #[error(
        "`rate_schedule[{index}].at` = {at} must be later than the previous change at {previous}"
    )]
    UnsortedSchedule {
        index: usize,
        at: Duration,
        previous: Duration,
    },
    #[error("`{field}` must be a probability in {range}, found {value}")]
    Probability {
        field: &'static str,
        range: &'static str,
        value: f64,
    },
    #[error("`{field}` must be a positive size, found 0")]
    ZeroSize { field: &'static str },
    #[error("`{field}` is too large: the one-way delay must stay under a day")]
    TooLong { field: &'static str },
    #[error("`loss.drop` must list at least one packet index")]
    EmptyLossTrace,
    #[error(
        "`loss.drop[{index}]` = {value} must be greater than the previous index {previous}: list packet indices in increasing order"
    )]
    UnsortedLossTrace {
        index: usize,
        value: u64,
        previous: u64,
    },
    #[error("`delivery_trace` must have at least one delivery opportunity")]
    EmptyDeliveryTrace,
    #[error(
        "`delivery_trace[{index}]` = {value} ms is earlier than the previous timestamp {previous} ms"
    )]
    UnsortedDeliveryTrace {
        index: usize,
        value: u64,
        previous: u64,
    },
    #[error("`delivery_trace` must end after 0 ms: its last timestamp is its period")]
    ZeroTracePeriod,
    #[error("mahimahi trace line {line}: expected a whole number of milliseconds, found {found:?}")]
    TraceLine { line: usize, found: String },
    #[error("`outages[{index}]`: `until` ({until}) must be after `from` ({from})")]
    EmptyOutage {
        index: usize,
        from: Duration,
        until: Duration,
    },
    #[error(
        "`outages[{index}].from` = {from} must not be before the end of the previous outage ({previous_until})"
    )]
    UnsortedOutages {
        index: usize,
        from: Duration,
        previous_until: Duration,
    },
}

fn check_probability(
    field: &'static str,
    value: f64,
    include_one: bool,
) -> Result<(), LinkConfigError> {
    // NaN fails both comparisons, so it is rejected here too.
    let ok = value >= 0.0
        && (if include_one {
            value <= 1.0
        } else {
            value < 1.0
        });
    if ok {
        Ok(())
    } else {
        Err(LinkConfigError::Probability {
            field,
            range: if include_one { "[0, 1]" } else { "[0, 1)" },
            value,
        })
    }
}

impl LinkConfig {
    /// A loss-free link with a line rate and a fibre length; everything else
    /// at its default.
    pub fn new(rate: DataRate, distance: Distance) -> Self {
        Self {
            distance,
            fibre_delay_per_km: default_fibre_delay_per_km(),
            overhead: Duration::default(),
            rate: Some(rate),
            rate_schedule: Vec::new(),
            delivery_trace: None,
            per_packet_overhead: ByteSize::default(),
            buffer: None,
            ecn_threshold: None,
            loss: LossModel::None,
            jitter: None,
            duplicate: 0.0,
            outages: Vec::new(),
        }
    }

    /// One direction of one link of a topology's WAN bundle: its distance,
    /// overhead, rate, buffer and Bernoulli loss.
    pub fn from_wan_link(link: &WanLink) -> Self {
        let mut config = Self::new(link.link_rate, link.distance);
        config.overhead = link.overhead;
        config.buffer = link.buffer;
        if link.loss > 0.0 {
            config.loss = LossModel::Bernoulli { p: link.loss };
        }
        config
    }

    /// Propagation delay in ns: `round(distance_km × fibre_delay_per_km_ns)`,
    /// halves away from zero. Saturates on absurd input; `validate` rejects it.
    pub fn propagation_ns(&self) -> u64 {
        let ns = (self.distance.km() * self.fibre_delay_per_km.as_nanos() as f64).round();
        if ns.is_finite() && ns < u64::MAX as f64 {
            ns as u64
        } else {
            u64::MAX
        }
    }

    /// Propagation plus overhead.
    pub fn one_way_ns(&self) -> u64 {
        self.propagation_ns()
            .saturating_add(self.overhead.as_nanos())
    }

    /// The rate the default buffer is sized from: `rate`, or the trace's mean.
    pub fn nominal_bits_per_second(&self) -> u64 {
        match (&self.rate, &self.delivery_trace) {
            (Some(rate), _) => rate.bits_per_second(),
            (None, Some(trace)) => trace.mean_bits_per_second(),
            (None, None) => 0,
        }
    }

    /// The configured buffer, or one BDP = `floor(rate × 2 × one_way / 8e9)`
    /// bytes, at least [`MIN_DEFAULT_BUFFER_BYTES`].
    pub fn buffer_bytes(&self) -> u64 {
        if let Some(buffer) = self.buffer {
            return buffer.bytes();
        }
        let rtt_ns = 2 * u128::from(self.one_way_ns());
        let bdp = u128::from(self.nominal_bits_per_second()) * rtt_ns / 8 / 1_000_000_000;
        u64::try_from(bdp)
            .unwrap_or(u64::MAX)
            .max(MIN_DEFAULT_BUFFER_BYTES)
    }

    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), LinkConfigError> {
        if self.one_way_ns() > MAX_ONE_WAY_NS {
            return Err(LinkConfigError::TooLong {
                field: if self.propagation_ns() > MAX_ONE_WAY_NS {
                    "distance"
                } else {
                    "overhead"
                },
            });
        }
        match (&self.rate, &self.delivery_trace) {
            (None, None) => return Err(LinkConfigError::NoCapacity),
            (Some(_), Some(_)) => return Err(LinkConfigError::RateAndTrace),
            (Some(rate), None) => {
                if rate.bits_per_second() == 0 {
                    return Err(LinkConfigError::ZeroRate {
                        field: "rate".to_string(),
                    });
                }
            }
            (None, Some(trace)) => {
                if !self.rate_schedule.is_empty() {
                    return Err(LinkConfigError::ScheduleWithTrace);
                }
                trace.validate()?;
            }
        }
        for (index, change) in self.rate_schedule.iter().enumerate() {
            if change.rate.bits_per_second() == 0 {
                return Err(LinkConfigError::ZeroRate {
                    field: format!("rate_schedule[{index}].rate"),
                });
            }
            if index > 0 && change.at <= self.rate_schedule[index - 1].at {
                return Err(LinkConfigError::UnsortedSchedule {
                    index,
                    at: change.at,
                    previous: self.rate_schedule[index - 1].at,
                });
            }
        }
        if self.buffer.is_some_and(|b| b.bytes() == 0) {
            return Err(LinkConfigError::ZeroSize { field: "buffer" });
        }
        if self.ecn_threshold.is_some_and(|k| k.bytes() == 0) {
            return Err(LinkConfigError::ZeroSize {
                field: "ecn_threshold",
            });
        }
        self.validate_loss()?;
        check_probability("duplicate", self.duplicate, false)?;
        if self
            .jitter
            .is_some_and(|j| j.max.as_nanos() > MAX_ONE_WAY_NS)
        {
            return Err(LinkConfigError::TooLong {
                field: "jitter.max",
            });
        }
        for (index, outage) in self.outages.iter().enumerate() {
            if outage.until <= outage.from {
                return Err(LinkConfigError::EmptyOutage {
                    index,
                    from: outage.from,
                    until: outage.until,
                });
            }
            if index > 0 && outage.from < self.outages[index - 1].until {
                return Err(LinkConfigError::UnsortedOutages {
                    index,
                    from: outage.from,
                    previous_until: self.outages[index - 1].until,
                });
            }
        }
        Ok(())
    }

    fn validate_loss(&self) -> Result<(), LinkConfigError> {
        match &self.loss {
            LossModel::None => Ok(()),
            LossModel::Bernoulli { p } => check_probability("loss.p", *p, false),
            LossModel::GilbertElliott {
                p,
                r,
                loss_in_bad,
                loss_in_good,
            } => {
                check_probability("loss.p", *p, true)?;
                check_probability("loss.r", *r, true)?;
                if *r == 0.0 {
                    // With r = 0 the bad state never ends.
                    return Err(LinkConfigError::Probability {
                        field: "loss.r",
                        range: "(0, 1]",
                        value: *r,
                    });
                }
                check_probability("loss.1-h", *loss_in_bad, true)?;
                check_probability("loss.1-k", *loss_in_good, false)?;
                let stationary = self.loss.stationary_loss().unwrap_or(0.0);
                if stationary >= 1.0 {
                    return Err(LinkConfigError::Probability {
                        field: "loss",
                        range: "[0, 1) (the long-run loss of p, r, 1-h, 1-k)",
                        value: stationary,
                    });
                }
                Ok(())
            }
            LossModel::Trace { drop } => {
                if drop.is_empty() {
                    return Err(LinkConfigError::EmptyLossTrace);
                }
                for (index, pair) in drop.windows(2).enumerate() {
                    if pair[1] <= pair[0] {
                        return Err(LinkConfigError::UnsortedLossTrace {
                            index: index + 1,
                            value: pair[1],
                            previous: pair[0],
                        });
                    }
                }
                Ok(())
            }
        }
    }
}
