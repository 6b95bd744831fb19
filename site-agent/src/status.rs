//! The agent's local `longhaul.v1.SiteAgent` service: what `site-agent
//! status` shows, and probes on demand.

use std::time::Duration;

use longhaul_proto::v1 as pb;
use longhaul_proto::v1::site_agent_server::SiteAgent;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::agent::{SharedStatus, lock};

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
