//! Coordinator replicas for tests: configs with fast timers on free loopback
//! ports, and clients.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use longhaul_coordinator::consensus::NodeConfig;
use longhaul_coordinator::server::{Replica, ReplicaConfig, Role};
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

use crate::{eventually, free_addr};

/// Fast timers for tests: 20 ms ticks, election after 10–20 ticks.
pub fn fast_node(id: u64) -> NodeConfig {
    NodeConfig {
        tick_interval: Duration::from_millis(20),
        ..NodeConfig::new(id)
    }
}

pub fn replica_configs(dir: &Path, n: u64) -> Vec<ReplicaConfig> {
    let addrs: Vec<SocketAddr> = (0..n).map(|_| free_addr()).collect();
    let cluster: HashMap<u64, String> = addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| (i as u64 + 1, format!("http://{addr}")))
        .collect();
    addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            let id = i as u64 + 1;
            ReplicaConfig {
                id,
                data_dir: dir.join(format!("replica-{id}")),
                listen: *addr,
                initial_cluster: cluster.clone(),
                join: false,
                cluster_id: 7,
                node: fast_node(id),
                tls: None,
                lease_ttl: Duration::from_secs(3),
                message_filter: None,
                round_timing: Default::default(),
            }
        })
        .collect()
}

pub async fn client(addr: SocketAddr) -> CoordinatorClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("test setup")
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy();
    CoordinatorClient::new(channel)
}

/// A small dense job (1B parameters) that needs no registered site to be accepted.
pub fn small_job(name: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        model: Some(pb::ModelShape {
            parameters: 1_000_000_000,
            layers: 16,
            hidden_size: 2048,
            attention_heads: 16,
            sequence_length: 2048,
            vocabulary_size: 0,
            kv_heads: 0,
            moe: None,
        }),
        global_batch: 64,
        micro_batch: 1,
        ..Default::default()
    }
}

/// The leader every running replica agrees on, once there is one (20 s at most).
pub async fn leader_of(replicas: &[Option<Replica>]) -> u64 {
    eventually(Duration::from_secs(20), "a leader", || async {
        // Every running replica agrees on a leader that is itself running.
        let statuses: Vec<_> = replicas.iter().flatten().map(|r| r.raft.status()).collect();
        let first = statuses.first()?.leader_id;
        let agreed = statuses.iter().all(|s| s.leader_id == first);
        let running = statuses
            .iter()
            .any(|s| s.id == first && s.role == Role::Leader);
        (first != 0 && agreed && running).then_some(first)
    })
    .await
}
