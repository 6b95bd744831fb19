//! What both gRPC services (`service.rs`, `agent_service.rs`) do before and around a wait on
//! consensus: forward a write to the leader, once, and bound every wait by the client's
//! deadline (`grpc-timeout`) capped by the server's.
//!
//! A follower forwards with the `forward!` macro, through the service's [`Forwarding`] client;
//! the forwarded request carries [`FORWARDED`], so the replica that receives it does not
//! forward it again, and the caller's deadline (capped by the server's) as its own. How a
//! refused command or a consensus error becomes a `tonic::Status` is decided in `convert.rs`,
//! not here.

use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use super::raft_loop::{ConsensusError, RaftHandle, Role};
use super::transport::PeerBook;

/// Metadata key set on forwarded requests, so a request is forwarded once.
pub(super) const FORWARDED: &str = "x-longhaul-forwarded";

/// The default bound on a wait for consensus when the client sets no deadline.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

/// A service whose writes a follower forwards to the leader (see `forward!`).
pub(super) trait Forwarding {
    /// The generated gRPC client of the service.
    type Client;

    /// A client for the leader when this replica is not it (`None` when it is); see
    /// [`leader_channel`].
    fn leader_client<T>(&self, request: &Request<T>) -> Result<Option<Self::Client>, Status>;

    /// The server's bound on a wait when the client sets no deadline.
    fn default_wait(&self) -> Duration {
        DEFAULT_WAIT
    }
}

/// Forwards `$request` to the leader, once, through `$service`'s [`Forwarding`] client method
/// `$method`, and returns the leader's answer; does nothing on the leader.
macro_rules! forward {
    ($service:ident, $request:ident, $method:ident) => {
        if let Some(mut client) =
            $crate::server::forward::Forwarding::leader_client($service, &$request)?
        {
            let wait = $crate::server::forward::wait_for(
                &$request,
                $crate::server::forward::Forwarding::default_wait($service),
            );
            return client
                .$method($crate::server::forward::forwarded($request, wait))
                .await;
        }
    };
}
pub(super) use forward;

/// The request to send to the leader: the same body, the caller's deadline `wait`, and
/// marked as forwarded.
pub(super) fn forwarded<T>(request: Request<T>, wait: Duration) -> Request<T> {
    let mut forwarded = Request::new(request.into_inner());
    forwarded.set_timeout(wait);
    forwarded
        .metadata_mut()
        .insert(FORWARDED, MetadataValue::from_static("1"));
    forwarded
}

/// The channel to the current leader, kept between forwarded requests: one HTTP/2 connection
/// carries them all, instead of a connection (and a TLS handshake) per request. It is replaced
/// when the leader, or its address, changes.
#[derive(Debug, Clone, Default)]
pub(super) struct LeaderChannel {
    cached: std::sync::Arc<std::sync::Mutex<Option<(String, Channel)>>>,
}

impl LeaderChannel {
    fn to(
        &self,
        url: &str,
        connect: impl FnOnce() -> Result<Channel, Status>,
    ) -> Result<Channel, Status> {
        let mut cached = self
            .cached
            .lock()
            .map_err(|_| Status::internal("the leader channel's lock is poisoned"))?;
        if let Some((cached_url, channel)) = cached.as_ref()
            && cached_url == url
        {
            return Ok(channel.clone());
        }
        let channel = connect()?;
        *cached = Some((url.to_string(), channel.clone()));
        Ok(channel)
    }
}

/// A channel to the leader when this replica is not it (`None` when it is). A request already
/// forwarded once is not forwarded again.
pub(super) fn leader_channel<T>(
    raft: &RaftHandle,
    peers: &PeerBook,
    tls: Option<&ClientTlsConfig>,
    cache: &LeaderChannel,
    request: &Request<T>,
) -> Result<Option<Channel>, Status> {
    let status = raft.status();
    if status.role == Role::Leader {
        return Ok(None);
    }
    if request.metadata().contains_key(FORWARDED) {
        return Err(Status::unavailable(
            "this replica is not the leader and the request was already forwarded once; retry",
        ));
    }
    if status.leader_id == 0 {
        return Err(Status::unavailable(ConsensusError::NoLeader.to_string()));
    }
    let url = peers.get(status.leader_id).ok_or_else(|| {
        Status::unavailable(format!(
            "leader {} has no known address; retry",
            status.leader_id
        ))
    })?;
    let channel = cache.to(&url, || {
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| Status::internal(format!("leader address: {e}")))?
            .connect_timeout(Duration::from_secs(1))
            // The channel is kept: a path that died silently is noticed in seconds, not at
            // the kernel's retransmission timeout, and the channel reconnects.
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .tcp_keepalive(Some(Duration::from_secs(10)));
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| Status::internal(format!("leader TLS: {e}")))?;
        }
        Ok(endpoint.connect_lazy())
    })?;
    Ok(Some(channel))
}

/// Bounds a wait; the message says what was waited for.
pub(super) async fn bounded<T>(
    wait: Duration,
    what: &str,
    future: impl Future<Output = Result<T, ConsensusError>>,
) -> Result<T, Status> {
    match tokio::time::timeout(wait, future).await {
        Ok(result) => result.map_err(Status::from),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "{what} did not complete within {} ms (no quorum reachable?)",
            wait.as_millis()
        ))),
    }
}

/// The client's deadline (`grpc-timeout`), capped by the server's bound `default`.
pub(super) fn wait_for<T>(request: &Request<T>, default: Duration) -> Duration {
    request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .map_or(default, |client| client.min(default))
}

/// A `grpc-timeout` value: an integer and one unit letter (gRPC over HTTP/2).
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    // ASCII digits and a one-letter unit (the gRPC spec allows 8 digits;
    // more are read, saturating); anything else is ignored, and the
    // server's own bound applies. Never a panic, whatever a client sends.
    if !value.is_ascii() || value.len() < 2 {
        return None;
    }
    let (number, unit) = value.split_at(value.len() - 1);
    let number: u64 = number.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(number.saturating_mul(3600)),
        "M" => Duration::from_secs(number.saturating_mul(60)),
        "S" => Duration::from_secs(number),
        "m" => Duration::from_millis(number),
        "u" => Duration::from_micros(number),
        "n" => Duration::from_nanos(number),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(grpc_timeout: Option<&str>, expected: Duration) {
        let mut request = Request::new(());
        if let Some(value) = grpc_timeout {
            request.metadata_mut().insert(
                "grpc-timeout",
                value.parse().expect("test values are valid metadata"),
            );
        }
        assert_eq!(
            wait_for(&request, DEFAULT_WAIT),
            expected,
            "grpc-timeout {grpc_timeout:?}"
        );
    }

    #[test]
    fn the_clients_deadline_bounds_the_wait_up_to_the_servers() {
        check(None, DEFAULT_WAIT);
        check(Some("250m"), Duration::from_millis(250));
        check(Some("2S"), Duration::from_secs(2));
        check(Some("1500000u"), Duration::from_micros(1_500_000));
        check(Some("700000000n"), Duration::from_millis(700));
        check(Some("1M"), DEFAULT_WAIT);
        check(Some("1H"), DEFAULT_WAIT);
        check(Some("0m"), Duration::ZERO);
        // What cannot be read leaves the server's bound.
        check(Some(""), DEFAULT_WAIT);
        check(Some("m"), DEFAULT_WAIT);
        check(Some("5x"), DEFAULT_WAIT);
        check(Some("-5S"), DEFAULT_WAIT);
        // Absurd values saturate to the server's bound instead of
        // overflowing; a non-ASCII one is ignored.
        check(Some("99999999999999999H"), DEFAULT_WAIT);
        check(Some("18446744073709551615M"), DEFAULT_WAIT);
    }

    #[test]
    fn a_forwarded_request_is_marked_and_carries_the_deadline() {
        let forwarded = forwarded(Request::new(7u32), Duration::from_millis(300));
        assert!(forwarded.metadata().contains_key(FORWARDED));
        assert_eq!(
            wait_for(&forwarded, DEFAULT_WAIT),
            Duration::from_millis(300)
        );
        assert_eq!(forwarded.into_inner(), 7);
    }

    #[tokio::test]
    async fn forwarded_requests_share_one_channel_until_the_leader_moves() {
        let cache = LeaderChannel::default();
        let mut connects = 0;
        let mut connect = |url: &str| {
            connects += 1;
            let url = url.to_string();
            move || Ok(Endpoint::from_shared(url).unwrap().connect_lazy())
        };
        cache
            .to("http://127.0.0.1:1", connect("http://127.0.0.1:1"))
            .unwrap();
        cache
            .to("http://127.0.0.1:1", || panic!("connected again"))
            .unwrap();
        cache
            .to("http://127.0.0.1:2", connect("http://127.0.0.1:2"))
            .unwrap();
        cache
            .to("http://127.0.0.1:2", || panic!("connected again"))
            .unwrap();
        assert_eq!(connects, 2);
    }
}
