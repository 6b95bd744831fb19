//! Membership changes at the leader: AddMember and RemoveMember, each run whole, one at a
//! time, on its own task (see `CoordinatorService::membership_change`).

use std::time::Duration;

use longhaul_core::limits;
use longhaul_core::state::{Command, Member, Request as StateRequest};
use longhaul_proto::v1 as pb;
use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState};
use tonic::Status;

use super::CoordinatorService;
use crate::server::convert;
use crate::server::forward::bounded;

/// Time left until `deadline`.
fn left(deadline: tokio::time::Instant) -> Duration {
    deadline.saturating_duration_since(tokio::time::Instant::now())
}

impl CoordinatorService {
    /// The recorded members, learners marked by `conf_state`.
    fn members_in(&self, conf_state: &ConfState) -> Vec<pb::Member> {
        let state = self.raft.state().read();
        state
            .members()
            .map(|m| convert::member(m, &conf_state.learners))
            .collect()
    }

    /// Runs one membership change at this leader, whole: on its own task, which holds the
    /// membership lock from the first step to the last (a caller that gives up cannot leave
    /// the lock free while its change is half done), every step within one deadline.
    pub(super) async fn membership_change<T, F, Fut>(
        &self,
        wait: Duration,
        change: F,
    ) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(CoordinatorService, tokio::time::Instant) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, Status>> + Send + 'static,
    {
        let service = self.clone();
        let deadline = tokio::time::Instant::now() + wait;
        tokio::spawn(async move {
            let lock = service.membership.clone();
            let _one_change = tokio::time::timeout(left(deadline), lock.lock_owned())
                .await
                .map_err(|_| {
                    Status::unavailable("another membership change is in progress; retry")
                })?;
            // Everything committed before is applied after a read barrier (under a new leader,
            // once it committed an entry of its term), so what follows sees every member an
            // earlier change recorded.
            service.read_barrier(false, left(deadline)).await?;
            change(service, deadline).await
        })
        .await
        .map_err(|e| Status::internal(format!("membership change task failed: {e}")))?
    }

    pub(super) async fn add_member_here(
        &self,
        body: pb::AddMemberRequest,
        deadline: tokio::time::Instant,
    ) -> Result<pb::AddMemberResponse, Status> {
        let status = self.raft.status();
        let configured = |id: u64| {
            status.conf_state.voters.contains(&id) || status.conf_state.learners.contains(&id)
        };
        let existing = self
            .raft
            .state()
            .read()
            .members()
            .find(|m| m.peer_url == body.peer_url)
            .cloned();
        let member = match existing {
            Some(existing) if configured(existing.id) => {
                return Err(Status::already_exists(format!(
                    "field `peer_url`: member {} is already reached at {}",
                    existing.id,
                    limits::quote(&body.peer_url)
                )));
            }
            // An earlier change recorded the member and stopped before the configuration
            // took it (a timeout, a leader change): finish it, with the id it recorded.
            Some(existing) => existing,
            None => {
                // Above every id ever recorded, removed members' included: an id is never
                // reused (see `ClusterState::highest_member_id`).
                let known = self.raft.state().read().highest_member_id();
                let id = status
                    .conf_state
                    .voters
                    .iter()
                    .chain(&status.conf_state.learners)
                    .copied()
                    .chain([known])
                    .max()
                    .unwrap_or(0)
                    + 1;
                let member = Member {
                    id,
                    name: if body.name.is_empty() {
                        format!("replica-{id}")
                    } else {
                        body.name
                    },
                    peer_url: body.peer_url.clone(),
                    client_url: if body.client_url.is_empty() {
                        body.peer_url.clone()
                    } else {
                        body.client_url
                    },
                };
                self.write(
                    StateRequest::new(Command::PutMember {
                        member: member.clone(),
                    }),
                    left(deadline),
                )
                .await?;
                member
            }
        };
        self.peers.insert(member.id, member.peer_url.clone());
        let change_type = if body.as_learner {
            ConfChangeType::AddLearnerNode
        } else {
            ConfChangeType::AddNode
        };
        let conf_state = bounded(
            left(deadline),
            "membership change",
            self.raft
                .change_membership(single_change(change_type, member.id)),
        )
        .await?;
        let members = self.members_in(&conf_state);
        Ok(pb::AddMemberResponse {
            header: Some(self.header()),
            member: Some(convert::member(&member, &conf_state.learners)),
            members,
        })
    }

    pub(super) async fn remove_member_here(
        &self,
        id: u64,
        deadline: tokio::time::Instant,
    ) -> Result<pb::RemoveMemberResponse, Status> {
        let status = self.raft.status();
        let cs = &status.conf_state;
        let recorded = self.raft.state().read().members().any(|m| m.id == id);
        let configured = cs.voters.contains(&id) || cs.learners.contains(&id);
        if !configured && !recorded {
            return Err(Status::not_found(format!(
                "field `id`: {id} is not a member"
            )));
        }
        if cs.voters == [id] {
            return Err(Status::failed_precondition(
                "field `id`: cannot remove the last voter",
            ));
        }
        // Record the removal first: once the leader removes itself it can
        // no longer propose.
        if recorded {
            self.write(
                StateRequest::new(Command::RemoveMember { member_id: id }),
                left(deadline),
            )
            .await?;
        }
        // A record whose change never reached the configuration is gone with the record.
        let conf_state = if configured {
            bounded(
                left(deadline),
                "membership change",
                self.raft
                    .change_membership(single_change(ConfChangeType::RemoveNode, id)),
            )
            .await?
        } else {
            status.conf_state.clone()
        };
        let members = self.members_in(&conf_state);
        Ok(pb::RemoveMemberResponse {
            header: Some(self.header()),
            members,
        })
    }
}

fn single_change(change_type: ConfChangeType, id: u64) -> ConfChangeV2 {
    let mut single = ConfChangeSingle::default();
    single.set_change_type(change_type);
    single.node_id = id;
    let mut change = ConfChangeV2::default();
    change.set_changes(vec![single].into());
    change
}
