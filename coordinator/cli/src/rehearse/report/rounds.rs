//! The rehearsal report's outer rounds: each round beside what the agents
//! said they exchanged, the planner's cost model and the simulator, per
//! link, and the text table.

use std::io::Write;

use longhaul_core::units;
use longhaul_proto::v1 as pb;
use serde::Serialize;

use crate::rehearse::simulated::SimulatedRound;
use crate::table::{Table, thousands};

/// The job's outer rounds: what each took at the coordinator (opened to
/// committed: the agents' exchange of every fragment and their reports),
/// beside what the planner's cost model predicts for exchanging the
/// rehearsal's synthetic fragments over the links.
#[derive(Debug, Clone, Serialize)]
pub struct RoundsReport {
    /// f32 values per fragment each agent contributed.
    pub elements_per_fragment: u64,
    pub committed: usize,
    pub aborted: usize,
    pub open: usize,
    /// Committed rounds the agents still had records of (they keep their
    /// last 8192 fragments; an agent restarted since keeps none before).
    pub measured: usize,
    /// Medians over those.
    pub median_took_ms: Option<f64>,
    pub median_exchange_ms: Option<f64>,
    pub median_predicted_ms: Option<f64>,
    pub median_simulated_ms: Option<f64>,
    /// The median over the same rounds of each round's measured exchange
    /// over its simulated one: the simulator's fidelity in this rehearsal.
    pub median_measured_over_simulated: Option<f64>,
    /// Each part of the simulated exchange's median over the same rounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_simulated: Option<SimulatedRound>,
    /// Each milestone's median over the same rounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_milestones: Option<Milestones>,
    pub rounds: Vec<RoundRow>,
    /// Per link, over the rounds whose exchanges the agents reported.
    pub links: Vec<ExchangeLinkRow>,
}

/// When a round's exchange passed its milestones: milliseconds from the
/// first agent's start of an exchange to the last agent to pass each (its
/// fragments' latest), as the agents timed them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Milestones {
    /// The last start of an exchange: how far apart the sites began, and
    /// with more fragments than run at once, when the last batch began.
    pub last_start_ms: f64,
    /// Contributions encoded and queued.
    pub encoded_ms: f64,
    /// The first data message from a peer.
    pub first_data_ms: f64,
    /// The site's shard reduced from every live site (reduce-scatter).
    pub reduced_ms: f64,
    /// Every shard's average held (all-gather); the last acks follow.
    pub assembled_ms: f64,
}

impl Milestones {
    /// The round's milestones from its agents' records (`None` when there
    /// are none).
    fn of(records: &[(&str, &pb::FragmentExchange)]) -> Option<Milestones> {
        let start = records.iter().map(|(_, e)| e.started_at_unix_ms).min()?;
        let latest = |at: fn(&pb::FragmentExchange) -> u64| {
            records
                .iter()
                .map(|(_, e)| (e.started_at_unix_ms - start) as f64 + at(e) as f64 / 1e3)
                .fold(0.0, f64::max)
        };
        Some(Milestones {
            last_start_ms: latest(|_| 0),
            encoded_ms: latest(|e| e.encoded_us),
            first_data_ms: latest(|e| e.first_data_us),
            reduced_ms: latest(|e| e.reduced_us),
            assembled_ms: latest(|e| e.assembled_us),
        })
    }

    /// Each milestone's median over `rows`.
    fn median(rows: &[Milestones], median: impl Fn(Vec<f64>) -> Option<f64>) -> Option<Milestones> {
        let of = |at: fn(&Milestones) -> f64| median(rows.iter().map(at).collect());
        Some(Milestones {
            last_start_ms: of(|m| m.last_start_ms)?,
            encoded_ms: of(|m| m.encoded_ms)?,
            first_data_ms: of(|m| m.first_data_ms)?,
            reduced_ms: of(|m| m.reduced_ms)?,
            assembled_ms: of(|m| m.assembled_ms)?,
        })
    }
}

/// One link's part in the rounds' exchanges.
#[derive(Debug, Clone, Serialize)]
pub struct ExchangeLinkRow {
    /// `a<->b`.
    pub link: String,
    /// Rounds in which its ends exchanged over it.
    pub rounds: usize,
    /// Data bytes the two ends sent each other (chunks sent again after a
    /// lost connection included).
    pub bytes: u64,
    /// The rounds' exchange time (see [`RoundRow::exchange_ms`]), summed.
    pub exchange_seconds: f64,
    /// `bytes` over `exchange_seconds`, bits per second.
    pub goodput_bits_per_second: f64,
    /// The planner's cost model for the same rounds on this link, summed.
    pub predicted_seconds: f64,
    /// The link's configured rate, bits per second.
    pub rate_bits_per_second: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RoundRow {
    pub round: u64,
    /// `open`, `committed` or `aborted`.
    pub state: String,
    pub participants: Vec<String>,
    /// Excluded participants, as `site (reason)`.
    pub excluded: Vec<String>,
    /// Participants that catch up before taking part, as `site (after
    /// round R from S)`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub catching_up: Vec<String>,
    pub fragments: u32,
    /// The widest link's bits per value.
    pub bits: u32,
    /// H and τ of the round's outer step (0: not carried); they change
    /// when the coordinator re-plans the sync at the trainers' measured
    /// inner step.
    #[serde(skip_serializing_if = "is_zero")]
    pub inner_steps: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub overlap_steps: u32,
    /// Opened to committed or aborted.
    pub took_ms: Option<u64>,
    /// From the first agent's start of an exchange of its fragments to the
    /// last one's result, as the agents reported them (`None` when none
    /// did: an agent killed since loses its records).
    pub exchange_ms: Option<u64>,
    /// What `exchange_ms` is made of, as the agents timed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub milestones: Option<Milestones>,
    /// Data bytes the agents sent each other for the round.
    pub bytes: u64,
    /// The exchange of its fragments among the sites left, by the
    /// planner's cost model: per fragment 2·(α + F/(M·B)) on each link
    /// (α one way, B the link's rate, F the fragment's encoded bytes, M
    /// the sites), the agents' fragments four at a time.
    pub predicted_ms: f64,
    /// The same exchange through the simulator: the sites' start apart
    /// and their encoding timed on this machine, then the discrete-event
    /// tier on the links as the emulator played them (Cubic senders, the
    /// pool's connections; see `rehearse::simulated`); `None` when there
    /// was nothing to exchange or the simulation did not finish.
    pub simulated_ms: Option<f64>,
    /// `simulated_ms` in its parts (`None` also when encoding could not be
    /// timed: a round the agents could not plan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated: Option<SimulatedRound>,
    /// Opened to deadline (the coordinator's, from the expected outer
    /// step: the measured inner step once the trainers reported one).
    pub deadline_ms: u64,
    /// The slowest inner step the participants' trainers measured, as
    /// their agents reported it with the applied fragments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inner_step_ms: Option<f64>,
    /// Why it was aborted.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// The rounds of `rounds` (by number) as the report shows them, with what
/// the agents said they exchanged (by site); `None` when there were none.
pub(in crate::rehearse) fn rounds_report(
    rounds: &std::collections::BTreeMap<u64, pb::OuterRound>,
    exchanges: &std::collections::BTreeMap<String, Vec<pb::FragmentExchange>>,
    topology: &longhaul_core::Topology,
    elements: u64,
    simulator: &crate::rehearse::simulated::Simulator<'_>,
) -> Option<RoundsReport> {
    if rounds.is_empty() {
        return None;
    }
    let of_round = |r: &pb::OuterRound| -> Vec<(&str, &pb::FragmentExchange)> {
        exchanges
            .iter()
            .flat_map(|(site, list)| list.iter().map(move |e| (site.as_str(), e)))
            .filter(|(_, e)| e.job_id == r.job_id && e.round == r.round_id)
            .collect()
    };
    let span = |records: &[(&str, &pb::FragmentExchange)]| -> Option<u64> {
        let start = records.iter().map(|(_, e)| e.started_at_unix_ms).min()?;
        let end = records.iter().map(|(_, e)| e.ended_at_unix_ms).max()?;
        Some(end.saturating_sub(start))
    };
    let rows: Vec<RoundRow> = rounds
        .values()
        .map(|r| {
            let records = of_round(r);
            let simulated = simulator.round(r, elements, |a, b| fragment_bytes(r, a, b, elements));
            RoundRow {
                round: r.round_id,
                state: match pb::RoundState::try_from(r.state) {
                    Ok(pb::RoundState::Committed) => "committed",
                    Ok(pb::RoundState::Aborted) => "aborted",
                    _ => "open",
                }
                .to_string(),
                participants: r.participants.clone(),
                excluded: r
                    .participant_states
                    .iter()
                    .filter(|p| p.excluded)
                    .map(|p| format!("{} ({})", p.site_id, p.exclusion_reason))
                    .collect(),
                catching_up: r
                    .participant_states
                    .iter()
                    .filter(|p| p.catch_up_from_round != 0)
                    .map(|p| {
                        format!(
                            "{} (after round {} from {})",
                            p.site_id, p.catch_up_from_round, p.catch_up_from_site
                        )
                    })
                    .collect(),
                fragments: r.fragments,
                bits: r.codec_bits,
                inner_steps: r.inner_steps,
                overlap_steps: r.overlap_steps,
                took_ms: (r.ended_at_unix_ms != 0)
                    .then(|| r.ended_at_unix_ms.saturating_sub(r.opened_at_unix_ms)),
                exchange_ms: span(&records),
                milestones: Milestones::of(&records),
                bytes: records
                    .iter()
                    .flat_map(|(_, e)| &e.peers)
                    .map(|p| p.sent_bytes)
                    .sum(),
                predicted_ms: live_pairs(r, topology)
                    .map(|(a, b, wan)| predicted_link_seconds(r, a, b, wan, elements))
                    .fold(0.0, f64::max)
                    * 1e3,
                simulated_ms: simulated.map(|s| s.total_ms()),
                simulated,
                deadline_ms: r.deadline_unix_ms.saturating_sub(r.opened_at_unix_ms),
                inner_step_ms: r
                    .participant_states
                    .iter()
                    .map(|p| p.inner_step_us)
                    .max()
                    .filter(|us| *us > 0)
                    .map(|us| us as f64 / 1e3),
                reason: r.reason.clone(),
            }
        })
        .collect();
    let mut links = Vec::new();
    for wan in &topology.links {
        let [a, b] = &wan.between;
        let mut row = ExchangeLinkRow {
            link: format!("{a}<->{b}"),
            rounds: 0,
            bytes: 0,
            exchange_seconds: 0.0,
            goodput_bits_per_second: 0.0,
            predicted_seconds: 0.0,
            rate_bits_per_second: wan.link_rate.bits_per_second(),
        };
        for r in rounds.values() {
            let records = of_round(r);
            // What `from` sent `to`: as the sender reported it, else as
            // the receiver did (an agent restarted since lost its records).
            let reported = |site: &str| records.iter().any(|(s, _)| *s == site);
            let traffic = |site: &str, peer: &str| {
                records
                    .iter()
                    .filter(|(s, _)| *s == site)
                    .flat_map(|(_, e)| &e.peers)
                    .filter(|p| p.site_id == peer)
                    .fold((0, 0), |(sent, received), p| {
                        (sent + p.sent_bytes, received + p.received_bytes)
                    })
            };
            let sent = |from: &str, to: &str| -> Option<u64> {
                if reported(from) {
                    Some(traffic(from, to).0)
                } else if reported(to) {
                    Some(traffic(to, from).1)
                } else {
                    None
                }
            };
            let (Some(ab), Some(ba)) = (sent(a, b), sent(b, a)) else {
                continue;
            };
            if ab + ba == 0 {
                continue;
            }
            row.rounds += 1;
            row.bytes += ab + ba;
            row.exchange_seconds += span(&records).unwrap_or(0) as f64 / 1e3;
            row.predicted_seconds += predicted_link_seconds(r, a, b, wan, elements);
        }
        if row.rounds == 0 {
            continue;
        }
        if row.exchange_seconds > 0.0 {
            row.goodput_bits_per_second = row.bytes as f64 * 8.0 / row.exchange_seconds;
        }
        links.push(row);
    }
    let committed: Vec<&RoundRow> = rows.iter().filter(|r| r.state == "committed").collect();
    // The medians are over the same rounds: committed ones the agents
    // still had records of.
    let measured: Vec<&&RoundRow> = committed
        .iter()
        .filter(|r| r.exchange_ms.is_some())
        .collect();
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        (!values.is_empty()).then(|| values[values.len() / 2])
    };
    Some(RoundsReport {
        elements_per_fragment: elements,
        committed: committed.len(),
        aborted: rows.iter().filter(|r| r.state == "aborted").count(),
        open: rows.iter().filter(|r| r.state == "open").count(),
        median_took_ms: median(
            measured
                .iter()
                .filter_map(|r| r.took_ms.map(|t| t as f64))
                .collect(),
        ),
        median_exchange_ms: median(
            measured
                .iter()
                .filter_map(|r| r.exchange_ms.map(|t| t as f64))
                .collect(),
        ),
        median_predicted_ms: median(measured.iter().map(|r| r.predicted_ms).collect()),
        median_simulated_ms: median(measured.iter().filter_map(|r| r.simulated_ms).collect()),
        median_measured_over_simulated: median(
            measured
                .iter()
                .filter_map(|r| Some(r.exchange_ms? as f64 / r.simulated_ms.filter(|s| *s > 0.0)?))
                .collect(),
        ),
        median_simulated: SimulatedRound::median(
            &measured
                .iter()
                .filter_map(|r| r.simulated)
                .collect::<Vec<_>>(),
            median,
        ),
        median_milestones: Milestones::median(
            &measured
                .iter()
                .filter_map(|r| r.milestones)
                .collect::<Vec<_>>(),
            median,
        ),
        measured: measured.len(),
        rounds: rows,
        links,
    })
}

/// The sites the round did not exclude.
pub(in crate::rehearse) fn live_sites(round: &pb::OuterRound) -> Vec<&str> {
    round
        .participant_states
        .iter()
        .filter(|p| !p.excluded)
        .map(|p| p.site_id.as_str())
        .collect()
}

/// The pairs of sites the round did not exclude that a link joins.
fn live_pairs<'a>(
    round: &'a pb::OuterRound,
    topology: &'a longhaul_core::Topology,
) -> impl Iterator<Item = (&'a str, &'a str, &'a longhaul_core::topology::WanLink)> {
    let live = live_sites(round);
    let mut pairs = Vec::new();
    for (i, a) in live.iter().enumerate() {
        for b in &live[i + 1..] {
            if let Some(wan) = topology.links.iter().find(|l| l.joins(a, b)) {
                pairs.push((*a, *b, wan));
            }
        }
    }
    pairs.into_iter()
}

/// See [`RoundRow::predicted_ms`], for the link between `a` and `b`, in
/// seconds.
fn predicted_link_seconds(
    round: &pb::OuterRound,
    a: &str,
    b: &str,
    wan: &longhaul_core::topology::WanLink,
    elements: u64,
) -> f64 {
    let m = live_sites(round).len().max(1) as f64;
    let fragments = f64::from(round.fragments);
    let waves = (fragments / longhaul_site_agent::rounds::FRAGMENTS_AT_ONCE as f64).ceil();
    let serialise = fragment_bytes(round, a, b, elements) / m / wan.link_rate.bytes_per_second();
    waves * 2.0 * wan.one_way_seconds() + fragments * 2.0 * serialise
}

/// One fragment of `elements` values as the round's codec for the link
/// between `a` and `b` encodes it, in bytes: bits per value plus the
/// block's 16-bit scale.
fn fragment_bytes(round: &pb::OuterRound, a: &str, b: &str, elements: u64) -> f64 {
    let codec = round
        .links
        .iter()
        .find(|l| (l.site_a == a && l.site_b == b) || (l.site_a == b && l.site_b == a));
    let (bits, block) = codec.map_or((round.codec_bits, 0), |c| (c.bits, c.block_size));
    let bits_per_value = f64::from(bits)
        + if block == 0 {
            0.0
        } else {
            16.0 / f64::from(block)
        };
    elements as f64 * bits_per_value / 8.0
}

/// Rounds shown in the text report besides those where something
/// happened; the JSON has every one.
const ROUNDS_SHOWN: usize = 24;

/// The rounds table's columns: name, right-aligned.
const COLUMNS: &[(&str, bool)] = &[
    ("round", true),
    ("state", false),
    ("sites", false),
    ("excluded, catching up", false),
    ("fragments", true),
    ("bits", true),
    ("H, τ", true),
    ("bytes", true),
    ("exchange", true),
    ("predicted", true),
    ("simulated", true),
    ("took", true),
];

/// For `skip_serializing_if`: a figure not carried.
fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// H and τ of a round: a row where they change (a re-plan) is shown.
fn steps(r: &RoundRow) -> (u32, u32) {
    (r.inner_steps, r.overlap_steps)
}

/// A row of the rounds table standing for `hidden` rounds not shown.
fn elided(hidden: usize, columns: usize) -> Vec<String> {
    let mut row = vec!["...".to_string(), format!("{hidden} more")];
    row.resize(columns, String::new());
    row
}

pub(super) fn print_rounds(rounds: &RoundsReport, out: &mut dyn Write) -> std::io::Result<()> {
    let what = if rounds.elements_per_fragment == 0 {
        "the trainers' pseudo-gradients".to_string()
    } else {
        format!(
            "every agent's fragments hold {} synthetic values",
            thousands(rounds.elements_per_fragment)
        )
    };
    writeln!(
        out,
        "\nouter rounds: {} committed, {} aborted, {} open; {what}",
        rounds.committed, rounds.aborted, rounds.open,
    )?;
    let mut table = Table::new(COLUMNS);
    // The first and last rounds, and every round in between where a site
    // was excluded or caught up, or that aborted; the rest as "N more".
    let n = rounds.rounds.len();
    let shown = |i: usize, r: &RoundRow| {
        n <= ROUNDS_SHOWN
            || i < ROUNDS_SHOWN / 2
            || i >= n - ROUNDS_SHOWN / 2
            || !r.excluded.is_empty()
            || !r.catching_up.is_empty()
            || r.state == "aborted"
            || (i > 0 && steps(&rounds.rounds[i - 1]) != steps(r))
    };
    let mut hidden = 0;
    for (i, r) in rounds.rounds.iter().enumerate() {
        if !shown(i, r) {
            hidden += 1;
            continue;
        }
        if hidden > 0 {
            table.row(elided(hidden, COLUMNS.len()));
            hidden = 0;
        }
        let mut notes = r.excluded.clone();
        notes.extend(r.catching_up.iter().map(|c| format!("catching up: {c}")));
        table.row(vec![
            r.round.to_string(),
            r.state.clone(),
            r.participants.join(", "),
            if notes.is_empty() {
                "-".into()
            } else {
                notes.join(", ")
            },
            r.fragments.to_string(),
            r.bits.to_string(),
            if r.inner_steps == 0 {
                "-".into()
            } else {
                format!("{}, {}", r.inner_steps, r.overlap_steps)
            },
            units::human_bytes(r.bytes as f64),
            r.exchange_ms.map_or("-".into(), |t| format!("{t} ms")),
            format!("{:.1} ms", r.predicted_ms),
            r.simulated_ms.map_or("-".into(), |t| format!("{t:.1} ms")),
            r.took_ms.map_or("-".into(), |t| format!("{t} ms")),
        ]);
    }
    write!(out, "{}", table.render(2))?;
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} ms"));
    writeln!(
        out,
        "  median of {} committed rounds the agents had records of: exchange {} measured at the \
         agents, {} predicted by the planner's cost model for the links, {} simulated on them \
         (measured / simulated {}); {} opened to committed at the coordinator",
        rounds.measured,
        ms(rounds.median_exchange_ms),
        ms(rounds.median_predicted_ms),
        ms(rounds.median_simulated_ms),
        rounds
            .median_measured_over_simulated
            .map_or("-".to_string(), |r| format!("{r:.2}")),
        ms(rounds.median_took_ms),
    )?;
    if let Some(p) = &rounds.median_simulated {
        writeln!(
            out,
            "  what the simulation charged (medians): the sites' start apart {:.1} ms, encoding \
             (timed here) {:.1} ms, the links {:.1} ms",
            p.start_ms, p.encode_ms, p.links_ms,
        )?;
    }
    if let Some(m) = &rounds.median_milestones {
        writeln!(
            out,
            "  where the exchange's time went (medians, from the first agent's start to the last \
             agent past each): last start {:.1} ms, encoded {:.1} ms, first data in {:.1} ms, \
             own shard reduced {:.1} ms, result held {:.1} ms, done (acknowledged) {}",
            m.last_start_ms,
            m.encoded_ms,
            m.first_data_ms,
            m.reduced_ms,
            m.assembled_ms,
            ms(rounds.median_exchange_ms),
        )?;
    }
    if !rounds.links.is_empty() {
        writeln!(out, "\nexchanges per link (predicted vs measured)")?;
        let mut links = Table::new(&[
            ("link", false),
            ("rounds", true),
            ("bytes", true),
            ("measured", true),
            ("goodput", true),
            ("predicted", true),
            ("link rate", true),
        ]);
        for l in &rounds.links {
            links.row(vec![
                l.link.clone(),
                l.rounds.to_string(),
                units::human_bytes(l.bytes as f64),
                format!("{:.2} s", l.exchange_seconds),
                units::human_rate(l.goodput_bits_per_second),
                format!("{:.3} s", l.predicted_seconds),
                units::human_rate(l.rate_bits_per_second as f64),
            ]);
        }
        write!(out, "{}", links.render(2))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(round: u64, excluded: &[&str], catching_up: &[&str]) -> RoundRow {
        RoundRow {
            round,
            state: "committed".into(),
            participants: vec!["east".into(), "north".into()],
            excluded: excluded.iter().map(|s| s.to_string()).collect(),
            catching_up: catching_up.iter().map(|s| s.to_string()).collect(),
            fragments: 1,
            bits: 4,
            inner_steps: 20,
            overlap_steps: 0,
            took_ms: Some(10),
            exchange_ms: None,
            milestones: None,
            bytes: 0,
            predicted_ms: 0.0,
            simulated_ms: None,
            simulated: None,
            deadline_ms: 30_000,
            inner_step_ms: None,
            reason: String::new(),
        }
    }

    #[test]
    fn a_rounds_milestones_are_the_latest_agents_from_the_first_start() {
        let record =
            |started: u64, [encoded, first, reduced, assembled]: [u64; 4]| pb::FragmentExchange {
                started_at_unix_ms: started,
                encoded_us: encoded,
                first_data_us: first,
                reduced_us: reduced,
                assembled_us: assembled,
                ..Default::default()
            };
        let north = record(1_000, [10_000, 40_000, 150_000, 200_000]);
        // South started 5 ms later and encoded faster.
        let south = record(1_005, [2_000, 30_000, 160_000, 190_000]);
        let m = Milestones::of(&[("north", &north), ("south", &south)]).unwrap();
        assert_eq!(
            m,
            Milestones {
                last_start_ms: 5.0,
                encoded_ms: 10.0,
                first_data_ms: 40.0,
                reduced_ms: 165.0,
                assembled_ms: 200.0,
            }
        );
        assert_eq!(Milestones::of(&[]), None);
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let later = Milestones {
            last_start_ms: 1.0,
            ..m
        };
        assert_eq!(
            Milestones::median(&[m, later, later], median).map(|m| m.last_start_ms),
            Some(1.0)
        );
        assert_eq!(Milestones::median(&[], median), None);
    }

    #[test]
    fn the_rounds_table_elides_only_rounds_where_nothing_happened() {
        let rows: Vec<RoundRow> = (1..=60)
            .map(|r| match r {
                30 => row(r, &["east (site_down)"], &[]),
                31 => row(r, &[], &["east (after round 30 from north)"]),
                // A re-plan: H from 20 to 50 from round 40.
                40.. => RoundRow {
                    inner_steps: 50,
                    ..row(r, &[], &[])
                },
                _ => row(r, &[], &[]),
            })
            .collect();
        let report = RoundsReport {
            elements_per_fragment: 0,
            committed: 60,
            aborted: 0,
            open: 0,
            measured: 0,
            median_took_ms: None,
            median_exchange_ms: None,
            median_predicted_ms: None,
            median_simulated_ms: None,
            median_simulated: None,
            median_measured_over_simulated: None,
            median_milestones: None,
            rounds: rows,
            links: Vec::new(),
        };
        let mut out = Vec::new();
        print_rounds(&report, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("east (site_down)"), "{text}");
        assert!(
            text.contains("catching up: east (after round 30 from north)"),
            "{text}"
        );
        // Round 40, where H changed, is shown; rounds 13-29, 32-39 and
        // 41-48 stand for themselves as one line each.
        assert!(text.contains("50, 0"), "{text}");
        assert!(text.contains("17 more"), "{text}");
        assert_eq!(text.matches("8 more").count(), 2, "{text}");
        assert_eq!(text.matches(" more").count(), 3, "{text}");
    }
}
