//! The coordinator's replicated state machine (pure).
//!
//! [`ClusterState::apply`] is deterministic: the same requests in the same
//! order give the same state and the same events on every replica. Every
//! applied command bumps the revision by one; a refused command changes
//! nothing, not even the revision. Each applied command yields [`Event`]s
//! that carry the changed entity, so the server can persist exactly what
//! changed and watchers can resume from any revision still in the history.

mod admission;
mod command;
pub mod rounds;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use admission::check_bounds;
pub(crate) use admission::{link_bounds, site_bounds, total_gpus};
pub use command::{
    ApplyError, Change, Command, Compacted, Event, InventoryChange, JobRecord, JobState,
    LinkMeasurement, LinkRecord, Liveness, Member, Placement, Request, SiteRecord,
    replays_from_json,
};
pub use rounds::{
    CatchUp, Exclusion, ExclusionReason, FragmentState, HashGroup, LinkCodec, Participant,
    ROUNDS_KEPT_PER_JOB, RoundOutcome, RoundRecord, RoundReport,
};
use serde::{Deserialize, Serialize};

use crate::config::Validate;
use crate::topology::Topology;

/// How many past events are kept for watches to resume from.
pub const DEFAULT_HISTORY_LIMIT: usize = 10_000;

/// The outcome of an applied command.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub revision: u64,
    pub events: Vec<Event>,
    /// Revisions that fell out of the watch history with this command.
    pub evicted: Vec<u64>,
}

/// Everything the coordinator replicates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    revision: u64,
    sites: BTreeMap<String, SiteRecord>,
    /// Keyed by the ordered pair of sites; written as a list, since JSON
    /// map keys are strings (see [`links_as_list`]).
    #[serde(with = "links_as_list")]
    links: BTreeMap<(String, String), LinkRecord>,
    jobs: BTreeMap<String, JobRecord>,
    members: BTreeMap<u64, Member>,
    /// Ids of removed members. An id is never given again: a removed replica that still
    /// runs would otherwise speak as the new member that took its id (absent in older
    /// snapshots; removals recorded before this field existed are not remembered).
    #[serde(default)]
    retired_members: BTreeSet<u64>,
    /// Each job's kept outer rounds, by round (absent in older snapshots).
    #[serde(default)]
    rounds: BTreeMap<String, BTreeMap<u64, RoundRecord>>,
    history: VecDeque<Event>,
    history_limit: usize,
}

impl Default for ClusterState {
    fn default() -> Self {
        Self::new(DEFAULT_HISTORY_LIMIT)
    }
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

impl ClusterState {
    pub fn new(history_limit: usize) -> Self {
        Self {
            revision: 0,
            sites: BTreeMap::new(),
            links: BTreeMap::new(),
            jobs: BTreeMap::new(),
            members: BTreeMap::new(),
            retired_members: BTreeSet::new(),
            rounds: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
        }
    }

    /// Rebuilds a state from persisted parts: the revision, the latest change
    /// of every entity (in any order: a round's reports are folded in after
    /// every record), and the retained history (oldest first).
    pub fn from_parts(
        revision: u64,
        entities: impl IntoIterator<Item = Change>,
        history: impl IntoIterator<Item = Event>,
        history_limit: usize,
    ) -> Self {
        let mut state = Self::new(history_limit);
        state.revision = revision;
        let (reports, records): (Vec<Change>, Vec<Change>) = entities
            .into_iter()
            .partition(|c| matches!(c, Change::RoundReport { .. }));
        for change in records.into_iter().chain(reports) {
            state.store(change);
        }
        state.history = history.into_iter().collect();
        state
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }
    /// The revision of the latest site liveness change (a registration, a
    /// site marked down, one back up): 0 before any site registered.
    pub fn liveness_epoch(&self) -> u64 {
        self.sites()
            .map(|site| site.liveness_revision)
            .max()
            .unwrap_or(0)
    }

    pub fn sites(&self) -> impl Iterator<Item = &SiteRecord> {
        self.sites.values()
    }
    pub fn site(&self, id: &str) -> Option<&SiteRecord> {
        self.sites.get(id)
    }
    pub fn links(&self) -> impl Iterator<Item = &LinkRecord> {
        self.links.values()
    }
    pub fn jobs(&self) -> impl Iterator<Item = &JobRecord> {
        self.jobs.values()
    }
    pub fn job(&self, id: &str) -> Option<&JobRecord> {
        self.jobs.get(id)
    }
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }
    /// Whether `id` belonged to a member that was removed.
    pub fn is_retired_member(&self, id: u64) -> bool {
        self.retired_members.contains(&id)
    }
    /// The highest member id ever recorded, removed members included: a new member's id
    /// must be above it.
    pub fn highest_member_id(&self) -> u64 {
        let recorded = self.members.keys().next_back().copied().unwrap_or(0);
        let retired = self.retired_members.last().copied().unwrap_or(0);
        recorded.max(retired)
    }

    /// Every stored entity as the change that would recreate it.
    pub fn entities(&self) -> Vec<Change> {
        let sites = self
            .sites
            .values()
            .map(|r| Change::Site { record: r.clone() });
        let links = self
            .links
            .values()
            .map(|r| Change::Link { record: r.clone() });
        let jobs = self
            .jobs
            .values()
            .map(|r| Change::Job { record: r.clone() });
        let members = self
            .members
            .values()
            .map(|m| Change::Member { member: m.clone() });
        let retired = self
            .retired_members
            .iter()
            .map(|&member_id| Change::MemberRemoved { member_id });
        let rounds = self.rounds.values().flat_map(|rounds| {
            rounds.values().map(|r| Change::Round {
                record: Box::new(r.clone()),
            })
        });
        sites
            .chain(links)
            .chain(jobs)
            .chain(members)
            .chain(retired)
            .chain(rounds)
            .collect()
    }

    /// The registered sites and configured links as a topology, for placement.
    /// Only sites that are up are included; links are kept when both ends are.
    pub fn live_topology(&self, name: &str) -> Topology {
        let sites: Vec<_> = self
            .sites
            .values()
            .filter(|r| r.liveness == Liveness::Up)
            .map(|r| r.site.clone())
            .collect();
        let up = |id: &str| sites.iter().any(|s| s.id == id);
        let links = self
            .links
            .values()
            .filter(|l| up(&l.configured.between[0]) && up(&l.configured.between[1]))
            .map(|l| l.configured.clone())
            .collect();
        Topology {
            name: name.to_string(),
            gpu_types: Vec::new(),
            sites,
            links,
        }
    }

    /// The retained watch history, oldest first.
    pub fn history(&self) -> impl Iterator<Item = &Event> {
        self.history.iter()
    }

    /// Events with a revision greater than `after`, oldest first.
    pub fn events_after(&self, after: u64) -> Result<Vec<Event>, Compacted> {
        let oldest = self
            .history
            .front()
            .map_or(self.revision + 1, |e| e.revision);
        // Events after `after` start at after + 1; it must still be retained
        // unless nothing has happened since.
        if after + 1 < oldest && after < self.revision {
            return Err(Compacted {
                requested: after,
                oldest: oldest.saturating_sub(1),
            });
        }
        Ok(self
            .history
            .iter()
            .filter(|e| e.revision > after)
            .cloned()
            .collect())
    }

    /// Applies one request. On error nothing changes.
    pub fn apply(&mut self, request: &Request) -> Result<Applied, ApplyError> {
        if let Some(expected) = request.expected_revision
            && expected != self.revision
        {
            return Err(stale_revision(expected, self.revision));
        }
        let revision = self.revision + 1;
        let changes = self.check(&request.command, revision)?;
        self.revision = revision;
        let events: Vec<Event> = changes
            .into_iter()
            .map(|change| Event { revision, change })
            .collect();
        let mut evicted = Vec::new();
        for event in &events {
            self.store(event.change.clone());
            self.history.push_back(event.clone());
        }
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front()
                && evicted.last() != Some(&old.revision)
            {
                evicted.push(old.revision);
            }
        }
        // Keep every event of one revision together: a watcher resuming from
        // a revision must see all of the next one or be told it is compacted.
        if let Some(&last_evicted) = evicted.last() {
            while self
                .history
                .front()
                .is_some_and(|e| e.revision == last_evicted)
            {
                self.history.pop_front();
            }
        }
        Ok(Applied {
            revision,
            events,
            evicted,
        })
    }

    /// Validates a command against the current state and returns the changes
    /// it makes, without making them.
    fn check(&self, command: &Command, revision: u64) -> Result<Vec<Change>, ApplyError> {
        Ok(match command {
            Command::RegisterSite {
                site,
                data_address,
                at_unix_ms,
                lease_id,
                lease_ttl_ms,
            } => {
                check_site(site, "site")?;
                let previous = self.sites.get(&site.id);
                let transition = previous.is_none_or(|p| p.liveness != Liveness::Up);
                vec![Change::Site {
                    record: SiteRecord {
                        site: site.clone(),
                        data_address: data_address.clone(),
                        liveness: Liveness::Up,
                        liveness_revision: if transition {
                            revision
                        } else {
                            previous.map_or(revision, |p| p.liveness_revision)
                        },
                        liveness_reason: if previous.is_some() {
                            "re-registered".to_string()
                        } else {
                            "registered".to_string()
                        },
                        changed_at_unix_ms: *at_unix_ms,
                        lease_id: *lease_id,
                        lease_ttl_ms: *lease_ttl_ms,
                    },
                }]
            }
            Command::MarkSiteDown {
                site_id,
                reason,
                at_unix_ms,
                lease_id,
            } => {
                let record = self.sites.get(site_id).ok_or_else(|| {
                    ApplyError::not_found("site_id", format!("unknown site {site_id:?}"))
                })?;
                if record.liveness == Liveness::Down {
                    return Err(ApplyError::precondition(
                        "site_id",
                        format!("site {site_id:?} is already down"),
                    ));
                }
                if let Some(lease_id) = lease_id
                    && *lease_id != record.lease_id
                {
                    return Err(ApplyError::precondition(
                        "lease_id",
                        format!(
                            "site {site_id:?} holds lease {} now, not {lease_id}",
                            record.lease_id
                        ),
                    ));
                }
                let mut changes = vec![Change::Site {
                    record: SiteRecord {
                        liveness: Liveness::Down,
                        liveness_revision: revision,
                        liveness_reason: reason.clone(),
                        changed_at_unix_ms: *at_unix_ms,
                        ..record.clone()
                    },
                }];
                // A round never waits on a site that is down.
                changes.extend(self.exclude_down_site(site_id, reason, *at_unix_ms, revision));
                changes
            }
            Command::UpdateInventory {
                site_id,
                lease_id,
                changes,
                at_unix_ms,
            } => {
                let record = self.sites.get(site_id).ok_or_else(|| {
                    ApplyError::not_found("site_id", format!("unknown site {site_id:?}"))
                })?;
                if record.liveness != Liveness::Up || record.lease_id != *lease_id {
                    return Err(ApplyError::precondition(
                        "lease_id",
                        format!(
                            "site {site_id:?} does not hold lease {lease_id} (it is {}); register again",
                            match record.liveness {
                                Liveness::Up => "up under another lease",
                                Liveness::Down => "down",
                            }
                        ),
                    ));
                }
                if changes.is_empty() {
                    return Err(ApplyError::invalid("changes", "is empty"));
                }
                let mut site = record.site.clone();
                for (i, change) in changes.iter().enumerate() {
                    apply_inventory_change(&mut site, change, i)?;
                }
                check_site(&site, "site")?;
                vec![Change::Site {
                    record: SiteRecord {
                        site,
                        changed_at_unix_ms: *at_unix_ms,
                        ..record.clone()
                    },
                }]
            }
            Command::PutLink { link } => {
                for (i, id) in link.between.iter().enumerate() {
                    if !self.sites.contains_key(id) {
                        return Err(ApplyError::not_found(
                            format!("link.between[{i}]"),
                            format!(
                                "unknown site {id:?}: a site registers before its links are configured"
                            ),
                        ));
                    }
                }
                let topology = Topology {
                    name: "link".to_string(),
                    gpu_types: Vec::new(),
                    sites: Vec::new(),
                    links: vec![link.clone()],
                };
                // Only the link's own checks matter here; the sites are known.
                if let Some(violation) = topology.violations().into_iter().find(|v| {
                    v.path.to_string().starts_with("links[0]")
                        && !v.message.contains("unknown site")
                }) {
                    let field = violation.path.to_string().replacen("links[0]", "link", 1);
                    return Err(ApplyError::invalid(field, violation.message));
                }
                let key = pair(&link.between[0], &link.between[1]);
                let measured = self.links.get(&key).and_then(|l| l.measured);
                vec![Change::Link {
                    record: LinkRecord {
                        configured: link.clone(),
                        measured,
                    },
                }]
            }
            Command::RecordLinkMeasurement {
                site_a,
                site_b,
                measurement,
            } => {
                let record = self.links.get(&pair(site_a, site_b)).ok_or_else(|| {
                    ApplyError::not_found(
                        "site_b",
                        format!("no link is configured between {site_a:?} and {site_b:?}"),
                    )
                })?;
                if !(measurement.loss_rate.is_finite()
                    && (0.0..=1.0).contains(&measurement.loss_rate))
                {
                    return Err(ApplyError::invalid(
                        "measurement.loss_rate",
                        format!(
                            "must be a probability in [0, 1], found {}",
                            measurement.loss_rate
                        ),
                    ));
                }
                vec![Change::Link {
                    record: LinkRecord {
                        configured: record.configured.clone(),
                        measured: Some(*measurement),
                    },
                }]
            }
            Command::SubmitJob {
                job_id,
                spec,
                placement,
            } => {
                let mut problems = Vec::new();
                crate::config::check_id(
                    &crate::config::FieldPath::root().key("job_id"),
                    job_id,
                    &mut problems,
                );
                if let Some(problem) = problems.into_iter().next() {
                    return Err(ApplyError::invalid("job_id", problem.message));
                }
                if let Some(violation) = spec.violations().into_iter().next() {
                    return Err(ApplyError::invalid(
                        format!("spec.{}", violation.path),
                        violation.message,
                    ));
                }
                if self
                    .jobs
                    .get(job_id)
                    .is_some_and(|j| j.state != JobState::Cancelled)
                {
                    return Err(ApplyError::AlreadyExists {
                        field: "job_id".to_string(),
                        message: format!("job {job_id:?} already exists; cancel it first"),
                    });
                }
                let mut changes = vec![Change::Job {
                    record: JobRecord {
                        id: job_id.clone(),
                        spec: spec.clone(),
                        state: state_of(placement),
                        placement: placement.clone(),
                        revision,
                    },
                }];
                // A job submitted again under a cancelled job's id starts
                // from round 1: the cancelled job's rounds go, in this
                // revision, so storage deletes them too.
                changes.extend(self.rounds(job_id).map(|r| Change::RoundRemoved {
                    job_id: r.job_id.clone(),
                    round: r.round,
                }));
                changes
            }
            Command::SetPlacement {
                job_id,
                placement,
                at_unix_ms,
                sites_as_of,
            } => {
                let job = self.live_job(job_id)?;
                let epoch = self.liveness_epoch();
                if let Some(as_of) = sites_as_of
                    && epoch > *as_of
                {
                    return Err(ApplyError::precondition(
                        "sites_as_of",
                        format!(
                            "the placement was computed from the sites as of revision {as_of}; a site changed liveness at revision {epoch} since"
                        ),
                    ));
                }
                let mut changes = vec![Change::Job {
                    record: JobRecord {
                        state: state_of(placement),
                        placement: placement.clone(),
                        revision,
                        ..job.clone()
                    },
                }];
                // No report counts past a re-placement.
                changes.extend(self.apply_placement_to_round(
                    job_id,
                    placement,
                    *at_unix_ms,
                    revision,
                ));
                changes
            }
            Command::CancelJob { job_id, at_unix_ms } => {
                let job = self.live_job(job_id)?;
                let mut changes = vec![Change::Job {
                    record: JobRecord {
                        state: JobState::Cancelled,
                        revision,
                        ..job.clone()
                    },
                }];
                changes.extend(self.abort_for_cancel(job_id, *at_unix_ms, revision));
                changes
            }
            Command::PutMember { member } => {
                if member.id == 0 {
                    return Err(ApplyError::invalid("member.id", "must not be 0"));
                }
                if member.peer_url.trim().is_empty() {
                    return Err(ApplyError::invalid("member.peer_url", "must not be empty"));
                }

                vec![Change::Member {
                    member: member.clone(),
                }]
            }
            Command::RemoveMember { member_id } => {
                if !self.members.contains_key(member_id) {
                    return Err(ApplyError::not_found(
                        "member_id",
                        format!("unknown member {member_id}"),
                    ));
                }
                vec![Change::MemberRemoved {
                    member_id: *member_id,
                }]
            }
            Command::OpenRound {
                job_id,
                round,
                participants,
                catch_up,
                fragments,
                codec_bits,
                links,
                inner_steps,
                overlap_steps,
                schedule_inner_steps,
                schedule_overlap_steps,
                deadline_unix_ms,
                at_unix_ms,
            } => self.check_open_round(
                &rounds::OpenRound {
                    job_id,
                    round: *round,
                    participants,
                    catch_up,
                    fragments: *fragments,
                    codec_bits: *codec_bits,
                    links,
                    inner_steps: *inner_steps,
                    overlap_steps: *overlap_steps,
                    schedule_inner_steps: *schedule_inner_steps,
                    schedule_overlap_steps: *schedule_overlap_steps,
                    deadline_unix_ms: *deadline_unix_ms,
                    at_unix_ms: *at_unix_ms,
                },
                revision,
            )?,
            Command::ReportContributed {
                job_id,
                round,
                site_id,
                fragment,
                at_unix_ms,
            } => self.check_contributed(
                &rounds::Report {
                    job_id,
                    round: *round,
                    site_id,
                    fragment: *fragment,
                    at_unix_ms: *at_unix_ms,
                },
                revision,
            )?,
            Command::ReportApplied {
                job_id,
                round,
                site_id,
                fragment,
                hash,
                at_unix_ms,
                inner_step_us,
            } => self.check_applied(
                &rounds::Report {
                    job_id,
                    round: *round,
                    site_id,
                    fragment: *fragment,
                    at_unix_ms: *at_unix_ms,
                },
                hash,
                *inner_step_us,
                revision,
            )?,
            Command::ExcludeParticipant {
                job_id,
                round,
                site_id,
                reason,
                message,
                at_unix_ms,
            } => self.check_exclude(
                &rounds::Report {
                    job_id,
                    round: *round,
                    site_id,
                    fragment: 0,
                    at_unix_ms: *at_unix_ms,
                },
                *reason,
                message,
                revision,
            )?,
            Command::ReplanSync {
                job_id,
                after_round,
                sync,
                ..
            } => self.check_replan_sync(job_id, *after_round, sync, revision)?,
            Command::AbortRound {
                job_id,
                round,
                reason,
                at_unix_ms,
            } => self.check_abort_round(job_id, *round, reason, *at_unix_ms, revision)?,
            Command::Noop { .. } => vec![Change::Noop],
        })
    }

    fn live_job(&self, job_id: &str) -> Result<&JobRecord, ApplyError> {
        let job = self
            .jobs
            .get(job_id)
            .ok_or_else(|| ApplyError::not_found("job_id", format!("unknown job {job_id:?}")))?;
        if job.state == JobState::Cancelled {
            return Err(ApplyError::precondition(
                "job_id",
                format!("job {job_id:?} is cancelled"),
            ));
        }
        Ok(job)
    }

    /// Stores an entity's new value.
    fn store(&mut self, change: Change) {
        match change {
            Change::Site { record } => {
                self.sites.insert(record.site.id.clone(), record);
            }
            Change::Link { record } => {
                let key = pair(&record.configured.between[0], &record.configured.between[1]);
                self.links.insert(key, record);
            }
            Change::Job { record } => {
                self.jobs.insert(record.id.clone(), record);
            }
            Change::Member { member } => {
                self.members.insert(member.id, member);
            }
            Change::MemberRemoved { member_id } => {
                self.members.remove(&member_id);
                self.retired_members.insert(member_id);
            }
            Change::Round { record } => {
                self.rounds
                    .entry(record.job_id.clone())
                    .or_default()
                    .insert(record.round, *record);
            }
            Change::RoundReport { report } => {
                if let Some(record) = self
                    .rounds
                    .get_mut(&report.job_id)
                    .and_then(|rounds| rounds.get_mut(&report.round))
                {
                    record.apply_report(&report);
                }
            }
            Change::RoundRemoved { job_id, round } => {
                if let Some(rounds) = self.rounds.get_mut(&job_id) {
                    rounds.remove(&round);
                    if rounds.is_empty() {
                        self.rounds.remove(&job_id);
                    }
                }
            }
            Change::Noop => {}
        }
    }
}

/// The links of a state as JSON: a list of records (each names its pair).
/// A map with tuple keys cannot be JSON, so a state holding a link could
/// not be snapshotted before; states written without links hold an empty
/// map, which still reads.
mod links_as_list {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    use super::{LinkRecord, pair};

    pub fn serialize<S: Serializer>(
        links: &BTreeMap<(String, String), LinkRecord>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(links.values())
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        List(Vec<LinkRecord>),
        Map(BTreeMap<String, LinkRecord>),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<(String, String), LinkRecord>, D::Error> {
        let records = match Repr::deserialize(deserializer)? {
            Repr::List(records) => records,
            Repr::Map(records) => records.into_values().collect(),
        };
        Ok(records
            .into_iter()
            .map(|record| {
                let [a, b] = &record.configured.between;
                (pair(a, b), record)
            })
            .collect())
    }
}

fn stale_revision(expected: u64, revision: u64) -> ApplyError {
    ApplyError::precondition(
        "expected_revision",
        format!(
            "stale revision: the write expected revision {expected} but the store is at {revision}"
        ),
    )
}

/// Checks a site with the topology's own rules; the field is renamed from
/// `sites[0]` to `prefix`.
fn check_site(site: &crate::topology::Site, prefix: &str) -> Result<(), ApplyError> {
    let topology = Topology {
        name: "registration".to_string(),
        gpu_types: Vec::new(),
        sites: vec![site.clone()],
        links: Vec::new(),
    };
    match topology.violations().into_iter().next() {
        Some(violation) => {
            let field = violation.path.to_string().replacen("sites[0]", prefix, 1);
            Err(ApplyError::invalid(field, violation.message))
        }
        None => Ok(()),
    }
}

fn apply_inventory_change(
    site: &mut crate::topology::Site,
    change: &InventoryChange,
    index: usize,
) -> Result<(), ApplyError> {
    let building_id = match change {
        InventoryChange::PutGroup { building, .. }
        | InventoryChange::RemoveGroup { building, .. } => building,
    };
    let building = site
        .buildings
        .iter_mut()
        .find(|b| &b.id == building_id)
        .ok_or_else(|| {
            ApplyError::not_found(
                format!("changes[{index}].building"),
                format!(
                    "unknown building {building_id:?}; a new building needs a new registration"
                ),
            )
        })?;
    match change {
        InventoryChange::PutGroup { group, .. } => {
            match building.domains.iter_mut().find(|g| g.id == group.id) {
                Some(existing) => *existing = group.clone(),
                None => building.domains.push(group.clone()),
            }
        }
        InventoryChange::RemoveGroup { group_id, .. } => {
            let before = building.domains.len();
            building.domains.retain(|g| &g.id != group_id);
            if building.domains.len() == before {
                return Err(ApplyError::not_found(
                    format!("changes[{index}].group_id"),
                    format!("building {building_id:?} has no domain group {group_id:?}"),
                ));
            }
        }
    }
    Ok(())
}

fn state_of(placement: &Placement) -> JobState {
    match placement {
        Placement::Placed { .. } => JobState::Placed,
        Placement::Infeasible { .. } => JobState::Infeasible,
        Placement::Pending => JobState::Pending,
    }
}

#[cfg(test)]
mod rounds_tests;
#[cfg(test)]
mod tests;
