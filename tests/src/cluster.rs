//! One cluster abstraction over the two kinds of test cluster, as tikv's
//! `test_raftstore` has: the virtual-time cluster (`consensus::harness`,
//! real `Node`s on real stores, a `Vec` of messages for a network, time
//! moved by ticks) and three in-process replicas over real gRPC. Both judge
//! every raft message by [`Faults`] rules through the same `MessageFilter`
//! seam, so a fault scenario ([`crate::scenarios`]) is written once over
//! [`FaultCluster`] and runs on both.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use longhaul_coordinator::consensus::KvStateMachine;
use longhaul_coordinator::consensus::NodeConfig;
use longhaul_coordinator::consensus::harness::Cluster;
use longhaul_coordinator::server::{Replica, Role};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

use crate::faults::Faults;
use crate::{client, replica_configs, small_job};

/// What a scenario may ask of one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaStatus {
    pub id: u64,
    pub is_leader: bool,
    /// A candidate or pre-candidate: it lost its leader and campaigns.
    pub campaigning: bool,
    pub leader_id: u64,
    pub term: u64,
    pub applied_index: u64,
    pub snapshots_installed: u64,
}

/// A cluster of three replicas whose raft messages pass [`Faults`].
pub trait FaultCluster {
    /// The rules every raft message of the cluster is judged by.
    fn faults(&self) -> &Faults;

    /// The running replicas.
    fn ids(&self) -> Vec<u64>;

    fn status(&self, id: u64) -> ReplicaStatus;

    /// The keys (job names, keys of the key-value store) replica `id` has
    /// applied, read from its own state.
    fn keys(&self, id: u64) -> BTreeSet<String>;

    /// Writes `key` through the leader; true once acknowledged within
    /// `timeout` (of the cluster's time).
    fn write(&mut self, key: &str, timeout: Duration) -> impl Future<Output = bool>;

    /// Lets `d` of the cluster's time pass.
    fn pass(&mut self, d: Duration) -> impl Future<Output = ()>;

    /// Lets time pass until `done` holds; panics with `what` after `limit`.
    fn until(
        &mut self,
        limit: Duration,
        what: &str,
        done: impl Fn(&Self) -> bool,
    ) -> impl Future<Output = ()>;

    /// The leader every running replica follows, once there is one.
    fn leader(&mut self) -> impl Future<Output = u64> {
        async {
            self.until(Duration::from_secs(30), "a leader everyone follows", |c| {
                agreed_leader(c).is_some()
            })
            .await;
            agreed_leader(self).unwrap_or(0)
        }
    }
}

fn agreed_leader<C: FaultCluster + ?Sized>(c: &C) -> Option<u64> {
    let statuses: Vec<ReplicaStatus> = c.ids().into_iter().map(|id| c.status(id)).collect();
    let leader = statuses.iter().find(|s| s.is_leader)?.id;
    statuses
        .iter()
        .all(|s| s.leader_id == leader)
        .then_some(leader)
}

/// How the clusters' replicas are tuned. Over gRPC both use timers slow
/// enough that a loaded two-core machine does not elect a new leader by
/// itself (50 ms ticks, elections after 0.5-1 s); in virtual time the
/// harness's seeded timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timers {
    /// The default log compaction.
    Steady,
    /// The log compacted every 20 entries beyond the last 5.
    Compacting,
}

impl Timers {
    fn tune(self, node: &mut NodeConfig) {
        match self {
            Timers::Steady => {}
            Timers::Compacting => compacting(node),
        }
    }
}

fn compacting(node: &mut NodeConfig) {
    node.snapshot_interval_entries = 20;
    node.compaction_retained_entries = 5;
}

/// The virtual-time cluster, three replicas of the key-value state machine.
#[derive(Debug)]
pub struct VirtualCluster {
    cluster: Cluster,
}

impl VirtualCluster {
    pub fn new(seed: u64, timers: Timers) -> Self {
        let tune: fn(&mut NodeConfig) = match timers {
            Timers::Steady => |_| {},
            Timers::Compacting => compacting,
        };
        Self {
            cluster: Cluster::<KvStateMachine>::with_config(3, seed, tune),
        }
    }

    fn ticks(&self, d: Duration) -> u64 {
        let tick = self.cluster.tick_interval().as_nanos().max(1);
        u64::try_from(d.as_nanos().div_ceil(tick)).unwrap_or(u64::MAX)
    }

    /// The cluster underneath.
    pub fn inner(&mut self) -> &mut Cluster {
        &mut self.cluster
    }
}

impl FaultCluster for VirtualCluster {
    fn faults(&self) -> &Faults {
        self.cluster.faults()
    }

    fn ids(&self) -> Vec<u64> {
        self.cluster.ids()
    }

    fn status(&self, id: u64) -> ReplicaStatus {
        let node = self.cluster.node(id);
        let snapshots = self.cluster.events.get(&id).map_or(0, |events| {
            events
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        longhaul_coordinator::consensus::Event::SnapshotInstalled { .. }
                    )
                })
                .count() as u64
        });
        ReplicaStatus {
            id,
            is_leader: node.is_leader(),
            campaigning: matches!(
                node.role(),
                raft::StateRole::Candidate | raft::StateRole::PreCandidate
            ),
            leader_id: node.leader_id(),
            term: node.term(),
            applied_index: node.applied_index(),
            snapshots_installed: snapshots,
        }
    }

    fn keys(&self, id: u64) -> BTreeSet<String> {
        self.cluster.kv(id).into_keys().collect()
    }

    async fn write(&mut self, key: &str, timeout: Duration) -> bool {
        let ticks = self.ticks(timeout);
        self.cluster.try_put(key, "written", ticks).is_some()
    }

    async fn pass(&mut self, d: Duration) {
        let ticks = self.ticks(d);
        self.cluster.ticks(ticks);
    }

    async fn until(&mut self, limit: Duration, what: &str, done: impl Fn(&Self) -> bool) {
        let ticks = self.ticks(limit);
        self.cluster.drive();
        for _ in 0..ticks {
            if done(self) {
                return;
            }
            self.cluster.tick();
        }
        assert!(
            done(self),
            "{what}: not reached within {ticks} ticks\n{}",
            self.cluster.describe()
        );
    }
}

/// Three in-process replicas over real gRPC on loopback, with their raft
/// transports judged by one [`Faults`].
#[derive(Debug)]
pub struct GrpcCluster {
    /// One connection per replica, reused by every write.
    clients: Vec<CoordinatorClient<Channel>>,
    replicas: Vec<Option<Replica>>,
    faults: Faults,
}

impl GrpcCluster {
    pub async fn start(dir: &Path, seed: u64, timers: Timers) -> Self {
        let faults = Faults::new(seed);
        let mut configs = replica_configs(dir, 3);
        let mut replicas = Vec::new();
        let mut clients = Vec::new();
        for config in &mut configs {
            config.node.tick_interval = Duration::from_millis(50);
            timers.tune(&mut config.node);
            config.message_filter = faults.filter();
            replicas.push(Some(
                Replica::start(config.clone())
                    .await
                    .expect("start a replica"),
            ));
            clients.push(client(config.listen).await);
        }
        Self {
            clients,
            replicas,
            faults,
        }
    }

    fn replica(&self, id: u64) -> &Replica {
        self.replicas[id as usize - 1]
            .as_ref()
            .expect("a running replica")
    }

    /// Stops every replica (closing its store).
    pub async fn stop(self) {
        for replica in self.replicas.into_iter().flatten() {
            replica.stop().await;
        }
    }
}

impl FaultCluster for GrpcCluster {
    fn faults(&self) -> &Faults {
        &self.faults
    }

    fn ids(&self) -> Vec<u64> {
        (1..=self.replicas.len() as u64)
            .filter(|id| self.replicas[*id as usize - 1].is_some())
            .collect()
    }

    fn status(&self, id: u64) -> ReplicaStatus {
        let status = self.replica(id).raft.status();
        ReplicaStatus {
            id,
            is_leader: status.role == Role::Leader,
            campaigning: status.role == Role::Candidate,
            leader_id: status.leader_id,
            term: status.term,
            applied_index: status.applied_index,
            snapshots_installed: status.snapshots_installed,
        }
    }

    fn keys(&self, id: u64) -> BTreeSet<String> {
        self.replica(id)
            .raft
            .state()
            .read()
            .jobs()
            .map(|job| job.id.clone())
            .collect()
    }

    async fn write(&mut self, key: &str, timeout: Duration) -> bool {
        // Through the leader if one is known, else through any replica,
        // which forwards.
        let to = self
            .ids()
            .into_iter()
            .find(|id| self.status(*id).is_leader)
            .unwrap_or(1);
        let mut c = self.clients[to as usize - 1].clone();
        let mut request = tonic::Request::new(pb::SubmitJobRequest {
            spec: Some(small_job(key)),
            expected_revision: 0,
        });
        request.set_timeout(timeout);
        c.submit_job(request).await.is_ok()
    }

    async fn pass(&mut self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn until(&mut self, limit: Duration, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + limit;
        while !done(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not reached within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
