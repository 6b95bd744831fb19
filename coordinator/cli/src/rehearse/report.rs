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

mod rounds;
pub use rounds::{ExchangeLinkRow, RoundRow, RoundsReport};
pub(super) use rounds::{live_sites, rounds_report};

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
        rounds::print_rounds(rounds, out)?;
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
