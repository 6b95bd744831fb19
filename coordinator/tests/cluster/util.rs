//! Shared helpers (most live in the library, for the agent's tests too).

use std::time::Duration;

use longhaul_coordinator::server::{Replica, Role};
pub use longhaul_coordinator::testing::*;
use longhaul_proto::v1 as pb;

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
