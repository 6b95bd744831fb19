//! The `longhaul.v1.AgentService` the site agents call.
//!
//! Identity first: with mutual TLS, a request about site `X` is served only
//! when the client certificate names `X.site.longhaul`, or when a replica
//! forwards it, having checked it (`auth.rs`, the one authorization
//! boundary, lets only replicas forward). Then the same rule as the operator
//! API: writes and renewals go to the leader (a follower forwards once),
//! the assignment watch is served from the local applied state.

use longhaul_core::limits;
use longhaul_core::state::{
    Change, ClusterState, Command, Event, ExclusionReason, InventoryChange, JobRecord,
    LinkMeasurement, Request as StateRequest,
};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::agent_service_client::AgentServiceClient;
use longhaul_proto::v1::agent_service_server::AgentService;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::assignments::assignment_for;
use super::convert::{self, invalid};
use super::forward::{DEFAULT_WAIT, Forwarding, forward, wait_for};
use super::leases::{LeaseError, Leases};
use super::service::{CoordinatorService, async_stream, follow_live, now_unix_ms};

/// The agent-facing service of one replica.
#[derive(Debug, Clone)]
pub struct AgentServiceImpl {
    coordinator: CoordinatorService,
    leases: Leases,
}

type AssignmentStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<pb::Assignment, Status>> + Send>>;
type RoundStream = std::pin::Pin<Box<dyn Stream<Item = Result<pb::RoundEvent, Status>> + Send>>;

impl AgentServiceImpl {
    pub fn new(coordinator: CoordinatorService, leases: Leases) -> Self {
        Self {
            coordinator,
            leases,
        }
    }
}

impl Forwarding for AgentServiceImpl {
    type Client = AgentServiceClient<tonic::transport::Channel>;

    fn leader_client<T>(&self, request: &Request<T>) -> Result<Option<Self::Client>, Status> {
        Ok(self
            .coordinator
            .leader_channel(request)?
            .map(|channel| AgentServiceClient::new(channel).max_decoding_message_size(64 << 20)))
    }
}

/// Refuses a request about `site` from a caller that may not speak for it
/// (see `auth::check_site`).
pub fn check_identity<T>(request: &Request<T>, site: &str) -> Result<(), Status> {
    super::auth::check_site(request, site)
}

fn required_site(site_id: &str) -> Result<(), Status> {
    if site_id.is_empty() {
        return Err(invalid("site_id", "is required"));
    }
    Ok(())
}

/// The most a `LeaveRound` reason may hold: with its prefix it stays
/// within an exclusion message's bound (`limits::MAX_REASON_LEN`).
const MAX_LEAVE_REASON_LEN: usize = 1024;

/// Checks the fields every round report carries.
fn round_report_fields(site_id: &str, job_id: &str, round: u64) -> Result<(), Status> {
    required_site(site_id)?;
    if job_id.is_empty() {
        return Err(invalid("job_id", "is required"));
    }
    if round == 0 {
        return Err(invalid("round", "is required (rounds count from 1)"));
    }
    Ok(())
}

fn lease_status(error: LeaseError) -> Status {
    match error {
        LeaseError::UnknownSite(_) => Status::not_found(error.to_string()),
        LeaseError::SiteDown { .. } | LeaseError::Superseded { .. } => {
            Status::failed_precondition(error.to_string())
        }
        LeaseError::NotLeader | LeaseError::Unconfirmed(_) => {
            Status::unavailable(error.to_string())
        }
    }
}

fn group_change(change: &pb::DomainGroupChange, index: usize) -> Result<InventoryChange, Status> {
    use pb::domain_group_change::Change as C;
    if change.building_id.is_empty() {
        return Err(invalid(
            &format!("changes[{index}].building_id"),
            "is required",
        ));
    }
    match &change.change {
        Some(C::Put(group)) => Ok(InventoryChange::PutGroup {
            building: change.building_id.clone(),
            group: convert::domain_group_from_wire(group),
        }),
        Some(C::RemoveGroupId(id)) if !id.is_empty() => Ok(InventoryChange::RemoveGroup {
            building: change.building_id.clone(),
            group_id: id.clone(),
        }),
        Some(C::RemoveGroupId(_)) => Err(invalid(
            &format!("changes[{index}].remove_group_id"),
            "is empty",
        )),
        None => Err(invalid(
            &format!("changes[{index}]"),
            "sets neither `put` nor `remove_group_id`",
        )),
    }
}

/// The assignments for `site` that the change at `event` implies.
fn assignments_of(event: &Event, site: &str) -> Option<pb::Assignment> {
    match &event.change {
        Change::Job { record } => Some(assignment_for(record, site, event.revision)),
        _ => None,
    }
}

/// Every job currently placed on `site`, at its last revision.
fn current_assignments(state: &ClusterState, site: &str) -> Vec<pb::Assignment> {
    let mut out: Vec<pb::Assignment> = state
        .jobs()
        .map(|job: &JobRecord| assignment_for(job, site, job.revision))
        .filter(|a| !a.removed)
        .collect();
    out.sort_by_key(|a| a.revision);
    out
}

impl AgentServiceImpl {
    /// Stores a round report, or answers a report already stored (the same
    /// report sent again, after an unknown outcome) as it was answered.
    async fn report_round(
        &self,
        command: Command,
        job_id: &str,
        round: u64,
        wait: std::time::Duration,
    ) -> Result<pb::RoundReportResponse, Status> {
        let revision = match self
            .coordinator
            .write(StateRequest::new(command), wait)
            .await
        {
            Ok(revision) => revision,
            // Only a report sent again (the same hash; a measured step that
            // differs is not stored again) is refused as already existing.
            Err(status) if status.code() == tonic::Code::AlreadyExists => {
                self.coordinator.raft().state().read().revision()
            }
            Err(status) => return Err(status),
        };
        let round = self
            .coordinator
            .raft()
            .state()
            .read()
            .round(job_id, round)
            .map(super::rounds::round_to_wire);
        Ok(pb::RoundReportResponse {
            header: Some(self.coordinator.header_at(revision)),
            round,
        })
    }
}

#[tonic::async_trait]
impl AgentService for AgentServiceImpl {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let body = request.get_ref();
        required_site(&body.site_id)?;
        check_identity(&request, &body.site_id)?;
        let inventory = body
            .inventory
            .as_ref()
            .ok_or_else(|| invalid("inventory", "is required"))?;
        if inventory.id != body.site_id {
            return Err(invalid(
                "inventory.id",
                format!(
                    "is {} but the request is for site {}",
                    limits::quote(&inventory.id),
                    limits::quote(&body.site_id)
                ),
            ));
        }
        let site = convert::site_from_wire(inventory, "inventory")?;
        if !body.data_address.is_empty() {
            body.data_address
                .parse::<std::net::SocketAddr>()
                .map_err(|e| invalid("data_address", format!("not a host:port address: {e}")))?;
        }
        forward!(self, request, register);
        let wait = wait_for(&request, DEFAULT_WAIT);
        let started = std::time::Instant::now();
        let body = request.into_inner();
        let ttl = self.leases.ttl();
        let register = |lease_id| {
            StateRequest::new(Command::RegisterSite {
                site: site.clone(),
                data_address: body.data_address.clone(),
                at_unix_ms: now_unix_ms(),
                lease_id,
                lease_ttl_ms: ttl.as_millis() as u64,
            })
        };
        // No lease is granted for a registration that will be refused.
        self.coordinator.admit(&register(0), wait).await?;
        let lease_id = self.leases.grant().map_err(lease_status)?;
        let revision = self
            .coordinator
            .write_admitted(register(lease_id), wait)
            .await?;
        // Acknowledged as a renewal is (see `leases.rs`).
        self.leases
            .confirm(wait.saturating_sub(started.elapsed()))
            .await
            .map_err(lease_status)?;
        metrics::counter!("longhaul_site_registrations_total").increment(1);
        tracing::info!(site = %body.site_id, lease_id, revision, "site registered");
        Ok(Response::new(pb::RegisterResponse {
            header: Some(self.coordinator.header_at(revision)),
            lease_id,
            lease_ttl_ms: ttl.as_millis() as u64,
        }))
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        let body = request.get_ref();
        required_site(&body.site_id)?;
        check_identity(&request, &body.site_id)?;
        if body.lease_id == 0 {
            return Err(invalid("lease_id", "is required"));
        }
        forward!(self, request, keep_alive);
        let wait = wait_for(&request, DEFAULT_WAIT);
        let body = request.into_inner();
        let ttl = self
            .leases
            .keep_alive(&body.site_id, body.lease_id, wait)
            .await
            .map_err(lease_status)?;
        let header = self.coordinator.header();
        Ok(Response::new(pb::KeepAliveResponse {
            lease_ttl_ms: ttl.as_millis() as u64,
            leader_id: header.member_id,
            leader_url: self
                .coordinator
                .leader_url(header.member_id)
                .unwrap_or_default(),
            header: Some(header),
        }))
    }

    async fn report_inventory_delta(
        &self,
        request: Request<pb::InventoryDeltaRequest>,
    ) -> Result<Response<pb::InventoryDeltaResponse>, Status> {
        let body = request.get_ref();
        required_site(&body.site_id)?;
        check_identity(&request, &body.site_id)?;
        if body.lease_id == 0 {
            return Err(invalid("lease_id", "is required"));
        }
        if body.changes.is_empty() {
            return Err(invalid("changes", "is empty"));
        }
        let changes = body
            .changes
            .iter()
            .enumerate()
            .map(|(i, c)| group_change(c, i))
            .collect::<Result<Vec<_>, _>>()?;
        forward!(self, request, report_inventory_delta);
        let wait = wait_for(&request, DEFAULT_WAIT);
        let body = request.into_inner();
        let revision = self
            .coordinator
            .write(
                StateRequest::new(Command::UpdateInventory {
                    site_id: body.site_id,
                    lease_id: body.lease_id,
                    changes,
                    at_unix_ms: now_unix_ms(),
                }),
                wait,
            )
            .await?;
        Ok(Response::new(pb::InventoryDeltaResponse {
            header: Some(self.coordinator.header_at(revision)),
        }))
    }

    type WatchAssignmentsStream = AssignmentStream;

    async fn watch_assignments(
        &self,
        request: Request<pb::WatchAssignmentsRequest>,
    ) -> Result<Response<Self::WatchAssignmentsStream>, Status> {
        let body = request.get_ref();
        required_site(&body.site_id)?;
        check_identity(&request, &body.site_id)?;
        let body = request.into_inner();
        let site = body.site_id;
        let raft = self.coordinator.raft().clone();
        // Subscribe before reading, so nothing falls between.
        let live = raft.subscribe();
        let (backlog, last) = {
            let state = raft.state().read();
            if body.after_revision == 0 {
                (current_assignments(&state, &site), state.revision())
            } else {
                let events = state
                    .events_after(body.after_revision)
                    .map_err(|e| Status::out_of_range(format!("field `after_revision`: {e}")))?;
                let backlog = events
                    .iter()
                    .filter_map(|e| assignments_of(e, &site))
                    .collect();
                (backlog, state.revision().max(body.after_revision))
            }
        };
        let state = raft.state().clone();
        let sync_point = pb::Assignment {
            revision: last,
            sync_point: true,
            ..pb::Assignment::default()
        };
        let stream = async_stream(move |tx| async move {
            for assignment in backlog.into_iter().chain([sync_point]) {
                if tx.send(Ok(assignment)).await.is_err() {
                    return;
                }
            }
            follow_live(live, state, last, &tx, |event| assignments_of(event, &site)).await;
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn report_link_probe(
        &self,
        request: Request<pb::LinkProbeReport>,
    ) -> Result<Response<pb::LinkProbeAck>, Status> {
        let body = request.get_ref();
        required_site(&body.site_id)?;
        check_identity(&request, &body.site_id)?;
        if body.peer_site_id.is_empty() {
            return Err(invalid("peer_site_id", "is required"));
        }
        if body.peer_site_id == body.site_id {
            return Err(invalid("peer_site_id", "is the reporting site itself"));
        }
        let m = body
            .measurement
            .as_ref()
            .ok_or_else(|| invalid("measurement", "is required"))?;
        if !(m.loss_rate.is_finite() && (0.0..=1.0).contains(&m.loss_rate)) {
            return Err(invalid(
                "measurement.loss_rate",
                format!("must be a probability in [0, 1], found {}", m.loss_rate),
            ));
        }
        forward!(self, request, report_link_probe);
        let wait = wait_for(&request, DEFAULT_WAIT);
        let body = request.into_inner();
        let m = body.measurement.unwrap_or_default();
        let revision = self
            .coordinator
            .write(
                StateRequest::new(Command::RecordLinkMeasurement {
                    site_a: body.site_id,
                    site_b: body.peer_site_id,
                    measurement: LinkMeasurement {
                        rtt_ns: m.rtt_ns,
                        loss_rate: m.loss_rate,
                        throughput_bps: m.throughput_bps,
                        measured_at_unix_ms: m.measured_at_unix_ms,
                    },
                }),
                wait,
            )
            .await?;
        Ok(Response::new(pb::LinkProbeAck {
            header: Some(self.coordinator.header_at(revision)),
        }))
    }

    async fn report_contributed(
        &self,
        request: Request<pb::ReportContributedRequest>,
    ) -> Result<Response<pb::RoundReportResponse>, Status> {
        let body = request.get_ref();
        round_report_fields(&body.site_id, &body.job_id, body.round)?;
        check_identity(&request, &body.site_id)?;
        forward!(self, request, report_contributed);
        let wait = wait_for(&request, DEFAULT_WAIT);
        let body = request.into_inner();
        let command = Command::ReportContributed {
            job_id: body.job_id.clone(),
            round: body.round,
            site_id: body.site_id,
            fragment: body.fragment,
            at_unix_ms: now_unix_ms(),
        };
        let response = self
            .report_round(command, &body.job_id, body.round, wait)
            .await?;
        Ok(Response::new(response))
    }

    async fn report_applied(
        &self,
        request: Request<pb::ReportAppliedRequest>,
    ) -> Result<Response<pb::RoundReportResponse>, Status> {
        let body = request.get_ref();
        round_report_fields(&body.site_id, &body.job_id, body.round)?;
        if body.hash.is_empty() {
            return Err(invalid("hash", "is required"));
        }
        check_identity(&request, &body.site_id)?;
        forward!(self, request, report_applied);
        let wait = wait_for(&request, DEFAULT_WAIT);
        let body = request.into_inner();
        let command = Command::ReportApplied {
            job_id: body.job_id.clone(),
            round: body.round,
            site_id: body.site_id,
            fragment: body.fragment,
            hash: body.hash,
            at_unix_ms: now_unix_ms(),
            inner_step_us: body.inner_step_us,
        };
        let response = self
            .report_round(command, &body.job_id, body.round, wait)
            .await?;
        Ok(Response::new(response))
    }

    async fn leave_round(
        &self,
        request: Request<pb::LeaveRoundRequest>,
    ) -> Result<Response<pb::RoundReportResponse>, Status> {
        let body = request.get_ref();
        round_report_fields(&body.site_id, &body.job_id, body.round)?;
        if body.reason.is_empty() {
            return Err(invalid("reason", "is required"));
        }
        if body.reason.len() > MAX_LEAVE_REASON_LEN {
            return Err(invalid(
                "reason",
                format!(
                    "is {} bytes, more than the {MAX_LEAVE_REASON_LEN} allowed",
                    body.reason.len(),
                ),
            ));
        }
        if body.reason.chars().any(char::is_control) {
            return Err(invalid(
                "reason",
                "holds a control character; it is stored in the round's record",
            ));
        }
        check_identity(&request, &body.site_id)?;
        forward!(self, request, leave_round);
        let wait = wait_for(&request, DEFAULT_WAIT);
        let body = request.into_inner();
        let command = Command::ExcludeParticipant {
            job_id: body.job_id.clone(),
            round: body.round,
            site_id: body.site_id,
            reason: ExclusionReason::SatOut,
            message: format!("its agent sits the round out: {}", body.reason),
            at_unix_ms: now_unix_ms(),
        };
        let response = self
            .report_round(command, &body.job_id, body.round, wait)
            .await?;
        Ok(Response::new(response))
    }

    type WatchRoundsStream = RoundStream;

    async fn watch_rounds(
        &self,
        request: Request<pb::WatchRoundsRequest>,
    ) -> Result<Response<Self::WatchRoundsStream>, Status> {
        let body = request.get_ref();
        required_site(&body.site_id)?;
        check_identity(&request, &body.site_id)?;
        let body = request.into_inner();
        let site = body.site_id;
        let raft = self.coordinator.raft().clone();
        // Subscribe before reading, so nothing falls between.
        let live = raft.subscribe();
        let (backlog, last) = {
            let state = raft.state().read();
            if body.after_revision == 0 {
                let open = state
                    .open_rounds()
                    .filter(|r| r.participant(&site).is_some())
                    .map(|r| pb::RoundEvent {
                        revision: r.revision,
                        round: Some(super::rounds::round_to_wire(r)),
                        sync_point: false,
                        report: None,
                    })
                    .collect::<Vec<_>>();
                (open, state.revision())
            } else {
                let events = state
                    .events_after(body.after_revision)
                    .map_err(|e| Status::out_of_range(format!("field `after_revision`: {e}")))?;
                let backlog = events
                    .iter()
                    .filter_map(|e| super::rounds::round_event_for(e, &site, &state))
                    .collect();
                (backlog, state.revision().max(body.after_revision))
            }
        };
        let state = raft.state().clone();
        let sync_point = pb::RoundEvent {
            revision: last,
            round: None,
            sync_point: true,
            report: None,
        };
        let stream = async_stream(move |tx| async move {
            for event in backlog.into_iter().chain([sync_point]) {
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            let reader = state.clone();
            follow_live(live, state, last, &tx, |event| {
                super::rounds::round_event_for(event, &site, &reader.read())
            })
            .await;
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
