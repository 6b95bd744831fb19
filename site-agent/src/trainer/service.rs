//! The gRPC face of the [`TrainerHub`]: one conversion of its refusals to a
//! `tonic::Status`, and the listeners (a Unix socket, or TCP loopback).

use std::sync::Arc;

use longhaul_proto::v1 as pb;
use longhaul_proto::v1::trainer_server::{Trainer, TrainerServer};
use tonic::{Request, Response, Status};

use super::{TrainerError, TrainerHub};

/// Largest request the service reads (requests name tensors; they do not
/// carry them).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

impl From<TrainerError> for Status {
    fn from(error: TrainerError) -> Status {
        let message = error.to_string();
        match error {
            TrainerError::Invalid { .. } => Status::invalid_argument(message),
            TrainerError::NotFound { .. } => Status::not_found(message),
            TrainerError::NotOwned { .. } => Status::permission_denied(message),
            TrainerError::AlreadyExists { .. } => Status::already_exists(message),
            TrainerError::Over { .. } => Status::failed_precondition(message),
            TrainerError::Timeout { .. } => Status::deadline_exceeded(message),
            TrainerError::Exhausted { .. } => Status::resource_exhausted(message),
        }
    }
}

/// The user a request speaks for: the peer of its Unix socket
/// (`SO_PEERCRED`), or the agent's own user over TCP loopback, which
/// carries no credentials.
fn caller<T>(request: &Request<T>) -> u32 {
    request
        .extensions()
        .get::<tonic::transport::server::UdsConnectInfo>()
        .and_then(|info| info.peer_cred)
        .map_or_else(super::shm::own_uid, |cred| cred.uid())
}

/// The service over a shared hub.
#[derive(Debug, Clone)]
pub struct TrainerService {
    hub: Arc<TrainerHub>,
}

impl TrainerService {
    pub fn new(hub: Arc<TrainerHub>) -> Self {
        Self { hub }
    }

    /// The tonic server, with its request size bound.
    pub fn server(self) -> TrainerServer<TrainerService> {
        TrainerServer::new(self).max_decoding_message_size(MAX_REQUEST_BYTES)
    }
}

#[tonic::async_trait]
impl Trainer for TrainerService {
    async fn describe(
        &self,
        _request: Request<pb::TrainerDescribeRequest>,
    ) -> Result<Response<pb::TrainerDescribeResponse>, Status> {
        Ok(Response::new(self.hub.describe()))
    }

    async fn join(
        &self,
        request: Request<pb::TrainerJoinRequest>,
    ) -> Result<Response<pb::TrainerJoinResponse>, Status> {
        Ok(Response::new(self.hub.join(request.get_ref())?))
    }

    async fn leave(
        &self,
        request: Request<pb::TrainerLeaveRequest>,
    ) -> Result<Response<pb::TrainerLeaveResponse>, Status> {
        self.hub.leave(&request.get_ref().session)?;
        Ok(Response::new(pb::TrainerLeaveResponse {}))
    }

    async fn get_schedule(
        &self,
        request: Request<pb::TrainerScheduleRequest>,
    ) -> Result<Response<pb::TrainerSchedule>, Status> {
        Ok(Response::new(
            self.hub.schedule(&request.get_ref().session)?,
        ))
    }

    async fn report_progress(
        &self,
        request: Request<pb::TrainerProgressRequest>,
    ) -> Result<Response<pb::TrainerSchedule>, Status> {
        Ok(Response::new(self.hub.progress(request.get_ref())?))
    }

    async fn submit(
        &self,
        request: Request<pb::TrainerSubmitRequest>,
    ) -> Result<Response<pb::TrainerSubmitResponse>, Status> {
        let hub = Arc::clone(&self.hub);
        let caller = caller(&request);
        let request = request.into_inner();
        // Reading up to 1 GiB from shared memory is blocking work.
        let elements = tokio::task::spawn_blocking(move || hub.submit(&request, caller))
            .await
            .map_err(|error| Status::internal(format!("submit stopped: {error}")))??;
        Ok(Response::new(pb::TrainerSubmitResponse { elements }))
    }

    async fn collect(
        &self,
        request: Request<pb::TrainerCollectRequest>,
    ) -> Result<Response<pb::TrainerCollectResponse>, Status> {
        let caller = caller(&request);
        Ok(Response::new(
            self.hub.collect(request.get_ref(), caller).await?,
        ))
    }

    async fn publish_state(
        &self,
        request: Request<pb::TrainerPublishStateRequest>,
    ) -> Result<Response<pb::TrainerPublishStateResponse>, Status> {
        let hub = Arc::clone(&self.hub);
        let caller = caller(&request);
        let request = request.into_inner();
        // Reading the state from shared memory is blocking work.
        let elements = tokio::task::spawn_blocking(move || hub.publish_state(&request, caller))
            .await
            .map_err(|error| Status::internal(format!("publish stopped: {error}")))??;
        Ok(Response::new(pb::TrainerPublishStateResponse { elements }))
    }

    async fn catch_up(
        &self,
        request: Request<pb::TrainerCatchUpRequest>,
    ) -> Result<Response<pb::TrainerCatchUpResponse>, Status> {
        let caller = caller(&request);
        Ok(Response::new(
            self.hub.catch_up(request.get_ref(), caller).await?,
        ))
    }
}
