//! Playing the scenario's fault timeline: each event at its time (kill or
//! restart processes, cut or heal a site's links, change a link), recorded
//! as an action, with a line of progress every second.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use longhaul_core::Scenario;
use longhaul_core::scenario::{Action, TimelineEvent};
use longhaul_simulations::emulator::{Emulator, LinkChange};

use super::observe::{LiveReplicas, Shared, lock};
use super::processes::{Process, ReplicaProcess, running_addrs};
use super::progress;
use super::report::Record;

/// What the timeline acts on, and the observers' state it keeps current.
pub(super) struct Stage<'a> {
    pub emulator: &'a Emulator,
    pub replicas: &'a mut [ReplicaProcess],
    pub agents: &'a mut BTreeMap<String, Process>,
    pub live: &'a LiveReplicas,
    pub shared: &'a Shared,
    /// This binary, to start killed processes again.
    pub exe: &'a Path,
}

/// Plays the timeline from `t0` for the scenario's duration.
pub(super) async fn play(
    scenario: &Scenario,
    stage: &mut Stage<'_>,
    t0: Instant,
    quiet: bool,
) -> anyhow::Result<()> {
    let shared = stage.shared;
    let duration = Duration::from(scenario.duration);
    let mut timeline: Vec<&TimelineEvent> = scenario.timeline.iter().collect();
    timeline.sort_by_key(|e| e.at.as_nanos());
    let mut next_progress = Duration::from_secs(1);
    let mut pending = timeline.into_iter().peekable();
    while t0.elapsed() < duration {
        if let Some(event) = pending.next_if(|e| Duration::from(e.at) <= t0.elapsed()) {
            let t = t0.elapsed();
            let detail = perform(event, stage)?;
            progress(quiet, &format!("  {:>6.1} s  {detail}", t.as_secs_f64()));
            let mut observed = lock(shared);
            observed.actions.push((t, event.action, event.site.clone()));
            let mut record = Record::new(t, "action", detail);
            record.site = event.site.clone();
            observed.records.push(record);
            continue;
        }
        if t0.elapsed() >= next_progress {
            next_progress += Duration::from_secs(1);
            let observed = lock(shared);
            let up = observed.sites.values().filter(|u| **u).count();
            progress(
                quiet,
                &format!(
                    "  {:>6.1} s  leader {}  sites up {up}/{}  job {} on {}",
                    t0.elapsed().as_secs_f64(),
                    observed.leader,
                    observed.sites.len(),
                    observed.job_state,
                    if observed.job_sites.is_empty() {
                        "-".into()
                    } else {
                        observed.job_sites.join("+")
                    }
                ),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Performs one timeline step; says what was done.
fn perform(event: &TimelineEvent, stage: &mut Stage<'_>) -> anyhow::Result<String> {
    let Stage {
        emulator,
        replicas,
        agents,
        live,
        shared,
        exe,
    } = stage;
    let site = event.site.clone().unwrap_or_default();
    let set_live = |replicas: &[ReplicaProcess]| {
        *live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = running_addrs(replicas);
    };
    Ok(match event.action {
        Action::KillLeader => {
            let leader = lock(shared).leader;
            match replicas
                .iter_mut()
                .find(|r| r.id == leader && r.process.running())
            {
                Some(replica) => {
                    replica.process.kill();
                    set_live(replicas);
                    format!("killed the leader, replica {leader} (SIGKILL)")
                }
                None => "kill-leader: no leader is known; nothing killed".to_string(),
            }
        }
        Action::RestartCoordinators => {
            let mut restarted = Vec::new();
            for replica in replicas.iter_mut().filter(|r| !r.process.running()) {
                replica.process.spawn(exe)?;
                restarted.push(replica.id.to_string());
            }
            set_live(replicas);
            if restarted.is_empty() {
                "restart-coordinators: none was down".to_string()
            } else {
                format!("restarted replica(s) {}", restarted.join(", "))
            }
        }
        Action::Partition => {
            emulator.set_down(&site, None, true)?;
            format!("partitioned {site}: every link of {site} cut")
        }
        Action::Heal => {
            emulator.set_down(&site, None, false)?;
            format!("healed {site}")
        }
        Action::KillAgent => {
            if let Some(agent) = agents.get_mut(&site) {
                agent.kill();
            }
            format!("killed {site}'s agent (SIGKILL)")
        }
        Action::RestartAgent => {
            if let Some(agent) = agents.get_mut(&site)
                && !agent.running()
            {
                agent.spawn(exe)?;
            }
            format!("restarted {site}'s agent")
        }
        Action::SetLoss | Action::SetRate => {
            let [a, b] = event.link.clone().unwrap_or_default();
            let change = LinkChange {
                loss: event.loss,
                rate_bits_per_second: event.rate.map(|r| r.bits_per_second()),
                ..LinkChange::default()
            };
            emulator.set(&a, &b, false, &change)?;
            match (event.loss, event.rate) {
                (Some(loss), _) => format!("loss on {a}–{b} set to {loss}"),
                (_, Some(rate)) => format!("rate of {a}–{b} set to {rate}"),
                _ => format!("{a}–{b} unchanged"),
            }
        }
    })
}
