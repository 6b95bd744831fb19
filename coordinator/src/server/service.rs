//! The public `longhaul.v1.Coordinator` service.
//!
//! Writes are accepted on any replica: a follower forwards them, once, to the
//! leader it knows. Reads are linearizable (ReadIndex) unless the request
//! sets `allow_stale`. Every wait on consensus is bounded: a request that
//! cannot complete fails with UNAVAILABLE or DEADLINE_EXCEEDED, never hangs.
//! Forwarding and the bounds on waits are `forward.rs`'s, shared with the
//! agent service.

use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use longhaul_core::limits;
use longhaul_core::state::{Change, Command, Event, Placement, Request as StateRequest};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use longhaul_proto::v1::coordinator_server::Coordinator;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::convert::{self, invalid};
use super::forward::{self, Forwarding, bounded, forward, wait_for};
use super::raft_loop::RaftHandle;
use super::state_machine::ApplyResponse;
use super::transport::PeerBook;

mod membership;

#[derive(Debug, Clone)]
pub struct CoordinatorService {
    raft: RaftHandle,
    peers: PeerBook,
    tls: Option<tonic::transport::ClientTlsConfig>,
    wait: Duration,
    /// Held by a membership change from allocating its id to its conf change applying, so
    /// two changes at this leader neither take one id nor race raft's one-at-a-time rule.
    membership: std::sync::Arc<tokio::sync::Mutex<()>>,
    leader: forward::LeaderChannel,
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

impl CoordinatorService {
    pub fn new(
        raft: RaftHandle,
        peers: PeerBook,
        tls: Option<tonic::transport::ClientTlsConfig>,
    ) -> Self {
        Self {
            raft,
            peers,
            tls,
            wait: forward::DEFAULT_WAIT,
            membership: Default::default(),
            leader: Default::default(),
        }
    }

    pub(super) fn raft(&self) -> &RaftHandle {
        &self.raft
    }

    pub(super) fn header(&self) -> pb::ResponseHeader {
        let status = self.raft.status();
        pb::ResponseHeader {
            revision: self.raft.state().read().revision(),
            raft_term: status.term,
            member_id: status.id,
        }
    }

    /// Waits for a linearizable read point unless stale reads are allowed.
    async fn read_barrier(&self, allow_stale: bool, wait: Duration) -> Result<(), Status> {
        if allow_stale {
            return Ok(());
        }
        bounded(
            wait,
            "linearizable read (ReadIndex)",
            self.raft.read_index(),
        )
        .await
    }

    /// Serves a read from the applied state, after a ReadIndex barrier unless
    /// stale reads are allowed; the header carries the revision read at.
    pub(super) async fn read<T>(
        &self,
        allow_stale: bool,
        wait: Duration,
        f: impl FnOnce(&longhaul_core::state::ClusterState) -> Result<T, Status>,
    ) -> Result<(T, pb::ResponseHeader), Status> {
        self.read_barrier(allow_stale, wait).await?;
        let (value, revision) = {
            let state = self.raft.state().read();
            (f(&state)?, state.revision())
        };
        Ok((value, self.header_at(revision)))
    }

    /// A channel to the leader when this replica is not it (`None` when it
    /// is), for either service; see [`forward::leader_channel`].
    pub(super) fn leader_channel<T>(
        &self,
        request: &Request<T>,
    ) -> Result<Option<tonic::transport::Channel>, Status> {
        forward::leader_channel(
            &self.raft,
            &self.peers,
            self.tls.as_ref(),
            &self.leader,
            request,
        )
    }

    /// The URL replica `id` is reached at.
    pub(super) fn leader_url(&self, id: u64) -> Option<String> {
        self.peers.get(id)
    }

    /// Refuses a write that cannot apply to the state as it is now (a bound exceeded, or what
    /// apply itself would refuse), so that it is never replicated; see
    /// `longhaul_core::state::ClusterState::admit`. The state judged is a leader's that has
    /// applied an entry of its own term (so every write acknowledged before is in it), and for
    /// a compare-and-set on a revision ahead of it, one after a read barrier. Waits at most
    /// `wait` for either.
    pub(super) async fn admit(&self, request: &StateRequest, wait: Duration) -> Result<(), Status> {
        longhaul_core::state::check_bounds(&request.command).map_err(convert::apply_status)?;
        let mut status = self.raft.watch_status();
        let ready = tokio::time::timeout(
            wait,
            status.wait_for(|s| s.leader_ready || s.role != super::raft_loop::Role::Leader),
        )
        .await
        .map(|seen| seen.map(|s| s.leader_ready));
        match ready {
            Ok(Ok(true)) => {}
            Ok(_) => {
                return Err(Status::unavailable(
                    "this replica is no longer the leader; retry",
                ));
            }
            Err(_) => {
                return Err(Status::unavailable(format!(
                    "the new leader has not applied an entry of its term within {} ms; retry",
                    wait.as_millis()
                )));
            }
        }
        if request
            .expected_revision
            .is_some_and(|expected| expected > self.raft.state().read().revision())
        {
            self.read_barrier(false, wait).await?;
        }
        self.raft
            .state()
            .read()
            .admit(request)
            .map_err(convert::apply_status)
    }

    /// Admits a state change, proposes it at the leader and maps the outcome.
    pub(super) async fn write(&self, request: StateRequest, wait: Duration) -> Result<u64, Status> {
        self.admit(&request, wait).await?;
        self.write_admitted(request, wait).await
    }

    /// [`CoordinatorService::write`] for a request the caller admitted itself.
    pub(super) async fn write_admitted(
        &self,
        request: StateRequest,
        wait: Duration,
    ) -> Result<u64, Status> {
        match bounded(wait, "write", self.raft.propose(request)).await? {
            ApplyResponse::Applied { revision } => Ok(revision),
            ApplyResponse::Refused { error } => Err(convert::apply_status(error)),
        }
    }

    /// Places a job on the sites that are up, off the async threads (a large
    /// topology takes seconds). The inner error is why the job is infeasible.
    async fn place(
        &self,
        spec: &longhaul_core::JobSpec,
    ) -> Result<Result<longhaul_core::placement::Plan, String>, Status> {
        let (topology, links) = {
            let state = self.raft.state().read();
            let links: Vec<_> = state.links().cloned().collect();
            (state.live_topology("registered-sites"), links)
        };
        // With no site up there is nothing to search and the solver answers at once: not worth
        // the blocking pool's hand-off, two thread wake-ups on every write's path.
        if topology.sites.is_empty() {
            return Ok(super::replan::place_live(&topology, &links, spec));
        }
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || super::replan::place_live(&topology, &links, &spec))
            .await
            .map_err(|e| Status::internal(format!("placement task failed: {e}")))
    }

    pub(super) fn header_at(&self, revision: u64) -> pb::ResponseHeader {
        pb::ResponseHeader {
            revision,
            ..self.header()
        }
    }
}

impl Forwarding for CoordinatorService {
    type Client = CoordinatorClient<tonic::transport::Channel>;

    fn leader_client<T>(&self, request: &Request<T>) -> Result<Option<Self::Client>, Status> {
        Ok(self.leader_channel(request)?.map(CoordinatorClient::new))
    }

    fn default_wait(&self) -> Duration {
        self.wait
    }
}

fn expected(revision: u64) -> Option<u64> {
    (revision != 0).then_some(revision)
}

#[tonic::async_trait]
impl Coordinator for CoordinatorService {
    async fn get_cluster(
        &self,
        request: Request<pb::GetClusterRequest>,
    ) -> Result<Response<pb::GetClusterResponse>, Status> {
        let wait = wait_for(&request, self.wait);
        self.read_barrier(request.get_ref().allow_stale, wait)
            .await?;
        let status = self.raft.status();
        let learners = status.conf_state.learners.clone();
        let state = self.raft.state().read();
        let mut members: Vec<pb::Member> = state
            .members()
            .map(|m| convert::member(m, &learners))
            .collect();
        // Voters the state does not describe yet (a cluster that has not
        // recorded its founding members) are still listed, by id.
        for id in status.conf_state.voters.iter().chain(&learners) {
            if !members.iter().any(|m| m.id == *id) {
                members.push(pb::Member {
                    id: *id,
                    peer_url: self.peers.get(*id).unwrap_or_default(),
                    client_url: self.peers.get(*id).unwrap_or_default(),
                    is_learner: learners.contains(id),
                    ..pb::Member::default()
                });
            }
        }
        members.sort_by_key(|m| m.id);
        drop(state);
        Ok(Response::new(pb::GetClusterResponse {
            header: Some(self.header()),
            leader_id: status.leader_id,
            members,
            applied_index: status.applied_index,
            commit_index: status.commit_index,
        }))
    }

    async fn add_member(
        &self,
        request: Request<pb::AddMemberRequest>,
    ) -> Result<Response<pb::AddMemberResponse>, Status> {
        let body = request.get_ref();
        if body.peer_url.is_empty() {
            return Err(invalid("peer_url", "is required"));
        }
        for (field, url) in [
            ("peer_url", &body.peer_url),
            ("client_url", &body.client_url),
        ] {
            if let Some(problem) = (!url.is_empty())
                .then(|| limits::url_problem(url))
                .flatten()
            {
                return Err(invalid(field, problem));
            }
        }
        if body.name.len() > limits::MAX_NAME_LEN {
            return Err(invalid(
                "name",
                format!(
                    "is {} bytes long, more than the {} allowed",
                    body.name.len(),
                    limits::MAX_NAME_LEN
                ),
            ));
        }
        forward!(self, request, add_member);
        let wait = wait_for(&request, self.wait);
        let body = request.into_inner();
        self.membership_change(wait, move |service, deadline| async move {
            service.add_member_here(body, deadline).await
        })
        .await
        .map(Response::new)
    }

    async fn remove_member(
        &self,
        request: Request<pb::RemoveMemberRequest>,
    ) -> Result<Response<pb::RemoveMemberResponse>, Status> {
        forward!(self, request, remove_member);
        let wait = wait_for(&request, self.wait);
        let id = request.into_inner().id;
        self.membership_change(wait, move |service, deadline| async move {
            service.remove_member_here(id, deadline).await
        })
        .await
        .map(Response::new)
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::TransferLeaderResponse>, Status> {
        forward!(self, request, transfer_leader);
        let wait = wait_for(&request, self.wait);
        let target = request.into_inner().target_id;
        if !self.raft.status().conf_state.voters.contains(&target) {
            return Err(Status::not_found(format!(
                "field `target_id`: {target} is not a voter"
            )));
        }
        bounded(
            wait,
            "leadership transfer",
            self.raft.transfer_leader(target),
        )
        .await?;
        let mut status = self.raft.watch_status();
        let waited = tokio::time::timeout(wait, status.wait_for(|s| s.leader_id == target)).await;
        match waited {
            Ok(Ok(_)) => Ok(Response::new(pb::TransferLeaderResponse {
                header: Some(self.header()),
                leader_id: target,
            })),
            _ => Err(Status::deadline_exceeded(format!(
                "leadership did not move to {target} within {} ms",
                wait.as_millis()
            ))),
        }
    }

    async fn list_sites(
        &self,
        request: Request<pb::ListSitesRequest>,
    ) -> Result<Response<pb::ListSitesResponse>, Status> {
        let wait = wait_for(&request, self.wait);
        let (sites, header) = self
            .read(request.get_ref().allow_stale, wait, |state| {
                Ok(state.sites().map(convert::site_status).collect())
            })
            .await?;
        Ok(Response::new(pb::ListSitesResponse {
            header: Some(header),
            sites,
        }))
    }

    async fn get_site(
        &self,
        request: Request<pb::GetSiteRequest>,
    ) -> Result<Response<pb::GetSiteResponse>, Status> {
        let wait = wait_for(&request, self.wait);
        let body = request.get_ref();
        if body.site_id.is_empty() {
            return Err(invalid("site_id", "is required"));
        }
        let (site, header) = self
            .read(body.allow_stale, wait, |state| {
                state
                    .site(&body.site_id)
                    .map(convert::site_status)
                    .ok_or_else(|| {
                        Status::not_found(format!(
                            "field `site_id`: unknown site {}",
                            limits::quote(&body.site_id)
                        ))
                    })
            })
            .await?;
        Ok(Response::new(pb::GetSiteResponse {
            header: Some(header),
            site: Some(site),
        }))
    }

    async fn list_links(
        &self,
        request: Request<pb::ListLinksRequest>,
    ) -> Result<Response<pb::ListLinksResponse>, Status> {
        let wait = wait_for(&request, self.wait);
        let (links, header) = self
            .read(request.get_ref().allow_stale, wait, |state| {
                Ok(state.links().map(convert::link_status).collect())
            })
            .await?;
        Ok(Response::new(pb::ListLinksResponse {
            header: Some(header),
            links,
        }))
    }

    async fn put_link(
        &self,
        request: Request<pb::PutLinkRequest>,
    ) -> Result<Response<pb::PutLinkResponse>, Status> {
        forward!(self, request, put_link);
        let wait = wait_for(&request, self.wait);
        let body = request.into_inner();
        let link = body
            .link
            .as_ref()
            .ok_or_else(|| invalid("link", "is required"))?;
        let link = convert::link_from_wire(link, "link")?;
        let command = StateRequest {
            command: Command::PutLink { link },
            expected_revision: expected(body.expected_revision),
        };
        let revision = self.write(command, wait).await?;
        Ok(Response::new(pb::PutLinkResponse {
            header: Some(self.header_at(revision)),
        }))
    }

    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        forward!(self, request, submit_job);
        let wait = wait_for(&request, self.wait);
        let body = request.into_inner();
        let spec = body
            .spec
            .as_ref()
            .ok_or_else(|| invalid("spec", "is required"))?;
        let spec = convert::job_from_wire(spec, "spec")?;
        let job_id = spec.name.clone();
        let mut command = StateRequest {
            command: Command::SubmitJob {
                job_id: job_id.clone(),
                spec: spec.clone(),
                placement: Placement::Pending,
            },
            expected_revision: expected(body.expected_revision),
        };
        // Refused before the placement is worked out, not after.
        self.admit(&command, wait).await?;
        // The leader places the job against the sites that are up now; the
        // outcome (plan or the reason it is infeasible) is replicated with it.
        let outcome = match self.place(&spec).await? {
            Ok(plan) => Placement::placed(plan),
            Err(reason) => Placement::Infeasible { reason },
        };
        if let Command::SubmitJob { placement, .. } = &mut command.command {
            *placement = outcome;
        }
        // Admitted above; the placement the leader made adds nothing admission checks, and a
        // state that moved meanwhile is apply's to judge.
        let revision = self.write_admitted(command, wait).await?;
        let job = self.raft.state().read().job(&job_id).map(convert::job);
        Ok(Response::new(pb::SubmitJobResponse {
            header: Some(self.header_at(revision)),
            job,
        }))
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::GetJobResponse>, Status> {
        let wait = wait_for(&request, self.wait);
        let body = request.get_ref();
        if body.job_id.is_empty() {
            return Err(invalid("job_id", "is required"));
        }
        let (job, header) = self
            .read(body.allow_stale, wait, |state| {
                state.job(&body.job_id).map(convert::job).ok_or_else(|| {
                    Status::not_found(format!(
                        "field `job_id`: unknown job {}",
                        limits::quote(&body.job_id)
                    ))
                })
            })
            .await?;
        Ok(Response::new(pb::GetJobResponse {
            header: Some(header),
            job: Some(job),
        }))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let wait = wait_for(&request, self.wait);
        let (jobs, header) = self
            .read(request.get_ref().allow_stale, wait, |state| {
                Ok(state.jobs().map(convert::job).collect())
            })
            .await?;
        Ok(Response::new(pb::ListJobsResponse {
            header: Some(header),
            jobs,
        }))
    }

    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobResponse>, Status> {
        forward!(self, request, cancel_job);
        let wait = wait_for(&request, self.wait);
        let body = request.into_inner();
        if body.job_id.is_empty() {
            return Err(invalid("job_id", "is required"));
        }
        let command = StateRequest {
            command: Command::CancelJob {
                job_id: body.job_id,
                at_unix_ms: now_unix_ms(),
            },
            expected_revision: expected(body.expected_revision),
        };
        let revision = self.write(command, wait).await?;
        Ok(Response::new(pb::CancelJobResponse {
            header: Some(self.header_at(revision)),
        }))
    }

    async fn plan(
        &self,
        request: Request<pb::PlanRequest>,
    ) -> Result<Response<pb::PlanResponse>, Status> {
        let wait = wait_for(&request, self.wait);
        let body = request.into_inner();
        let spec = body
            .spec
            .as_ref()
            .ok_or_else(|| invalid("spec", "is required"))?;
        let spec = convert::job_from_wire(spec, "spec")?;
        if let Some(violation) = longhaul_core::config::Validate::violations(&spec)
            .into_iter()
            .next()
        {
            return Err(invalid(
                &format!("spec.{}", violation.path),
                violation.message,
            ));
        }
        // What-if plans read the current sites linearizably, store nothing.
        self.read_barrier(false, wait).await?;
        let plan = self.place(&spec).await?.map_err(|reason| {
            Status::failed_precondition(limits::shorten(format!(
                "field `spec`: infeasible: {reason}"
            )))
        })?;
        Ok(Response::new(pb::PlanResponse {
            header: Some(self.header()),
            plan: Some(convert::plan_to_wire(&plan)?),
        }))
    }

    async fn get_sync_schedule(
        &self,
        request: Request<pb::GetSyncScheduleRequest>,
    ) -> Result<Response<pb::GetSyncScheduleResponse>, Status> {
        let wait = wait_for(&request, self.wait);
        let body = request.get_ref();
        if body.job_id.is_empty() {
            return Err(invalid("job_id", "is required"));
        }
        let (schedule, header) = self
            .read(body.allow_stale, wait, |state| {
                let job = state.job(&body.job_id).ok_or_else(|| {
                    Status::not_found(format!(
                        "field `job_id`: unknown job {}",
                        limits::quote(&body.job_id)
                    ))
                })?;
                let plan = super::assignments::plan_of(job).ok_or_else(|| {
                    Status::failed_precondition(format!(
                        "field `job_id`: job {:?} is not placed (state {:?}); it has no schedule",
                        body.job_id, job.state
                    ))
                })?;
                let mut schedule = super::assignments::sync_schedule(&job.id, plan).ok_or_else(|| {
                    Status::failed_precondition(format!(
                        "field `job_id`: job {:?} runs as one cross-site pipeline: it has no outer synchronisation",
                        body.job_id
                    ))
                })?;
                schedule.current_round = super::rounds::current_round(state, &job.id);
                Ok(schedule)
            })
            .await?;
        Ok(Response::new(pb::GetSyncScheduleResponse {
            header: Some(header),
            schedule: Some(schedule),
        }))
    }

    async fn list_rounds(
        &self,
        request: Request<pb::ListRoundsRequest>,
    ) -> Result<Response<pb::ListRoundsResponse>, Status> {
        let wait = wait_for(&request, self.wait);
        let body = request.get_ref();
        if body.job_id.is_empty() {
            return Err(invalid("job_id", "is required"));
        }
        let (rounds, header) = self
            .read(body.allow_stale, wait, |state| {
                if state.job(&body.job_id).is_none() {
                    return Err(Status::not_found(format!(
                        "field `job_id`: unknown job {}",
                        limits::quote(&body.job_id)
                    )));
                }
                Ok(state
                    .rounds(&body.job_id)
                    .map(super::rounds::round_to_wire)
                    .collect())
            })
            .await?;
        Ok(Response::new(pb::ListRoundsResponse {
            header: Some(header),
            rounds,
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let body = request.into_inner();
        let kinds: Vec<String> = body.kinds;
        if kinds.len() > limits::MAX_WATCH_KINDS {
            return Err(invalid(
                "kinds",
                format!(
                    "holds {} kinds, more than the {} allowed",
                    kinds.len(),
                    limits::MAX_WATCH_KINDS
                ),
            ));
        }
        for (i, kind) in kinds.iter().enumerate() {
            if !matches!(
                kind.as_str(),
                "site" | "link" | "job" | "member" | "round" | "noop"
            ) {
                return Err(invalid(
                    &format!("kinds[{i}]"),
                    format!(
                        "unknown kind {}: expected site, link, job, member, round or noop",
                        limits::quote(kind)
                    ),
                ));
            }
        }
        // Subscribe before reading the history, so nothing falls between.
        let live = self.raft.subscribe();
        let backlog = self
            .raft
            .state()
            .read()
            .events_after(body.after_revision)
            .map_err(|e| Status::out_of_range(format!("field `after_revision`: {e}")))?;
        let state = self.raft.state().clone();
        let stream = async_stream(move |tx| async move {
            let mut last = body.after_revision;
            let wanted =
                |event: &Event| kinds.is_empty() || kinds.iter().any(|k| k == event.change.kind());
            for event in backlog {
                last = event.revision;
                if wanted(&event) && tx.send(Ok(watch_event(&event))).await.is_err() {
                    return;
                }
            }
            follow_live(live, state, last, &tx, |event| {
                wanted(event).then(|| watch_event(event))
            })
            .await;
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Sends, through `map`, every live event with a revision above `last`
/// (anything at or below it was already sent from the history); when the
/// live feed lagged, or an event comes after a gap (a snapshot install moved
/// the state past revisions that were never applied here one by one),
/// catches up from the retained history first, or fails the stream with
/// OUT_OF_RANGE when those revisions are no longer retained, so the client
/// re-lists: a watch never skips a revision silently. One revision may
/// carry several changes (a site marked down and the rounds it is excluded
/// from; a re-placement and the round it aborts): each is sent, in order.
/// Returns when the receiver is gone or the feed ends, having said why on
/// the stream.
pub(super) async fn follow_live<T>(
    mut live: tokio::sync::broadcast::Receiver<Event>,
    state: super::state_machine::SharedState,
    mut last: u64,
    tx: &tokio::sync::mpsc::Sender<Result<T, Status>>,
    mut map: impl FnMut(&Event) -> Option<T>,
) {
    // Every change of a revision up to `last` was sent; of the revision
    // being sent now, `partial` = (revision, changes sent so far).
    let mut partial: Option<(u64, usize)> = None;
    loop {
        let current = partial.map_or(last, |(revision, _)| revision);
        let mut caught_up = false;
        let events = match live.recv().await {
            Ok(event) if event.revision <= last => continue,
            // The next change of the revision being sent, or the first of
            // the next revision.
            Ok(event) if event.revision == current || event.revision == current + 1 => {
                vec![event]
            }
            // A gap: revisions in between either changed nothing (then the
            // history has nothing for them either) or were installed by a
            // snapshot; the history says which, or that they are gone.
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                let catch_up = state.read().events_after(last);
                match catch_up {
                    Ok(events) => {
                        caught_up = true;
                        // The history holds whole revisions: skip the
                        // changes of the partial one already sent.
                        let (revision, sent) = partial.take().unwrap_or((0, 0));
                        let mut skip = sent;
                        events
                            .into_iter()
                            .filter(|e| {
                                if skip > 0 && e.revision == revision {
                                    skip -= 1;
                                    return false;
                                }
                                true
                            })
                            .collect()
                    }
                    Err(error) => {
                        let _ = tx.send(Err(Status::out_of_range(error.to_string()))).await;
                        return;
                    }
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                let _ = tx
                    .send(Err(Status::unavailable("the replica is shutting down")))
                    .await;
                return;
            }
        };
        for event in events {
            partial = match partial {
                Some((revision, sent)) if revision == event.revision => Some((revision, sent + 1)),
                Some((revision, _)) => {
                    last = revision;
                    Some((event.revision, 1))
                }
                None => Some((event.revision, 1)),
            };
            if let Some(item) = map(&event)
                && tx.send(Ok(item)).await.is_err()
            {
                return;
            }
        }
        if caught_up {
            // Whole revisions: the live feed's copies of them are skipped.
            if let Some((revision, _)) = partial.take() {
                last = revision;
            }
        }
    }
}

fn watch_event(event: &Event) -> pb::WatchEvent {
    use pb::watch_event::Event as E;
    let body = match &event.change {
        Change::Site { record } => Some(E::Site(convert::site_status(record))),
        Change::Link { record } => Some(E::Link(convert::link_status(record))),
        Change::Job { record } => Some(E::Job(convert::job(record))),
        Change::Round { record } => Some(E::Round(super::rounds::round_to_wire(record))),
        Change::RoundReport { report } => {
            Some(E::RoundReport(super::rounds::round_report_to_wire(report)))
        }
        Change::Member { .. }
        | Change::MemberRemoved { .. }
        | Change::RoundRemoved { .. }
        | Change::Noop => None,
    };
    pb::WatchEvent {
        revision: event.revision,
        event: body,
    }
}

/// A stream fed by a task through a bounded channel.
pub(super) fn async_stream<T, F, Fut>(producer: F) -> impl Stream<Item = Result<T, Status>>
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<Result<T, Status>>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(producer(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
