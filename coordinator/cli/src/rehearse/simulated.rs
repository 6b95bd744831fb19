//! What the simulator's discrete-event tier says a rehearsed round's
//! exchange takes, on the links the emulator played: the simulator beside
//! the real processes, round by round, in one report.
//!
//! A round's exchange, as the agents run it (`longhaul_site_agent::rounds`
//! and `exchange`): its fragments [`FRAGMENTS_AT_ONCE`] at a time; for each
//! batch, reduce-scatter then all-gather among the sites the round did not
//! exclude, in each phase every ordered pair of linked sites moving its
//! 1/M shard of each fragment of the batch (encoded at that link's codec)
//! over the pool's connections, once a stream's hello has had its welcome
//! (one round trip). The simulation is that, phase by phase: a
//! [`transfer`] per ordered pair over the emulator's configuration of that
//! direction (the scenario's impairments applied, as the emulator got
//! them), the ACKs on the reverse direction, quinn's Cubic senders
//! ([`SenderModel::QuinnCubic`]: quinn's default controller, which the
//! agents run) as many as the pool holds,
//! QUIC's probe timeout in place of TCP's timer ([`quic_packets`]), each
//! phase with its own link fates; a phase ends with its slowest pair, and
//! a round is the sum of its batches' round trip and two phases.
//!
//! Before the links, two costs the agents pay before their first byte
//! ([`SimulatedRound`]): the sites do not start together, since each
//! learns of the round from the coordinator, one way from the nearest
//! replica's site (the replicas' own replication before the round opens
//! is not charged); and each site encodes its whole contribution to a
//! fragment (error feedback, every shard at its link's codec) before
//! anything is sent. Encoding is CPU, so it is not simulated but timed
//! here, on this machine, with the agents' own code
//! ([`longhaul_site_agent::rounds::time_encoding`], the median of
//! [`ENCODE_RUNS`] for each live site, the slowest site's charged), once
//! per shape of round; the round's fragments are charged one after
//! another, as on one core per site.
//!
//! Left out, which the simulation does not charge for: QUIC's handshakes
//! (the pool's connections are kept across rounds), reducing, decoding and
//! hashing (CPU, overlapped with the transfers, chunk by chunk), the
//! control messages of a phase, and the coordinator's
//! opening and committing of the round.
//!
//! The agents' pooled connections stay open across phases and rounds, so
//! each carries its window (and what loss made of it) from one to the
//! next. The rehearsal's report simulates that
//! ([`Simulator::keeping_connections`]): rounds in order, each pair's
//! connections going on from where its last phase left them
//! ([`WarmConnection`]), their Cubic clocks running through the time they
//! idle in simulated time: from the end of the last round's simulated
//! exchange (its opening plus what the simulation charged it) to this
//! round's opening, its start apart and encoding, each batch's hello, and
//! the wait for a phase's slowest pair. Without it, every phase's senders
//! begin in slow start. The senders are paced as quinn paces
//! ([`SenderModel::QuinnCubic`]), so a kept window does not leave as one
//! burst.
//!
//! Also left out: the agents' own limits on what they hand a connection
//! (two chunks unacknowledged by the peer's application, at least; see
//! `exchange::sender`), so a simulated sender always has data. Packets are
//! QUIC's size on the emulator's UDP path, acknowledged one by one (QUIC
//! acknowledges about every second packet: the simulated ACK traffic is
//! larger than the real, which matters only on a link whose reverse
//! direction is full).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use longhaul_core::rng::derive;
use longhaul_core::units::Duration;
use longhaul_proto::v1 as pb;
use longhaul_simulations::des::{
    Limits, Outcome, SenderModel, TcpParams, TransferConfig, WarmConnection, transfer,
};
use longhaul_simulations::emulator::{LinkSpec, direction_seed};
use longhaul_simulations::link::LinkConfig;
use longhaul_site_agent::rounds::{FRAGMENTS_AT_ONCE, time_encoding};
use serde::Serialize;

/// QUIC's packets and loss timer on the emulator's UDP path, for an agent
/// configured with `initial_rtt`: payload bytes of one full packet
/// (quinn's largest datagram after path MTU discovery on a 1500-byte path,
/// less its short header and frame overhead) and the IP, UDP and QUIC
/// bytes around them; the probe timeout of RFC 9002 §6.2 (smoothed RTT +
/// max(4·RTT variance, 1 ms granularity) + the peer's 25 ms max ACK delay)
/// in place of TCP's retransmission timer: 3·initial_rtt + 25 ms before
/// the first sample, at least 26 ms after.
fn quic_packets(initial_rtt: std::time::Duration) -> TcpParams {
    let initial_rtt = u64::try_from(initial_rtt.as_nanos()).unwrap_or(u64::MAX);
    TcpParams {
        mss_bytes: 1_400,
        header_bytes: 52,
        min_rto: Duration::from_millis(26),
        initial_rto: Duration::from_nanos(
            initial_rtt
                .saturating_mul(3)
                .saturating_add(MAX_ACK_DELAY_NS),
        ),
        ..TcpParams::default()
    }
}

/// quinn's default `max_ack_delay`.
const MAX_ACK_DELAY_NS: u64 = 25_000_000;

/// Bounds on one simulated phase: beyond them the round is left
/// unsimulated rather than holding up the report.
const LIMITS: Limits = Limits {
    max_virtual_time: Duration::from_secs(600),
    max_events: 20_000_000,
};

/// Timed encodes of one site's contribution, of which the median is
/// charged.
const ENCODE_RUNS: u32 = 5;

/// What the simulation says a round's exchange takes, in parts, each in
/// milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SimulatedRound {
    /// The last live site's start after the first's.
    pub start_ms: f64,
    /// Encoding the round's fragments, one after another (timed on this
    /// machine; 0 when not timed).
    pub encode_ms: f64,
    /// The exchange over the links: the discrete-event tier.
    pub links_ms: f64,
}

impl SimulatedRound {
    pub fn total_ms(&self) -> f64 {
        self.start_ms + self.encode_ms + self.links_ms
    }

    /// Each part's median over `rows` (`None` when there are none).
    pub fn median(
        rows: &[SimulatedRound],
        median: impl Fn(Vec<f64>) -> Option<f64>,
    ) -> Option<SimulatedRound> {
        let of = |part: fn(&SimulatedRound) -> f64| median(rows.iter().map(part).collect());
        Some(SimulatedRound {
            start_ms: of(|p| p.start_ms)?,
            encode_ms: of(|p| p.encode_ms)?,
            links_ms: of(|p| p.links_ms)?,
        })
    }
}

/// The rounds' exchanges, simulated on the emulator's links.
pub(super) struct Simulator<'a> {
    links: &'a [LinkSpec],
    connections: u32,
    seed: u64,
    /// The sites of the coordinator's replicas.
    coordinators: Vec<String>,
    /// Whether encoding is timed (the rehearsal's report) or charged as
    /// nothing (the tests of the simulation, which must be exact).
    time_encoding: bool,
    /// Seconds one fragment's encoding is charged, by shape of round.
    encodes: Mutex<HashMap<String, Option<f64>>>,
    /// Connections kept across phases and rounds, when they are.
    kept: Option<Mutex<Kept>>,
}

/// The pools as the rounds simulated so far left them.
#[derive(Debug, Default)]
struct Kept {
    /// Each ordered pair's connections after its last phase.
    pools: HashMap<(String, String), Vec<WarmConnection>>,
    /// When the last simulated round's exchange ended, in simulated time:
    /// its opening plus what the simulation charged it.
    busy_until_unix_ms: Option<f64>,
}

impl<'a> Simulator<'a> {
    /// `links` as the emulator was configured (`scenario_links`), pools of
    /// `connections` per peer, link fates seeded from the rehearsal's seed;
    /// every site starting at once and encoding charged as nothing until
    /// [`Simulator::with_coordinators`] and [`Simulator::timing_encoding`].
    pub(super) fn new(links: &'a [LinkSpec], connections: u32, seed: u64) -> Self {
        Self {
            links,
            connections: connections.max(1),
            seed,
            coordinators: Vec::new(),
            time_encoding: false,
            encodes: Mutex::new(HashMap::new()),
            kept: None,
        }
    }

    /// Each pair's connections are kept from phase to phase and round to
    /// round, as the agents' pools keep theirs: rounds must then be
    /// simulated in order, once each.
    pub(super) fn keeping_connections(mut self) -> Self {
        self.kept = Some(Mutex::new(Kept::default()));
        self
    }

    /// Sites learn of a round one way from the nearest of `sites` (the
    /// coordinator's replicas').
    pub(super) fn with_coordinators(mut self, sites: impl IntoIterator<Item = String>) -> Self {
        self.coordinators = sites.into_iter().collect();
        self
    }

    /// Encoding is timed on this machine and charged.
    pub(super) fn timing_encoding(mut self) -> Self {
        self.time_encoding = true;
        self
    }

    /// Seconds after the round opens that `site` learns of it: one way
    /// from the nearest replica's site over a link (0 at a replica's site;
    /// `None` when no replica's site is linked to it).
    fn learns_after(&self, site: &str) -> Option<f64> {
        self.coordinators
            .iter()
            .filter_map(|c| {
                if c == site {
                    Some(0)
                } else {
                    self.direction(c, site).map(|(f, _)| f.one_way_ns())
                }
            })
            .min()
            .map(|ns| ns as f64 / 1e9)
    }

    /// One fragment's encoding at the slowest live site, timed (cached by
    /// the round's participants, exclusions, codecs and `elements`).
    fn encode_seconds(&self, round: &pb::OuterRound, elements: u64) -> Option<f64> {
        if !self.time_encoding || elements == 0 {
            return Some(0.0);
        }
        let live = super::report::live_sites(round);
        let key = format!(
            "{:?} {live:?} {:?} {elements}",
            round.participants, round.links
        );
        let mut cache = self.encodes.lock().unwrap_or_else(PoisonError::into_inner);
        *cache.entry(key).or_insert_with(|| {
            live.into_iter()
                .map(|site| time_encoding(round, site, elements, ENCODE_RUNS))
                .map(|t| t.map(|t| t.as_secs_f64()))
                .try_fold(0.0f64, |slowest, t| Some(slowest.max(t?)))
        })
    }

    /// The round's exchange, simulated: `None` for a round with nothing to
    /// exchange (no fragments, fewer than two live sites, no values), one
    /// the simulation could not finish, or, when encoding is timed, one
    /// whose encoding could not be (the agents could not plan it, or its
    /// codecs are unusable). A site with no link to a replica's site is
    /// left out of the start apart (the simulation does not route the
    /// round's news over other sites). Each fragment holds `elements`
    /// values (what encoding is timed on; 0: not timed), and
    /// `fragment_bytes(a, b)` is one fragment's encoded bytes on the link
    /// between `a` and `b`.
    pub(super) fn round(
        &self,
        round: &pb::OuterRound,
        elements: u64,
        fragment_bytes: impl Fn(&str, &str) -> f64,
    ) -> Option<SimulatedRound> {
        let starts: Vec<f64> = super::report::live_sites(round)
            .into_iter()
            .filter_map(|site| self.learns_after(site))
            .collect();
        let first = starts.iter().copied().reduce(f64::min).unwrap_or(0.0);
        let start = starts.iter().copied().fold(first, f64::max) - first;
        let encode = self.encode_seconds(round, elements)? * f64::from(round.fragments);
        self.idle_until(round, start + encode);
        let links = self.round_seconds(round, fragment_bytes);
        if let (Some(kept), Some(links)) = (&self.kept, links) {
            let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
            kept.busy_until_unix_ms =
                Some(round.opened_at_unix_ms as f64 + (start + encode + links) * 1e3);
        }
        Some(SimulatedRound {
            start_ms: start * 1e3,
            encode_ms: encode * 1e3,
            links_ms: links? * 1e3,
        })
    }

    /// Kept connections idle from the last round's simulated end until
    /// `round` opened, then for `seconds` more before its first phase.
    fn idle_until(&self, round: &pb::OuterRound, seconds: f64) {
        let gap_ms = self.kept.as_ref().map_or(0.0, |kept| {
            let kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
            kept.busy_until_unix_ms
                .map_or(0.0, |busy| (round.opened_at_unix_ms as f64 - busy).max(0.0))
        });
        self.idle(None, gap_ms / 1e3 + seconds);
    }

    /// Kept connections (only the pair's, with `pair`) idle for `seconds`.
    fn idle(&self, pair: Option<(&str, &str)>, seconds: f64) {
        let Some(kept) = &self.kept else {
            return;
        };
        let idle = Duration::from_nanos((seconds.max(0.0) * 1e9) as u64);
        let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, pool) in kept.pools.iter_mut() {
            if pair.is_none_or(|(a, b)| key.0 == a && key.1 == b) {
                *pool = pool.drain(..).map(|c| c.after_idle(idle)).collect();
            }
        }
    }

    /// The configuration of the direction `from` → `to` and of its reverse.
    fn direction(&self, from: &str, to: &str) -> Option<(&'a LinkConfig, &'a LinkConfig)> {
        self.links.iter().find_map(|l| {
            if l.sites[0] == from && l.sites[1] == to {
                Some((&l.forward, &l.backward))
            } else if l.sites[0] == to && l.sites[1] == from {
                Some((&l.backward, &l.forward))
            } else {
                None
            }
        })
    }

    /// Seconds `bytes` take from `from` to `to` over the pool, in the
    /// `phase`-th phase of round `round` (each with its own link fates:
    /// the emulator's links do not replay theirs round after round).
    ///
    /// With connections kept, the pair's go on from its last phase and are
    /// left as this one ends (a phase that does not finish leaves none:
    /// the next starts in slow start).
    fn phase(&self, (round, phase): (u64, u64), from: &str, to: &str, bytes: u64) -> Option<f64> {
        let (forward, reverse) = self.direction(from, to)?;
        let mut config = TransferConfig::new(
            forward.clone(),
            bytes,
            self.connections,
            SenderModel::QuinnCubic,
            derive(
                direction_seed(self.seed, from, to),
                "round",
                round * 64 + phase,
            ),
        );
        config.reverse = Some(reverse.clone());
        // The rehearsal gives each agent its longest link's RTT (at least
        // 1 ms) as the initial RTT; with two sites, this link's.
        config.tcp = quic_packets(std::time::Duration::from_nanos(
            rtt_ns(forward, reverse).max(1_000_000),
        ));
        config.limits = LIMITS;
        let pair = (from.to_string(), to.to_string());
        if let Some(kept) = &self.kept {
            let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
            config.warm = kept.pools.remove(&pair).unwrap_or_default();
        }
        // Kept state the transfer cannot take (a shard smaller than the
        // pool: fewer connections carry it) is dropped, not fatal.
        let report = transfer(&config)
            .or_else(|error| {
                if config.warm.is_empty() {
                    return Err(error);
                }
                config.warm.clear();
                transfer(&config)
            })
            .ok()
            .filter(|r| r.outcome == Outcome::Completed)?;
        if let Some(kept) = &self.kept {
            let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
            kept.pools.insert(pair, report.warm);
        }
        report.completion.map(|d| d.as_nanos() as f64 / 1e9)
    }

    /// What the round's exchange over the links takes, simulated, in
    /// seconds (see [`Simulator::round`]).
    fn round_seconds(
        &self,
        round: &pb::OuterRound,
        fragment_bytes: impl Fn(&str, &str) -> f64,
    ) -> Option<f64> {
        let live = super::report::live_sites(round);
        if live.len() < 2 || round.fragments == 0 {
            return None;
        }
        // Every ordered pair of live sites a link joins: its shard of one
        // fragment, and the link's round trip.
        let mut pairs = Vec::new();
        for &a in &live {
            for &b in live.iter().filter(|b| **b != a) {
                let Some((forward, reverse)) = self.direction(a, b) else {
                    continue;
                };
                let shard = (fragment_bytes(a, b) / live.len() as f64).ceil() as u64;
                if shard == 0 {
                    return None;
                }
                pairs.push((a, b, shard, rtt_ns(forward, reverse) as f64 / 1e9));
            }
        }
        // No linked pair: nothing crosses a link.
        let handshake = pairs.iter().map(|p| p.3).reduce(f64::max)?;
        let mut total = 0.0;
        let mut left = round.fragments as usize;
        let mut phase = 0u64;
        while left > 0 {
            let batch = left.min(FRAGMENTS_AT_ONCE);
            left -= batch;
            // A hello and its welcome, then reduce-scatter, then the
            // averaged shards back in the all-gather, each phase as long
            // as its slowest pair.
            total += handshake;
            self.idle(None, handshake);
            for _ in 0..2 {
                let mut took = Vec::with_capacity(pairs.len());
                for &(a, b, shard, _) in &pairs {
                    let bytes = shard.saturating_mul(batch as u64);
                    took.push(self.phase((round.round_id, phase), a, b, bytes)?);
                }
                let slowest = took.iter().copied().fold(0.0f64, f64::max);
                // Each pair's connections wait for the slowest pair.
                for (&(a, b, ..), seconds) in pairs.iter().zip(&took) {
                    self.idle(Some((a, b)), slowest - seconds);
                }
                total += slowest;
                phase += 1;
            }
        }
        Some(total)
    }
}

/// A link's round trip: one way each direction.
fn rtt_ns(forward: &LinkConfig, reverse: &LinkConfig) -> u64 {
    forward.one_way_ns().saturating_add(reverse.one_way_ns())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use longhaul_core::units::{DataRate, Distance};

    use super::*;

    fn round(sites: &[(&str, bool)], fragments: u32) -> pb::OuterRound {
        pb::OuterRound {
            fragments,
            participant_states: sites
                .iter()
                .map(|(site, excluded)| pb::RoundParticipant {
                    site_id: (*site).into(),
                    excluded: *excluded,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// A link with a buffer of a few BDPs, so slow start's overshoot does
    /// not dominate what the tests look at.
    fn link(a: &str, b: &str, mbit: u64, km: f64) -> LinkSpec {
        let mut config = LinkConfig::new(
            DataRate::from_bits_per_second(mbit * 1_000_000),
            Distance::from_km(km).unwrap(),
        );
        let bdp = mbit as f64 * 1e6 / 8.0 * km * 10e-6;
        config.buffer = Some(longhaul_core::units::ByteSize::from_bytes(4 * bdp as u64));
        LinkSpec::symmetric(a, b, config)
    }

    #[test]
    fn a_round_takes_at_least_its_shards_at_the_link_rate_and_one_way_per_phase() {
        let links = [link("north", "south", 100, 1000.0)];
        let sim = Simulator::new(&links, 4, 1);
        // 2 MB fragments, two sites: 1 MB each way per phase.
        let bytes = 2_000_000.0;
        let seconds = sim
            .round_seconds(&round(&[("north", false), ("south", false)], 1), |_, _| {
                bytes
            })
            .unwrap();
        let packets = (1_000_000f64 / 1400.0).ceil();
        let wire = packets * 1452.0 * 8.0 / 100e6;
        let floor = 2.0 * (wire + 0.005);
        assert!(seconds >= floor, "{seconds} < {floor}");
        // Slow start costs a few RTTs, not more.
        assert!(seconds < floor + 2.0 * 8.0 * 0.010, "{seconds} vs {floor}");
        // Deterministic, and 5 fragments are two batches: 4, then 1.
        let again = Simulator::new(&links, 4, 1)
            .round_seconds(&round(&[("north", false), ("south", false)], 1), |_, _| {
                bytes
            })
            .unwrap();
        assert_eq!(seconds, again);
        let five = sim
            .round_seconds(&round(&[("north", false), ("south", false)], 5), |_, _| {
                bytes
            })
            .unwrap();
        let four = sim
            .round_seconds(&round(&[("north", false), ("south", false)], 4), |_, _| {
                bytes
            })
            .unwrap();
        assert_eq!(five, four + seconds);
        assert!(four > 3.0 * seconds, "{four} vs {seconds}");
    }

    #[test]
    fn the_slowest_pair_paces_a_phase_and_excluded_or_unlinked_sites_are_left_out() {
        let links = [
            link("a", "b", 100, 1000.0),
            link("a", "c", 10, 1000.0),
            link("b", "c", 100, 1000.0),
        ];
        let sim = Simulator::new(&links, 2, 7);
        let bytes = |_: &str, _: &str| 900_000.0;
        let three = sim
            .round_seconds(
                &round(&[("a", false), ("b", false), ("c", false)], 1),
                bytes,
            )
            .unwrap();
        let without_c = sim
            .round_seconds(&round(&[("a", false), ("b", false), ("c", true)], 1), bytes)
            .unwrap();
        // a<->c at a tenth of the rate paces the three-site round, even
        // with shards of a third rather than a half.
        assert!(three > 4.0 * without_c, "{three} vs {without_c}");
        // Nothing to exchange: one site left, no fragments, no bytes.
        assert_eq!(
            sim.round_seconds(&round(&[("a", false), ("b", true)], 1), bytes),
            None
        );
        assert_eq!(
            sim.round_seconds(&round(&[("a", false), ("b", false)], 0), bytes),
            None
        );
        assert_eq!(
            sim.round_seconds(&round(&[("a", false), ("b", false)], 1), |_, _| 0.0),
            None
        );
        // Sites no link joins.
        let sim = Simulator::new(&links[..1], 2, 7);
        assert_eq!(
            sim.round_seconds(&round(&[("a", false), ("c", false)], 1), bytes),
            None
        );
    }

    #[test]
    fn a_round_charges_the_sites_start_apart_and_their_encoding_before_the_links() {
        let links = [
            link("north", "south", 100, 1000.0),
            link("north", "east", 100, 400.0),
            link("south", "east", 100, 800.0),
        ];
        let mut r = round(&[("north", false), ("south", false), ("east", false)], 2);
        r.job_id = "job".into();
        r.participants = vec!["north".into(), "south".into(), "east".into()];
        r.codec_bits = 4;
        r.links = [("north", "south"), ("north", "east"), ("south", "east")]
            .iter()
            .map(|(a, b)| pb::RoundLinkCodec {
                site_a: (*a).into(),
                site_b: (*b).into(),
                bits: 4,
                block_size: 256,
                error_feedback: true,
                ..Default::default()
            })
            .collect();
        let elements = 1 << 16;
        let bytes = |_: &str, _: &str| elements as f64 / 2.0;
        let untimed = Simulator::new(&links, 2, 5)
            .round(&r, elements, bytes)
            .unwrap();
        // Every site starts at once and encoding is not charged.
        assert_eq!((untimed.start_ms, untimed.encode_ms), (0.0, 0.0));
        let links_ms = Simulator::new(&links, 2, 5)
            .round_seconds(&r, bytes)
            .unwrap()
            * 1e3;
        assert_eq!(untimed.links_ms, links_ms);
        // With the replica at north: south learns 5 ms after the round
        // opens, east 2 ms after; the last starts 5 ms after the first.
        let sim = Simulator::new(&links, 2, 5)
            .with_coordinators(["north".to_string()])
            .timing_encoding();
        let timed = sim.round(&r, elements, bytes).unwrap();
        assert!((timed.start_ms - 5.0).abs() < 1e-6, "{timed:?}");
        assert_eq!(timed.links_ms, links_ms);
        assert!(timed.encode_ms > 0.0, "{timed:?}");
        assert_eq!(
            timed.total_ms(),
            timed.start_ms + timed.encode_ms + timed.links_ms
        );
        // Timed once per shape of round, charged per fragment.
        assert_eq!(sim.round(&r, elements, bytes).unwrap(), timed);
        let mut one = r.clone();
        one.fragments = 1;
        let one = sim.round(&one, elements, bytes).unwrap();
        assert_eq!(one.encode_ms * 2.0, timed.encode_ms);
        // Replicas at north and east: south hears from the nearer, east.
        let both = Simulator::new(&links, 2, 5)
            .with_coordinators(["north".to_string(), "east".to_string()])
            .round(&r, elements, bytes)
            .unwrap();
        assert!((both.start_ms - 4.0).abs() < 1e-6, "{both:?}");
        // A round the agents could not plan is not simulated.
        let mut unplannable = r.clone();
        unplannable.participants.clear();
        assert_eq!(sim.round(&unplannable, elements, bytes), None);
    }

    /// Kept connections: the all-gather goes on from the windows the
    /// reduce-scatter left, and the next round from the first's, without
    /// slow start, so both rounds are faster than a fresh simulator's but
    /// not below the bytes at the line rate; a simulator that keeps
    /// nothing gives every round the same time.
    #[test]
    fn kept_connections_carry_their_window_into_the_next_round() {
        let links = [link("north", "south", 100, 1000.0)];
        let bytes = |_: &str, _: &str| 2_000_000.0;
        let mut first = round(&[("north", false), ("south", false)], 1);
        first.opened_at_unix_ms = 1_000;
        first.ended_at_unix_ms = 1_300;
        let mut second = first.clone();
        second.round_id += 1;
        second.opened_at_unix_ms = 1_400;
        second.ended_at_unix_ms = 1_700;
        let kept = Simulator::new(&links, 2, 1).keeping_connections();
        let fresh = Simulator::new(&links, 2, 1);
        let cold = fresh.round(&first, 0, bytes).unwrap().links_ms;
        let floor = 2.0 * ((1_000_000f64 / 1400.0).ceil() * 1452.0 * 8.0 / 100e6 + 0.005) * 1e3;
        for r in [&first, &second] {
            let warm = kept.round(r, 0, bytes).unwrap().links_ms;
            assert!(warm < cold - 5.0, "round {}: {warm} vs {cold}", r.round_id);
            assert!(warm >= floor, "round {}: {warm} < {floor}", r.round_id);
        }
        let mut again = second.clone();
        again.round_id = first.round_id;
        assert!((fresh.round(&again, 0, bytes).unwrap().links_ms - cold).abs() < 1e-9);
    }

    #[test]
    fn loss_on_the_link_slows_the_simulated_round() {
        let clean = [link("north", "south", 100, 1000.0)];
        let mut lossy = clean.clone();
        let p = longhaul_simulations::link::LossModel::Bernoulli { p: 0.01 };
        lossy[0].forward.loss = p.clone();
        lossy[0].backward.loss = p;
        let r = round(&[("north", false), ("south", false)], 1);
        let bytes = |_: &str, _: &str| 4_000_000.0;
        let clean = Simulator::new(&clean, 1, 3)
            .round_seconds(&r, bytes)
            .unwrap();
        let lossy = Simulator::new(&lossy, 1, 3)
            .round_seconds(&r, bytes)
            .unwrap();
        assert!(lossy > 1.5 * clean, "{lossy} vs {clean}");
    }
}
