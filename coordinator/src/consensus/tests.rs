//! Cluster tests in virtual time: no wall clock, no sleeps, every random choice seeded.
//!
//! - election: one leader, everyone agrees, leader-change events
//! - replication: proposals commit and apply everywhere
//! - failures: isolated leader, leader in a minority partition, crash and restart from disk,
//!   lossy and delaying network
//! - log compaction: a lagging follower catches up from a zstd-compressed snapshot
//! - pre-vote: a healed minority does not bump the majority's term
//! - membership: add a replica, remove the leader through joint consensus
//! - reads and leadership transfer (held for an election timeout), no vote from a replica that
//!   just restarted

use raft::StateRole;
use raft::eraftpb::ConfChangeType;

use super::Event;
use super::faults::Route;
use super::harness::seed_or;

/// The harness's cluster of key-value replicas.
type Cluster = super::harness::Cluster;
use super::storage::decompress_snapshot;

/// Raft keeps voters in hash order; compare them sorted.
fn sorted(ids: &[u64]) -> Vec<u64> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids
}

#[test]
fn elects_exactly_one_leader_that_everyone_follows() {
    for seed in 0..4 {
        let mut cluster = Cluster::new(3, seed_or(seed));
        let leader = cluster.wait_for_leader(&[1, 2, 3]);
        let leaders: Vec<u64> = cluster
            .ids()
            .into_iter()
            .filter(|id| cluster.node(*id).role() == StateRole::Leader)
            .collect();
        assert_eq!(leaders, vec![leader]);
        let term = cluster.node(leader).term();
        for id in cluster.ids() {
            assert_eq!(cluster.node(id).term(), term);
            let saw_leader = cluster.events[&id].iter().any(
                |e| matches!(e, Event::LeaderChanged { leader_id, .. } if *leader_id == leader),
            );
            assert!(
                saw_leader,
                "replica {id} reported no LeaderChanged({leader})"
            );
        }
    }
}

#[test]
fn proposals_commit_and_apply_on_every_replica() {
    let mut cluster = Cluster::new(3, seed_or(7));
    cluster.wait_for_leader(&[1, 2, 3]);
    let mut last = 0;
    for i in 0..20 {
        let index = cluster.put(&format!("k{i}"), &format!("v{i}"));
        assert!(index > last, "indexes grow: {index} after {last}");
        last = index;
    }
    cluster.assert_converged();
    for id in cluster.ids() {
        let kv = cluster.kv(id);
        assert_eq!(kv.len(), 20);
        assert_eq!(kv["k13"], "v13");
        assert!(cluster.node(id).applied_index() >= last);
    }
}

#[test]
fn isolated_leader_is_replaced_and_no_acknowledged_write_is_lost() {
    let mut cluster = Cluster::new(3, seed_or(11));
    let old = cluster.wait_for_leader(&[1, 2, 3]);
    for i in 0..5 {
        cluster.put(&format!("before{i}"), "acked");
    }
    let isolate = cluster.faults().isolate(old);
    // The old leader still accepts this proposal but can never commit it: not acknowledged.
    cluster
        .node_mut(old)
        .propose(b"lost".to_vec(), b"not a command".to_vec())
        .unwrap();
    let others: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old).collect();
    let new = cluster.wait_for_leader(&others);
    assert_ne!(new, old);
    for i in 0..5 {
        cluster.put(&format!("after{i}"), "acked");
    }
    // check-quorum: the old leader notices it lost its quorum and steps down on its own.
    cluster.tick_until(100, "old leader steps down", |c| !c.node(old).is_leader());

    cluster.faults().remove(isolate);
    cluster.assert_converged();
    let kv = cluster.kv(old);
    assert_eq!(kv.len(), 10, "{kv:?}");
    assert!(kv.values().all(|v| v == "acked"));
    assert_eq!(cluster.applied_with_context(old, b"lost"), None);
}

#[test]
fn leader_in_minority_partition_cannot_commit_and_majority_moves_on() {
    let mut cluster = Cluster::new(5, seed_or(31));
    let old = cluster.wait_for_leader(&[1, 2, 3, 4, 5]);
    cluster.put("before", "acked");
    let buddy = if old == 1 { 2 } else { 1 };
    let minority = [old, buddy];
    let majority: Vec<u64> = (1..=5).filter(|id| !minority.contains(id)).collect();
    let partition = cluster.faults().partition(&[&minority[..], &majority[..]]);
    cluster
        .node_mut(old)
        .propose(b"minority-write".to_vec(), b"x".to_vec())
        .unwrap();
    let new = cluster.wait_for_leader(&majority);
    cluster.put("during", "acked");
    cluster.ticks(30);
    assert_eq!(cluster.applied_with_context(old, b"minority-write"), None);
    assert!(
        !cluster.node(old).is_leader(),
        "check-quorum steps the old leader down"
    );

    cluster.faults().remove(partition);
    cluster.assert_converged();
    assert_eq!(cluster.leader(), Some(new));
    for id in cluster.ids() {
        let kv = cluster.kv(id);
        assert_eq!(kv.len(), 2, "replica {id}: {kv:?}");
        assert_eq!(cluster.applied_with_context(id, b"minority-write"), None);
    }
}

#[test]
fn restarted_replica_recovers_log_hard_state_and_state_machine_from_disk_alone() {
    let mut cluster = Cluster::new(3, seed_or(3));
    cluster.wait_for_leader(&[1, 2, 3]);
    let mut put_at = Vec::new();
    for i in 0..10 {
        let (key, value) = (format!("k{i}"), format!("v{i}"));
        let index = cluster.put(&key, &value);
        put_at.push((index, key, value));
    }
    cluster.assert_converged();
    let id = 2;
    let before = cluster.node(id).storage().state().clone();
    let kv_before = cluster.kv(id);
    cluster.restart(id);
    // Nothing was delivered since the restart: all of this came from the redb file. The log,
    // term, vote and membership were fsynced and come back exactly.
    let node = cluster.node(id);
    let after = node.storage().state().clone();
    assert_eq!(after.last_index, before.last_index);
    assert_eq!(after.truncated_index, before.truncated_index);
    assert_eq!(
        (after.hard_state.term, after.hard_state.vote),
        (before.hard_state.term, before.hard_state.vote)
    );
    assert_eq!(node.term(), before.hard_state.term);
    assert_eq!(node.commit_index(), after.hard_state.commit);
    assert_eq!(sorted(&node.conf_state().voters), [1, 2, 3]);
    // Applying is not fsynced on its own, so the crash may have rolled it back, but only to a
    // state that is exactly the entries up to the restored applied index.
    assert!(after.applied <= before.applied);
    assert!(after.applied <= after.hard_state.commit);
    let expected: std::collections::BTreeMap<String, String> = put_at
        .iter()
        .filter(|(index, _, _)| *index <= after.applied)
        .map(|(_, key, value)| (key.clone(), value.clone()))
        .collect();
    assert_eq!(cluster.kv(id), expected);
    // From the leader it learns the commit index again and re-applies the rest of its log.
    cluster.assert_converged();
    assert_eq!(cluster.kv(id), kv_before);

    // A whole-cluster restart loses nothing either, and the cluster goes on.
    for id in cluster.ids() {
        cluster.restart(id);
    }
    cluster.wait_for_leader(&[1, 2, 3]);
    cluster.put("after-restart", "yes");
    cluster.assert_converged();
    assert_eq!(cluster.kv(1).len(), 11);
}

#[test]
fn follower_behind_compacted_log_catches_up_from_zstd_snapshot() {
    let mut cluster = Cluster::new(3, seed_or(5));
    let leader = cluster.wait_for_leader(&[1, 2, 3]);
    let lagging = if leader == 3 { 2 } else { 3 };
    cluster.put("early", "1");
    cluster.assert_converged();
    let lagging_last = cluster.node(lagging).storage().state().last_index;

    let isolate = cluster.faults().isolate(lagging);
    for i in 0..30 {
        cluster.put(&format!("k{i}"), &"x".repeat(100));
    }
    let snapshot_index = cluster.node_mut(leader).snapshot_and_compact().unwrap();
    let leader_state = cluster.node(leader).storage().state().clone();
    assert_eq!(leader_state.first_index(), snapshot_index + 1);
    assert!(
        leader_state.first_index() > lagging_last + 1,
        "the entries it needs are gone"
    );
    cluster.put("after-compaction", "2");

    cluster.faults().remove(isolate);
    cluster.assert_converged();
    let installed = cluster.events[&lagging]
        .iter()
        .any(|e| matches!(e, Event::SnapshotInstalled { index, .. } if *index == snapshot_index));
    assert!(installed, "follower caught up without the snapshot?");
    assert_eq!(cluster.kv(lagging).len(), 32);

    // The follower kept the compressed blob it received, so it can serve it on.
    let stored = cluster
        .node(lagging)
        .storage()
        .stored_snapshot()
        .unwrap()
        .unwrap();
    assert_eq!(
        &stored.data[..4],
        &[0x28, 0xb5, 0x2f, 0xfd],
        "zstd frame magic"
    );
    let raw = decompress_snapshot(&stored.data).unwrap();
    assert!(
        stored.data.len() < raw.len() / 3,
        "{} vs {}",
        stored.data.len(),
        raw.len()
    );
}

#[test]
fn healed_minority_does_not_bump_the_majority_term_with_pre_vote() {
    let mut cluster = Cluster::new(3, seed_or(9));
    let leader = cluster.wait_for_leader(&[1, 2, 3]);
    let minority = if leader == 1 { 2 } else { 1 };
    let majority: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != minority)
        .collect();
    let term = cluster.node(leader).term();

    let partition = cluster.faults().partition(&[&[minority], &majority[..]]);
    // Many election timeouts: without pre-vote the minority's term would climb each time.
    cluster.ticks(200);
    assert_eq!(
        cluster.node(minority).term(),
        term,
        "pre-vote keeps the term"
    );
    assert_ne!(cluster.node(minority).role(), StateRole::Leader);

    cluster.faults().remove(partition);
    cluster.ticks(50);
    assert_eq!(
        cluster.leader(),
        Some(leader),
        "leadership was not disrupted"
    );
    for id in cluster.ids() {
        assert_eq!(cluster.node(id).term(), term, "replica {id}");
    }
    cluster.put("still", "works");
    cluster.assert_converged();
}

#[test]
fn adds_a_fourth_replica_then_removes_the_leader_through_joint_consensus() {
    let mut cluster = Cluster::new(3, seed_or(13));
    let leader = cluster.wait_for_leader(&[1, 2, 3]);
    for i in 0..5 {
        cluster.put(&format!("k{i}"), "v");
    }

    // A new replica starts empty and learns the whole log from the leader.
    cluster.start(4, &[]);
    cluster.change_membership(&[(ConfChangeType::AddNode, 4)], false);
    cluster.tick_until(100, "replica 4 is a voter everywhere", |c| {
        c.ids()
            .iter()
            .all(|id| sorted(&c.node(*id).conf_state().voters) == [1, 2, 3, 4])
    });
    cluster.assert_converged();
    assert_eq!(cluster.kv(4).len(), 5);

    // Remove the leader with an explicit joint configuration that is left automatically.
    cluster.change_membership(&[(ConfChangeType::RemoveNode, leader)], true);
    let remaining: Vec<u64> = (1..=4).filter(|id| *id != leader).collect();
    let entered_joint = cluster.events[&remaining[0]].iter().any(
        |e| matches!(e, Event::ConfChanged { conf_state, .. } if !conf_state.voters_outgoing.is_empty()),
    );
    let expected = remaining.clone();
    cluster.tick_until(200, "joint configuration left on all", |c| {
        expected.iter().all(|id| {
            let cs = c.node(*id).conf_state();
            sorted(&cs.voters) == expected && cs.voters_outgoing.is_empty()
        })
    });
    assert!(
        entered_joint,
        "the removal did not go through a joint configuration"
    );
    let new_leader = cluster.wait_for_leader(&remaining);
    assert_ne!(new_leader, leader);

    cluster.stop(leader);
    cluster.put("after-removal", "v");
    cluster.assert_converged();
    assert_eq!(cluster.kv(remaining[0]).len(), 6);
}

#[test]
fn read_index_confirms_leadership_before_answering() {
    let mut cluster = Cluster::new(3, seed_or(17));
    let leader = cluster.wait_for_leader(&[1, 2, 3]);
    let written = cluster.put("k", "v");
    let follower = if leader == 1 { 2 } else { 1 };
    for (id, context) in [(leader, b"read-at-leader"), (follower, b"read-at-follow")] {
        cluster.node_mut(id).read_index(context.to_vec());
        cluster.drive();
        let index = cluster.events[&id].iter().find_map(|e| match e {
            Event::ReadIndexReady { context: c, index } if c == context => Some(*index),
            _ => None,
        });
        let index = index.unwrap_or_else(|| panic!("no read index at replica {id}"));
        assert!(
            index >= written,
            "read index {index} is behind acknowledged write {written}"
        );
    }

    // An isolated leader cannot confirm it still leads, so it answers no read.
    cluster.faults().isolate(leader);
    cluster.node_mut(leader).read_index(b"stale".to_vec());
    cluster.ticks(5);
    let answered = cluster.events[&leader]
        .iter()
        .any(|e| matches!(e, Event::ReadIndexReady { context, .. } if context == b"stale"));
    assert!(!answered);
}

#[test]
fn leadership_transfer_moves_the_leader() {
    let mut cluster = Cluster::new(3, seed_or(19));
    let leader = cluster.wait_for_leader(&[1, 2, 3]);
    let target = if leader == 3 { 1 } else { 3 };
    cluster.node_mut(leader).transfer_leader(target);
    cluster.drive();
    cluster.tick_until(50, "transfer done", |c| c.leader() == Some(target));
    cluster.put("k", "v");
    cluster.assert_converged();
}

/// The hand-over waits an election timeout (10 ticks here), handing over all the while, so that
/// a forced campaign never follows a site lease the leader confirmed (`longhaul_core::lease`,
/// step 4); one a follower asks for is held the same way.
#[test]
fn a_hand_over_waits_an_election_timeout_first() {
    for from_follower in [false, true] {
        let mut cluster = Cluster::new(3, seed_or(19));
        let leader = cluster.wait_for_leader(&[1, 2, 3]);
        let target = if leader == 3 { 1 } else { 3 };
        // A follower other than the transferee, so that the request raft forwards must name
        // the transferee, not the asker.
        let bystander = (1..=3).find(|id| *id != leader && *id != target).unwrap();
        let asker = if from_follower { bystander } else { leader };
        assert!(!cluster.node(leader).is_handing_over());
        cluster.node_mut(asker).transfer_leader(target);
        cluster.drive();
        for tick in 0..9 {
            assert!(
                cluster.node(leader).is_handing_over(),
                "tick {tick}: not handing over\n{}",
                cluster.describe()
            );
            assert_eq!(cluster.leader(), Some(leader), "tick {tick}: moved early");
            cluster.tick();
        }
        cluster.tick_until(50, "transfer done", |c| c.leader() == Some(target));
        assert!(!cluster.node(target).is_handing_over());
        assert!(!cluster.node(leader).is_handing_over());
        cluster.put("k", "v");
        cluster.assert_converged();
    }
}

/// A restarted replica has forgotten whom it heard, so raft's leader lease would let it vote at
/// once: it grants no pre-vote (nor vote) in its first election timeout.
#[test]
fn a_restarted_replica_grants_no_vote_in_its_first_election_timeout() {
    let mut cluster = Cluster::new(3, seed_or(41));
    let leader = cluster.wait_for_leader(&[1, 2, 3]);
    let others: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    let (restarted, candidate) = (others[0], others[1]);
    cluster.stop(leader);
    cluster.restart(restarted);
    // The candidate's explicit campaign skips its own timer; only the restarted replica's vote
    // could elect it.
    cluster.node_mut(candidate).campaign().unwrap();
    cluster.drive();
    for tick in 0..9 {
        assert_eq!(
            cluster.leader(),
            None,
            "tick {tick}: elected with a restarted replica's vote\n{}",
            cluster.describe()
        );
        cluster.tick();
    }
    cluster.tick_until(100, "a leader after the window", |c| c.leader().is_some());
    cluster.start(leader, &[]);
    cluster.put("k", "v");
    cluster.assert_converged();
}

#[test]
fn lossy_delaying_network_loses_no_acknowledged_write() {
    for default_seed in [21, 22, 23] {
        let mut cluster = Cluster::new(3, seed_or(default_seed));
        cluster.wait_for_leader(&[1, 2, 3]);
        let three_ticks = 3 * cluster.tick_interval();
        cluster.faults().drop_randomly(Route::All, 0.15);
        cluster
            .faults()
            .delay_randomly(Route::All, 0.2, std::time::Duration::ZERO, three_ticks);
        let mut acknowledged = Vec::new();
        for i in 0..15 {
            let key = format!("k{i}");
            if cluster.try_put(&key, "v", 100).is_some() {
                acknowledged.push(key);
            }
            if i == 7 {
                // Crash whoever leads mid-run and bring it back from disk.
                if let Some(leader) = cluster.leader() {
                    cluster.restart(leader);
                }
            }
        }
        assert!(!acknowledged.is_empty(), "nothing got through at all");
        cluster.faults().heal();
        cluster.wait_for_leader(&[1, 2, 3]);
        cluster.put("final", "v");
        cluster.assert_converged();
        let kv = cluster.kv(1);
        for key in &acknowledged {
            assert!(
                kv.contains_key(key),
                "acknowledged {key} lost; state {kv:?}"
            );
        }
    }
}

#[test]
fn automatic_compaction_bounds_the_log_and_a_replica_behind_it_gets_a_snapshot() {
    let mut cluster = Cluster::with_config(3, seed_or(29), |config| {
        config.snapshot_interval_entries = 10;
        config.compaction_retained_entries = 3;
    });
    cluster.wait_for_leader(&[1, 2, 3]);
    let lagging = 3;
    let isolate = cluster.faults().isolate(lagging);
    for i in 0..40 {
        cluster.put(&format!("k{i}"), "v");
        if i % 5 == 4 {
            // Time passes: the applied state becomes durable, which compaction waits for.
            cluster.tick();
        }
    }
    cluster.faults().remove(isolate);
    cluster.put("last", "v");
    cluster.ticks(2);
    cluster.assert_converged();
    for id in cluster.ids() {
        let state = cluster.node(id).storage().state();
        let log_len = state.last_index + 1 - state.first_index();
        assert!(state.first_index() > 30, "replica {id} never compacted");
        assert!(
            log_len <= 10 + 3 + 1,
            "replica {id} keeps {log_len} entries"
        );
    }
    assert_eq!(cluster.kv(lagging).len(), 41);
    let installed = cluster.events[&lagging]
        .iter()
        .any(|e| matches!(e, Event::SnapshotInstalled { .. }));
    assert!(
        installed,
        "the lagging replica should have needed a snapshot"
    );
}

/// A follower's acknowledgement of new entries goes out (through `send_now`) as soon as they
/// are fsynced, not after the entries the same Ready lets it apply: the leader's commit, and
/// with it every write's latency, does not wait for a follower's apply.
#[test]
fn a_follower_acknowledges_new_entries_before_it_applies_committed_ones() {
    use raft::eraftpb::MessageType;

    use super::kv::KvCommand;

    let mut cluster = Cluster::new(3, seed_or(31));
    let leader = cluster.wait_for_leader(&[1, 2, 3]);
    cluster.drive();
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap_or(0);
    let put = |key: &str| {
        KvCommand::Put {
            key: key.into(),
            value: b"v".to_vec(),
        }
        .encode()
    };
    let to_follower = |messages: Vec<raft::eraftpb::Message>| -> Vec<raft::eraftpb::Message> {
        messages.into_iter().filter(|m| m.to == follower).collect()
    };

    // Entry `a` reaches the follower and is committed by its acknowledgement.
    cluster
        .node_mut(leader)
        .propose(b"a".to_vec(), put("a"))
        .expect("propose a");
    let appends = to_follower(
        cluster
            .node_mut(leader)
            .handle_ready()
            .expect("ready")
            .messages,
    );
    for message in appends {
        cluster.node_mut(follower).step(message).expect("step");
    }
    let acks = cluster
        .node_mut(follower)
        .handle_ready()
        .expect("ready")
        .messages;
    for ack in acks {
        cluster.node_mut(leader).step(ack).expect("step");
    }
    let commit = to_follower(
        cluster
            .node_mut(leader)
            .handle_ready()
            .expect("ready")
            .messages,
    );
    // Entry `b` follows; the follower learns that `a` is committed in the same round.
    cluster
        .node_mut(leader)
        .propose(b"b".to_vec(), put("b"))
        .expect("propose b");
    let appends = to_follower(
        cluster
            .node_mut(leader)
            .handle_ready()
            .expect("ready")
            .messages,
    );
    for message in commit.into_iter().chain(appends) {
        cluster.node_mut(follower).step(message).expect("step");
    }

    let mut sent_now = Vec::new();
    let out = cluster
        .node_mut(follower)
        .handle_ready_sending(&mut |messages| sent_now.extend(messages))
        .expect("ready");
    let applied: Vec<&[u8]> = out
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Applied { context, .. } => Some(context.as_slice()),
            _ => None,
        })
        .collect();
    assert!(applied.contains(&b"a".as_slice()), "{:?}", out.events);
    let acknowledged = sent_now
        .iter()
        .filter(|m| m.get_msg_type() == MessageType::MsgAppendResponse && !m.reject)
        .map(|m| m.index)
        .max()
        .unwrap_or(0);
    assert!(
        acknowledged >= cluster.node(follower).storage().state().last_index,
        "the acknowledgement of b went through send_now: {sent_now:?}"
    );
    assert!(out.messages.is_empty(), "{:?}", out.messages);
}
