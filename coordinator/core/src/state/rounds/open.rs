//! Opening a round: `OpenRound` checked against the job, its plan and the
//! sites, and the catch-up of returning sites.

use std::collections::BTreeMap;

use super::{
    FragmentState, LinkCodec, OpenRound, Participant, ROUNDS_KEPT_PER_JOB, RoundOutcome,
    RoundRecord, round_change,
};
use crate::placement::CrossSiteMode;
use crate::state::{ApplyError, Change, ClusterState, JobState, Liveness};

impl ClusterState {
    /// The live job `job_id` and its plan, if it is placed as DiLoCo
    /// replicas; else a refusal naming `job_id` that says the job has no
    /// `what` (outer rounds, a sync schedule).
    pub(in crate::state) fn diloco_plan(
        &self,
        job_id: &str,
        what: &str,
    ) -> Result<(&crate::state::JobRecord, &crate::placement::Plan), ApplyError> {
        let job = self.live_job(job_id)?;
        match (job.state, job.placement.plan()) {
            (JobState::Placed, Some(plan)) if matches!(plan.mode, CrossSiteMode::Diloco { .. }) => {
                Ok((job, plan))
            }
            _ => Err(ApplyError::precondition(
                "job_id",
                format!(
                    "job {job_id:?} is not placed as DiLoCo replicas (state {:?}); it has no {what}",
                    job.state
                ),
            )),
        }
    }

    /// H and τ the trainers of `job_id` run its next round with: the
    /// schedule in force when its latest round opened (they read it during
    /// that round and take it at the start of their next outer step), or,
    /// before any round (or after rounds that did not carry it), the
    /// schedule in force now. (0, 0) for a job not placed as DiLoCo.
    pub fn next_round_steps(&self, job_id: &str) -> (u32, u32) {
        match self.latest_round(job_id) {
            Some(r) if r.schedule_inner_steps != 0 => {
                (r.schedule_inner_steps, r.schedule_overlap_steps)
            }
            _ => self.schedule_steps(job_id),
        }
    }

    /// H and τ of `job_id`'s sync schedule now: the planner's, or for a
    /// plan stored before placement ran it, its H and no overlap; (0, 0)
    /// for a job not placed as DiLoCo.
    pub fn schedule_steps(&self, job_id: &str) -> (u32, u32) {
        self.job(job_id)
            .and_then(|j| j.placement.plan())
            .map_or((0, 0), schedule_steps)
    }

    pub(in crate::state) fn check_open_round(
        &self,
        open: &OpenRound<'_>,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        let (_, plan) = self.diloco_plan(open.job_id, "outer rounds")?;
        let latest = self.latest_round(open.job_id);
        if let Some(latest) = latest {
            if latest.round == open.round {
                return Err(ApplyError::AlreadyExists {
                    field: "round".into(),
                    message: format!(
                        "round {} of job {:?} was opened already",
                        open.round, open.job_id
                    ),
                });
            }
            if latest.is_open() {
                return Err(ApplyError::precondition(
                    "round",
                    format!(
                        "round {} of job {:?} is still open; it must commit or be aborted first",
                        latest.round, open.job_id
                    ),
                ));
            }
        }
        let next = latest.map_or(1, |r| r.round + 1);
        if open.round != next {
            return Err(ApplyError::precondition(
                "round",
                format!(
                    "the next round of job {:?} is {next}, not {}",
                    open.job_id, open.round
                ),
            ));
        }
        if open.participants.is_empty() {
            return Err(ApplyError::invalid("participants", "is empty"));
        }
        for (i, site) in open.participants.iter().enumerate() {
            let field = format!("participants[{i}]");
            if open.participants[..i].contains(site) {
                return Err(ApplyError::invalid(
                    field,
                    format!("site {site:?} is listed twice"),
                ));
            }
            if !plan.site_order.contains(site) {
                return Err(ApplyError::precondition(
                    field,
                    format!("site {site:?} runs no replica of job {:?}", open.job_id),
                ));
            }
            match self.sites.get(site) {
                Some(record) if record.liveness == Liveness::Up => {}
                Some(_) => {
                    return Err(ApplyError::precondition(
                        field,
                        format!("site {site:?} is down"),
                    ));
                }
                None => {
                    return Err(ApplyError::not_found(
                        field,
                        format!("unknown site {site:?}"),
                    ));
                }
            }
        }
        if open.fragments == 0 {
            return Err(ApplyError::invalid("fragments", "must be at least 1"));
        }
        // Admission's bound, checked again before the allocation below: no
        // logged command exceeds it (admission always refused one that
        // did), so replay is unchanged.
        if open.fragments > crate::limits::MAX_ROUND_FRAGMENTS {
            return Err(ApplyError::invalid(
                "fragments",
                format!(
                    "is {}, more than the {} allowed",
                    open.fragments,
                    crate::limits::MAX_ROUND_FRAGMENTS
                ),
            ));
        }
        if open.codec_bits > 32 {
            return Err(ApplyError::invalid(
                "codec_bits",
                format!(
                    "must be at most 32 (0: uncompressed), found {}",
                    open.codec_bits
                ),
            ));
        }
        check_links(open, plan)?;
        if open.deadline_unix_ms <= open.at_unix_ms {
            return Err(ApplyError::invalid(
                "deadline_unix_ms",
                format!(
                    "{} is not after the opening time {}",
                    open.deadline_unix_ms, open.at_unix_ms
                ),
            ));
        }
        let mut participants: Vec<Participant> = open
            .participants
            .iter()
            .map(|site| Participant {
                site: site.clone(),
                catch_up: None,
                contributed: Vec::new(),
                applied: Vec::new(),
                excluded: None,
                inner_step_us: 0,
            })
            .collect();
        for (i, catch_up) in open.catch_up.iter().enumerate() {
            let field = |name: &str| format!("catch_up[{i}].{name}");
            let Some(index) = open.participants.iter().position(|s| *s == catch_up.site) else {
                return Err(ApplyError::invalid(
                    field("site"),
                    format!("site {:?} is not a participant", catch_up.site),
                ));
            };
            if participants[index].catch_up.is_some() {
                return Err(ApplyError::invalid(
                    field("site"),
                    format!("site {:?} has a catch-up already", catch_up.site),
                ));
            }
            let source = self
                .round(open.job_id, catch_up.from_round)
                .filter(|r| r.is_committed())
                .ok_or_else(|| {
                    ApplyError::precondition(
                        field("from_round"),
                        format!(
                            "round {} of job {:?} is not a committed round still kept",
                            catch_up.from_round, open.job_id
                        ),
                    )
                })?;
            let served = source
                .participant(&catch_up.from_site)
                .is_some_and(|p| p.excluded.is_none());
            let serves_now = open.participants.contains(&catch_up.from_site)
                && !open.catch_up.iter().any(|c| c.site == catch_up.from_site);
            if !served || !serves_now {
                return Err(ApplyError::precondition(
                    field("from_site"),
                    format!(
                        "site {:?} cannot serve round {}: it must have applied it and take part in this round without catching up",
                        catch_up.from_site, catch_up.from_round
                    ),
                ));
            }
            participants[index].catch_up = Some(catch_up.clone());
        }
        let record = RoundRecord {
            job_id: open.job_id.to_string(),
            round: open.round,
            participants,
            fragments: vec![FragmentState::Open; open.fragments as usize],
            codec_bits: open.codec_bits,
            links: open.links.to_vec(),
            inner_steps: open.inner_steps,
            overlap_steps: open.overlap_steps,
            inner_steps_through: latest.map_or(0, |r| r.inner_steps_through)
                + u64::from(open.inner_steps),
            schedule_inner_steps: open.schedule_inner_steps,
            schedule_overlap_steps: open.schedule_overlap_steps,
            opened_at_unix_ms: open.at_unix_ms,
            deadline_unix_ms: open.deadline_unix_ms,
            opened_revision: revision,
            outcome: RoundOutcome::Open,
            revision,
        };
        let mut changes = vec![round_change(record)];
        let kept = self.rounds.get(open.job_id).map_or(0, BTreeMap::len);
        let evict = (kept + 1).saturating_sub(ROUNDS_KEPT_PER_JOB);
        // The latest committed round is never evicted: it is what a returning
        // site catches up from, however many rounds aborted since.
        let last_committed = self.last_committed_round(open.job_id).map(|r| r.round);
        changes.extend(
            self.rounds(open.job_id)
                .filter(|r| Some(r.round) != last_committed)
                .take(evict)
                .map(|r| Change::RoundRemoved {
                    job_id: r.job_id.clone(),
                    round: r.round,
                }),
        );
        Ok(changes)
    }
}

/// A round's per-link codecs: each joins two of the job's replica sites,
/// once; a width of at most 32 bits, with blocks for a quantised one; the
/// round's `codec_bits` is their widest; and, for a plan that holds its
/// sync schedule, exactly the schedule's codecs, so every agent of the
/// round encodes each link as the planner decided. None (a command logged
/// before rounds carried them) passes.
fn check_links(open: &OpenRound<'_>, plan: &crate::placement::Plan) -> Result<(), ApplyError> {
    if open.links.is_empty() {
        return Ok(());
    }
    for (i, link) in open.links.iter().enumerate() {
        let field = |name: &str| format!("links[{i}].{name}");
        let [a, b] = &link.between;
        if a == b {
            return Err(ApplyError::invalid(
                field("between"),
                format!("a link joins two different sites, found {a:?} twice"),
            ));
        }
        if let Some(site) = [a, b].into_iter().find(|s| !plan.site_order.contains(s)) {
            return Err(ApplyError::precondition(
                field("between"),
                format!("site {site:?} runs no replica of job {:?}", open.job_id),
            ));
        }
        if open.links[..i].iter().any(|l| l.joins(a, b)) {
            return Err(ApplyError::invalid(
                field("between"),
                format!("the link between {a:?} and {b:?} is listed twice"),
            ));
        }
        if link.bits > 32 {
            return Err(ApplyError::invalid(
                field("bits"),
                format!("must be at most 32 (0: uncompressed), found {}", link.bits),
            ));
        }
        if (1..16).contains(&link.bits) && link.block_size == 0 {
            return Err(ApplyError::invalid(
                field("block_size"),
                format!("a {}-bit codec needs blocks of at least 1", link.bits),
            ));
        }
    }
    let widest = open.links.iter().map(|l| l.bits).max().unwrap_or(0);
    if open.codec_bits != widest {
        return Err(ApplyError::invalid(
            "codec_bits",
            format!(
                "is {} but the widest codec of the round's links is {widest} bits",
                open.codec_bits
            ),
        ));
    }
    if let Some(sync) = &plan.sync
        && open.links != LinkCodec::of_schedule(sync).as_slice()
    {
        return Err(ApplyError::precondition(
            "links",
            format!(
                "the codecs differ from job {:?}'s sync schedule (re-placed since?)",
                open.job_id
            ),
        ));
    }
    Ok(())
}

/// H and τ of `plan`'s sync schedule: the planner's, or for a plan stored
/// before placement ran it, its H and no overlap; (0, 0) when it is not a
/// DiLoCo plan.
fn schedule_steps(plan: &crate::placement::Plan) -> (u32, u32) {
    match (&plan.sync, plan.mode) {
        (Some(sync), _) => (sync.inner_steps, sync.overlap_steps),
        (None, CrossSiteMode::Diloco { inner_steps }) => (inner_steps, 0),
        (None, _) => (0, 0),
    }
}
