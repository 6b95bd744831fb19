//! Writes that cannot apply are refused before they are proposed: nothing
//! of them reaches the log of any replica, errors name the field and quote
//! a short prefix of the value, and membership changes neither share an id
//! nor take each other's outcome.

use std::time::Duration;

use longhaul_coordinator::server::Replica;
use longhaul_proto::v1 as pb;
use tonic::Code;

use crate::util::{client, eventually, free_addr, leader_of, replica_configs, small_job};

async fn three() -> (tempfile::TempDir, Vec<Option<Replica>>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut replicas = Vec::new();
    for config in replica_configs(dir.path(), 3) {
        replicas.push(Some(Replica::start(config).await.unwrap()));
    }
    let leader = leader_of(&replicas).await;
    (dir, replicas, leader)
}

/// The commit index of every replica.
fn last_indexes(replicas: &[Option<Replica>]) -> Vec<u64> {
    replicas
        .iter()
        .flatten()
        .map(|r| r.raft.status().commit_index)
        .collect()
}

/// The highest term any replica is in.
fn term(replicas: &[Option<Replica>]) -> u64 {
    replicas
        .iter()
        .flatten()
        .map(|r| r.raft.status().term)
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_writes_never_reach_the_log_and_their_errors_stay_short() {
    let (_dir, replicas, leader) = three().await;
    // A write through the leader settles the log first.
    let leader_addr = replicas[leader as usize - 1].as_ref().unwrap().local_addr;
    let follower_addr = replicas
        .iter()
        .flatten()
        .find(|r| r.raft.status().id != leader)
        .unwrap()
        .local_addr;
    client(leader_addr)
        .await
        .submit_job(pb::SubmitJobRequest {
            spec: Some(small_job("settle")),
            expected_revision: 0,
        })
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "every replica at one index",
        || async {
            let indexes = last_indexes(&replicas);
            indexes.windows(2).all(|w| w[0] == w[1]).then_some(())
        },
    )
    .await;
    let before = last_indexes(&replicas);
    let term_before = term(&replicas);

    let huge = "a".repeat(1 << 20);
    for addr in [leader_addr, follower_addr] {
        let mut c = client(addr).await;
        // A 1 MiB job name: refused as INVALID_ARGUMENT naming the field,
        // its value quoted by a prefix, not echoed (through a follower too).
        let error = c
            .submit_job(pb::SubmitJobRequest {
                spec: Some(small_job(&huge)),
                expected_revision: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
        assert!(error.message().starts_with("field `job_id`"), "{error:?}");
        assert!(
            error.message().len() < 300,
            "{} bytes",
            error.message().len()
        );

        // A job that already exists: apply would refuse it; so does admission.
        let error = c
            .submit_job(pb::SubmitJobRequest {
                spec: Some(small_job("settle")),
                expected_revision: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(error.code(), Code::AlreadyExists, "{error:?}");

        // A replica that could never be reached.
        for (url, field) in [
            ("ftp://127.0.0.1:2380", "peer_url"),
            ("http://127.0.0.1:99999", "peer_url"),
        ] {
            let error = c
                .add_member(pb::AddMemberRequest {
                    name: "x".into(),
                    peer_url: url.into(),
                    client_url: String::new(),
                    as_learner: true,
                })
                .await
                .unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{url}: {error:?}");
            assert!(error.message().contains(field), "{error:?}");
        }

        // A request above the size limit is not decoded at all.
        let error = c
            .submit_job(pb::SubmitJobRequest {
                spec: Some(small_job(&"b".repeat(5 << 20))),
                expected_revision: 0,
            })
            .await
            .unwrap_err();
        assert_ne!(error.code(), Code::Ok);
        assert!(
            error.message().len() < 1024,
            "{} bytes",
            error.message().len()
        );
    }
    // An election on a loaded machine appends one empty entry per new term;
    // a refused write would have appended one entry of its own each (there
    // were six).
    let elections = term(&replicas) - term_before;
    for (now, was) in last_indexes(&replicas).iter().zip(&before) {
        assert!(
            now - was <= elections,
            "a refused write was appended to the log: commit index {was} -> {now} over {elections} elections"
        );
    }
    for replica in replicas.into_iter().flatten() {
        replica.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_membership_changes_take_distinct_ids_and_their_own_outcomes() {
    let (_dir, replicas, _leader) = three().await;
    let addrs: Vec<_> = replicas.iter().flatten().map(|r| r.local_addr).collect();
    // Six learners at once, through every replica (unreachable addresses:
    // learners do not count towards a quorum).
    let mut calls = Vec::new();
    for i in 0..6 {
        let addr = addrs[i % addrs.len()];
        let url = format!("http://{}", free_addr());
        calls.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            c.add_member(pb::AddMemberRequest {
                name: format!("learner-{i}"),
                peer_url: url,
                client_url: String::new(),
                as_learner: true,
            })
            .await
        }));
    }
    let mut added = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(reply) => {
                let member = reply.into_inner().member.unwrap();
                added.push((member.id, member.peer_url));
            }
            // Refused while another change was pending: said so, not
            // answered with the other's success.
            Err(error) => assert!(
                matches!(error.code(), Code::FailedPrecondition | Code::Unavailable),
                "{error:?}"
            ),
        }
    }
    assert!(!added.is_empty(), "no change succeeded");
    let mut distinct: Vec<u64> = added.iter().map(|(id, _)| *id).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), added.len(), "one id given twice: {added:?}");
    // Every change reported as done is in the configuration, and recorded
    // with the address its caller gave.
    let learners = replicas
        .iter()
        .flatten()
        .find(|r| r.raft.status().role == longhaul_coordinator::server::Role::Leader)
        .map(|r| r.raft.status().conf_state.learners)
        .unwrap();
    let cluster = client(addrs[0])
        .await
        .get_cluster(pb::GetClusterRequest { allow_stale: false })
        .await
        .unwrap()
        .into_inner();
    // No change left a member recorded that the configuration does not hold.
    for member in &cluster.members {
        assert!(
            learners.contains(&member.id) || member.id <= 3,
            "member {} recorded but not configured: {cluster:?}",
            member.id
        );
    }
    for (id, url) in &added {
        assert!(
            learners.contains(id),
            "{id} reported added, learners {learners:?}"
        );
        let recorded = cluster.members.iter().find(|m| m.id == *id).unwrap();
        assert_eq!(
            &recorded.peer_url, url,
            "member {id} recorded with another's address"
        );
    }
    for replica in replicas.into_iter().flatten() {
        replica.stop().await;
    }
}
