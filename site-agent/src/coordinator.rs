//! The agent's connection to the coordinator replicas.
//!
//! The agent knows several endpoints; any may be a follower (which forwards
//! writes and renewals to the leader) or down. Calls go to the current
//! endpoint; a call that fails for a reason another replica might not have
//! (unreachable, no leader there, deadline) moves to the next one. When a
//! renewal names the leader's URL, the agent moves there, so that renewals
//! take one hop.

use std::time::Duration;

use longhaul_proto::v1::agent_service_client::AgentServiceClient;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

/// Largest message the agent accepts (a 100k-GPU site's assignment is a few MB).
const MAX_MESSAGE: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("field `coordinators`: is empty: the agent needs at least one replica URL")]
    NoEndpoints,
    #[error("field `coordinators[{index}]`: {url:?} is not a URL: {message}")]
    BadUrl {
        index: usize,
        url: String,
        message: String,
    },
    #[error("field `coordinators[{index}]`: {url:?} must start with {scheme} (TLS is {tls})")]
    WrongScheme {
        index: usize,
        url: String,
        scheme: &'static str,
        tls: &'static str,
    },
    #[error("TLS settings for {url}: {message}")]
    Tls { url: String, message: String },
}

/// Whether a failed call is worth retrying at another replica.
pub fn is_transient(status: &Status) -> bool {
    is_transient_code(status.code())
}

/// Whether a call that failed with `code` is worth retrying at another
/// replica.
pub fn is_transient_code(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Cancelled
            | Code::Aborted
    )
}

#[derive(Debug, Clone)]
struct Replica {
    url: String,
    channel: Channel,
}

/// Endpoints of the coordinator replicas and the one in use.
#[derive(Debug, Clone)]
pub struct Coordinators {
    replicas: Vec<Replica>,
    current: usize,
}

impl Coordinators {
    pub fn new(
        urls: &[String],
        tls: Option<ClientTlsConfig>,
        connect_timeout: Duration,
    ) -> Result<Self, ConnectError> {
        if urls.is_empty() {
            return Err(ConnectError::NoEndpoints);
        }
        let (scheme, state) = if tls.is_some() {
            ("https://", "on")
        } else {
            ("http://", "off")
        };
        let mut replicas = Vec::with_capacity(urls.len());
        for (index, url) in urls.iter().enumerate() {
            if !url.starts_with(scheme) {
                return Err(ConnectError::WrongScheme {
                    index,
                    url: url.clone(),
                    scheme,
                    tls: state,
                });
            }
            let channel = channel(url, tls.as_ref(), connect_timeout).map_err(|message| {
                ConnectError::BadUrl {
                    index,
                    url: url.clone(),
                    message,
                }
            })?;
            replicas.push(Replica {
                url: url.clone(),
                channel,
            });
        }
        Ok(Self {
            replicas,
            current: 0,
        })
    }

    /// A client for the replica in use.
    pub fn client(&self) -> AgentServiceClient<Channel> {
        let channel = self.replicas[self.current].channel.clone();
        AgentServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// The operator API of the replica in use (sites, links).
    pub fn operator_client(&self) -> CoordinatorClient<Channel> {
        CoordinatorClient::new(self.replicas[self.current].channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
    }

    /// The URL of the replica in use.
    pub fn url(&self) -> &str {
        &self.replicas[self.current].url
    }

    /// Moves to the next replica (after a failure at this one).
    pub fn rotate(&mut self) {
        self.current = (self.current + 1) % self.replicas.len();
    }

    /// How many replicas are known (a full rotation's length).
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// Moves to the leader's URL as a renewal reported it, when it is one of
    /// the configured replicas. An unknown URL is not dialled: the agent may
    /// reach the replicas through addresses of its own (a proxy, a NAT), and
    /// a follower forwards renewals to the leader anyway.
    pub fn prefer(&mut self, leader_url: &str) {
        if let Some(i) = self.replicas.iter().position(|r| r.url == leader_url) {
            self.current = i;
        }
    }
}

fn channel(
    url: &str,
    tls: Option<&ClientTlsConfig>,
    connect_timeout: Duration,
) -> Result<Channel, String> {
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| e.to_string())?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.clone())
            .map_err(|e| e.to_string())?;
    }
    Ok(endpoint.connect_lazy())
}
