//! Watching the replicas: the leader (polled), and site and job changes
//! (a watch stream), each turned into a record with the action or change it
//! follows and how long after.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_core::scenario::Action;
use longhaul_proto::v1 as pb;

use super::network::Network;
use super::report::Record;

/// What the observers know now.
#[derive(Debug, Default)]
pub(super) struct Observed {
    pub leader: u64,
    pub term: u64,
    pub sites: BTreeMap<String, bool>,
    pub job_sites: Vec<String>,
    pub job_state: String,
    pub job_revision: u64,
    pub records: Vec<Record>,
    /// The last action and last site change, for "took".
    pub actions: Vec<(Duration, Action, Option<String>)>,
    pub site_changes: Vec<(Duration, String, bool)>,
    /// The job's outer rounds by number, as last seen.
    pub rounds: BTreeMap<u64, pb::OuterRound>,
}

pub(super) type Shared = Arc<Mutex<Observed>>;

/// The direct addresses of the replicas that are running now, kept by the
/// timeline for the observers.
pub(super) type LiveReplicas = Arc<Mutex<Vec<SocketAddr>>>;

pub(super) fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Observed> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The sites a job's plan puts stages on, sorted, each once.
pub fn plan_sites(job: &pb::Job) -> Vec<String> {
    let mut sites: Vec<String> = job
        .plan
        .as_ref()
        .map(|p| p.stages.iter().map(|s| s.site_id.clone()).collect())
        .unwrap_or_default();
    sites.sort();
    sites.dedup();
    sites
}

pub(super) fn job_state(job: &pb::Job) -> &'static str {
    match pb::JobState::try_from(job.state) {
        Ok(pb::JobState::Placed) => "placed",
        Ok(pb::JobState::Infeasible) => "infeasible",
        Ok(pb::JobState::Pending) => "pending",
        Ok(pb::JobState::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

/// Polls the live replicas for the leader every 100 ms.
pub(super) fn spawn_leader_watch(
    network: Network,
    addrs: LiveReplicas,
    shared: Shared,
    t0: Instant,
) {
    tokio::spawn(async move {
        loop {
            let live: Vec<SocketAddr> = addrs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let mut best: Option<(u64, u64)> = None;
            for addr in live {
                let Ok(mut c) = network.client(addr) else {
                    continue;
                };
                let mut request = tonic::Request::new(pb::GetClusterRequest { allow_stale: true });
                request.set_timeout(Duration::from_millis(300));
                if let Ok(response) = c.get_cluster(request).await {
                    let response = response.into_inner();
                    let term = response.header.map_or(0, |h| h.raft_term);
                    if response.leader_id != 0 && best.is_none_or(|(t, _)| term > t) {
                        best = Some((term, response.leader_id));
                    }
                }
            }
            if let Some((term, leader)) = best {
                let mut observed = lock(&shared);
                if leader != observed.leader {
                    let t = t0.elapsed();
                    let mut record =
                        Record::new(t, "leader", format!("replica {leader} leads (term {term})"));
                    record.leader = Some(leader);
                    // The most recent action that can move leadership.
                    if observed.leader != 0
                        && let Some((at, action, site)) =
                            observed.actions.iter().rev().find(|(_, a, _)| {
                                matches!(
                                    a,
                                    Action::KillLeader
                                        | Action::RestartCoordinators
                                        | Action::Partition
                                        | Action::Heal
                                )
                            })
                    {
                        record.after = Some(match site {
                            Some(site) => format!("{} {site}", action_name(*action)),
                            None => action_name(*action).to_string(),
                        });
                        record.took_ms = Some(t.saturating_sub(*at).as_millis() as u64);
                    }
                    observed.records.push(record);
                    observed.leader = leader;
                    observed.term = term;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// Watches site, job and round changes after `after` on every replica at
/// once, and takes each change from whichever replica shows it first: a
/// replica cut off from the quorum (or killed) lags, and a single watch on
/// it would see the change only after the heal. Each stream is in revision
/// order (one revision may carry several changes, in one order on every
/// replica) and only changes past the last taken, as (revision, its n-th
/// change), are taken, so no change is taken twice or out of order.
pub(super) fn spawn_change_watch(
    network: &Network,
    addrs: LiveReplicas,
    shared: Shared,
    t0: Instant,
    after: u64,
) {
    let all: Vec<SocketAddr> = addrs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let taken = Arc::new(Mutex::new((after, usize::MAX)));
    for addr in all {
        let (addrs, shared, taken) = (addrs.clone(), shared.clone(), Arc::clone(&taken));
        let network = network.clone();
        tokio::spawn(async move {
            loop {
                let live = addrs
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .contains(&addr);
                if !live {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                // The last revision taken may have had more changes than
                // were taken: start before it and skip what was.
                let (revision, count) = *taken
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let after = if count == usize::MAX {
                    revision
                } else {
                    revision.saturating_sub(1)
                };
                if let Ok(mut c) = network.client(addr)
                    && let Ok(response) = c
                        .watch(pb::WatchRequest {
                            after_revision: after,
                            kinds: vec!["site".into(), "job".into(), "round".into()],
                        })
                        .await
                {
                    let mut stream = response.into_inner();
                    let mut at = (0u64, 0usize);
                    while let Ok(Some(event)) = stream.message().await {
                        let t = t0.elapsed();
                        at = if at.0 == event.revision {
                            (at.0, at.1 + 1)
                        } else {
                            (event.revision, 1)
                        };
                        {
                            let mut taken = taken
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            let past = match *taken {
                                (revision, usize::MAX) => at.0 > revision,
                                last => at > last,
                            };
                            if !past {
                                continue;
                            }
                            *taken = at;
                            // Under the lock: the changes of one revision
                            // are taken in their order whichever stream
                            // brings them.
                            take(&shared, event, t);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
}

/// One change, seen at `t`, as records.
fn take(shared: &Shared, event: pb::WatchEvent, t: Duration) {
    let mut observed = lock(shared);
    match event.event {
        Some(pb::watch_event::Event::Site(site)) => {
            let id = site.site.as_ref().map(|s| s.id.clone()).unwrap_or_default();
            let up = site.state() == pb::SiteState::Up;
            if observed.sites.get(&id) == Some(&up) {
                return;
            }
            observed.sites.insert(id.clone(), up);
            let mut record = Record::new(
                t,
                "site",
                format!(
                    "site {id} {} ({})",
                    if up { "up" } else { "down" },
                    site.state_reason
                ),
            );
            record.site = Some(id.clone());
            record.up = Some(up);
            let cause = observed.actions.iter().rev().find(|(_, a, s)| {
                s.as_deref() == Some(id.as_str())
                    && match a {
                        Action::Partition | Action::KillAgent => !up,
                        Action::Heal | Action::RestartAgent => up,
                        _ => false,
                    }
            });
            if let Some((at, action, _)) = cause {
                record.after = Some(format!("{} {id}", action_name(*action)));
                record.took_ms = Some(t.saturating_sub(*at).as_millis() as u64);
            }
            observed.records.push(record);
            observed.site_changes.push((t, id, up));
        }
        Some(pb::watch_event::Event::Job(job)) => {
            let sites = plan_sites(&job);
            let state = job_state(&job).to_string();
            if observed.job_revision != 0
                && (sites != observed.job_sites || state != observed.job_state)
            {
                let mut record = Record::new(
                    t,
                    "job",
                    format!(
                        "job {} re-planned: {} on {} (was {} on {})",
                        job.id,
                        state,
                        if sites.is_empty() {
                            "-".into()
                        } else {
                            sites.join("+")
                        },
                        observed.job_state,
                        if observed.job_sites.is_empty() {
                            "-".into()
                        } else {
                            observed.job_sites.join("+")
                        }
                    ),
                );
                if let Some((at, site, up)) = observed.site_changes.last() {
                    record.after = Some(format!("site {site} {}", if *up { "up" } else { "down" }));
                    record.took_ms = Some(t.saturating_sub(*at).as_millis() as u64);
                }
                record.job_sites = Some(sites.clone());
                observed.records.push(record);
            }
            observed.job_sites = sites;
            observed.job_state = state;
            observed.job_revision = job.revision;
        }
        Some(pb::watch_event::Event::Round(round)) => {
            let before = observed.rounds.get(&round.round_id).cloned();
            round_records(&mut observed, before.as_ref(), &round, t);
            observed.rounds.insert(round.round_id, round);
        }
        Some(pb::watch_event::Event::RoundReport(report)) => {
            if let Some(before) = observed.rounds.get(&report.round_id).cloned() {
                let mut round = before.clone();
                longhaul_proto::rounds::apply_round_report(&mut round, &report);
                round_records(&mut observed, Some(&before), &round, t);
                observed.rounds.insert(round.round_id, round);
            }
        }
        _ => {}
    }
}

/// Records for what a round's change did that an operator looks for: a
/// participant excluded, the round aborted. Commits go to the rounds table.
fn round_records(
    observed: &mut Observed,
    before: Option<&pb::OuterRound>,
    round: &pb::OuterRound,
    t: Duration,
) {
    for p in round.participant_states.iter().filter(|p| p.excluded) {
        let known = before.is_some_and(|b| {
            b.participant_states
                .iter()
                .any(|q| q.site_id == p.site_id && q.excluded)
        });
        if known {
            continue;
        }
        let mut record = Record::new(
            t,
            "round",
            format!(
                "round {} went on without {} ({})",
                round.round_id, p.site_id, p.exclusion_reason
            ),
        );
        record.site = Some(p.site_id.clone());
        if let Some((at, site, up)) = observed.site_changes.last() {
            record.after = Some(format!("site {site} {}", if *up { "up" } else { "down" }));
            record.took_ms = Some(t.saturating_sub(*at).as_millis() as u64);
        }
        observed.records.push(record);
    }
    // A round opened with another H or τ than the one before: the
    // coordinator re-planned the sync at the trainers' measured step.
    if before.is_none()
        && round.inner_steps != 0
        && let Some(previous) = observed.rounds.get(&round.round_id.saturating_sub(1))
        && previous.inner_steps != 0
        && (previous.inner_steps, previous.overlap_steps)
            != (round.inner_steps, round.overlap_steps)
    {
        observed.records.push(Record::new(
            t,
            "round",
            format!(
                "round {} runs H = {}, τ = {} (round {}: H = {}, τ = {}): the sync was re-planned at the trainers' measured inner step",
                round.round_id,
                round.inner_steps,
                round.overlap_steps,
                previous.round_id,
                previous.inner_steps,
                previous.overlap_steps
            ),
        ));
    }
    let aborted = pb::RoundState::Aborted as i32;
    if round.state == aborted && before.is_none_or(|b| b.state != aborted) {
        observed.records.push(Record::new(
            t,
            "round",
            format!("round {} aborted: {}", round.round_id, round.reason),
        ));
    }
}

fn action_name(action: Action) -> &'static str {
    match action {
        Action::KillLeader => "kill-leader",
        Action::RestartCoordinators => "restart-coordinators",
        Action::Partition => "partition",
        Action::Heal => "heal",
        Action::KillAgent => "kill-agent",
        Action::RestartAgent => "restart-agent",
        Action::SetLoss => "set-loss",
        Action::SetRate => "set-rate",
    }
}
