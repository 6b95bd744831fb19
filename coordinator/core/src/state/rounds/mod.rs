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
//! A report's change is a [`RoundReport`], not the round's record: what
//! the report added (the site's contribution, or its applied hash) and
//! what it settled (the fragment's new state, the round's outcome, if
//! either changed), so storage and the watch history take O(1) bytes per
//! report in the participants × fragments, and watchers fold it into the
//! round they hold ([`RoundRecord::apply_report`]). Opening, exclusions
//! and aborts, a few per round, still carry the whole record.
//!
//! The last [`ROUNDS_KEPT_PER_JOB`] rounds of each job are kept; opening one
//! more removes the oldest, except the job's latest committed round, which
//! stays for returning sites to catch up from. A job submitted again under
//! a cancelled job's id starts without the cancelled job's rounds.

mod effects;
mod open;
mod replan;
mod reports;

use serde::{Deserialize, Serialize};

use super::{Change, ClusterState};

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
    /// The site's agent said it sits the round out (its catch-up failed).
    SatOut,
}

impl ExclusionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeadlineMissed => "deadline_missed",
            Self::SiteDown => "site_down",
            Self::LeftPlan => "left_plan",
            Self::SatOut => "sat_out",
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
    /// The slowest inner step its applied reports measured, in
    /// microseconds (0: none measured).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inner_step_us: u64,
}

/// For `skip_serializing_if`: a measurement not taken, a figure not
/// carried.
pub(crate) fn is_zero<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
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

/// The codec one link of a round's collective carries, as the sync
/// planner chose it for the job's schedule: what the two sites' agents
/// encode and decode the pseudo-gradients on that link with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCodec {
    pub between: [String; 2],
    /// Bits per element (0: uncompressed).
    pub bits: u32,
    /// Elements per scale block.
    pub block_size: u32,
    pub error_feedback: bool,
    pub zstd: bool,
}

impl LinkCodec {
    /// The planner's codec of each link of `sync`, in its order.
    pub fn of_schedule(sync: &crate::sync::SyncPlan) -> Vec<Self> {
        sync.links
            .iter()
            .map(|l| Self {
                between: l.between.clone(),
                bits: l.bits,
                block_size: l.block_size,
                error_feedback: l.error_feedback,
                zstd: l.zstd,
            })
            .collect()
    }

    fn joins(&self, a: &str, b: &str) -> bool {
        let [x, y] = &self.between;
        (x == a && y == b) || (x == b && y == a)
    }
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
    /// The round's codec width: the widest of `links`.
    pub codec_bits: u32,
    /// The codec of each link of the collective, from the job's sync
    /// schedule (empty in rounds opened before rounds carried them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkCodec>,
    /// H and τ the trainers run the round's outer step with
    /// ([`ClusterState::next_round_steps`] when it opened, as its
    /// `OpenRound` carries them; 0 in rounds opened before rounds carried
    /// them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inner_steps: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub overlap_steps: u32,
    /// H and τ of the job's sync schedule when the round opened. The
    /// trainers read the schedule while the round runs (at its first
    /// submit) and take it at the start of their next outer step: these
    /// are the next round's H and τ, whatever re-plans or re-placements
    /// came between.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub schedule_inner_steps: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub schedule_overlap_steps: u32,
    /// The job's inner steps through this round: the previous round's
    /// count plus this round's H (every round counts, aborted ones too:
    /// their trainers ran its steps). Trainers spend a step budget by it,
    /// whatever H each round had. 0 in rounds opened before rounds
    /// carried H.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inner_steps_through: u64,
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

/// One report's change to an open round, stored and watched on its own (see
/// the module docs). Folding it into the round is idempotent and does not
/// depend on the order of the reports, nor on whether a later whole record
/// of the round already holds it ([`RoundRecord::apply_report`]), so a
/// stored round loads from its record and its reports in any order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundReport {
    pub job_id: String,
    pub round: u64,
    pub site: String,
    pub fragment: u32,
    /// The reduced fragment's hash, for an applied report; none for a
    /// contribution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_hash: Option<String>,
    /// An applied report's measured inner step, in microseconds (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inner_step_us: u64,
    /// The fragment's new state, when the report settled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragment_state: Option<FragmentState>,
    /// The round's outcome, when the report ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<RoundOutcome>,
    /// The report's revision.
    pub revision: u64,
}

impl RoundReport {
    /// Whether it is an applied report (else a contribution).
    pub fn is_applied(&self) -> bool {
        self.applied_hash.is_some()
    }
}

impl RoundRecord {
    /// Folds `report` into the round: the site's contribution or applied
    /// hash (once), the fragment's state and the round's outcome if the
    /// report settled them and they are still open, the revision if it is
    /// later. A report about another round, or a site that is not a
    /// participant, changes nothing.
    pub fn apply_report(&mut self, report: &RoundReport) {
        if report.job_id != self.job_id || report.round != self.round {
            return;
        }
        let Some(p) = self.participants.iter_mut().find(|p| p.site == report.site) else {
            return;
        };
        // The slowest measured: the same whatever the reports' order.
        p.inner_step_us = p.inner_step_us.max(report.inner_step_us);
        match &report.applied_hash {
            None => {
                if let Err(at) = p.contributed.binary_search(&report.fragment) {
                    p.contributed.insert(at, report.fragment);
                }
            }
            Some(hash) => {
                if let Err(at) = p
                    .applied
                    .binary_search_by_key(&report.fragment, |a| a.fragment)
                {
                    p.applied.insert(
                        at,
                        AppliedFragment {
                            fragment: report.fragment,
                            hash: hash.clone(),
                        },
                    );
                }
            }
        }
        if let Some(state) = &report.fragment_state
            && let Some(slot) = self.fragments.get_mut(report.fragment as usize)
            && *slot == FragmentState::Open
        {
            *slot = state.clone();
        }
        if let Some(outcome) = &report.outcome
            && self.is_open()
        {
            self.outcome = outcome.clone();
        }
        self.revision = self.revision.max(report.revision);
    }
}

/// What an `OpenRound` command carries, borrowed.
pub(in crate::state) struct OpenRound<'a> {
    pub job_id: &'a str,
    pub round: u64,
    pub participants: &'a [String],
    pub catch_up: &'a [CatchUp],
    pub fragments: u32,
    pub codec_bits: u32,
    pub links: &'a [LinkCodec],
    pub inner_steps: u32,
    pub overlap_steps: u32,
    pub schedule_inner_steps: u32,
    pub schedule_overlap_steps: u32,
    pub deadline_unix_ms: u64,
    pub at_unix_ms: u64,
}

/// A report of one site about one fragment.
pub(in crate::state) struct Report<'a> {
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
}
