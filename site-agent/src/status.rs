//! What `site-agent status` shows: the status board the agent's tasks keep
//! current, and the local `longhaul.v1.SiteAgent` service that serves it
//! and runs probes on demand.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use longhaul_proto::v1 as pb;
use longhaul_proto::v1::site_agent_server::SiteAgent;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::inventory::Inventory;
use crate::store::JobRecord;

/// What `site-agent status` shows, kept current by the tasks.
#[derive(Debug, Default)]
pub struct StatusBoard {
    pub lease_id: u64,
    pub lease_ttl: Duration,
    pub registered: bool,
    pub last_renewal: Option<Instant>,
    pub leader_id: u64,
    pub endpoint: String,
    pub last_revision: u64,
    pub inventory: Option<Inventory>,
    pub inventory_source: String,
    pub jobs: BTreeMap<String, JobRecord>,
    pub probes: Vec<pb::PeerProbe>,
    pub renewals: u64,
    pub reconnects: u64,
    pub plaintext: bool,
    /// Revisions of the assignments acted on in this run (the last 256).
    pub handled_revisions: VecDeque<u64>,
    /// Fragments exchanged and applied in this run (the last 8192).
    pub exchanges: VecDeque<pb::FragmentExchange>,
}

/// How many exchanged fragments the status keeps.
const EXCHANGES_KEPT: usize = 8192;

/// How many handled revisions the status keeps.
const HANDLED_KEPT: usize = 256;

pub type SharedStatus = Arc<Mutex<StatusBoard>>;

pub fn lock(status: &SharedStatus) -> MutexGuard<'_, StatusBoard> {
    status.lock().unwrap_or_else(PoisonError::into_inner)
}

impl StatusBoard {
    /// Notes that the assignment of `revision` was acted on, keeping the
    /// last [`HANDLED_KEPT`].
    pub fn record_handled(&mut self, revision: u64) {
        self.handled_revisions.push_back(revision);
        while self.handled_revisions.len() > HANDLED_KEPT {
            self.handled_revisions.pop_front();
        }
    }

    /// Notes a fragment exchanged and applied, keeping the last
    /// [`EXCHANGES_KEPT`].
    pub fn record_exchange(&mut self, exchange: pb::FragmentExchange) {
        if self.exchanges.len() == EXCHANGES_KEPT {
            self.exchanges.pop_front();
        }
        self.exchanges.push_back(exchange);
    }

    /// The board as the status service returns it.
    pub fn to_wire(&self, site_id: &str) -> pb::AgentStatus {
        let since = self
            .last_renewal
            .map_or(0, |t| t.elapsed().as_millis() as u64);
        let lease_state = if !self.registered {
            pb::LeaseState::Registering
        } else if self
            .last_renewal
            .is_some_and(|t| t.elapsed() > self.lease_ttl)
        {
            pb::LeaseState::Lapsed
        } else {
            pb::LeaseState::Held
        };
        let inventory = self.inventory.as_ref().map(|inv| pb::InventorySummary {
            source: self.inventory_source.clone(),
            buildings: inv.site.buildings.len() as u32,
            domains: inv
                .site
                .buildings
                .iter()
                .flat_map(|b| &b.domains)
                .map(|g| g.count)
                .sum(),
            nodes: inv.nodes.len() as u64,
            gpus: inv.site.gpus(),
            unmapped: inv
                .unmapped
                .iter()
                .map(|u| format!("{}: {}", u.object, u.reason))
                .collect(),
        });
        pb::AgentStatus {
            site_id: site_id.to_string(),
            lease_state: lease_state as i32,
            lease_id: self.lease_id,
            lease_ttl_ms: self.lease_ttl.as_millis() as u64,
            since_last_renewal_ms: since,
            leader_id: self.leader_id,
            coordinator_endpoint: self.endpoint.clone(),
            last_revision: self.last_revision,
            inventory,
            probes: self.probes.clone(),
            assignments: self
                .jobs
                .iter()
                .map(|(job, r)| pb::AssignmentSummary {
                    job_id: job.clone(),
                    revision: r.revision,
                    ranks: r.ranks as u32,
                    rendered_files: r
                        .rendered_files
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect(),
                    submitted_as: r.submitted_as.clone().unwrap_or_default(),
                })
                .collect(),
            renewals: self.renewals,
            reconnects: self.reconnects,
            plaintext: self.plaintext,
            handled_revisions: self.handled_revisions.iter().copied().collect(),
            exchanges: self.exchanges.iter().cloned().collect(),
        }
    }
}

/// Asks the prober to probe every peer now; answered with the results.
pub type ProbeTrigger = mpsc::Sender<oneshot::Sender<Vec<pb::PeerProbe>>>;

#[derive(Debug, Clone)]
pub struct StatusService {
    site_id: String,
    status: SharedStatus,
    probes: Option<ProbeTrigger>,
    probe_timeout: Duration,
}

impl StatusService {
    pub fn new(
        site_id: String,
        status: SharedStatus,
        probes: Option<ProbeTrigger>,
        probe_timeout: Duration,
    ) -> Self {
        Self {
            site_id,
            status,
            probes,
            probe_timeout,
        }
    }
}

#[tonic::async_trait]
impl SiteAgent for StatusService {
    async fn get_status(
        &self,
        _request: Request<pb::GetAgentStatusRequest>,
    ) -> Result<Response<pb::AgentStatus>, Status> {
        Ok(Response::new(lock(&self.status).to_wire(&self.site_id)))
    }

    async fn probe_now(
        &self,
        _request: Request<pb::ProbeNowRequest>,
    ) -> Result<Response<pb::ProbeNowResponse>, Status> {
        let Some(trigger) = &self.probes else {
            return Err(Status::failed_precondition(
                "probes are not configured on this agent (no [probe] section or no peers)",
            ));
        };
        let (reply, answer) = oneshot::channel();
        trigger
            .send(reply)
            .await
            .map_err(|_| Status::unavailable("the prober has stopped"))?;
        match tokio::time::timeout(self.probe_timeout, answer).await {
            Ok(Ok(probes)) => Ok(Response::new(pb::ProbeNowResponse { probes })),
            Ok(Err(_)) => Err(Status::unavailable("the prober dropped the request")),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "probes did not finish within {} ms",
                self.probe_timeout.as_millis()
            ))),
        }
    }
}
