//! What a rehearsal reports: the plan, the records of what happened and the
//! emulator's counters per link direction, as text tables or JSON.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use longhaul_core::units;
use longhaul_proto::v1 as pb;
use longhaul_simulations::emulator::{Emulator, PacketEmulator, human_ns};
use serde::Serialize;

use super::observe::plan_sites;
use crate::table::{Table, thousands};

/// One thing that happened, at `t` since the job was placed.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub t_ms: u64,
    /// `action`, `leader`, `site`, `job`.
    pub kind: &'static str,
    pub detail: String,
    /// For a consequence: the action or change it follows, and how long after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub took_ms: Option<u64>,
    /// Structured fields for checks: the site, the leader id, the job's sites.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub up: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_sites: Option<Vec<String>>,
}

impl Record {
    pub(super) fn new(t: Duration, kind: &'static str, detail: String) -> Self {
        Self {
            t_ms: t.as_millis() as u64,
            kind,
            detail,
            after: None,
            took_ms: None,
            site: None,
            up: None,
            leader: None,
            job_sites: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    pub direction: String,
    pub packets_in: u64,
    pub bytes_delivered: u64,
    pub drops_queue: u64,
    pub drops_loss: u64,
    pub drops_down: u64,
    /// Released datagrams the host could not send.
    pub drops_host: u64,
    /// Datagrams the kernel dropped at a proxy socket before the emulator
    /// read them: losses the scenario did not ask for.
    pub drops_kernel: u64,
    pub retransmissions: u64,
    pub queue_high_water_bytes: u64,
    pub lateness_p50_us: u64,
    pub lateness_p99_us: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub mode: String,
    pub sites: Vec<String>,
    pub gpus: u64,
    pub step_seconds: f64,
}

/// A site as the packet-level mode set it up.
#[derive(Debug, Clone, Serialize)]
pub struct SiteReport {
    pub site: String,
    pub address: String,
    pub namespace: String,
    pub tcp_congestion_control: String,
}

/// The rehearsal's result.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    /// `proxy` or `packet`, as `--mode` spells it.
    pub emulator_mode: String,
    /// Packet mode: every site's address and namespace; empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<SiteReport>,
    /// Packet mode: packets the emulator dropped because no link leads to
    /// their address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unroutable_packets: Option<u64>,
    pub seed: u64,
    pub lease_ttl_ms: u64,
    pub replicas: Vec<(u64, String)>,
    pub plan: PlanReport,
    pub timeline: Vec<Record>,
    /// The job's outer rounds, when it was placed as DiLoCo replicas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounds: Option<RoundsReport>,
    /// The trainers of `[training]`, when the scenario has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub training: Option<TrainingReport>,
    pub links: Vec<LinkReport>,
    pub directory: Option<PathBuf>,
}

/// What the scenario's trainers did, from the JSON each wrote
/// (`LONGHAUL_OUTPUT`), and the bytes their rounds moved.
#[derive(Debug, Clone, Serialize)]
pub struct TrainingReport {
    pub sites: Vec<TrainerRow>,
    /// Every trainer that finished ended with the same parameters (their
    /// SHA-256 agrees).
    pub same_parameters: bool,
    /// Bytes the agents sent each other in the job's fragment exchanges
    /// (over the rounds the agents still had records of).
    pub exchange_bytes: u64,
    /// Fragment exchanges those bytes are over.
    pub exchanges: u64,
    /// Every byte the emulated links delivered (control plane and probes
    /// included).
    pub wan_bytes: u64,
}

/// One site's trainer.
#[derive(Debug, Clone, Serialize)]
pub struct TrainerRow {
    pub site: String,
    /// How the process ended (`None`: it was still running and was killed).
    pub exit: Option<String>,
    /// The trainer's own JSON (`None`: it wrote none).
    pub run: Option<serde_json::Value>,
}

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
    pub rounds: Vec<RoundRow>,
    /// Per link, over the rounds whose exchanges the agents reported.
    pub links: Vec<ExchangeLinkRow>,
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
    /// Opened to committed or aborted.
    pub took_ms: Option<u64>,
    /// From the first agent's start of an exchange of its fragments to the
    /// last one's result, as the agents reported them (`None` when none
    /// did: an agent killed since loses its records).
    pub exchange_ms: Option<u64>,
    /// Data bytes the agents sent each other for the round.
    pub bytes: u64,
    /// The exchange of its fragments among the sites left, by the
    /// planner's cost model: per fragment 2·(α + F/(M·B)) on each link
    /// (α one way, B the link's rate, F the fragment's encoded bytes, M
    /// the sites), the agents' fragments four at a time.
    pub predicted_ms: f64,
    /// The same exchange through the simulator's discrete-event tier, on
    /// the links as the emulator played them (Cubic senders, the pool's
    /// connections; see `rehearse::simulated`); `None` when there was
    /// nothing to exchange or the simulation did not finish.
    pub simulated_ms: Option<f64>,
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
pub(super) fn rounds_report(
    rounds: &std::collections::BTreeMap<u64, pb::OuterRound>,
    exchanges: &std::collections::BTreeMap<String, Vec<pb::FragmentExchange>>,
    topology: &longhaul_core::Topology,
    elements: u64,
    simulator: &super::simulated::Simulator<'_>,
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
                took_ms: (r.ended_at_unix_ms != 0)
                    .then(|| r.ended_at_unix_ms.saturating_sub(r.opened_at_unix_ms)),
                exchange_ms: span(&records),
                bytes: records
                    .iter()
                    .flat_map(|(_, e)| &e.peers)
                    .map(|p| p.sent_bytes)
                    .sum(),
                predicted_ms: live_pairs(r, topology)
                    .map(|(a, b, wan)| predicted_link_seconds(r, a, b, wan, elements))
                    .fold(0.0, f64::max)
                    * 1e3,
                simulated_ms: simulator
                    .round_seconds(r, |a, b| fragment_bytes(r, a, b, elements))
                    .map(|s| s * 1e3),
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
        measured: measured.len(),
        rounds: rows,
        links,
    })
}

/// The sites the round did not exclude.
pub(super) fn live_sites(round: &pb::OuterRound) -> Vec<&str> {
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
pub(super) fn fragment_bytes(round: &pb::OuterRound, a: &str, b: &str, elements: u64) -> f64 {
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

/// The plan of the job as the coordinator placed it.
pub(super) fn plan_report(placed: &pb::Job) -> PlanReport {
    let plan = placed.plan.clone().unwrap_or_default();
    PlanReport {
        mode: plan.cross_site_mode.clone(),
        sites: plan_sites(placed),
        gpus: u64::from(plan.tensor_parallel)
            * u64::from(plan.pipeline_parallel)
            * u64::from(plan.data_parallel),
        step_seconds: plan.predicted_step.map_or(0.0, |s| s.total_ns as f64 / 1e9),
    }
}

/// The packet-level mode's sites.
pub(super) fn site_reports(packet: &PacketEmulator) -> Vec<SiteReport> {
    packet
        .sites()
        .into_iter()
        .map(|s| SiteReport {
            site: s.site,
            address: s.address.to_string(),
            namespace: s.namespace,
            tcp_congestion_control: s.congestion_control,
        })
        .collect()
}

/// The emulator's counters now, per link direction.
/// The trainers' report: their JSON runs, the exchanges' bytes and the
/// links' bytes.
pub(super) fn training_report(
    trainers: &mut [super::processes::Trainer],
    dir: &std::path::Path,
    exchanges: &std::collections::BTreeMap<String, Vec<pb::FragmentExchange>>,
    links: &[LinkReport],
) -> TrainingReport {
    let sites: Vec<TrainerRow> = trainers
        .iter_mut()
        .map(|t| {
            t.poll();
            let path = super::processes::trainer_output(dir, &t.site);
            let run = std::fs::read_to_string(&path)
                .ok()
                .and_then(|text| serde_json::from_str(&text).ok());
            TrainerRow {
                site: t.site.clone(),
                exit: t.exited.clone(),
                run,
            }
        })
        .collect();
    let hashes: std::collections::BTreeSet<&str> = sites
        .iter()
        .filter_map(|s| s.run.as_ref()?.get("params_sha256")?.as_str())
        .collect();
    let (mut exchange_bytes, mut count) = (0, 0);
    for site in exchanges.values() {
        for exchange in site {
            count += 1;
            exchange_bytes += exchange.peers.iter().map(|p| p.sent_bytes).sum::<u64>();
        }
    }
    TrainingReport {
        same_parameters: hashes.len() == 1,
        sites,
        exchange_bytes,
        exchanges: count,
        wan_bytes: links.iter().map(|l| l.bytes_delivered).sum(),
    }
}

pub(super) fn link_reports(emulator: &Emulator) -> Vec<LinkReport> {
    emulator
        .statuses()
        .into_iter()
        .map(|s| LinkReport {
            direction: s.id(),
            packets_in: s.stats.packets_in,
            bytes_delivered: s.stats.bytes_delivered,
            drops_queue: s.stats.drops.queue,
            drops_loss: s.stats.drops.loss,
            drops_down: s.stats.drops.down,
            drops_host: s.host_drops,
            drops_kernel: s.kernel_drops,
            retransmissions: s.retransmissions,
            queue_high_water_bytes: s.stats.queue_high_water_bytes,
            lateness_p50_us: s.lateness.p50_us,
            lateness_p99_us: s.lateness.p99_us,
        })
        .collect()
}

pub(super) fn print_report(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "rehearsal {:?}, seed {}, lease TTL {} ms",
        report.scenario, report.seed, report.lease_ttl_ms
    )?;
    match report.emulator_mode.as_str() {
        "packet" => writeln!(
            out,
            "emulator: packet mode, every process in its site's network namespace, kernel TCP/UDP \
             end to end ({}; {} unroutable packets)",
            report
                .sites
                .iter()
                .map(|s| format!("{} {} {}", s.site, s.address, s.tcp_congestion_control))
                .collect::<Vec<_>>()
                .join(", "),
            report.unroutable_packets.unwrap_or(0)
        )?,
        mode => writeln!(
            out,
            "emulator: {mode} mode, loopback proxies per link (TCP relayed)"
        )?,
    }
    writeln!(
        out,
        "replicas: {}",
        report
            .replicas
            .iter()
            .map(|(id, site)| format!("{id}@{site}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(
        out,
        "plan: {} on {} ({} GPUs), predicted step {:.2} s",
        report.plan.mode,
        report.plan.sites.join(" + "),
        thousands(report.plan.gpus),
        report.plan.step_seconds
    )?;
    writeln!(out, "\nwhat happened (t since the job was placed)")?;
    let mut table = Table::new(&[
        ("t", true),
        ("what", false),
        ("took", true),
        ("after", false),
    ]);
    for r in &report.timeline {
        table.row(vec![
            format!("{:.1} s", r.t_ms as f64 / 1000.0),
            r.detail.clone(),
            r.took_ms.map_or(String::new(), |t| format!("{t} ms")),
            r.after.clone().unwrap_or_default(),
        ]);
    }
    write!(out, "{}", table.render(2))?;
    if let Some(rounds) = &report.rounds {
        print_rounds(rounds, out)?;
    }
    if let Some(training) = &report.training {
        print_training(training, out)?;
    }
    writeln!(out, "\nemulated links")?;
    let mut links = Table::new(&[
        ("direction", false),
        ("packets", true),
        ("delivered", true),
        ("drops queue/loss/down/host/kernel", true),
        ("retransmits", true),
        ("queue peak", true),
        ("late p50/p99", true),
    ]);
    for l in &report.links {
        links.row(vec![
            l.direction.clone(),
            thousands(l.packets_in),
            units::human_bytes(l.bytes_delivered as f64),
            format!(
                "{}/{}/{}/{}/{}",
                l.drops_queue, l.drops_loss, l.drops_down, l.drops_host, l.drops_kernel
            ),
            thousands(l.retransmissions),
            units::human_bytes(l.queue_high_water_bytes as f64),
            format!(
                "{}/{}",
                human_ns(l.lateness_p50_us * 1000),
                human_ns(l.lateness_p99_us * 1000)
            ),
        ]);
    }
    write!(out, "{}", links.render(2))?;
    if let Some(warning) = host_drop_warning(&report.links) {
        writeln!(out, "\n{warning}")?;
    }
    if let Some(dir) = &report.directory {
        writeln!(out, "\nconfigs, stores and logs kept in {}", dir.display())?;
    }
    Ok(())
}

fn print_training(training: &TrainingReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "\ntraining: {} trainers; fragment exchanges moved {} in {} exchanges; the links delivered {} in all; final parameters {}",
        training.sites.len(),
        units::human_bytes(training.exchange_bytes as f64),
        thousands(training.exchanges),
        units::human_bytes(training.wan_bytes as f64),
        if training.same_parameters {
            "identical at every site"
        } else {
            "DIFFER between sites"
        }
    )?;
    let mut table = Table::new(&[
        ("site", false),
        ("mode", false),
        ("steps", true),
        ("rounds", true),
        ("excluded", true),
        ("final loss", true),
        ("seconds", true),
        ("ended", false),
    ]);
    for site in &training.sites {
        let run = site.run.as_ref();
        let field = |key: &str| run.and_then(|r| r.get(key));
        let rounds = field("rounds").and_then(|r| r.as_array());
        table.row(vec![
            site.site.clone(),
            field("mode")
                .and_then(|m| m.as_str())
                .unwrap_or("-")
                .to_string(),
            field("steps")
                .and_then(|v| v.as_u64())
                .map_or("-".into(), thousands),
            rounds.map_or("-".into(), |r| thousands(r.len() as u64)),
            rounds.map_or("-".into(), |r| {
                thousands(
                    r.iter()
                        .filter(|x| x.get("applied").and_then(|a| a.as_bool()) == Some(false))
                        .count() as u64,
                )
            }),
            field("final_held_out_loss")
                .and_then(|v| v.as_f64())
                .map_or("-".into(), |l| format!("{l:.4}")),
            field("seconds")
                .and_then(|v| v.as_f64())
                .map_or("-".into(), |s| format!("{s:.1}")),
            site.exit
                .clone()
                .unwrap_or_else(|| "killed at the end".into()),
        ]);
    }
    write!(out, "{}", table.render(2))?;
    for site in &training.sites {
        if let Some(line) = site.run.as_ref().and_then(left_out_and_caught_up) {
            writeln!(out, "  {}: {line}", site.site)?;
        }
    }
    Ok(())
}

/// The rounds a trainer's run did not apply and its catch-ups, in words
/// (`None` when it applied every round).
fn left_out_and_caught_up(run: &serde_json::Value) -> Option<String> {
    let rounds = run.get("rounds")?.as_array()?;
    let number = |r: &serde_json::Value| r.get("round").and_then(|n| n.as_u64()).unwrap_or(0);
    let mut parts = Vec::new();
    let missed: Vec<String> = rounds
        .iter()
        .filter(|r| r.get("applied").and_then(|a| a.as_bool()) == Some(false))
        .map(|r| number(r).to_string())
        .collect();
    if !missed.is_empty() {
        parts.push(format!("did not apply round {}", missed.join(", ")));
    }
    for r in rounds {
        let text = |key: &str| r.get(key).and_then(|v| v.as_str()).unwrap_or("");
        if !text("caught_up_from").is_empty() {
            parts.push(format!(
                "caught up after round {} from {} before round {}",
                r.get("caught_up_after")
                    .and_then(|n| n.as_u64())
                    .unwrap_or(0),
                text("caught_up_from"),
                number(r)
            ));
        }
        if !text("catch_up_failed").is_empty() {
            parts.push(format!(
                "sat round {} out: catch-up failed ({})",
                number(r),
                text("catch_up_failed")
            ));
        }
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Rounds shown in the text report besides those where something
/// happened; the JSON has every one.
const ROUNDS_SHOWN: usize = 24;

/// A row of the rounds table standing for `hidden` rounds not shown.
fn elided(hidden: usize) -> Vec<String> {
    let mut row = vec!["...".to_string(), format!("{hidden} more")];
    row.resize(10, String::new());
    row
}

fn print_rounds(rounds: &RoundsReport, out: &mut dyn Write) -> std::io::Result<()> {
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
    let mut table = Table::new(&[
        ("round", true),
        ("state", false),
        ("sites", false),
        ("excluded, catching up", false),
        ("fragments", true),
        ("bits", true),
        ("bytes", true),
        ("exchange", true),
        ("predicted", true),
        ("simulated", true),
        ("took", true),
    ]);
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
    };
    let mut hidden = 0;
    for (i, r) in rounds.rounds.iter().enumerate() {
        if !shown(i, r) {
            hidden += 1;
            continue;
        }
        if hidden > 0 {
            table.row(elided(hidden));
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

/// What a report says when the host, not the link model, dropped packets:
/// those are losses the scenario never asked for, so the run's transport
/// figures are not the scenario's.
pub(super) fn host_drop_warning(links: &[LinkReport]) -> Option<String> {
    let kernel: u64 = links.iter().map(|l| l.drops_kernel).sum();
    let host: u64 = links.iter().map(|l| l.drops_host).sum();
    if kernel == 0 && host == 0 {
        return None;
    }
    let directions: Vec<&str> = links
        .iter()
        .filter(|l| l.drops_kernel + l.drops_host > 0)
        .map(|l| l.direction.as_str())
        .collect();
    Some(format!(
        "warning: this host dropped {kernel} datagram(s) at the emulator's sockets before the link \
         model saw them and failed to send {host} released one(s) ({}): the transports saw losses \
         the scenario did not configure (see the emulator's socket-buffer log lines)",
        directions.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(direction: &str, host: u64, kernel: u64) -> LinkReport {
        LinkReport {
            direction: direction.to_string(),
            packets_in: 10,
            bytes_delivered: 1000,
            drops_queue: 1,
            drops_loss: 1,
            drops_down: 0,
            drops_host: host,
            drops_kernel: kernel,
            retransmissions: 0,
            queue_high_water_bytes: 0,
            lateness_p50_us: 0,
            lateness_p99_us: 0,
        }
    }

    #[test]
    fn a_report_says_when_the_host_dropped_datagrams() {
        // The link model's own drops are the scenario's: no warning.
        assert_eq!(host_drop_warning(&[link("a->b", 0, 0)]), None);
        let warning = host_drop_warning(&[link("a->b", 0, 0), link("b->a", 1, 7)]).unwrap();
        assert!(warning.contains("dropped 7 datagram(s)"), "{warning}");
        assert!(warning.contains("failed to send 1"), "{warning}");
        assert!(warning.contains("(b->a)"), "{warning}");
    }

    fn row(round: u64, excluded: &[&str], catching_up: &[&str]) -> RoundRow {
        RoundRow {
            round,
            state: "committed".into(),
            participants: vec!["east".into(), "north".into()],
            excluded: excluded.iter().map(|s| s.to_string()).collect(),
            catching_up: catching_up.iter().map(|s| s.to_string()).collect(),
            fragments: 1,
            bits: 4,
            took_ms: Some(10),
            exchange_ms: None,
            bytes: 0,
            predicted_ms: 0.0,
            simulated_ms: None,
            deadline_ms: 30_000,
            inner_step_ms: None,
            reason: String::new(),
        }
    }

    #[test]
    fn the_rounds_table_elides_only_rounds_where_nothing_happened() {
        let rows: Vec<RoundRow> = (1..=60)
            .map(|r| match r {
                30 => row(r, &["east (site_down)"], &[]),
                31 => row(r, &[], &["east (after round 30 from north)"]),
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
            median_measured_over_simulated: None,
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
        // Rounds 13-29 and 32-48 stand for themselves as one line each.
        assert!(text.contains("17 more"), "{text}");
        assert_eq!(text.matches(" more").count(), 2, "{text}");
    }

    #[test]
    fn a_trainers_missed_rounds_and_catch_ups_are_told() {
        let run = serde_json::json!({"rounds": [
            {"round": 8, "applied": true, "caught_up_from": "", "caught_up_after": 0, "catch_up_failed": ""},
            {"round": 9, "applied": false, "caught_up_from": "", "caught_up_after": 0, "catch_up_failed": ""},
            {"round": 10, "applied": false, "caught_up_from": "", "caught_up_after": 0, "catch_up_failed": "no state"},
            {"round": 11, "applied": true, "caught_up_from": "north", "caught_up_after": 10, "catch_up_failed": ""},
        ]});
        assert_eq!(
            left_out_and_caught_up(&run).unwrap(),
            "did not apply round 9, 10; sat round 10 out: catch-up failed (no state); \
             caught up after round 10 from north before round 11"
        );
        let clean = serde_json::json!({"rounds": [{"round": 1, "applied": true}]});
        assert_eq!(left_out_and_caught_up(&clean), None);
    }
}
