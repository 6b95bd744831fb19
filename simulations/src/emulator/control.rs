//! `longhaul.v1.EmulatorControl`: the emulator's gRPC control API.
//!
//! Requests are validated here (empty or out-of-range fields are
//! `INVALID_ARGUMENT` naming the field; unknown sites and links are
//! `NOT_FOUND`); [`EmulatorError`] becomes a `tonic::Status` in one place.

use std::future::Future;
use std::net::SocketAddr;

use longhaul_proto::v1 as pb;
use longhaul_proto::v1::emulator_control_server::{EmulatorControl, EmulatorControlServer};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use super::{Emulator, EmulatorError, LinkChange, PipeStatus};

impl From<EmulatorError> for Status {
    fn from(error: EmulatorError) -> Self {
        let message = error.to_string();
        match error {
            EmulatorError::UnknownLink { .. } | EmulatorError::UnknownSite { .. } => {
                Status::not_found(message)
            }
            EmulatorError::InvalidArgument { .. } | EmulatorError::LinkConfig { .. } => {
                Status::invalid_argument(message)
            }
            EmulatorError::PacketModeUnavailable { .. } => Status::failed_precondition(message),
            EmulatorError::Io { .. } | EmulatorError::Command { .. } => Status::internal(message),
        }
    }
}

/// The service over one emulator.
#[derive(Debug, Clone)]
pub struct ControlService {
    emulator: Emulator,
}

impl ControlService {
    pub fn new(emulator: Emulator) -> Self {
        Self { emulator }
    }

    pub fn into_server(self) -> EmulatorControlServer<Self> {
        EmulatorControlServer::new(self)
    }
}

/// Serves the control API on `listen` until `shutdown` completes. Returns
/// the bound address and the serving future.
pub async fn serve(
    emulator: Emulator,
    listen: SocketAddr,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<
    (
        SocketAddr,
        impl Future<Output = Result<(), tonic::transport::Error>>,
    ),
    EmulatorError,
> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| EmulatorError::Io {
            what: format!("cannot listen for the control API on {listen}"),
            source,
        })?;
    let address = listener.local_addr().map_err(|source| EmulatorError::Io {
        what: format!("cannot read the control API address {listen}"),
        source,
    })?;
    let server = tonic::transport::Server::builder()
        .add_service(ControlService::new(emulator).into_server())
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown);
    Ok((address, server))
}

/// The wire form of a link direction's status.
pub fn status_message(status: &PipeStatus) -> pb::EmulatorLinkDirectionStatus {
    pb::EmulatorLinkDirectionStatus {
        id: status.id(),
        from_site: status.from.clone(),
        to_site: status.to.clone(),
        seed: status.seed,
        rate_bits_per_second: status.rate_bits_per_second,
        one_way_delay_ns: status.one_way_ns,
        extra_delay_ns: status.extra_delay_ns,
        jitter_max_ns: status.jitter_ns.unwrap_or(0),
        loss: status.loss,
        buffer_bytes: status.buffer_bytes,
        down: status.down,
        packets_in: status.stats.packets_in,
        bytes_in: status.stats.bytes_in,
        packets_delivered: status.stats.packets_delivered,
        bytes_delivered: status.stats.bytes_delivered,
        drops: Some(pb::EmulatorDropCounts {
            queue: status.stats.drops.queue,
            loss: status.stats.drops.loss,
            down: status.stats.drops.down,
            trace: status.stats.drops.trace,
            host: status.host_drops,
            kernel: status.kernel_drops,
        }),
        queue_high_water_bytes: status.stats.queue_high_water_bytes,
        retransmissions: status.retransmissions,
        release_lateness: Some(pb::EmulatorLateness {
            samples: status.lateness.samples,
            p50_us: status.lateness.p50_us,
            p99_us: status.lateness.p99_us,
            max_us: status.lateness.max_us,
        }),
    }
}

fn required<'a>(field: &'static str, value: &'a str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!(
            "`{field}` is required: name a site of the scenario"
        )))
    } else {
        Ok(value)
    }
}

/// Checks a change's fields; the link model checks the rest.
fn change_of(request: &pb::EmulatorSetLinkRequest) -> Result<LinkChange, Status> {
    if request.rate_bits_per_second == Some(0) {
        return Err(Status::invalid_argument(
            "`rate_bits_per_second` must be a positive rate, found 0",
        ));
    }
    if let Some(loss) = request.loss {
        // NaN fails the comparison too.
        if !(0.0..1.0).contains(&loss) {
            return Err(Status::invalid_argument(format!(
                "`loss` must be a probability in [0, 1), found {loss}"
            )));
        }
    }
    let change = LinkChange {
        rate_bits_per_second: request.rate_bits_per_second,
        loss: request.loss,
        extra_delay_ns: request.extra_delay_ns,
    };
    if change.is_empty() {
        return Err(Status::invalid_argument(
            "nothing to change: set at least one of `rate_bits_per_second`, `loss`, `extra_delay_ns`",
        ));
    }
    Ok(change)
}

fn peer(value: &str) -> Option<&str> {
    (!value.is_empty()).then_some(value)
}

#[tonic::async_trait]
impl EmulatorControl for ControlService {
    async fn list_links(
        &self,
        _request: Request<pb::EmulatorListLinksRequest>,
    ) -> Result<Response<pb::EmulatorListLinksResponse>, Status> {
        Ok(Response::new(pb::EmulatorListLinksResponse {
            seed: self.emulator.seed(),
            links: self
                .emulator
                .statuses()
                .iter()
                .map(status_message)
                .collect(),
        }))
    }

    async fn set_link(
        &self,
        request: Request<pb::EmulatorSetLinkRequest>,
    ) -> Result<Response<pb::EmulatorSetLinkResponse>, Status> {
        let request = request.into_inner();
        let site_a = required("site_a", &request.site_a)?;
        let site_b = required("site_b", &request.site_b)?;
        let change = change_of(&request)?;
        let statuses = self
            .emulator
            .set(site_a, site_b, request.one_way, &change)?;
        Ok(Response::new(pb::EmulatorSetLinkResponse {
            links: statuses.iter().map(status_message).collect(),
        }))
    }

    async fn cut(
        &self,
        request: Request<pb::EmulatorCutRequest>,
    ) -> Result<Response<pb::EmulatorCutResponse>, Status> {
        let request = request.into_inner();
        let site = required("site", &request.site)?;
        let link_ids = self.emulator.set_down(site, peer(&request.peer), true)?;
        Ok(Response::new(pb::EmulatorCutResponse { link_ids }))
    }

    async fn heal(
        &self,
        request: Request<pb::EmulatorHealRequest>,
    ) -> Result<Response<pb::EmulatorHealResponse>, Status> {
        let request = request.into_inner();
        let site = required("site", &request.site)?;
        let link_ids = self.emulator.set_down(site, peer(&request.peer), false)?;
        Ok(Response::new(pb::EmulatorHealResponse { link_ids }))
    }
}
