//! Commands of the replicated state machine, its records and its errors.

use serde::{Deserialize, Serialize};

use super::rounds::{CatchUp, ExclusionReason, LinkCodec, RoundRecord, RoundReport};
use crate::job::JobSpec;
use crate::placement::Plan;
use crate::sync::SyncPlan;
use crate::topology::{DomainGroup, Site, WanLink};

/// A write, as proposed through Raft.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub command: Command,
    /// When set, the write applies only if the store is at exactly this
    /// revision (compare-and-set); otherwise it fails and changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_revision: Option<u64>,
}

impl Request {
    pub fn new(command: Command) -> Self {
        Self {
            command,
            expected_revision: None,
        }
    }

    pub fn expecting(command: Command, revision: u64) -> Self {
        Self {
            command,
            expected_revision: Some(revision),
        }
    }
}

/// Every change to the coordinator's state.
///
/// Time never comes from a clock here: commands that record a time carry it,
/// stamped by the proposer, so every replica applies the same value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // reason: a command lives one at a time, from proposal to apply; boxing the job would only add an allocation.
pub enum Command {
    /// An agent registers (or re-registers) its site's inventory; the site is
    /// up and holds a new lease.
    RegisterSite {
        site: Site,
        /// Where other agents reach this site's agent (QUIC).
        data_address: String,
        at_unix_ms: u64,
        /// The lease granted with this registration (chosen by the leader,
        /// unique across leaders); 0 when registered without one.
        #[serde(default)]
        lease_id: u64,
        #[serde(default)]
        lease_ttl_ms: u64,
    },
    /// The leader saw the site's lease expire.
    MarkSiteDown {
        site_id: String,
        reason: String,
        at_unix_ms: u64,
        /// When set, applies only while the site still holds this lease, so
        /// an expiry decided before a re-registration cannot undo it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease_id: Option<u64>,
    },
    /// An agent reports a change of its inventory as domain-group deltas.
    UpdateInventory {
        site_id: String,
        /// The lease the agent holds; the change applies only under it.
        lease_id: u64,
        changes: Vec<InventoryChange>,
        at_unix_ms: u64,
    },
    /// Configure (or reconfigure) the WAN link between two sites.
    PutLink {
        link: WanLink,
    },
    /// An agent's probe of a link.
    RecordLinkMeasurement {
        site_a: String,
        site_b: String,
        measurement: LinkMeasurement,
    },
    /// Store a job with its placement outcome.
    SubmitJob {
        job_id: String,
        spec: JobSpec,
        placement: Placement,
    },
    /// Replace a job's placement (re-planning after a site change).
    SetPlacement {
        job_id: String,
        placement: Placement,
        /// When the proposer decided it: the end or exclusion time of what
        /// it does to the job's open round (0 in commands logged before it
        /// was carried: the round's opening time stands in).
        #[serde(default)]
        at_unix_ms: u64,
        /// The revision of the last site liveness change the placement was
        /// computed from ([`ClusterState::liveness_epoch`]): refused at apply
        /// if a site has gone down or come back since, so that a placement
        /// computed while a site changed never undoes that change (the
        /// change's own re-planning pass follows). `None` in commands logged
        /// before it was carried: not checked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sites_as_of: Option<u64>,
    },
    CancelJob {
        job_id: String,
        /// As for `SetPlacement`.
        #[serde(default)]
        at_unix_ms: u64,
    },
    /// Record a coordinator replica's addresses (membership itself is Raft's
    /// configuration; this is what operators see).
    PutMember {
        member: Member,
    },
    RemoveMember {
        member_id: u64,
    },
    /// The leader opens round `round` of a DiLoCo job (see `rounds.rs`).
    OpenRound {
        job_id: String,
        round: u64,
        /// The job's replica sites that are up, in the plan's order.
        participants: Vec<String>,
        /// For each participant that must catch up first.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        catch_up: Vec<CatchUp>,
        fragments: u32,
        /// Bits per value of the pseudo-gradient codec (0: uncompressed):
        /// the widest of `links`.
        codec_bits: u32,
        /// The codec of each link, the job's sync schedule's (empty in
        /// commands logged before rounds carried them).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        links: Vec<LinkCodec>,
        /// H and τ the trainers run this round's outer step with, and
        /// those of the job's sync schedule as the round opens (the next
        /// round's; `ClusterState::next_round_steps`,
        /// `ClusterState::schedule_steps`). The leader decides them and
        /// the log carries them, so a replay records what was decided. 0
        /// in commands logged before rounds carried them.
        #[serde(default, skip_serializing_if = "crate::state::rounds::is_zero")]
        inner_steps: u32,
        #[serde(default, skip_serializing_if = "crate::state::rounds::is_zero")]
        overlap_steps: u32,
        #[serde(default, skip_serializing_if = "crate::state::rounds::is_zero")]
        schedule_inner_steps: u32,
        #[serde(default, skip_serializing_if = "crate::state::rounds::is_zero")]
        schedule_overlap_steps: u32,
        deadline_unix_ms: u64,
        at_unix_ms: u64,
    },
    /// A participant's pseudo-gradient for a fragment is out.
    ReportContributed {
        job_id: String,
        round: u64,
        site_id: String,
        fragment: u32,
        at_unix_ms: u64,
    },
    /// A participant applied the reduced fragment, whose hash it reports.
    ReportApplied {
        job_id: String,
        round: u64,
        site_id: String,
        fragment: u32,
        hash: String,
        at_unix_ms: u64,
        /// The site's measured inner step, in microseconds (0: none).
        #[serde(default, skip_serializing_if = "crate::state::rounds::is_zero")]
        inner_step_us: u64,
    },
    /// The leader excludes a participant from an open round.
    ExcludeParticipant {
        job_id: String,
        round: u64,
        site_id: String,
        reason: ExclusionReason,
        message: String,
        at_unix_ms: u64,
    },
    /// The leader replaces a placed DiLoCo job's sync schedule with one
    /// planned again at its trainers' measured inner step, between two
    /// rounds (`sync::replan_sync`).
    ReplanSync {
        job_id: String,
        /// The job's latest round when the re-plan was made (0: none):
        /// refused at apply if another round opened since.
        after_round: u64,
        sync: SyncPlan,
        at_unix_ms: u64,
    },
    /// The leader gives up an open round (its job left DiLoCo placement).
    AbortRound {
        job_id: String,
        round: u64,
        reason: String,
        at_unix_ms: u64,
    },
    /// Does nothing but bump the revision; used to test the pipeline and to
    /// carry opaque payloads in benchmarks.
    Noop {
        #[serde(default, skip_serializing_if = "String::is_empty")]
        payload: String,
    },
}

impl Command {
    /// The command's name as it appears in logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RegisterSite { .. } => "register_site",
            Self::MarkSiteDown { .. } => "mark_site_down",
            Self::UpdateInventory { .. } => "update_inventory",
            Self::PutLink { .. } => "put_link",
            Self::RecordLinkMeasurement { .. } => "record_link_measurement",
            Self::SubmitJob { .. } => "submit_job",
            Self::SetPlacement { .. } => "set_placement",
            Self::CancelJob { .. } => "cancel_job",
            Self::PutMember { .. } => "put_member",
            Self::RemoveMember { .. } => "remove_member",
            Self::OpenRound { .. } => "open_round",
            Self::ReportContributed { .. } => "report_contributed",
            Self::ReportApplied { .. } => "report_applied",
            Self::ExcludeParticipant { .. } => "exclude_participant",
            Self::ReplanSync { .. } => "replan_sync",
            Self::AbortRound { .. } => "abort_round",
            Self::Noop { .. } => "noop",
        }
    }
}

/// One change to a registered site's inventory. Draining one node of an
/// NVL72 rack, say, moves that rack out of its group of identical racks:
/// the old group's count drops by one (`PutGroup`) and a group of one
/// 17-node domain appears (`PutGroup`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum InventoryChange {
    /// Adds a domain group to a building, or replaces the one with its id.
    PutGroup {
        building: String,
        group: DomainGroup,
    },
    /// Removes a domain group from a building.
    RemoveGroup { building: String, group_id: String },
}

/// What placement decided for a job.
///
/// The plan is a typed value, parsed once when a command or a stored record
/// is read. Records and commands written before it was (`"plan_json"`: the
/// plan's JSON as a string inside the JSON) are still read, into the same
/// value, so old logs, snapshots and state files stay readable; they are
/// written back in the typed form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", try_from = "PlacementRepr")]
pub enum Placement {
    Placed {
        plan: Box<Plan>,
    },
    Infeasible {
        reason: String,
    },
    /// Not planned yet.
    Pending,
}

impl Placement {
    /// A placement of `plan`, as it will be replicated. A plan that does not
    /// come back from JSON as itself (a non-finite number, which JSON cannot
    /// hold, would be written as `null`) is not replicated: every replica
    /// would refuse the command. It becomes an infeasible placement that says
    /// why.
    pub fn placed(plan: Plan) -> Self {
        if replays_from_json(&plan) {
            Placement::Placed {
                plan: Box::new(plan),
            }
        } else {
            Placement::Infeasible {
                reason: "the plan holds a value that does not replay from JSON \
                         (a non-finite number); not stored"
                    .into(),
            }
        }
    }

    /// The plan, if the job was placed.
    pub fn plan(&self) -> Option<&Plan> {
        match self {
            Placement::Placed { plan } => Some(plan),
            Placement::Infeasible { .. } | Placement::Pending => None,
        }
    }
}

/// Whether `value` comes back from JSON as itself: what a command must do
/// to be replicated (a non-finite number, which JSON cannot hold, is
/// written as `null`, and every replica would refuse the command).
pub fn replays_from_json<T>(value: &T) -> bool
where
    T: Serialize + serde::de::DeserializeOwned + PartialEq,
{
    serde_json::to_string(value)
        .ok()
        .and_then(|json| serde_json::from_str::<T>(&json).ok())
        .is_some_and(|back| back == *value)
}

/// What a placement may look like in storage: the typed plan, or the plan
/// as a JSON string (older records).
#[derive(Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
enum PlacementRepr {
    Placed {
        #[serde(default)]
        plan: Option<Box<Plan>>,
        #[serde(default)]
        plan_json: Option<String>,
    },
    Infeasible {
        reason: String,
    },
    Pending,
}

impl TryFrom<PlacementRepr> for Placement {
    type Error = String;

    fn try_from(repr: PlacementRepr) -> Result<Self, String> {
        Ok(match repr {
            PlacementRepr::Placed {
                plan: Some(plan), ..
            } => Placement::Placed { plan },
            // An older record whose plan does not read as a plan (it could
            // hold a non-finite number written as `null`) still loads, the
            // same on every replica: as a placement that says why, which
            // re-planning then replaces.
            PlacementRepr::Placed {
                plan: None,
                plan_json: Some(json),
            } => match serde_json::from_str(&json) {
                Ok(plan) => Placement::Placed { plan },
                Err(error) => Placement::Infeasible {
                    reason: format!("the stored plan (`plan_json`) could not be read: {error}"),
                },
            },
            PlacementRepr::Placed {
                plan: None,
                plan_json: None,
            } => return Err("a placed job needs field `plan`".into()),
            PlacementRepr::Infeasible { reason } => Placement::Infeasible { reason },
            PlacementRepr::Pending => Placement::Pending,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkMeasurement {
    pub rtt_ns: u64,
    pub loss_rate: f64,
    pub throughput_bps: u64,
    pub measured_at_unix_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    Up,
    Down,
}

/// A registered site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteRecord {
    pub site: Site,
    pub data_address: String,
    pub liveness: Liveness,
    /// Revision of the last liveness transition.
    pub liveness_revision: u64,
    pub liveness_reason: String,
    pub changed_at_unix_ms: u64,
    /// The lease the site's agent holds (0: none).
    #[serde(default)]
    pub lease_id: u64,
    #[serde(default)]
    pub lease_ttl_ms: u64,
}

/// A configured link and its latest measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkRecord {
    pub configured: WanLink,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<LinkMeasurement>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Placed,
    Infeasible,
    Pending,
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    pub spec: JobSpec,
    pub state: JobState,
    pub placement: Placement,
    /// Revision of the last change to this job.
    pub revision: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_url: String,
    pub client_url: String,
}

/// One change, as delivered to watchers. It carries the entity's new value
/// (or its id when it was removed), so a watcher never has to read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub revision: u64,
    pub change: Change,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "entity", rename_all = "snake_case")]
pub enum Change {
    Site {
        record: SiteRecord,
    },
    Link {
        record: LinkRecord,
    },
    Job {
        record: JobRecord,
    },
    Member {
        member: Member,
    },
    MemberRemoved {
        member_id: u64,
    },
    /// A round's new state (boxed: it is the largest change by far).
    Round {
        record: Box<RoundRecord>,
    },
    /// One report's change to a round: what it added and settled, not the
    /// round (see `rounds.rs`). Stored beside the round's record, under its
    /// key + `/SITE/FRAGMENT/contributed|applied`.
    RoundReport {
        report: RoundReport,
    },
    /// A round that fell out of the rounds kept for its job, with its
    /// reports.
    RoundRemoved {
        job_id: String,
        round: u64,
    },
    Noop,
}

impl Change {
    /// The watch kind this change belongs to (`site`, `link`, `job`, `member`, `round`, `noop`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Site { .. } => "site",
            Self::Link { .. } => "link",
            Self::Job { .. } => "job",
            Self::Member { .. } | Self::MemberRemoved { .. } => "member",
            Self::Round { .. } | Self::RoundReport { .. } | Self::RoundRemoved { .. } => "round",
            Self::Noop => "noop",
        }
    }

    /// The key under which the entity is stored: `site/ID`, `link/A/B`,
    /// `job/ID`, `member/ID`, `round/JOB/ROUND` (20 digits, so keys sort
    /// by round), a round's report under the round's key +
    /// `/SITE/FRAGMENT/contributed|applied` (the fragment in 10 digits);
    /// `None` for changes that store nothing. A removal removes the
    /// entity's key and every key under it + `/`.
    pub fn key(&self) -> Option<String> {
        match self {
            Self::Site { record } => Some(format!("site/{}", record.site.id)),
            Self::Link { record } => {
                let [a, b] = &record.configured.between;
                let (a, b) = if a <= b { (a, b) } else { (b, a) };
                Some(format!("link/{a}/{b}"))
            }
            Self::Job { record } => Some(format!("job/{}", record.id)),
            Self::Member { member } => Some(format!("member/{}", member.id)),
            Self::MemberRemoved { member_id } => Some(format!("member/{member_id}")),
            Self::Round { record } => Some(format!("round/{}/{:020}", record.job_id, record.round)),
            Self::RoundReport { report } => Some(format!(
                "round/{}/{:020}/{}/{:010}/{}",
                report.job_id,
                report.round,
                report.site,
                report.fragment,
                if report.is_applied() {
                    "applied"
                } else {
                    "contributed"
                }
            )),
            Self::RoundRemoved { job_id, round } => Some(format!("round/{job_id}/{round:020}")),
            Self::Noop => None,
        }
    }

    /// Whether the change removes the entity under its key. A member's removal is not one:
    /// it is kept under the member's key as the record that the id was used.
    pub fn is_removal(&self) -> bool {
        matches!(self, Self::RoundRemoved { .. })
    }
}

/// Why a command was refused. A refused command changes nothing and does
/// not bump the revision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ApplyError {
    #[error("invalid argument: field `{field}`: {message}")]
    InvalidArgument { field: String, message: String },
    #[error("not found: field `{field}`: {message}")]
    NotFound { field: String, message: String },
    #[error("failed precondition: field `{field}`: {message}")]
    FailedPrecondition { field: String, message: String },
    #[error("already exists: field `{field}`: {message}")]
    AlreadyExists { field: String, message: String },
}

impl ApplyError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
    pub fn not_found(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::NotFound {
            field: field.into(),
            message: message.into(),
        }
    }
    pub fn precondition(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::FailedPrecondition {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A watch asked to resume from a revision whose events were compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "revision {requested} is compacted: the oldest revision still watchable is {oldest}; list the current state and watch from its revision"
)]
pub struct Compacted {
    pub requested: u64,
    pub oldest: u64,
}
