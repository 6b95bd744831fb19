//! The coordinator replica as a running server: storage, consensus loop,
//! raft transport, and the gRPC services on one listening address
//! (`longhaul.v1.Coordinator`, `longhaul.v1.RaftTransport`, the standard
//! health service and server reflection).

pub mod agent_service;
pub mod assignments;
pub mod auth;
pub mod convert;
pub mod forward;
pub mod leases;
pub mod raft_loop;
pub mod replan;
pub mod rounds;
pub mod service;
pub mod state_machine;
pub mod tls;
pub mod transport;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use longhaul_core::limits::MAX_REQUEST_BYTES;
use longhaul_proto::v1::agent_service_server::AgentServiceServer;
use longhaul_proto::v1::coordinator_server::CoordinatorServer;
use longhaul_proto::v1::raft_transport_server::RaftTransportServer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use crate::consensus::{DiskStorage, Node, NodeConfig, NodeError, StorageError};
pub use raft_loop::{RaftHandle, Role, Status};
use service::CoordinatorService;
use state_machine::CoordinatorStateMachine;
use transport::{Outbox, PeerBook, TransportService};

/// The largest raft envelope or snapshot chunk a replica decodes from a peer. An append
/// carries at most `NodeConfig::max_size_per_msg` (1 MiB) of entries, or one larger entry; a
/// command is admitted only within `limits::MAX_REQUEST_BYTES` (4 MiB) and a snapshot chunk
/// holds 1 MiB of data, so this leaves a wide margin and still bounds what a peer can make a
/// replica buffer.
pub const MAX_RAFT_MESSAGE_BYTES: usize = 64 << 20;

/// Everything one replica needs to start.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    pub id: u64,
    /// Directory of the replica's store (created if missing).
    pub data_dir: PathBuf,
    /// Where the replica listens for clients and peers.
    pub listen: SocketAddr,
    /// Every founding replica: id → URL (`http://host:port`). A single
    /// replica lists only itself.
    pub initial_cluster: HashMap<u64, String>,
    /// Join an existing cluster (added with AddMember) instead of founding one.
    pub join: bool,
    /// Identity of the cluster: replicas refuse raft traffic from another one.
    pub cluster_id: u64,
    pub node: NodeConfig,
    /// Mutual TLS for clients and peers; plaintext when `None`.
    pub tls: Option<tls::TlsMaterial>,
    /// The TTL of the leases granted to site agents.
    pub lease_ttl: Duration,
    /// A judge of every outgoing raft message, for tests that inject
    /// faults (the test kit's `Faults`); `None`, the daemon's only value,
    /// leaves the transport as it is.
    pub message_filter: Option<std::sync::Arc<dyn transport::MessageFilter>>,
    /// How the leader sets outer rounds' deadlines.
    pub round_timing: rounds::RoundTiming,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the store: {0}")]
    Storage(#[from] StorageError),
    #[error("cannot load the state machine: {0}")]
    StateMachine(String),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("server reflection: {0}")]
    Reflection(String),
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// A started replica.
#[derive(Debug)]
pub struct Replica {
    pub raft: RaftHandle,
    pub local_addr: SocketAddr,
    consensus: raft_loop::ConsensusThread,
    /// Until it ended.
    server: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Replica {
    /// Opens the store, starts consensus and serves gRPC.
    pub async fn start(config: ReplicaConfig) -> Result<Self, ServerError> {
        if config.id == 0 {
            return Err(ServerError::Config("id: must not be 0".into()));
        }
        if !config.join && !config.initial_cluster.contains_key(&config.id) {
            return Err(ServerError::Config(format!(
                "initial_cluster: does not list this replica's id {}",
                config.id
            )));
        }
        std::fs::create_dir_all(&config.data_dir).map_err(|source| ServerError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
        // What can fail without the store is done before it is opened, so
        // a failed start leaves no store open and no consensus thread.
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| ServerError::Listen {
                    addr: config.listen,
                    source,
                })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| ServerError::Listen {
                addr: config.listen,
                source,
            })?;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(longhaul_proto::v1::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| ServerError::Reflection(e.to_string()))?;
        let mut builder = tonic::transport::Server::builder().tcp_nodelay(true);
        if let Some(material) = &config.tls {
            // Peers refuse raft traffic from a certificate without the replica role: a
            // replica started with one would never be heard, so it does not start.
            let roles = material
                .roles()
                .map_err(|e| ServerError::Config(format!("tls: {e}")))?;
            if !roles.replica {
                return Err(ServerError::Config(format!(
                    "tls: this replica's certificate grants {}; a replica's must name the DNS name `{}` \
                     (beside the host it is reached at), or its peers refuse it",
                    roles.describe(),
                    longhaul_core::identity::REPLICA_NAME
                )));
            }
            builder = builder.tls_config(material.server())?;
        } else {
            tracing::warn!(
                "serving PLAINTEXT gRPC: clients and peers are not authenticated (pass TLS material for mTLS)"
            );
        }
        // `store.wal/` and `store.state.redb`; a `store.redb` of older versions held the log
        // and is moved on open.
        let storage = DiskStorage::open(&config.data_dir.join("store.redb"))?;
        let state_machine = CoordinatorStateMachine::load(&storage.read()?)
            .map_err(|e| ServerError::StateMachine(e.to_string()))?;
        let mut voters: Vec<u64> = if config.join {
            Vec::new()
        } else {
            config.initial_cluster.keys().copied().collect()
        };
        voters.sort_unstable();
        let tick_interval = config.node.tick_interval;
        let node = Node::open(config.node.clone(), storage, state_machine, &voters)?;

        let peers = PeerBook::new(config.initial_cluster.clone());
        // Members recorded in the replicated state (added at runtime) too.
        {
            let state = node.state_machine().shared();
            for member in state.read().members() {
                peers.insert(member.id, member.peer_url.clone());
            }
        }
        // Peers and the leader are reached as replicas: their certificate must name the
        // replica role, not merely the host (an agent's certificate may name a host too).
        let client_tls = config.tls.as_ref().map(|material| {
            material
                .client()
                .domain_name(longhaul_core::identity::REPLICA_NAME)
        });
        let outbox = Outbox::new(config.cluster_id, peers.clone(), client_tls.clone())
            .with_filter(config.message_filter.clone());

        let (raft, consensus) = raft_loop::spawn(node, outbox, tick_interval)
            .map_err(|e| ServerError::Config(format!("cannot start the consensus thread: {e}")))?;
        keep_peer_book_current(&raft, &peers);
        replan::spawn(raft.clone());
        rounds::spawn(raft.clone(), config.round_timing);

        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        report_health(&raft, health_reporter);

        let leases = leases::Leases::new(raft.clone(), config.lease_ttl, &config.node);
        leases.spawn_expiry();
        let coordinator_service = CoordinatorService::new(raft.clone(), peers, client_tls);
        let agents = AgentServiceServer::new(agent_service::AgentServiceImpl::new(
            coordinator_service.clone(),
            leases,
        ))
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(64 << 20);
        let coordinator = CoordinatorServer::new(coordinator_service)
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(64 << 20);
        let transport = RaftTransportServer::new(TransportService {
            cluster_id: config.cluster_id,
            id: config.id,
            raft: raft.clone(),
        })
        .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES);
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            builder
                .layer(auth::AuthLayer {
                    tls: config.tls.is_some(),
                })
                .add_service(health_service)
                .add_service(reflection)
                .add_service(coordinator)
                .add_service(agents)
                .add_service(transport)
                .serve_with_incoming_shutdown(incoming(listener), async {
                    let _ = shutdown_rx.await;
                }),
        );
        tracing::info!(id = config.id, %local_addr, "coordinator replica serving");
        Ok(Self {
            raft,
            local_addr,
            consensus,
            server: Some(server),
            shutdown: Some(shutdown_tx),
        })
    }

    /// Stops serving and waits for the server to finish.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(mut server) = self.server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut server).await;
            server.abort();
        }
        // Closing the store commits and fsyncs the applied state; on a slow
        // machine that may take a while, and a replica restarted on the same
        // directory needs it closed.
        self.consensus.stop(Duration::from_secs(30)).await;
    }

    /// Waits until the consensus loop or the server stops, and says why;
    /// [`Replica::stop`] afterwards closes the rest.
    pub async fn wait(&mut self) -> Result<(), ServerError> {
        let server = async {
            match self.server.as_mut() {
                Some(server) => {
                    let result = server.await;
                    self.server = None;
                    match result {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(error)) => Err(error.into()),
                        Err(join) => {
                            Err(ServerError::Config(format!("server task failed: {join}")))
                        }
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = self.consensus.wait() => result,
            result = server => result,
        }
    }
}

/// Health is SERVING while a leader is known, NOT_SERVING otherwise.
fn report_health(raft: &RaftHandle, reporter: tonic_health::server::HealthReporter) {
    let mut status = raft.watch_status();
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let serving = if status.borrow_and_update().leader_id != 0 {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            if last != Some(serving) {
                reporter.set_service_status("", serving).await;
                reporter
                    .set_service_status("longhaul.v1.Coordinator", serving)
                    .await;
                last = Some(serving);
            }
            if status.changed().await.is_err() {
                return;
            }
        }
    });
}

/// Members added at runtime reach the transport through the applied state.
fn keep_peer_book_current(raft: &RaftHandle, peers: &PeerBook) {
    let mut events = raft.subscribe();
    let peers = peers.clone();
    tokio::spawn(async move {
        use longhaul_core::state::Change;
        loop {
            match events.recv().await {
                Ok(event) => {
                    if let Change::Member { member } = event.change {
                        peers.insert(member.id, member.peer_url);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// The replica's accepted connections, with Nagle's algorithm off. The
/// builder's `tcp_nodelay` applies only to listeners tonic binds itself, not
/// to one handed in: before, a response whose trailers went out in a second
/// write waited for the client's delayed acknowledgement (40 ms on Linux),
/// which made every round report's answer about 40 ms slower than the
/// commit it reported (the `round_commit` bench).
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

#[cfg(test)]
mod incoming_tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use tokio_stream::StreamExt as _;

    /// Regression: the replica's server sockets had Nagle's algorithm on.
    #[tokio::test]
    async fn accepted_connections_have_nagles_algorithm_off() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = super::incoming(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap());
    }
}
