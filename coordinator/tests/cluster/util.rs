//! Shared helpers (most live in the library, for the agent's tests too).

use std::time::Duration;

use longhaul_coordinator::server::{Replica, Role};
pub use longhaul_coordinator::testing::*;

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
