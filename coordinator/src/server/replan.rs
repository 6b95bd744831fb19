//! Re-planning when a site goes down or comes back.
//!
//! Every replica watches applied events; only the leader acts. On a liveness
//! transition it re-examines each live job against the sites that are up:
//! a placed job whose plan still holds (every site it uses is up and the
//! plan passes the hard-constraint checker) keeps its plan, so nothing moves
//! that need not; any other job is placed again, and the new outcome (a plan,
//! or why it is infeasible) goes through raft as `SetPlacement`.

use longhaul_core::placement::{Plan, place, validate_plan};
use longhaul_core::state::{
    Change, ClusterState, Command, JobRecord, JobState, Placement, Request,
};

use super::raft_loop::{RaftHandle, Role};

/// Why a job's placement changes, for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Replan {
    pub job_id: String,
    pub placement: Placement,
    pub reason: String,
}

/// The placements to change after a liveness transition (pure: the caller
/// proposes them).
pub fn replans(state: &ClusterState) -> Vec<Replan> {
    let topology = state.live_topology("registered-sites");
    state
        .jobs()
        .filter(|job| {
            matches!(
                job.state,
                JobState::Placed | JobState::Infeasible | JobState::Pending
            )
        })
        .filter_map(|job| replan(job, &topology))
        .collect()
}

fn replan(job: &JobRecord, topology: &longhaul_core::Topology) -> Option<Replan> {
    if let Placement::Placed { plan_json } = &job.placement
        && let Ok(plan) = serde_json::from_str::<Plan>(plan_json)
        && validate_plan(topology, &job.spec, &plan).is_ok()
    {
        return None;
    }
    let (placement, reason) = match place(topology, &job.spec) {
        Ok(plan) => match serde_json::to_string(&plan) {
            Ok(plan_json) => (
                Placement::Placed { plan_json },
                format!("placed on {}", plan.site_order.join(", ")),
            ),
            Err(error) => (
                Placement::Infeasible {
                    reason: format!("plan serialization failed: {error}"),
                },
                "serialization failed".to_string(),
            ),
        },
        Err(error) => (
            Placement::Infeasible {
                reason: error.to_string(),
            },
            error.to_string(),
        ),
    };
    (placement != job.placement).then(|| Replan {
        job_id: job.id.clone(),
        placement,
        reason,
    })
}

/// Starts the watcher on this replica.
pub fn spawn(raft: RaftHandle) {
    let mut events = raft.subscribe();
    tokio::spawn(async move {
        loop {
            let event = match events.recv().await {
                Ok(event) => event,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            let Change::Site { record } = &event.change else {
                continue;
            };
            if record.liveness_revision != event.revision || raft.status().role != Role::Leader {
                continue;
            }
            let state = raft.state().clone();
            let changes = match tokio::task::spawn_blocking(move || replans(&state.read())).await {
                Ok(changes) => changes,
                Err(error) => {
                    tracing::error!(%error, "re-planning task failed");
                    continue;
                }
            };
            for change in changes {
                tracing::info!(job = %change.job_id, reason = %change.reason, site = %record.site.id, "re-planning after a site transition");
                let command = Command::SetPlacement {
                    job_id: change.job_id.clone(),
                    placement: change.placement,
                };
                if let Err(error) = raft.propose(Request::new(command)).await {
                    tracing::warn!(job = %change.job_id, %error, "re-plan not stored; the next transition retries");
                }
            }
        }
    });
}
