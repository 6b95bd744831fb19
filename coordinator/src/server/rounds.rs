//! Outer rounds on a running replica: the leader's round driver, rounds as
//! messages, and the rounds' metrics. The protocol itself is the core's
//! (`longhaul_core::state::rounds`).
//!
//! The driver runs on every replica; only a leader that has applied an
//! entry of its term acts. It wakes on every applied round, job or site
//! change, when this replica becomes leader, at the earliest deadline of an
//! open round, and to retry what it could not store. Each pass
//! ([`round_actions`], pure) decides, for every job placed as DiLoCo
//! replicas:
//!
//! - no round open: when the inner step the job's trainers measured is
//!   more than [`RoundTiming::replan_factor`] off the one its sync
//!   schedule was planned at, re-plan the schedule at the measured step
//!   (`ReplanSync`, [`longhaul_core::sync::replan_sync`]); else open the
//!   next round, with the job's replica sites that are up, the catch-up of
//!   each site that missed the last committed round, the planner's
//!   fragments, codec, H and τ, and a deadline ([`RoundTiming::deadline`],
//!   doubled for each round just before that ended at its deadline with
//!   nothing measured);
//! - a round open: exclude the participants it waits for once its deadline
//!   passed, and those the job was re-placed without.
//!
//! and aborts the open round of a job no longer placed as DiLoCo replicas.
//! A new leader resumes the open round (its deadline is in the replicated
//! record) instead of opening another: the round number is in the
//! command, so an `OpenRound` proposed again by an earlier leader is
//! refused at apply, never a second round.

use std::collections::BTreeMap;
use std::time::Duration;

use longhaul_core::cost::CostParams;
use longhaul_core::placement::CrossSiteMode;
use longhaul_core::state::{
    Change, ClusterState, Command, Event, ExclusionReason, FragmentState, JobState, LinkCodec,
    Liveness, Request, RoundOutcome, RoundRecord, RoundReport,
};
use longhaul_core::sync::{needs_replan, replan_sync, schedule_of};
use longhaul_proto::v1 as pb;

use super::raft_loop::{RaftHandle, Role};
use super::service::now_unix_ms;
use super::state_machine::ApplyResponse;

/// How a round's deadline follows from the planner's prediction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundTiming {
    /// The deadline is this many predicted outer steps (H inner steps plus
    /// the exposed exchange) after the opening: a participant gets twice the
    /// time the plan expects before it is excluded as a straggler.
    pub slack: f64,
    /// The deadline is never sooner than this after the opening (a restart
    /// of a site's training processes, a leader change, a slow first step).
    pub floor: Duration,
    /// A fixed deadline instead of the prediction, for rehearsals and
    /// tests (`coordinator --round-deadline`).
    pub fixed: Option<Duration>,
    /// Re-plan a job's sync schedule when its trainers' measured inner
    /// step is more than this factor off the one the schedule was planned
    /// at, either way (`None`: never; `coordinator --replan-factor`).
    pub replan_factor: Option<f64>,
}

/// A re-plan waits for this many rounds to end after the last one.
pub const ROUNDS_BETWEEN_REPLANS: u64 = 3;

/// The most a deadline is doubled for rounds that ended at theirs with
/// nothing measured (2⁴ = 16 ×).
pub const MAX_DEADLINE_DOUBLINGS: u32 = 4;

impl Default for RoundTiming {
    fn default() -> Self {
        Self {
            slack: 2.0,
            floor: Duration::from_secs(30),
            fixed: None,
            replan_factor: Some(2.0),
        }
    }
}

impl RoundTiming {
    /// The time from opening to deadline for a round predicted to take
    /// `outer_step_seconds` (`None`: no prediction, the floor), doubled
    /// `doublings` times (at most [`MAX_DEADLINE_DOUBLINGS`]; see
    /// [`deadline_doublings`]). A fixed deadline is never doubled.
    pub fn deadline(&self, outer_step_seconds: Option<f64>, doublings: u32) -> Duration {
        if let Some(fixed) = self.fixed {
            return fixed;
        }
        let predicted = outer_step_seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(Duration::ZERO, |s| {
                Duration::try_from_secs_f64(s * self.slack).unwrap_or(Duration::MAX)
            });
        // A year at most, so that unix milliseconds never overflow.
        predicted
            .max(self.floor)
            .saturating_mul(1 << doublings.min(MAX_DEADLINE_DOUBLINGS))
            .min(Duration::from_secs(365 * 24 * 3600))
    }
}

/// How many times the next round's deadline of `job_id` is doubled: once
/// for each of its latest rounds, newest first, that ended with a
/// participant excluded at the deadline and no inner step measured by any
/// (so the next deadline would be the same guess again). A round that
/// measured anything, or ended otherwise, stops the count: from a
/// measurement the deadline follows the trainers again.
pub fn deadline_doublings(state: &ClusterState, job_id: &str) -> u32 {
    let missed_blind = |r: &RoundRecord| {
        !r.is_open()
            && r.participants.iter().all(|p| p.inner_step_us == 0)
            && r.participants.iter().any(|p| {
                p.excluded
                    .as_ref()
                    .is_some_and(|e| e.reason == ExclusionReason::DeadlineMissed)
            })
    };
    state
        .rounds(job_id)
        .rev()
        .take(MAX_DEADLINE_DOUBLINGS as usize)
        .take_while(|r| missed_blind(r))
        .count() as u32
}

/// What the sync schedule says about the next round of a placed DiLoCo job.
#[derive(Debug, Clone, PartialEq)]
struct Planned {
    fragments: u32,
    /// The widest link's.
    codec_bits: u32,
    links: Vec<LinkCodec>,
    /// H and τ the trainers run the round with, and of the schedule now.
    inner_steps: u32,
    overlap_steps: u32,
    schedule_inner_steps: u32,
    schedule_overlap_steps: u32,
    /// [`expected_outer_step`]; `None` without a schedule.
    outer_step_seconds: Option<f64>,
}

/// What the sync schedule says about the next round of a placed DiLoCo
/// job: fragments, codec bits (the widest), the codec of each link and the
/// expected outer step ([`expected_outer_step`]) at the H and τ its
/// trainers run it with ([`ClusterState::next_round_steps`], which apply
/// records in the round); one uncompressed
/// fragment, no links and no prediction when there is none. The schedule
/// is the one placement costed the plan with (or the coordinator
/// re-planned it to) and `GetSyncSchedule` serves
/// ([`longhaul_core::sync::schedule_of`]), so a round and the schedule
/// never disagree; only a plan stored before placement ran the planner is
/// planned here.
fn planned(state: &ClusterState, job_id: &str, participants: &[String]) -> Planned {
    let none = Planned {
        fragments: 1,
        codec_bits: 0,
        links: Vec::new(),
        inner_steps: 0,
        overlap_steps: 0,
        schedule_inner_steps: 0,
        schedule_overlap_steps: 0,
        outer_step_seconds: None,
    };
    let Some(job) = state.job(job_id) else {
        return none;
    };
    let Some(plan) = job.placement.plan() else {
        return none;
    };
    let links: Vec<_> = if plan.sync.is_some() {
        Vec::new()
    } else {
        state.links().cloned().collect()
    };
    match schedule_of(plan, &job.spec, &links, &CostParams::default()) {
        Ok(sync) => {
            let (inner_steps, overlap_steps) = state.next_round_steps(job_id);
            let (schedule_inner_steps, schedule_overlap_steps) = state.schedule_steps(job_id);
            Planned {
                fragments: sync.fragments.max(1),
                codec_bits: sync.bits(),
                links: LinkCodec::of_schedule(&sync),
                inner_steps,
                overlap_steps,
                schedule_inner_steps,
                schedule_overlap_steps,
                outer_step_seconds: Some(expected_outer_step(
                    state,
                    job_id,
                    participants,
                    &sync,
                    (inner_steps, overlap_steps),
                )),
            }
        }
        Err(error) => {
            tracing::debug!(job = job_id, %error, "no sync schedule for the job; one fragment, uncompressed");
            none
        }
    }
}

/// The slowest inner step the trainers of `participants` measured for
/// `job_id` (each site's latest, in the rounds kept), in microseconds; 0
/// when none did.
pub(crate) fn measured_inner_step_us(
    state: &ClusterState,
    job_id: &str,
    participants: &[String],
) -> u64 {
    participants
        .iter()
        .filter_map(|site| {
            state.rounds(job_id).rev().find_map(|r| {
                r.participants
                    .iter()
                    .find(|p| p.site == *site && p.inner_step_us > 0)
                    .map(|p| p.inner_step_us)
            })
        })
        .max()
        .unwrap_or(0)
}

/// The outer step the next round of `job_id`, among `participants`, is
/// expected to take with H and τ = `steps`: the planner's prediction, but
/// at the slowest inner step t the participants' trainers measured
/// ([`measured_inner_step_us`]) when any did: H·t plus the exchange left
/// exposed at that t (P·max(0, T − τ·t), the planner's transfer time T).
/// A job's trainers are rarely the hardware the planner costed: the
/// deadline follows them.
pub(crate) fn expected_outer_step(
    state: &ClusterState,
    job_id: &str,
    participants: &[String],
    sync: &longhaul_core::sync::SyncPlan,
    (inner_steps, overlap_steps): (u32, u32),
) -> f64 {
    let measured_us = measured_inner_step_us(state, job_id, participants);
    let t = if measured_us == 0 {
        if (inner_steps, overlap_steps) == (sync.inner_steps, sync.overlap_steps) {
            return sync.outer_step_seconds;
        }
        sync.inner_step_seconds
    } else {
        measured_us as f64 / 1e6
    };
    let exposed = f64::from(sync.fragments)
        * longhaul_core::sync::exposed_seconds(sync.fragment_transfer_seconds, overlap_steps, t);
    f64::from(inner_steps) * t + exposed
}

/// The `ReplanSync` the leader proposes for `job` before its next round,
/// among `participants`, when its trainers' measured inner step is more
/// than `timing.replan_factor` off the one its sync schedule was planned
/// at and the planner can plan at it (see
/// [`longhaul_core::sync::replan_sync`]); `None` otherwise. Only a
/// schedule placement planned is re-planned.
fn replan_command(
    state: &ClusterState,
    job: &longhaul_core::state::JobRecord,
    participants: &[String],
    now_unix_ms: u64,
    timing: &RoundTiming,
) -> Option<Command> {
    let factor = timing.replan_factor?;
    let plan = job.placement.plan()?;
    let sync = plan.sync.as_ref()?;
    let after_round = state.latest_round(&job.id).map_or(0, |r| r.round);
    // Not again until a few rounds have run on the last re-plan: a first
    // measurement taken while warming up must not make the schedule swing.
    if sync
        .replanned
        .as_ref()
        .is_some_and(|r| after_round < r.after_round + ROUNDS_BETWEEN_REPLANS)
    {
        return None;
    }
    let measured_us = measured_inner_step_us(state, &job.id, participants);
    let measured = measured_us as f64 / 1e6;
    if measured_us == 0 || !needs_replan(sync, measured, factor) {
        return None;
    }
    let links: Vec<_> = state.links().cloned().collect();
    let next = match replan_sync(
        plan,
        &job.spec,
        &links,
        &CostParams::default(),
        measured,
        after_round,
    ) {
        Ok(next) => next,
        Err(error) => {
            tracing::debug!(job = %job.id, %error, "no re-plan at the measured inner step");
            return None;
        }
    };
    // A plan that does not come back from JSON as itself (a non-finite
    // figure) would be refused by every replica's log replay.
    if !longhaul_core::state::replays_from_json(&next) {
        tracing::warn!(job = %job.id, "the re-planned sync schedule does not replay from JSON; kept the old one");
        return None;
    }
    tracing::info!(
        job = %job.id,
        after_round,
        measured_us,
        planned_us = (sync.inner_step_seconds * 1e6).round(),
        inner_steps = format!("{} -> {}", sync.inner_steps, next.inner_steps),
        overlap_steps = format!("{} -> {}", sync.overlap_steps, next.overlap_steps),
        "re-planning the sync schedule at the trainers' measured inner step"
    );
    Some(Command::ReplanSync {
        job_id: job.id.clone(),
        after_round,
        sync: next,
        at_unix_ms: now_unix_ms,
    })
}

/// The round commands the leader proposes for the state at `now_unix_ms`
/// (pure: the caller proposes them). Every command returned is admitted
/// against `state`; the exclusions of one round are each admitted alone
/// (excluding one may commit the round, and the others are then refused
/// at apply, changing nothing).
pub fn round_actions(state: &ClusterState, now_unix_ms: u64, timing: &RoundTiming) -> Vec<Command> {
    let mut commands = Vec::new();
    for job in state.jobs() {
        let diloco_sites = match (job.state, job.placement.plan()) {
            (JobState::Placed, Some(plan)) if matches!(plan.mode, CrossSiteMode::Diloco { .. }) => {
                Some(&plan.site_order)
            }
            _ => None,
        };
        let open = state.open_round(&job.id);
        match (diloco_sites, open) {
            (None, Some(round)) => commands.push(Command::AbortRound {
                job_id: job.id.clone(),
                round: round.round,
                reason: format!("job {:?} is no longer placed as DiLoCo replicas", job.id),
                at_unix_ms: now_unix_ms,
            }),
            (None, None) => {}
            (Some(sites), Some(round)) => {
                for p in round.counted() {
                    let (reason, message) = if !sites.contains(&p.site) {
                        (
                            ExclusionReason::LeftPlan,
                            "the job was re-placed without this site".to_string(),
                        )
                    } else if now_unix_ms >= round.deadline_unix_ms
                        && round.waiting_on().contains(&p.site.as_str())
                    {
                        (
                            ExclusionReason::DeadlineMissed,
                            format!(
                                "had not applied every fragment by the deadline {} (now {now_unix_ms})",
                                round.deadline_unix_ms
                            ),
                        )
                    } else {
                        continue;
                    };
                    commands.push(Command::ExcludeParticipant {
                        job_id: job.id.clone(),
                        round: round.round,
                        site_id: p.site.clone(),
                        reason,
                        message,
                        at_unix_ms: now_unix_ms,
                    });
                }
            }
            (Some(sites), None) => {
                let participants: Vec<String> = sites
                    .iter()
                    .filter(|s| state.site(s).is_some_and(|r| r.liveness == Liveness::Up))
                    .cloned()
                    .collect();
                if participants.is_empty() {
                    continue;
                }
                // A re-plan first, when one is due and admitted: its change
                // to the job wakes the next pass, which opens the round on
                // the new schedule. One not admitted leaves the round to
                // open on the schedule in force.
                if let Some(replan) = replan_command(state, job, &participants, now_unix_ms, timing)
                {
                    match state.admit(&Request::new(replan.clone())) {
                        Ok(()) => {
                            commands.push(replan);
                            continue;
                        }
                        Err(error) => {
                            tracing::warn!(job = %job.id, %error, "round driver: re-plan not admitted");
                        }
                    }
                }
                let round = state.latest_round(&job.id).map_or(1, |r| r.round + 1);
                let planned = planned(state, &job.id, &participants);
                let deadline = timing
                    .deadline(
                        planned.outer_step_seconds,
                        deadline_doublings(state, &job.id),
                    )
                    .as_millis() as u64;
                let fragments = planned
                    .fragments
                    .min(longhaul_core::limits::MAX_ROUND_FRAGMENTS);
                commands.push(Command::OpenRound {
                    job_id: job.id.clone(),
                    round,
                    catch_up: state.catch_up_for(&job.id, &participants),
                    participants,
                    fragments,
                    codec_bits: planned.codec_bits,
                    links: planned.links,
                    inner_steps: planned.inner_steps,
                    overlap_steps: planned.overlap_steps,
                    schedule_inner_steps: planned.schedule_inner_steps,
                    schedule_overlap_steps: planned.schedule_overlap_steps,
                    deadline_unix_ms: now_unix_ms.saturating_add(deadline.max(1)),
                    at_unix_ms: now_unix_ms,
                });
            }
        }
    }
    commands.retain(
        |command| match state.admit(&Request::new(command.clone())) {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(command = command.name(), %error, "round driver: not admitted");
                false
            }
        },
    );
    commands
}

/// The earliest deadline of an open round, in unix milliseconds.
fn next_deadline(state: &ClusterState) -> Option<u64> {
    state.open_rounds().map(|r| r.deadline_unix_ms).min()
}

/// Starts the round driver on this replica (see the module docs).
pub fn spawn(raft: RaftHandle, timing: RoundTiming) {
    let mut events = raft.subscribe();
    record_site_states(&raft.state().read());
    let mut status = raft.watch_status();
    tokio::spawn(async move {
        let mut retry_at: Option<tokio::time::Instant> = None;
        // The earliest deadline a pass has already acted on: it is not armed
        // again (the pass's exclusions are in, or were refused because the
        // round moved on), so a deadline in the past never spins the loop.
        let mut acted_on: Option<u64> = None;
        // The status changes with every applied entry; only a change of
        // leadership is a reason for a pass.
        let mut leading = (Role::Follower, false);
        // A snapshot installed from the leader replaces the state without
        // events: the gauges read from the state are taken again.
        let mut installed = raft.status().snapshots_installed;
        loop {
            let wake_at = {
                let current = raft.status();
                let ready_leader = current.role == Role::Leader && current.leader_ready;
                // Only a ready leader acts on deadlines; a pending retry
                // (after a proposal failed) waits its second out first.
                let deadline = next_deadline(&raft.state().read())
                    .filter(|&at| ready_leader && Some(at) != acted_on)
                    .map(|at| {
                        let now = now_unix_ms();
                        tokio::time::Instant::now()
                            + Duration::from_millis(at.saturating_sub(now).saturating_add(1))
                    });
                retry_at.or(deadline)
            };
            let timer = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = events.recv() => match event {
                    Ok(event) => {
                        record_metrics(&event, &raft.state().read());
                        // A report matters only when it ended its round:
                        // the next one may open.
                        let wakes = match &event.change {
                            Change::Round { .. } | Change::Job { .. } | Change::Site { .. } => true,
                            Change::RoundReport { report } => report.outcome.is_some(),
                            _ => false,
                        };
                        if !wakes {
                            continue;
                        }
                    }
                    // Missed events: what they changed is read from the state.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        record_site_states(&raft.state().read());
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                changed = status.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let (now, installs) = {
                        let current = status.borrow_and_update();
                        ((current.role, current.leader_ready), current.snapshots_installed)
                    };
                    if installs != installed {
                        installed = installs;
                        record_site_states(&raft.state().read());
                    }
                    if now == leading {
                        continue;
                    }
                    leading = now;
                }
                () = timer => retry_at = None,
            }
            let current = raft.status();
            if current.role != Role::Leader || !current.leader_ready {
                continue;
            }
            let now = now_unix_ms();
            let commands = {
                let state = raft.state().read();
                acted_on = next_deadline(&state).filter(|&at| at <= now);
                round_actions(&state, now, &timing)
            };
            for command in commands {
                let name = command.name();
                let opens = matches!(command, Command::OpenRound { .. });
                match raft.propose(Request::new(command)).await {
                    Ok(ApplyResponse::Applied { .. }) => {
                        if opens {
                            record_planned_bytes(&raft.state().read());
                        }
                    }
                    // Another change got there first (an exclusion that
                    // committed the round, a site marked down meanwhile).
                    Ok(ApplyResponse::Refused { error }) => {
                        tracing::debug!(command = name, %error, "round command refused");
                    }
                    Err(error) => {
                        tracing::warn!(command = name, %error, "round command not stored; retrying in a second");
                        retry_at = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                        break;
                    }
                }
            }
        }
    });
}

/// The WAN bytes the sync schedules of the placed jobs plan for one outer
/// step, per configured link (both directions; 0 on a link no plan uses,
/// so a link that leaves every plan does not keep its old figure); set by
/// the leader when it opens a round. Links are labelled `a<->b` (sites in
/// name order), a set bounded by the topology.
fn record_planned_bytes(state: &ClusterState) {
    let label = |ends: &[String; 2]| {
        let mut ends = ends.clone();
        ends.sort();
        ends.join("<->")
    };
    let mut per_link: BTreeMap<String, f64> = state
        .links()
        .map(|link| (label(&link.configured.between), 0.0))
        .collect();
    let plans = state
        .jobs()
        .filter(|job| job.state == JobState::Placed)
        .filter_map(|job| job.placement.plan().and_then(|plan| plan.sync.as_ref()));
    for sync in plans {
        for link in &sync.links {
            *per_link.entry(label(&link.between)).or_default() += link.bytes_per_outer_step;
        }
    }
    for (link, bytes) in per_link {
        metrics::gauge!("longhaul_sync_planned_bytes", "link" => link).set(bytes);
    }
}

/// Sites by liveness, as this replica's state has them.
pub(super) fn record_site_states(state: &ClusterState) {
    for liveness in [Liveness::Up, Liveness::Down] {
        let count = state.sites().filter(|s| s.liveness == liveness).count();
        let label = match liveness {
            Liveness::Up => crate::metrics::SITE_STATES[0],
            Liveness::Down => crate::metrics::SITE_STATES[1],
        };
        metrics::gauge!("longhaul_sites", "state" => label).set(count as f64);
    }
}

/// Each replica counts the round transitions it applies (`state`, at or
/// after the event, gives a report's round its opening time).
fn record_metrics(event: &Event, state: &ClusterState) {
    let record = match &event.change {
        Change::Round { record } => record,
        Change::Site { .. } => {
            record_site_states(state);
            return;
        }
        Change::RoundReport { report } => {
            record_report_metrics(report, state);
            return;
        }
        _ => return,
    };
    if record.opened_revision == event.revision {
        metrics::counter!("longhaul_rounds_opened_total").increment(1);
    }
    for p in &record.participants {
        if let Some(exclusion) = &p.excluded
            && exclusion.revision == event.revision
        {
            metrics::counter!("longhaul_round_exclusions_total", "reason" => exclusion.reason.as_str())
                .increment(1);
        }
    }
    let (outcome, revision) = match &record.outcome {
        RoundOutcome::Open => return,
        RoundOutcome::Committed { revision, .. } => ("committed", *revision),
        RoundOutcome::Aborted { revision, .. } => ("aborted", *revision),
    };
    if revision != event.revision {
        return;
    }
    metrics::counter!("longhaul_rounds_ended_total", "outcome" => outcome).increment(1);
    if let Some(ended) = record
        .ended_at_unix_ms()
        .filter(|&at| at >= record.opened_at_unix_ms)
    {
        let seconds = (ended - record.opened_at_unix_ms) as f64 / 1000.0;
        metrics::histogram!("longhaul_round_duration_seconds", "outcome" => outcome)
            .record(seconds);
    }
}

/// The end of a round by a report: the same counters as a record's end.
fn record_report_metrics(report: &RoundReport, state: &ClusterState) {
    let (outcome, ended) = match &report.outcome {
        None | Some(RoundOutcome::Open) => return,
        Some(RoundOutcome::Committed { at_unix_ms, .. }) => ("committed", *at_unix_ms),
        Some(RoundOutcome::Aborted { at_unix_ms, .. }) => ("aborted", *at_unix_ms),
    };
    metrics::counter!("longhaul_rounds_ended_total", "outcome" => outcome).increment(1);
    if let Some(opened) = state
        .round(&report.job_id, report.round)
        .map(|r| r.opened_at_unix_ms)
        .filter(|&opened| ended >= opened)
    {
        let seconds = (ended - opened) as f64 / 1000.0;
        metrics::histogram!("longhaul_round_duration_seconds", "outcome" => outcome)
            .record(seconds);
    }
}

/// A round's outcome as the API names it: state, reason, end time.
fn outcome_to_wire(outcome: &RoundOutcome) -> (pb::RoundState, String, u64) {
    match outcome {
        RoundOutcome::Open => (pb::RoundState::Open, String::new(), 0),
        RoundOutcome::Committed { at_unix_ms, .. } => {
            (pb::RoundState::Committed, String::new(), *at_unix_ms)
        }
        RoundOutcome::Aborted {
            reason, at_unix_ms, ..
        } => (pb::RoundState::Aborted, reason.clone(), *at_unix_ms),
    }
}

fn fragment_to_wire(fragment: u32, state: &FragmentState) -> pb::RoundFragment {
    let (name, hash, disagreement) = match state {
        FragmentState::Open => ("open", String::new(), Vec::new()),
        FragmentState::Committed { hash, .. } => ("committed", hash.clone(), Vec::new()),
        FragmentState::Aborted { disagreement, .. } => (
            "aborted",
            String::new(),
            disagreement
                .iter()
                .map(|g| pb::HashGroup {
                    hash: g.hash.clone(),
                    site_ids: g.sites.clone(),
                })
                .collect(),
        ),
    };
    pb::RoundFragment {
        fragment,
        state: name.to_string(),
        hash,
        disagreement,
    }
}

/// A report's change to a round as the watches send it.
pub fn round_report_to_wire(report: &RoundReport) -> pb::RoundReport {
    let (state, reason, ended_at_unix_ms) =
        outcome_to_wire(report.outcome.as_ref().unwrap_or(&RoundOutcome::Open));
    pb::RoundReport {
        job_id: report.job_id.clone(),
        round_id: report.round,
        site_id: report.site.clone(),
        fragment: report.fragment,
        applied: report.is_applied(),
        hash: report.applied_hash.clone().unwrap_or_default(),
        inner_step_us: report.inner_step_us,
        fragment_state: report
            .fragment_state
            .as_ref()
            .map(|f| fragment_to_wire(report.fragment, f)),
        state: state as i32,
        reason,
        ended_at_unix_ms,
        revision: report.revision,
    }
}

/// A round as the API returns it.
pub fn round_to_wire(record: &RoundRecord) -> pb::OuterRound {
    let (state, reason, _) = outcome_to_wire(&record.outcome);
    pb::OuterRound {
        round_id: record.round,
        participants: record.participants.iter().map(|p| p.site.clone()).collect(),
        deadline_unix_ms: record.deadline_unix_ms,
        job_id: record.job_id.clone(),
        state: state as i32,
        reason,
        fragments: record.fragments.len() as u32,
        codec_bits: record.codec_bits,
        inner_steps: record.inner_steps,
        overlap_steps: record.overlap_steps,
        inner_steps_through: record.inner_steps_through,
        schedule_inner_steps: record.schedule_inner_steps,
        schedule_overlap_steps: record.schedule_overlap_steps,
        opened_at_unix_ms: record.opened_at_unix_ms,
        ended_at_unix_ms: record.ended_at_unix_ms().unwrap_or(0),
        opened_revision: record.opened_revision,
        revision: record.revision,
        participant_states: record
            .participants
            .iter()
            .map(|p| pb::RoundParticipant {
                site_id: p.site.clone(),
                catch_up_from_round: p.catch_up.as_ref().map_or(0, |c| c.from_round),
                catch_up_from_site: p
                    .catch_up
                    .as_ref()
                    .map_or_else(String::new, |c| c.from_site.clone()),
                contributed: p.contributed.clone(),
                applied: p
                    .applied
                    .iter()
                    .map(|a| pb::FragmentHash {
                        fragment: a.fragment,
                        hash: a.hash.clone(),
                    })
                    .collect(),
                excluded: p.excluded.is_some(),
                exclusion_reason: p
                    .excluded
                    .as_ref()
                    .map_or_else(String::new, |e| e.reason.as_str().to_string()),
                exclusion_message: p
                    .excluded
                    .as_ref()
                    .map_or_else(String::new, |e| e.message.clone()),
                excluded_at_revision: p.excluded.as_ref().map_or(0, |e| e.revision),
                inner_step_us: p.inner_step_us,
            })
            .collect(),
        fragment_states: record
            .fragments
            .iter()
            .enumerate()
            .map(|(f, state)| fragment_to_wire(f as u32, state))
            .collect(),
        waiting_on: record
            .waiting_on()
            .into_iter()
            .map(str::to_string)
            .collect(),
        links: record
            .links
            .iter()
            .map(|l| pb::RoundLinkCodec {
                site_a: l.between[0].clone(),
                site_b: l.between[1].clone(),
                bits: l.bits,
                block_size: l.block_size,
                error_feedback: l.error_feedback,
                zstd: l.zstd,
            })
            .collect(),
    }
}

/// The round `GetSyncSchedule` reports as current: the job's open round,
/// else its latest.
pub fn current_round(state: &ClusterState, job_id: &str) -> Option<pb::OuterRound> {
    state.latest_round(job_id).map(round_to_wire)
}

/// The round event for `site` that the change at `event` implies: a round
/// it takes part in, or a report's change to one (`state`, at or after the
/// event, names a report's round's participants, which never change; a
/// round no longer kept is sent anyway).
pub fn round_event_for(event: &Event, site: &str, state: &ClusterState) -> Option<pb::RoundEvent> {
    match &event.change {
        Change::Round { record } if record.participant(site).is_some() => Some(pb::RoundEvent {
            revision: event.revision,
            round: Some(round_to_wire(record)),
            sync_point: false,
            report: None,
        }),
        Change::RoundReport { report }
            if state
                .round(&report.job_id, report.round)
                .is_none_or(|r| r.participant(site).is_some()) =>
        {
            Some(pb::RoundEvent {
                revision: event.revision,
                round: None,
                sync_point: false,
                report: Some(round_report_to_wire(report)),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
