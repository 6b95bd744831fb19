//! One UDP port for everything agents send each other: the agent's
//! `data_listen` serves link probes ([`crate::probe::wire::ALPN`]), the
//! pseudo-gradient exchange ([`longhaul_exchange::wire::ALPN`]) and the
//! catch-up transfer ([`longhaul_exchange::catchup::ALPN`]) on one QUIC
//! endpoint, so a site registers one data address, a firewall opens one
//! port, and a rehearsal's link carries all three through one emulated
//! path. The agent's own fetches of a catch-up state leave from it too
//! ([`DataEndpoint::endpoint`]).
//!
//! A router accepts each connection, waits (at most [`ROUTE_TIMEOUT`]) for
//! the ALPN the client offered, and hands the handshake on to the probe
//! server, the exchange node or the catch-up server, which take it from
//! there exactly as when they own an endpoint ([`Pending`], [`Source`]). A
//! connection with another ALPN cannot get here: the TLS handshake offers
//! only these three. At most
//! [`MAX_ROUTING`] handshakes are routed at once; more are refused.
//!
//! The endpoint's transport settings are the exchange's (its windows sized
//! from the link) with the larger of the two windows and both servers'
//! stream limits; the UDP buffers are the larger of the two. Windows are
//! limits, not allocations.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connecting, ConnectionError, Incoming};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};

use crate::catchup::{CatchUpOptions, CatchUpServer, StateStore};
use crate::exchange::{ExchangeError, ExchangeNode, ExchangeOptions};
use crate::probe::{ProbeError, ProbeServer, ProbeServerOptions};
use crate::tls::AgentTls;

/// How long a client has to offer its ALPN before it is dropped.
pub const ROUTE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes being routed at once; more are refused.
pub const MAX_ROUTING: usize = 256;
/// Routed handshakes waiting for their server to take them.
const QUEUE: usize = 64;

/// A connection attempt on its way to a server: straight from the
/// endpoint, or routed (its handshake started, the ALPN read).
#[derive(Debug)]
pub(crate) enum Pending {
    Incoming(Box<Incoming>),
    Routed(Connecting),
}

impl Pending {
    pub fn remote_address(&self) -> SocketAddr {
        match self {
            Pending::Incoming(incoming) => incoming.remote_address(),
            Pending::Routed(connecting) => connecting.remote_address(),
        }
    }

    /// Turns it away: a refusal before the handshake; after it started,
    /// dropping the last handle closes the connection.
    pub fn refuse(self) {
        match self {
            Pending::Incoming(incoming) => incoming.refuse(),
            Pending::Routed(connecting) => drop(connecting),
        }
    }

    /// Goes on with the handshake.
    pub fn accept(self) -> Result<Connecting, ConnectionError> {
        match self {
            Pending::Incoming(incoming) => incoming.accept(),
            Pending::Routed(connecting) => Ok(connecting),
        }
    }
}

/// Where a server's connection attempts come from.
#[derive(Debug)]
pub(crate) enum Source {
    /// The server owns the endpoint.
    Endpoint(quinn::Endpoint),
    /// The router of a shared endpoint hands them on.
    Routed(mpsc::Receiver<Connecting>),
}

impl Source {
    /// Serves each connection attempt with `serve`, on a task of its own,
    /// at most `limit` at once: an attempt beyond that is shown to
    /// `refused` (to log or count it) and turned away. Returns when the
    /// source ends; dropping the future (aborting its task) aborts every
    /// task it started. The accept loop of the probe server, the exchange
    /// node and the catch-up server.
    pub(crate) async fn serve_each<S, Fut>(
        mut self,
        limit: usize,
        serve: S,
        refused: impl Fn(&Pending),
    ) where
        S: Fn(Pending) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut tasks = JoinSet::new();
        loop {
            tokio::select! {
                incoming = self.next() => {
                    let Some(incoming) = incoming else { break };
                    // Finished tasks no longer count against the limit.
                    while tasks.try_join_next().is_some() {}
                    if tasks.len() < limit {
                        tasks.spawn(serve(incoming));
                    } else {
                        refused(&incoming);
                        incoming.refuse();
                    }
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
    }

    /// The next attempt; `None` once the endpoint or the router is gone.
    pub async fn next(&mut self) -> Option<Pending> {
        match self {
            Source::Endpoint(endpoint) => endpoint
                .accept()
                .await
                .map(|incoming| Pending::Incoming(Box::new(incoming))),
            Source::Routed(routed) => routed.recv().await.map(Pending::Routed),
        }
    }
}

/// Why the shared endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum DataEndpointError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    #[error("cannot open a QUIC endpoint on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The shared endpoint's router; dropping it stops routing and closes the
/// endpoint (the probe server and the exchange node then see no new
/// connection).
#[derive(Debug)]
pub struct DataEndpoint {
    endpoint: quinn::Endpoint,
    router: JoinHandle<()>,
    _catch_up: CatchUpServer,
}

impl DataEndpoint {
    /// Binds `addr` (inside a tokio runtime) and starts a probe server, an
    /// exchange node and a catch-up server of `states` on it, as the agent
    /// of `tls.site()`.
    pub fn bind(
        addr: SocketAddr,
        tls: &AgentTls,
        probe: ProbeServerOptions,
        exchange: ExchangeOptions,
        states: Arc<StateStore>,
    ) -> Result<(DataEndpoint, ProbeServer, ExchangeNode), DataEndpointError> {
        probe.validate()?;
        exchange.validate()?;
        let mut tuning = exchange.tuning();
        tuning.target_bdp_bytes = tuning
            .target_bdp_bytes
            .max(probe.transport.target_bdp_bytes);
        tuning.socket_buffer_bytes = tuning
            .socket_buffer_bytes
            .max(probe.transport.socket_buffer_bytes);
        let transport =
            tuning.transport_config(probe.max_streams, crate::exchange::MAX_FRAGMENTS_AT_ONCE)?;
        let alpn = [
            crate::probe::wire::ALPN,
            longhaul_exchange::wire::ALPN,
            longhaul_exchange::catchup::ALPN,
        ];
        let server_config = tls
            .quinn_server_config(&alpn, transport)
            .map_err(ProbeError::from)?;
        let (endpoint, buffers) = crate::udp::quic_endpoint(
            addr,
            Some(server_config),
            tuning.socket_buffer_bytes,
            "data endpoint",
        )
        .map_err(|source| DataEndpointError::Bind { addr, source })?;
        let (probe_tx, probe_rx) = mpsc::channel(QUEUE);
        let (exchange_tx, exchange_rx) = mpsc::channel(QUEUE);
        let (catch_up_tx, catch_up_rx) = mpsc::channel(QUEUE);
        let probe_server =
            ProbeServer::on_endpoint(endpoint.clone(), Source::Routed(probe_rx), tls, probe)?;
        let node = ExchangeNode::on_endpoint(
            endpoint.clone(),
            Source::Routed(exchange_rx),
            tls,
            exchange,
        )?;
        tracing::info!(
            local_addr = ?endpoint.local_addr().ok(),
            site = tls.site(),
            socket_receive_buffer = buffers.receive,
            socket_send_buffer = buffers.send,
            "data endpoint listening (probes, exchange and catch-up)"
        );
        let catch_up = CatchUpServer::on_source(
            Source::Routed(catch_up_rx),
            tls,
            states,
            CatchUpOptions::default(),
        );
        let servers = Servers {
            probe: probe_tx,
            exchange: exchange_tx,
            catch_up: catch_up_tx,
        };
        let router = tokio::spawn(route(endpoint.clone(), servers));
        Ok((
            DataEndpoint {
                endpoint,
                router,
                _catch_up: catch_up,
            },
            probe_server,
            node,
        ))
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// The endpoint, for connections this agent opens (a catch-up fetch).
    pub fn endpoint(&self) -> quinn::Endpoint {
        self.endpoint.clone()
    }
}

impl Drop for DataEndpoint {
    fn drop(&mut self) {
        self.router.abort();
        self.endpoint.close(0u32.into(), b"shutdown");
    }
}

/// Where the router hands each ALPN's connections.
#[derive(Clone)]
struct Servers {
    probe: mpsc::Sender<Connecting>,
    exchange: mpsc::Sender<Connecting>,
    catch_up: mpsc::Sender<Connecting>,
}

async fn route(endpoint: quinn::Endpoint, servers: Servers) {
    let permits = Arc::new(Semaphore::new(MAX_ROUTING));
    let mut routing = JoinSet::new();
    loop {
        tokio::select! {
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                    tracing::warn!(remote = %incoming.remote_address(), limit = MAX_ROUTING, "connection refused: too many handshakes at once");
                    incoming.refuse();
                    continue;
                };
                let servers = servers.clone();
                routing.spawn(async move {
                    route_one(incoming, &servers).await;
                    drop(permit);
                });
            }
            Some(_) = routing.join_next(), if !routing.is_empty() => {}
        }
    }
}

async fn route_one(incoming: Incoming, servers: &Servers) {
    let remote = incoming.remote_address();
    let Ok(mut connecting) = incoming.accept() else {
        return;
    };
    let alpn = match tokio::time::timeout(ROUTE_TIMEOUT, connecting.handshake_data()).await {
        Ok(Ok(data)) => data
            .downcast::<quinn::crypto::rustls::HandshakeData>()
            .ok()
            .and_then(|data| data.protocol),
        Ok(Err(error)) => {
            tracing::debug!(%remote, %error, "handshake failed before its ALPN");
            return;
        }
        Err(_) => {
            tracing::debug!(%remote, "no ALPN within the routing timeout");
            return;
        }
    };
    let server = match alpn.as_deref() {
        Some(crate::probe::wire::ALPN) => &servers.probe,
        Some(longhaul_exchange::wire::ALPN) => &servers.exchange,
        Some(longhaul_exchange::catchup::ALPN) => &servers.catch_up,
        // rustls refuses a client without one of ours; nothing to route.
        _ => return,
    };
    // A server that is not taking connections within the timeout is busy:
    // the client sees its handshake time out and tries again.
    let _ = tokio::time::timeout(ROUTE_TIMEOUT, server.send(connecting)).await;
}
