//! The local trainer API (`trainer.proto`): the training processes of this
//! site join a job as one of the ranks the site owns, submit each
//! fragment's pseudo-gradient of an outer round through shared memory and
//! collect the fragment averaged over the round's live sites.
//!
//! [`TrainerHub`] is what the gRPC service ([`service`]) and the round
//! driver ([`crate::rounds`]) share:
//!
//! - **Jobs**: the site's assignments ([`WithTrainers`] wraps the
//!   assignment handler), so a join names a job placed here and a rank the
//!   site owns, and a submission has the size of the fragment in the job's
//!   sync schedule.
//! - **Rounds**: the latest state of each job's round, as the round driver
//!   watches them ([`TrainerHub::observe_round`]).
//! - **Sessions**: one per joined rank; a rank is held until `Leave` or
//!   until its trainer has been silent for the session TTL (a dead trainer
//!   releases its rank on the next call after that). A site whose trainer
//!   died without submitting is excluded from that round by the round's
//!   deadline, and from that round only.
//! - **Submissions**: one per (job, round, fragment) for the site, from any
//!   of its joined ranks; the round driver waits for it
//!   ([`TrainerHub::submission`]) and exchanges it.
//! - **Results**: per (job, round, fragment), the average (with its hash
//!   and the live sites), or why there is none (this site excluded, the
//!   round over); collectors wait for it.
//!
//! - **Catch-up** ([`catch_up`]): a site the open round names as catching
//!   up gets the state (anchor and outer momentum) the round driver
//!   fetched from the site it catches up from; a site named as the one to
//!   catch up from publishes its trainers' state for the other to fetch.
//!
//! Submissions and results of rounds more than [`ROUNDS_KEPT`] behind a
//! job's latest round are dropped, so the hub holds a bounded number of
//! fragments.

pub mod catch_up;
mod schedule;
pub mod service;
pub mod shm;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use longhaul_proto::v1 as pb;
use tokio::sync::Notify;

use crate::agent::Handle;
use crate::catchup::StateStore;
use crate::inventory::Inventory;
use crate::store::JobRecord;

/// Rounds of a job whose submissions and results are kept (the latest
/// and the ones before it).
pub const ROUNDS_KEPT: u64 = 3;
/// Longest `Collect` wait.
pub const MAX_COLLECT_WAIT: Duration = Duration::from_secs(600);
/// Buffers of dropped submissions kept for reuse.
pub const SPARE_BUFFERS: usize = 2;

/// Sessions at once (every rank of a large site fits).
pub const MAX_SESSIONS: usize = 65_536;

/// A refusal of the trainer API; [`service`] turns it into a status once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrainerError {
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("{field}: {message}")]
    NotFound {
        field: &'static str,
        message: String,
    },
    #[error("{field}: {message}")]
    NotOwned {
        field: &'static str,
        message: String,
    },
    #[error("{field}: {message}")]
    AlreadyExists {
        field: &'static str,
        message: String,
    },
    #[error("{field}: {message}")]
    Over {
        field: &'static str,
        message: String,
    },
    #[error("timeout_ms: no result within the timeout: {message}")]
    Timeout { message: String },
    #[error("{field}: {message}")]
    Exhausted {
        field: &'static str,
        message: String,
    },
}

/// At most 64 characters of `value`, for error messages.
pub(crate) fn prefix(value: &str) -> String {
    let mut out: String = value.chars().take(64).collect();
    if out.len() < value.len() {
        out.push('…');
    }
    out
}

/// What the hub knows of one job placed on this site.
#[derive(Debug, Clone)]
struct JobView {
    mode: String,
    ranks: BTreeSet<u64>,
    replicas: Vec<u32>,
    sync: Option<pb::SyncSchedule>,
}

#[derive(Debug, Clone)]
struct Session {
    job: String,
    rank: u64,
    pid: u32,
    last_seen: Instant,
    inner_step: u64,
    step_seconds: f64,
    /// Collects of this session waiting now: a session waiting for a
    /// result is not silent, however long the exchange takes.
    collecting: u32,
}

/// A fragment's outcome at this site, as collectors get it.
#[derive(Debug, Clone)]
pub enum FragmentResult {
    /// The average of the live sites' pseudo-gradients.
    Applied {
        values: Arc<Vec<f32>>,
        hash: String,
        live: Vec<String>,
    },
    /// This site was excluded from the round.
    Excluded { reason: String },
    /// The round ended without this fragment's average here.
    RoundOver { reason: String },
}

type FragmentKey = (String, u64, u32);

#[derive(Debug, Default)]
struct HubState {
    jobs: BTreeMap<String, JobView>,
    rounds: BTreeMap<String, pb::OuterRound>,
    sessions: HashMap<String, Session>,
    /// (job, rank) → session.
    holders: HashMap<(String, u64), String>,
    next_session: u64,
    submissions: BTreeMap<FragmentKey, Arc<Vec<f32>>>,
    /// Submissions being read from shared memory now (one per key).
    reading: BTreeSet<FragmentKey>,
    /// Buffers of submissions no longer held, for the next ones to read
    /// into (at most [`SPARE_BUFFERS`]).
    spare: Vec<Vec<f32>>,
    results: BTreeMap<FragmentKey, FragmentResult>,
    /// Per job, the state the round driver fetched for this site's latest
    /// catch-up (or why it could not).
    fetched: BTreeMap<String, catch_up::Fetched>,
}

/// What the trainer service and the round driver share.
#[derive(Debug)]
pub struct TrainerHub {
    site: String,
    ttl: Duration,
    shm: shm::ShmDir,
    state: Mutex<HubState>,
    /// Woken on every submission, result and round change.
    changed: Notify,
    /// Distinguishes sessions of this agent process from an earlier one's.
    epoch: u64,
    /// The states the trainers published for other sites to catch up
    /// from, which the catch-up server serves.
    states: Arc<StateStore>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl HubState {
    /// Drops the sessions silent for longer than `ttl`.
    fn reap(&mut self, ttl: Duration, now: Instant) {
        let expired: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.collecting == 0 && now.duration_since(s.last_seen) > ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(session) = self.sessions.remove(&id) {
                self.holders.remove(&(session.job.clone(), session.rank));
                tracing::warn!(job = %session.job, rank = session.rank, pid = session.pid, "trainer silent past its session TTL: its rank is released");
                metrics::counter!("longhaul_trainer_sessions_expired_total").increment(1);
            }
        }
    }

    fn session(&mut self, id: &str, now: Instant) -> Result<&mut Session, TrainerError> {
        match self.sessions.get_mut(id) {
            Some(session) => {
                session.last_seen = now;
                Ok(session)
            }
            None => Err(TrainerError::NotFound {
                field: "session",
                message: format!(
                    "{:?} is not a session of this agent (it ended, expired, or the agent restarted): join again",
                    prefix(id)
                ),
            }),
        }
    }

    /// Drops what belongs to rounds of `job` more than [`ROUNDS_KEPT`]
    /// behind `latest`.
    fn prune(&mut self, job: &str, latest: u64) {
        let keep_from = latest.saturating_sub(ROUNDS_KEPT - 1);
        let stale = |key: &FragmentKey| key.0 == job && key.1 < keep_from;
        self.results.retain(|key, _| !stale(key));
        self.drop_submissions(|key| stale(key));
    }

    /// Drops the submissions `drop` names, keeping their buffers (when
    /// nothing else holds them) for the next submissions.
    fn drop_submissions(&mut self, drop: impl Fn(&FragmentKey) -> bool) {
        let keys: Vec<FragmentKey> = self
            .submissions
            .keys()
            .filter(|k| drop(k))
            .cloned()
            .collect();
        for key in keys {
            if let Some(values) = self.submissions.remove(&key)
                && let Ok(buffer) = Arc::try_unwrap(values)
                && self.spare.len() < SPARE_BUFFERS
            {
                self.spare.push(buffer);
            }
        }
    }
}

/// Why `site` no longer counts in `round`, if it was excluded.
fn excluded<'a>(round: &'a pb::OuterRound, site: &str) -> Option<&'a str> {
    round
        .participant_states
        .iter()
        .find(|p| p.site_id == site && p.excluded)
        .map(|p| p.exclusion_reason.as_str())
}

impl TrainerHub {
    pub fn new(
        site: impl Into<String>,
        ttl: Duration,
        shm_dir: impl Into<std::path::PathBuf>,
    ) -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self {
            site: site.into(),
            ttl,
            shm: shm::ShmDir::new(shm_dir),
            state: Mutex::new(HubState::default()),
            changed: Notify::new(),
            epoch,
            states: StateStore::new(),
        }
    }

    /// The states published here for other sites to catch up from.
    pub fn states(&self) -> &Arc<StateStore> {
        &self.states
    }

    pub fn site(&self) -> &str {
        &self.site
    }

    pub fn session_ttl(&self) -> Duration {
        self.ttl
    }

    pub fn shm(&self) -> &shm::ShmDir {
        &self.shm
    }

    /// An assignment of this site, new or changed.
    pub fn assign(&self, assignment: &pb::Assignment) {
        let view = JobView {
            mode: assignment.mode.clone(),
            ranks: assignment.ranks.iter().map(|r| r.rank).collect(),
            replicas: assignment.replicas.clone(),
            sync: assignment.sync.clone(),
        };
        let mut state = lock(&self.state);
        // The held round stays: rounds come on a stream of their own, and
        // the job's first round may be here before its assignment.
        state.jobs.insert(assignment.job_id.clone(), view);
        drop(state);
        self.changed.notify_waiters();
    }

    /// The job no longer runs here: its sessions end.
    pub fn remove(&self, job_id: &str) {
        let mut state = lock(&self.state);
        state.jobs.remove(job_id);
        state.sessions.retain(|_, s| s.job != job_id);
        state.holders.retain(|(job, _), _| job != job_id);
        state.rounds.remove(job_id);
        state.results.retain(|key, _| key.0 != job_id);
        state.drop_submissions(|key| key.0 == job_id);
        state.fetched.remove(job_id);
        drop(state);
        self.states.forget(job_id);
        self.changed.notify_waiters();
    }

    /// The slowest inner step the job's trainers here report measuring
    /// (each rank's latest), in whole microseconds within the coordinator's
    /// bound; 0 when none reported one.
    pub fn inner_step_us(&self, job: &str) -> u64 {
        let mut state = lock(&self.state);
        state.reap(self.ttl, Instant::now());
        let slowest = state
            .sessions
            .values()
            .filter(|s| s.job == job)
            .map(|s| s.step_seconds)
            .fold(0.0_f64, f64::max);
        ((slowest * 1e6).round() as u64).min(longhaul_core::limits::MAX_INNER_STEP_US)
    }

    /// The latest state of one of the job's rounds. Once this site is
    /// excluded from it, or it is over, every fragment without a result
    /// gets one saying so.
    pub fn observe_round(&self, round: &pb::OuterRound) {
        let mut state = lock(&self.state);
        let job = round.job_id.clone();
        let newer = state
            .rounds
            .get(&job)
            .is_none_or(|held| (held.round_id, held.revision) <= (round.round_id, round.revision));
        if newer {
            state.rounds.insert(job.clone(), round.clone());
        }
        if round.state == pb::RoundState::Open as i32 {
            for (site, after) in catch_up::served_by(round, &self.site) {
                self.states.allow(&job, after, site);
            }
        }
        let ended = if let Some(reason) = excluded(round, &self.site) {
            Some(FragmentResult::Excluded {
                reason: format!(
                    "this site was excluded from round {} ({reason})",
                    round.round_id
                ),
            })
        } else if round.state != pb::RoundState::Open as i32 {
            Some(FragmentResult::RoundOver {
                reason: if round.reason.is_empty() {
                    format!("round {} is over", round.round_id)
                } else {
                    format!("round {} is over: {}", round.round_id, round.reason)
                },
            })
        } else {
            None
        };
        if let Some(ended) = ended {
            for fragment in 0..round.fragments {
                state
                    .results
                    .entry((job.clone(), round.round_id, fragment))
                    .or_insert_with(|| ended.clone());
            }
        }
        let latest = state
            .rounds
            .get(&job)
            .map_or(round.round_id, |r| r.round_id);
        state.prune(&job, latest);
        drop(state);
        self.changed.notify_waiters();
    }

    /// The pseudo-gradient a trainer submitted for the fragment, waiting
    /// for it; the caller races this with the round changing.
    pub async fn submission(&self, job: &str, round: u64, fragment: u32) -> Arc<Vec<f32>> {
        let key = (job.to_string(), round, fragment);
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(values) = lock(&self.state).submissions.get(&key) {
                return Arc::clone(values);
            }
            notified.await;
        }
    }

    /// The fragment's outcome at this site (the first one stands).
    pub fn publish(&self, job: &str, round: u64, fragment: u32, result: FragmentResult) {
        lock(&self.state)
            .results
            .entry((job.to_string(), round, fragment))
            .or_insert(result);
        self.changed.notify_waiters();
    }

    fn now() -> Instant {
        Instant::now()
    }

    /// Jobs and ranks, for `Describe`.
    pub fn describe(&self) -> pb::TrainerDescribeResponse {
        let state = lock(&self.state);
        pb::TrainerDescribeResponse {
            site_id: self.site.clone(),
            jobs: state
                .jobs
                .iter()
                .map(|(id, job)| pb::TrainerJobRanks {
                    job_id: id.clone(),
                    mode: job.mode.clone(),
                    ranks: job.ranks.iter().copied().collect(),
                    replicas: job.replicas.clone(),
                })
                .collect(),
        }
    }

    /// Joins `job_id` as `rank`, checked against the site's assignment.
    pub fn join(
        &self,
        request: &pb::TrainerJoinRequest,
    ) -> Result<pb::TrainerJoinResponse, TrainerError> {
        let now = Self::now();
        let mut state = lock(&self.state);
        state.reap(self.ttl, now);
        let job_id = &request.job_id;
        let Some(job) = state.jobs.get(job_id) else {
            let known: Vec<&String> = state.jobs.keys().take(8).collect();
            return Err(TrainerError::NotFound {
                field: "job_id",
                message: format!(
                    "{:?} is not placed on site {} (jobs here: {known:?})",
                    prefix(job_id),
                    self.site
                ),
            });
        };
        if job.mode != crate::assignment::MODE_DILOCO || job.sync.is_none() {
            return Err(TrainerError::Invalid {
                field: "job_id",
                message: format!(
                    "{job_id} runs here as a {:?} job: only DiLoCo jobs have outer rounds",
                    job.mode
                ),
            });
        }
        if !job.ranks.contains(&request.rank) {
            let (first, last) = (job.ranks.first(), job.ranks.last());
            return Err(TrainerError::NotOwned {
                field: "rank",
                message: format!(
                    "site {} does not own rank {} of {job_id} (it owns {} ranks, {first:?}..={last:?})",
                    self.site,
                    request.rank,
                    job.ranks.len()
                ),
            });
        }
        let schedule = state.schedule(job_id, &self.site, &self.states);
        if request.parameters != schedule.parameters {
            return Err(TrainerError::Invalid {
                field: "parameters",
                message: format!(
                    "the trainer has {} parameters; {job_id}'s sync schedule covers {}: the job file's `model.parameters` must be the model's",
                    request.parameters, schedule.parameters
                ),
            });
        }
        let holder_key = (job_id.clone(), request.rank);
        if let Some(holder) = state
            .holders
            .get(&holder_key)
            .and_then(|id| state.sessions.get(id))
        {
            return Err(TrainerError::AlreadyExists {
                field: "rank",
                message: format!(
                    "rank {} of {job_id} is held by process {}, last heard {:.1} s ago; it is released by Leave or after {:.0} s of silence",
                    request.rank,
                    holder.pid,
                    now.duration_since(holder.last_seen).as_secs_f64(),
                    self.ttl.as_secs_f64()
                ),
            });
        }
        if state.sessions.len() >= MAX_SESSIONS {
            return Err(TrainerError::Exhausted {
                field: "session",
                message: format!("{MAX_SESSIONS} sessions are open already"),
            });
        }
        state.next_session += 1;
        let id = format!("{:x}-{}", self.epoch, state.next_session);
        state.sessions.insert(
            id.clone(),
            Session {
                job: job_id.clone(),
                rank: request.rank,
                pid: request.pid,
                last_seen: now,
                inner_step: 0,
                step_seconds: 0.0,
                collecting: 0,
            },
        );
        state.holders.insert(holder_key, id.clone());
        tracing::info!(job = %job_id, rank = request.rank, pid = request.pid, "trainer joined");
        metrics::gauge!("longhaul_trainer_sessions").set(state.sessions.len() as f64);
        Ok(pb::TrainerJoinResponse {
            session: id,
            site_id: self.site.clone(),
            schedule: Some(schedule),
            session_ttl_ms: self.ttl.as_millis() as u64,
        })
    }

    pub fn leave(&self, session: &str) -> Result<(), TrainerError> {
        let mut state = lock(&self.state);
        let Some(ended) = state.sessions.remove(session) else {
            return Err(TrainerError::NotFound {
                field: "session",
                message: format!("{:?} is not a session of this agent", prefix(session)),
            });
        };
        state.holders.remove(&(ended.job.clone(), ended.rank));
        tracing::info!(job = %ended.job, rank = ended.rank, "trainer left");
        metrics::gauge!("longhaul_trainer_sessions").set(state.sessions.len() as f64);
        Ok(())
    }

    pub fn schedule(&self, session: &str) -> Result<pb::TrainerSchedule, TrainerError> {
        let now = Self::now();
        let mut state = lock(&self.state);
        state.reap(self.ttl, now);
        let job = state.session(session, now)?.job.clone();
        Ok(state.schedule(&job, &self.site, &self.states))
    }

    pub fn progress(
        &self,
        request: &pb::TrainerProgressRequest,
    ) -> Result<pb::TrainerSchedule, TrainerError> {
        if !request.step_seconds.is_finite() || !(0.0..=86_400.0).contains(&request.step_seconds) {
            return Err(TrainerError::Invalid {
                field: "step_seconds",
                message: format!(
                    "is {}; it must be between 0 and 86400",
                    request.step_seconds
                ),
            });
        }
        let now = Self::now();
        let mut state = lock(&self.state);
        state.reap(self.ttl, now);
        let session = state.session(&request.session, now)?;
        session.inner_step = request.inner_step;
        session.step_seconds = request.step_seconds;
        let job = session.job.clone();
        if request.step_seconds > 0.0 {
            metrics::histogram!("longhaul_trainer_step_seconds").record(request.step_seconds);
        }
        Ok(state.schedule(&job, &self.site, &self.states))
    }

    /// The job a session joined, touching it.
    fn session_job(&self, session: &str) -> Result<String, TrainerError> {
        let now = Self::now();
        let mut state = lock(&self.state);
        state.reap(self.ttl, now);
        Ok(state.session(session, now)?.job.clone())
    }

    /// Checks that `round` is the job's open round, this site takes part
    /// in it, and `fragment` is one of its fragments; the fragment's size.
    fn check_open(
        &self,
        state: &HubState,
        job: &str,
        round: u64,
        fragment: u32,
    ) -> Result<u64, TrainerError> {
        let held = state.rounds.get(job);
        let open = held.filter(|r| r.state == pb::RoundState::Open as i32);
        let Some(open) = open.filter(|r| r.round_id == round) else {
            let now = match (open, held) {
                (Some(open), _) => format!("the open round is {}", open.round_id),
                (None, Some(last)) => format!("no round is open (the last was {})", last.round_id),
                (None, None) => "no round of it has been seen yet".to_string(),
            };
            return Err(if held.is_some_and(|r| round <= r.round_id) {
                TrainerError::Over {
                    field: "round",
                    message: format!("round {round} of {job} is over; {now}"),
                }
            } else {
                TrainerError::NotFound {
                    field: "round",
                    message: format!("round {round} of {job} is not open; {now}"),
                }
            });
        };
        if let Some(reason) = excluded(open, &self.site) {
            return Err(TrainerError::Over {
                field: "round",
                message: format!(
                    "this site was excluded from round {round} ({reason}); train on and take part in the next"
                ),
            });
        }
        if fragment >= open.fragments {
            return Err(TrainerError::Invalid {
                field: "fragment",
                message: format!(
                    "is {fragment}; round {round} has {} fragments",
                    open.fragments
                ),
            });
        }
        state
            .jobs
            .get(job)
            .and_then(|j| j.sync.as_ref())
            .and_then(|s| s.schedule.iter().find(|f| f.fragment == fragment))
            .map(|f| f.parameters)
            .ok_or_else(|| TrainerError::Invalid {
                field: "fragment",
                message: format!("{job}'s sync schedule has no fragment {fragment}"),
            })
    }

    /// Reads and stores a fragment's pseudo-gradient, from a file of user
    /// `caller` (the request's, see [`shm`]).
    pub fn submit(
        &self,
        request: &pb::TrainerSubmitRequest,
        caller: u32,
    ) -> Result<u64, TrainerError> {
        let tensor = shm::TensorRef::from_wire(request.tensor.as_ref(), "tensor")?;
        let job = self.session_job(&request.session)?;
        let key = (job.clone(), request.round, request.fragment);
        let check = |state: &HubState| -> Result<(), TrainerError> {
            let elements = self.check_open(state, &job, request.round, request.fragment)?;
            if tensor.elements != elements {
                return Err(TrainerError::Invalid {
                    field: "tensor.elements",
                    message: format!(
                        "is {}; fragment {} of {job} has {elements} parameters",
                        tensor.elements, request.fragment
                    ),
                });
            }
            if state.submissions.contains_key(&key) || state.reading.contains(&key) {
                return Err(TrainerError::AlreadyExists {
                    field: "fragment",
                    message: format!(
                        "fragment {} of round {} was submitted already (one submission per site)",
                        request.fragment, request.round
                    ),
                });
            }
            Ok(())
        };
        let buffer = {
            // Reserved while it is read, so that a second submit of the
            // fragment is refused before it reads anything.
            let mut state = lock(&self.state);
            check(&state)?;
            state.reading.insert(key.clone());
            let n = tensor.elements as usize;
            match state.spare.iter().position(|b| b.len() == n) {
                Some(at) => state.spare.swap_remove(at),
                None => Vec::new(),
            }
        };
        // The copy out of shared memory (which refuses a value that is not
        // finite) runs without the lock.
        let read = self.shm.read_into(&tensor, "tensor", buffer, caller);
        let mut state = lock(&self.state);
        state.reading.remove(&key);
        let values = read?;
        // The round may have ended (or this site been excluded) meanwhile.
        self.check_open(&state, &job, request.round, request.fragment)?;
        state.submissions.insert(key, Arc::new(values));
        drop(state);
        tracing::debug!(
            job,
            round = request.round,
            fragment = request.fragment,
            elements = tensor.elements,
            "pseudo-gradient submitted"
        );
        metrics::counter!("longhaul_trainer_submitted_bytes_total")
            .increment(tensor.elements * tensor.dtype.size());
        self.changed.notify_waiters();
        Ok(tensor.elements)
    }

    /// Waits up to the request's timeout for the fragment's result, and
    /// writes an average into the request's tensor.
    pub async fn collect(
        &self,
        request: &pb::TrainerCollectRequest,
        caller: u32,
    ) -> Result<pb::TrainerCollectResponse, TrainerError> {
        let into = shm::TensorRef::from_wire(request.into.as_ref(), "into")?;
        let wait = Duration::from_millis(request.timeout_ms);
        if wait > MAX_COLLECT_WAIT {
            return Err(TrainerError::Invalid {
                field: "timeout_ms",
                message: format!(
                    "is {}; it must be at most {}",
                    request.timeout_ms,
                    MAX_COLLECT_WAIT.as_millis()
                ),
            });
        }
        if request.round == 0 {
            return Err(TrainerError::Invalid {
                field: "round",
                message: "is 0; rounds are numbered from 1".into(),
            });
        }
        let job = {
            let now = Self::now();
            let mut state = lock(&self.state);
            state.reap(self.ttl, now);
            let session = state.session(&request.session, now)?;
            session.collecting += 1;
            let job = session.job.clone();
            let fragments = state
                .jobs
                .get(&job)
                .and_then(|j| j.sync.as_ref())
                .map_or(0, |s| s.schedule.len() as u32);
            if request.fragment >= fragments {
                if let Some(session) = state.sessions.get_mut(&request.session) {
                    session.collecting -= 1;
                }
                return Err(TrainerError::Invalid {
                    field: "fragment",
                    message: format!(
                        "is {}; {job}'s schedule has {fragments} fragments",
                        request.fragment
                    ),
                });
            }
            job
        };
        // The session counts as heard from while it waits, and from when
        // the wait ends, however that is.
        let _waiting = Waiting {
            hub: self,
            session: &request.session,
        };
        let key = (job.clone(), request.round, request.fragment);
        let give_up = tokio::time::Instant::now() + wait;
        let result = loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = lock(&self.state);
                if let Some(result) = state.results.get(&key) {
                    break result.clone();
                }
                match state.rounds.get(&job) {
                    Some(latest) if request.round > latest.round_id => {
                        return Err(TrainerError::NotFound {
                            field: "round",
                            message: format!(
                                "round {} of {job} has not opened (the latest is {})",
                                request.round, latest.round_id
                            ),
                        });
                    }
                    Some(latest) if request.round + ROUNDS_KEPT <= latest.round_id => {
                        return Err(TrainerError::Over {
                            field: "round",
                            message: format!(
                                "round {} of {job} is too far behind the latest ({}): its results are gone",
                                request.round, latest.round_id
                            ),
                        });
                    }
                    None => {
                        return Err(TrainerError::NotFound {
                            field: "round",
                            message: format!("no round of {job} has been seen yet"),
                        });
                    }
                    // Every round this hub saw end has a result for each
                    // of its fragments (`observe_round`), and this site's
                    // average is published before its report can let the
                    // round commit: an older round without one ended
                    // unseen (the agent restarted meanwhile).
                    Some(latest) if request.round < latest.round_id => {
                        break FragmentResult::RoundOver {
                            reason: format!(
                                "round {} ended before this agent saw it (the latest is {})",
                                request.round, latest.round_id
                            ),
                        };
                    }
                    _ => {}
                }
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(give_up) => {
                    return Err(TrainerError::Timeout {
                        message: format!("fragment {} of round {} of {job} is still being exchanged", request.fragment, request.round),
                    });
                }
            }
        };
        Ok(match result {
            FragmentResult::Applied { values, hash, live } => {
                if into.elements != values.len() as u64 {
                    return Err(TrainerError::Invalid {
                        field: "into.elements",
                        message: format!(
                            "is {}; fragment {} has {} parameters",
                            into.elements,
                            request.fragment,
                            values.len()
                        ),
                    });
                }
                // Writing up to 1 GiB into shared memory is blocking work.
                let shm = self.shm.clone();
                tokio::task::spawn_blocking(move || shm.write(&into, &values, "into", caller))
                    .await
                    .map_err(|error| TrainerError::Exhausted {
                        field: "into",
                        message: format!("the write of the result stopped: {error}"),
                    })??;
                pb::TrainerCollectResponse {
                    outcome: pb::CollectOutcome::Applied as i32,
                    hash,
                    live_sites: live,
                    reason: String::new(),
                }
            }
            FragmentResult::Excluded { reason } => pb::TrainerCollectResponse {
                outcome: pb::CollectOutcome::Excluded as i32,
                reason,
                ..Default::default()
            },
            FragmentResult::RoundOver { reason } => pb::TrainerCollectResponse {
                outcome: pb::CollectOutcome::RoundOver as i32,
                reason,
                ..Default::default()
            },
        })
    }
}

/// A collect waiting: its session is not reaped meanwhile, and counts as
/// heard from when the wait ends.
struct Waiting<'a> {
    hub: &'a TrainerHub,
    session: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.hub.state);
        if let Some(session) = state.sessions.get_mut(self.session) {
            session.collecting = session.collecting.saturating_sub(1);
            session.last_seen = Instant::now();
        }
    }
}

/// The agent's assignment handler, telling the hub about every job placed
/// on or removed from the site before handing it on.
pub struct WithTrainers {
    pub inner: Box<dyn Handle>,
    pub hub: Arc<TrainerHub>,
}

impl std::fmt::Debug for WithTrainers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithTrainers").finish_non_exhaustive()
    }
}

impl Handle for WithTrainers {
    fn assign(
        &mut self,
        assignment: &pb::Assignment,
        inventory: &Inventory,
    ) -> Result<JobRecord, String> {
        self.hub.assign(assignment);
        self.inner.assign(assignment, inventory)
    }

    fn remove(&mut self, job_id: &str, record: &JobRecord) {
        self.hub.remove(job_id);
        self.inner.remove(job_id, record);
    }
}

#[cfg(test)]
mod tests;
