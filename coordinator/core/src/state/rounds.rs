//! Outer rounds of DiLoCo jobs: the replicated protocol (pure).
//!
//! A round is one outer step of a job whose replicas train at several
//! sites. Only its transitions go through Raft, O(sites × fragments)
//! commands per round, never one per inner step or per chunk:
//!
//! 1. `OpenRound` (the leader): round k = the job's last round + 1, once
//!    that one is over; its participants (the job's replica sites that are
//!    up), the fragment count P, the codec bits, a deadline (unix ms,
//!    from the planner's prediction) and, for a site that did not take part
//!    in the last committed round, where to catch up from (that round's
//!    parameters and outer-optimiser state, at a site that applied it).
//! 2. `ReportContributed` (site, fragment): the site's pseudo-gradient for
//!    the fragment is out.
//! 3. `ReportApplied` (site, fragment, hash): the site applied the reduced
//!    fragment, whose hash it reports.
//! 4. `ExcludeParticipant` (a missed deadline, or the site left the plan);
//!    the apply of `MarkSiteDown` excludes the site from every open round at
//!    once, in the same revision, and the apply of `SetPlacement` excludes
//!    the sites the new plan left out (or aborts the round when the job is
//!    no longer placed as DiLoCo replicas), also in the same revision.
//!
//! Settling, after every change to an open round: a fragment whose
//! non-excluded participants report two different hashes is aborted, naming
//! who reported which, and so is the round (it never commits); a fragment
//! every non-excluded participant applied with the same hash commits with
//! it; the round commits when every fragment has, and is aborted when no
//! participant is left. So a round never waits on an excluded site, and an
//! over round (committed or aborted) changes no more: it commits at most
//! once. A report stored already, sent again after an unknown outcome, is
//! answered as the first was (already exists), whatever happened to the
//! round or the site since. Any other report for a round that is over, a
//! site that is not a participant (or was excluded), a fragment out of
//! range, or a second apply with another hash (refused, naming the hash it
//! already gave) is refused, and a refused command changes nothing.
//!
//! The last [`ROUNDS_KEPT_PER_JOB`] rounds of each job are kept; opening one
//! more removes the oldest, except the job's latest committed round, which
//! stays for returning sites to catch up from. A job submitted again under
//! a cancelled job's id starts without the cancelled job's rounds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ApplyError, Change, ClusterState, JobState, Liveness, Placement};
use crate::placement::CrossSiteMode;

/// Rounds kept per job (the open one and the latest committed one
/// included).
pub const ROUNDS_KEPT_PER_JOB: usize = 16;

/// Where a returning site catches up: the parameters and outer-optimiser
/// state after `from_round`, fetched from `from_site`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatchUp {
    pub site: String,
    pub from_round: u64,
    pub from_site: String,
}

/// Why a participant no longer counts in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExclusionReason {
    /// It had not applied every fragment by the round's deadline.
    DeadlineMissed,
    /// Its site was marked down.
    SiteDown,
    /// The job was re-placed without the site.
    LeftPlan,
}

impl ExclusionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeadlineMissed => "deadline_missed",
            Self::SiteDown => "site_down",
            Self::LeftPlan => "left_plan",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exclusion {
    pub reason: ExclusionReason,
    pub message: String,
    pub at_unix_ms: u64,
    pub revision: u64,
}

/// One site's part in a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Participant {
    pub site: String,
    /// Set for a site that must fetch a committed round's state first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<CatchUp>,
    /// Fragments it contributed to, ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contributed: Vec<u32>,
    /// Fragments it applied, with the hash of the reduced result, ascending
    /// (a list, not a map: JSON maps inside the tagged `Change` cannot have
    /// number keys).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied: Vec<AppliedFragment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded: Option<Exclusion>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedFragment {
    pub fragment: u32,
    pub hash: String,
}

impl Participant {
    /// The hash it reported for `fragment`, if it applied it.
    pub fn applied_hash(&self, fragment: u32) -> Option<&str> {
        self.applied
            .iter()
            .find(|a| a.fragment == fragment)
            .map(|a| a.hash.as_str())
    }
}

/// Sites that reported one hash for a fragment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashGroup {
    pub hash: String,
    pub sites: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FragmentState {
    Open,
    Committed {
        hash: String,
        revision: u64,
    },
    /// Participants disagreed on the reduced result: who reported what.
    Aborted {
        disagreement: Vec<HashGroup>,
        revision: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RoundOutcome {
    Open,
    Committed {
        at_unix_ms: u64,
        revision: u64,
    },
    Aborted {
        reason: String,
        at_unix_ms: u64,
        revision: u64,
    },
}

/// One outer round of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundRecord {
    pub job_id: String,
    pub round: u64,
    /// In site order.
    pub participants: Vec<Participant>,
    /// One per fragment (P of them).
    pub fragments: Vec<FragmentState>,
    pub codec_bits: u32,
    pub opened_at_unix_ms: u64,
    pub deadline_unix_ms: u64,
    pub opened_revision: u64,
    pub outcome: RoundOutcome,
    /// Revision of the last change to this round.
    pub revision: u64,
}

impl RoundRecord {
    pub fn is_open(&self) -> bool {
        self.outcome == RoundOutcome::Open
    }

    pub fn is_committed(&self) -> bool {
        matches!(self.outcome, RoundOutcome::Committed { .. })
    }

    pub fn participant(&self, site: &str) -> Option<&Participant> {
        self.participants.iter().find(|p| p.site == site)
    }

    /// Participants that still count.
    pub fn counted(&self) -> impl Iterator<Item = &Participant> {
        self.participants.iter().filter(|p| p.excluded.is_none())
    }

    /// The counted participants that have not applied every open fragment:
    /// the ones an open round waits for.
    pub fn waiting_on(&self) -> Vec<&str> {
        if !self.is_open() {
            return Vec::new();
        }
        self.counted()
            .filter(|p| {
                self.fragments.iter().enumerate().any(|(f, state)| {
                    *state == FragmentState::Open && p.applied_hash(f as u32).is_none()
                })
            })
            .map(|p| p.site.as_str())
            .collect()
    }

    /// When the round ended, if it did.
    pub fn ended_at_unix_ms(&self) -> Option<u64> {
        match self.outcome {
            RoundOutcome::Open => None,
            RoundOutcome::Committed { at_unix_ms, .. }
            | RoundOutcome::Aborted { at_unix_ms, .. } => Some(at_unix_ms),
        }
    }

    /// Commits or aborts what the counted participants' reports decide,
    /// after a change that may touch every fragment (an exclusion).
    fn settle(&mut self, revision: u64, at_unix_ms: u64) {
        if !self.is_open() {
            return;
        }
        for f in 0..self.fragments.len() {
            self.settle_fragment(f, revision);
        }
        self.settle_outcome(revision, at_unix_ms);
    }

    /// As [`Self::settle`], after a report about `fragment` alone: the round
    /// was settled before it, so no other fragment can change.
    fn settle_reported(&mut self, fragment: usize, revision: u64, at_unix_ms: u64) {
        if !self.is_open() {
            return;
        }
        self.settle_fragment(fragment, revision);
        self.settle_outcome(revision, at_unix_ms);
    }

    fn settle_fragment(&mut self, f: usize, revision: u64) {
        if self.fragments[f] != FragmentState::Open {
            return;
        }
        let key = f as u32;
        let mut groups: Vec<HashGroup> = Vec::new();
        let mut all_applied = true;
        for p in self.participants.iter().filter(|p| p.excluded.is_none()) {
            match p.applied_hash(key) {
                Some(hash) => match groups.iter_mut().find(|g| g.hash == hash) {
                    Some(group) => group.sites.push(p.site.clone()),
                    None => groups.push(HashGroup {
                        hash: hash.to_string(),
                        sites: vec![p.site.clone()],
                    }),
                },
                None => all_applied = false,
            }
        }
        if groups.len() > 1 {
            self.fragments[f] = FragmentState::Aborted {
                disagreement: groups,
                revision,
            };
        } else if all_applied && let Some(group) = groups.pop() {
            self.fragments[f] = FragmentState::Committed {
                hash: group.hash,
                revision,
            };
        }
    }

    /// The round's outcome from its fragments' and participants' states.
    fn settle_outcome(&mut self, revision: u64, at_unix_ms: u64) {
        let aborted = self
            .fragments
            .iter()
            .enumerate()
            .find_map(|(f, s)| match s {
                FragmentState::Aborted { disagreement, .. } => Some((f, disagreement)),
                _ => None,
            });
        if let Some((f, disagreement)) = aborted {
            let said: Vec<String> = disagreement
                .iter()
                .map(|g| {
                    format!(
                        "{} reported {}",
                        g.sites.join(", "),
                        crate::limits::quote(&g.hash)
                    )
                })
                .collect();
            self.outcome = RoundOutcome::Aborted {
                reason: format!(
                    "fragment {f}: the participants disagree on the reduced result: {}",
                    said.join("; ")
                ),
                at_unix_ms,
                revision,
            };
        } else if self.counted().next().is_none() {
            self.outcome = RoundOutcome::Aborted {
                reason: "every participant was excluded".to_string(),
                at_unix_ms,
                revision,
            };
        } else if self
            .fragments
            .iter()
            .all(|s| matches!(s, FragmentState::Committed { .. }))
        {
            self.outcome = RoundOutcome::Committed {
                at_unix_ms,
                revision,
            };
        }
    }

    fn exclude(&mut self, site: &str, exclusion: Exclusion) {
        let (revision, at) = (exclusion.revision, exclusion.at_unix_ms);
        if let Some(p) = self.participants.iter_mut().find(|p| p.site == site) {
            p.excluded = Some(exclusion);
        }
        self.revision = revision;
        self.settle(revision, at);
    }
}

/// What an `OpenRound` command carries, borrowed.
pub(super) struct OpenRound<'a> {
    pub job_id: &'a str,
    pub round: u64,
    pub participants: &'a [String],
    pub catch_up: &'a [CatchUp],
    pub fragments: u32,
    pub codec_bits: u32,
    pub deadline_unix_ms: u64,
    pub at_unix_ms: u64,
}

/// A report of one site about one fragment.
pub(super) struct Report<'a> {
    pub job_id: &'a str,
    pub round: u64,
    pub site_id: &'a str,
    pub fragment: u32,
    pub at_unix_ms: u64,
}

fn round_change(record: RoundRecord) -> Change {
    Change::Round {
        record: Box::new(record),
    }
}

impl ClusterState {
    /// The rounds of `job_id` still kept, oldest first.
    pub fn rounds(&self, job_id: &str) -> impl DoubleEndedIterator<Item = &RoundRecord> {
        self.rounds.get(job_id).into_iter().flat_map(|r| r.values())
    }

    pub fn round(&self, job_id: &str, round: u64) -> Option<&RoundRecord> {
        self.rounds.get(job_id)?.get(&round)
    }

    /// The job's latest round (open or over).
    pub fn latest_round(&self, job_id: &str) -> Option<&RoundRecord> {
        self.rounds.get(job_id)?.values().next_back()
    }

    /// The job's open round, if it has one (at most one is open).
    pub fn open_round(&self, job_id: &str) -> Option<&RoundRecord> {
        self.latest_round(job_id).filter(|r| r.is_open())
    }

    /// The job's latest committed round, kept whatever came after it.
    pub fn last_committed_round(&self, job_id: &str) -> Option<&RoundRecord> {
        self.rounds(job_id).rev().find(|r| r.is_committed())
    }

    /// Every open round, in job order.
    pub fn open_rounds(&self) -> impl Iterator<Item = &RoundRecord> {
        self.rounds
            .values()
            .filter_map(|rounds| rounds.values().next_back())
            .filter(|r| r.is_open())
    }

    /// The catch-up each of `participants` needs before taking part in the
    /// next round of `job_id`: a site that was not a counted participant of
    /// the job's latest committed round fetches that round's state from a
    /// site that applied it and takes part again (the first such site in
    /// `participants`' order). Empty before any round committed, and for a
    /// site no one who applied it could serve.
    pub fn catch_up_for(&self, job_id: &str, participants: &[String]) -> Vec<CatchUp> {
        let Some(committed) = self.last_committed_round(job_id) else {
            return Vec::new();
        };
        let took_part = |site: &str| {
            committed
                .participant(site)
                .is_some_and(|p| p.excluded.is_none())
        };
        let Some(source) = participants.iter().find(|s| took_part(s)) else {
            return Vec::new();
        };
        participants
            .iter()
            .filter(|s| !took_part(s))
            .map(|site| CatchUp {
                site: site.clone(),
                from_round: committed.round,
                from_site: source.clone(),
            })
            .collect()
    }

    pub(super) fn check_open_round(
        &self,
        open: &OpenRound<'_>,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        let job = self.live_job(open.job_id)?;
        let plan = match (job.state, job.placement.plan()) {
            (JobState::Placed, Some(plan)) if matches!(plan.mode, CrossSiteMode::Diloco { .. }) => {
                plan
            }
            _ => {
                return Err(ApplyError::precondition(
                    "job_id",
                    format!(
                        "job {:?} is not placed as DiLoCo replicas (state {:?}); it has no outer rounds",
                        open.job_id, job.state
                    ),
                ));
            }
        };
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

    /// The round and the participant a report is about, whatever the
    /// round's outcome and the participant's exclusion: a report stored
    /// already is answered as the first was, even once the round is over.
    fn reported_participant(
        &self,
        report: &Report<'_>,
    ) -> Result<(&RoundRecord, usize), ApplyError> {
        if !self.jobs.contains_key(report.job_id) {
            return Err(ApplyError::not_found(
                "job_id",
                format!("unknown job {:?}", report.job_id),
            ));
        }
        let record = self.round(report.job_id, report.round).ok_or_else(|| {
            ApplyError::not_found(
                "round",
                format!(
                    "job {:?} has no round {} (kept: {:?})",
                    report.job_id,
                    report.round,
                    self.rounds(report.job_id)
                        .map(|r| r.round)
                        .collect::<Vec<_>>()
                ),
            )
        })?;
        let index = record
            .participants
            .iter()
            .position(|p| p.site == report.site_id)
            .ok_or_else(|| {
                ApplyError::precondition(
                    "site_id",
                    format!(
                        "site {:?} is not a participant of round {} of job {:?}",
                        report.site_id, report.round, report.job_id
                    ),
                )
            })?;
        Ok((record, index))
    }

    /// Refuses a new report in `record` from its participant `index`: the
    /// round is over, the participant excluded, or the fragment out of range.
    fn check_counts(
        record: &RoundRecord,
        index: usize,
        report: &Report<'_>,
    ) -> Result<(), ApplyError> {
        match &record.outcome {
            RoundOutcome::Open => {}
            RoundOutcome::Committed { revision, .. } => {
                return Err(ApplyError::precondition(
                    "round",
                    format!(
                        "round {} of job {:?} committed at revision {revision}",
                        report.round, report.job_id
                    ),
                ));
            }
            RoundOutcome::Aborted { reason, .. } => {
                return Err(ApplyError::precondition(
                    "round",
                    format!(
                        "round {} of job {:?} was aborted: {reason}",
                        report.round, report.job_id
                    ),
                ));
            }
        }
        if let Some(exclusion) = &record.participants[index].excluded {
            return Err(ApplyError::precondition(
                "site_id",
                format!(
                    "site {:?} was excluded from round {} at revision {} ({}: {})",
                    report.site_id,
                    report.round,
                    exclusion.revision,
                    exclusion.reason.as_str(),
                    exclusion.message
                ),
            ));
        }
        if report.fragment as usize >= record.fragments.len() {
            return Err(ApplyError::not_found(
                "fragment",
                format!(
                    "round {} has fragments 0 to {}, not {}",
                    report.round,
                    record.fragments.len() - 1,
                    report.fragment
                ),
            ));
        }
        Ok(())
    }

    /// The open round and the counted participant a report is about.
    fn reported(&self, report: &Report<'_>) -> Result<(&RoundRecord, usize), ApplyError> {
        let (record, index) = self.reported_participant(report)?;
        Self::check_counts(record, index, report)?;
        Ok((record, index))
    }

    pub(super) fn check_contributed(
        &self,
        report: &Report<'_>,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        let (record, index) = self.reported_participant(report)?;
        let participant = &record.participants[index];
        // Before the round's state: the same report again, sent after an
        // unknown outcome, gets the first answer even once the round is over.
        if participant.contributed.contains(&report.fragment) {
            return Err(ApplyError::AlreadyExists {
                field: "fragment".into(),
                message: format!(
                    "site {:?} already reported contributing fragment {} to round {}",
                    report.site_id, report.fragment, report.round
                ),
            });
        }
        Self::check_counts(record, index, report)?;
        let mut record = record.clone();
        let contributed = &mut record.participants[index].contributed;
        let at = contributed.partition_point(|&f| f < report.fragment);
        contributed.insert(at, report.fragment);
        record.revision = revision;
        Ok(vec![round_change(record)])
    }

    pub(super) fn check_applied(
        &self,
        report: &Report<'_>,
        hash: &str,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        if hash.is_empty() {
            return Err(ApplyError::invalid("hash", "is required"));
        }
        let (record, index) = self.reported_participant(report)?;
        let participant = &record.participants[index];
        let earlier = participant.applied_hash(report.fragment);
        let message = |earlier: &str| {
            format!(
                "site {:?} already reported applying fragment {} of round {} with hash {}",
                report.site_id,
                report.fragment,
                report.round,
                crate::limits::quote(earlier)
            )
        };
        // As for a contribution: the same report again, whatever the round's
        // outcome or the site's exclusion since.
        if let Some(earlier) = earlier
            && earlier == hash
        {
            return Err(ApplyError::AlreadyExists {
                field: "hash".into(),
                message: message(earlier),
            });
        }
        Self::check_counts(record, index, report)?;
        if let Some(earlier) = earlier {
            return Err(ApplyError::precondition(
                "hash",
                format!(
                    "{}; a second report with another hash ({}) is refused",
                    message(earlier),
                    crate::limits::quote(hash)
                ),
            ));
        }
        if !participant.contributed.contains(&report.fragment) {
            return Err(ApplyError::precondition(
                "fragment",
                format!(
                    "site {:?} has not reported contributing fragment {} to round {}",
                    report.site_id, report.fragment, report.round
                ),
            ));
        }
        let mut record = record.clone();
        let applied = &mut record.participants[index].applied;
        let at = applied.partition_point(|a| a.fragment < report.fragment);
        applied.insert(
            at,
            AppliedFragment {
                fragment: report.fragment,
                hash: hash.to_string(),
            },
        );
        record.revision = revision;
        record.settle_reported(report.fragment as usize, revision, report.at_unix_ms);
        Ok(vec![round_change(record)])
    }

    pub(super) fn check_exclude(
        &self,
        report: &Report<'_>,
        reason: ExclusionReason,
        message: &str,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        // The fragment is not part of an exclusion; 0 is always in range.
        let (record, _) = self.reported(&Report {
            fragment: 0,
            ..*report
        })?;
        if reason == ExclusionReason::DeadlineMissed {
            if report.at_unix_ms < record.deadline_unix_ms {
                return Err(ApplyError::precondition(
                    "reason",
                    format!(
                        "the deadline of round {} is {}, after {}",
                        report.round, record.deadline_unix_ms, report.at_unix_ms
                    ),
                ));
            }
            if !record.waiting_on().contains(&report.site_id) {
                return Err(ApplyError::precondition(
                    "site_id",
                    format!(
                        "site {:?} applied every open fragment of round {}: the round does not wait for it",
                        report.site_id, report.round
                    ),
                ));
            }
        }
        let mut record = record.clone();
        record.exclude(
            report.site_id,
            Exclusion {
                reason,
                message: message.to_string(),
                at_unix_ms: report.at_unix_ms,
                revision,
            },
        );
        Ok(vec![round_change(record)])
    }

    pub(super) fn check_abort_round(
        &self,
        job_id: &str,
        round: u64,
        reason: &str,
        at_unix_ms: u64,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        let record = self.round(job_id, round).ok_or_else(|| {
            ApplyError::not_found("round", format!("job {job_id:?} has no round {round}"))
        })?;
        if !record.is_open() {
            return Err(ApplyError::precondition(
                "round",
                format!("round {round} of job {job_id:?} is over already"),
            ));
        }
        let mut record = record.clone();
        record.outcome = RoundOutcome::Aborted {
            reason: reason.to_string(),
            at_unix_ms,
            revision,
        };
        record.revision = revision;
        Ok(vec![round_change(record)])
    }

    /// The site's exclusion from every open round it counts in, for the
    /// apply of `MarkSiteDown`.
    pub(super) fn exclude_down_site(
        &self,
        site_id: &str,
        reason: &str,
        at_unix_ms: u64,
        revision: u64,
    ) -> Vec<Change> {
        self.open_rounds()
            .filter(|r| r.counted().any(|p| p.site == site_id))
            .map(|r| {
                let mut record = r.clone();
                record.exclude(
                    site_id,
                    Exclusion {
                        reason: ExclusionReason::SiteDown,
                        message: reason.to_string(),
                        at_unix_ms,
                        revision,
                    },
                );
                round_change(record)
            })
            .collect()
    }

    /// The abort of the job's open round, for the apply of `CancelJob`.
    /// The command carries no time, and an end time of 0 reads as "still
    /// open" on the wire: the round ends at its opening time, the one time
    /// every replica knows for it.
    pub(super) fn abort_for_cancel(&self, job_id: &str, revision: u64) -> Vec<Change> {
        self.open_round(job_id)
            .map(|r| {
                let mut record = r.clone();
                record.outcome = RoundOutcome::Aborted {
                    reason: "the job was cancelled".to_string(),
                    at_unix_ms: r.opened_at_unix_ms,
                    revision,
                };
                record.revision = revision;
                round_change(record)
            })
            .into_iter()
            .collect()
    }

    /// The changes a new placement of `job_id` makes to its open round, for
    /// the apply of `SetPlacement` (as `MarkSiteDown` does for a site, in the
    /// same revision, so no report counts past the re-placement): the round
    /// is aborted when the job is no longer placed as DiLoCo replicas, and
    /// otherwise its participants outside the new plan are excluded. The
    /// command carries no time; the round's opening time stands in.
    pub(super) fn apply_placement_to_round(
        &self,
        job_id: &str,
        placement: &Placement,
        revision: u64,
    ) -> Vec<Change> {
        let Some(open) = self.open_round(job_id) else {
            return Vec::new();
        };
        let at_unix_ms = open.opened_at_unix_ms;
        let mut record = open.clone();
        record.revision = revision;
        match placement.plan() {
            Some(plan) if matches!(plan.mode, CrossSiteMode::Diloco { .. }) => {
                let left: Vec<String> = record
                    .counted()
                    .filter(|p| !plan.site_order.contains(&p.site))
                    .map(|p| p.site.clone())
                    .collect();
                if left.is_empty() {
                    return Vec::new();
                }
                for p in &mut record.participants {
                    if left.contains(&p.site) {
                        p.excluded = Some(Exclusion {
                            reason: ExclusionReason::LeftPlan,
                            message: "the job was re-placed without this site".to_string(),
                            at_unix_ms,
                            revision,
                        });
                    }
                }
                record.settle(revision, at_unix_ms);
            }
            _ => {
                record.outcome = RoundOutcome::Aborted {
                    reason: format!(
                        "job {job_id:?} is no longer placed as DiLoCo replicas (re-placed: {})",
                        placement_name(placement)
                    ),
                    at_unix_ms,
                    revision,
                };
            }
        }
        vec![round_change(record)]
    }
}

fn placement_name(placement: &Placement) -> &'static str {
    match placement {
        Placement::Placed { .. } => "placed in another mode",
        Placement::Infeasible { .. } => "infeasible",
        Placement::Pending => "pending",
    }
}
