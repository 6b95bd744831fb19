use raft::Storage as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, StorageError as RaftStorageError};
use redb::ReadableTable as _;

use super::migrate::{HARD_STATE, LOG, LOG_TRUNCATED, SNAPSHOT_DATA, SNAPSHOT_META};
use super::*;

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: vec![index as u8; 16].into(),
        ..Default::default()
    }
}

fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

fn open(dir: &tempfile::TempDir) -> DiskStorage {
    DiskStorage::open(&dir.path().join("raft.redb")).unwrap()
}

fn indexes(entries: &[Entry]) -> Vec<(u64, u64)> {
    entries.iter().map(|e| (e.index, e.term)).collect()
}

fn compacted<T: std::fmt::Debug>(r: raft::Result<T>) -> bool {
    matches!(r, Err(raft::Error::Store(RaftStorageError::Compacted)))
}

fn unavailable<T: std::fmt::Debug>(r: raft::Result<T>) -> bool {
    matches!(r, Err(raft::Error::Store(RaftStorageError::Unavailable)))
}

fn ctx() -> GetEntriesContext {
    GetEntriesContext::empty(false)
}

#[test]
fn fresh_store_is_empty_and_uninitialized() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    assert!(!store.is_initialized());
    assert_eq!(store.first_index().unwrap(), 1);
    assert_eq!(store.last_index().unwrap(), 0);
    assert_eq!(store.term(0).unwrap(), 0);
    assert!(unavailable(store.term(1)));
    assert_eq!(store.entries(1, 1, None, ctx()).unwrap(), vec![]);
}

#[test]
fn append_truncates_conflicting_suffix_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    let first: Vec<_> = (1..=5).map(|i| entry(i, 1)).collect();
    store
        .append_and_persist(&first, Some(&hard_state(1, 1, 2)))
        .unwrap();
    // A new leader at term 2 overwrites 4 and 5 and the old tail must not survive.
    store
        .append_and_persist(&[entry(4, 2)], Some(&hard_state(2, 2, 3)))
        .unwrap();
    assert_eq!(store.last_index().unwrap(), 4);
    assert_eq!(
        indexes(&store.entries(1, 5, None, ctx()).unwrap()),
        vec![(1, 1), (2, 1), (3, 1), (4, 2)]
    );
    assert!(unavailable(store.term(5)));
    assert_eq!(
        store.initial_state().unwrap().hard_state,
        hard_state(2, 2, 3)
    );
}

#[test]
fn append_rejects_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    store.append_and_persist(&[entry(1, 1)], None).unwrap();
    let err = store.append_and_persist(&[entry(3, 1)], None).unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::Gap {
                first_new: 3,
                last: 1
            }
        ),
        "{err}"
    );
    // The failed batch changed nothing.
    assert_eq!(store.last_index().unwrap(), 1);
}

#[test]
fn entries_honour_max_size_but_return_at_least_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    let all: Vec<_> = (1..=10).map(|i| entry(i, 1)).collect();
    store.append_and_persist(&all, None).unwrap();
    let one = u64::from(protobuf::Message::compute_size(&all[0]));
    assert_eq!(store.entries(1, 11, Some(0), ctx()).unwrap().len(), 1);
    assert_eq!(store.entries(1, 11, Some(one * 3), ctx()).unwrap().len(), 3);
    assert_eq!(
        store
            .entries(1, 11, Some(one * 3 + 1), ctx())
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        store.entries(1, 11, raft::NO_LIMIT, ctx()).unwrap().len(),
        10
    );
    assert_eq!(
        store.entries(3, 5, None, ctx()).unwrap(),
        all[2..4].to_vec()
    );
    assert!(unavailable(store.entries(5, 12, None, ctx())));
}

#[test]
fn compaction_keeps_term_of_truncated_entry_and_reports_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    let all: Vec<_> = (1..=10).map(|i| entry(i, i / 4 + 1)).collect();
    store.append_and_persist(&all, None).unwrap();
    // Nothing applied, nothing may be compacted: a crash must find what it re-applies.
    let err = store.compact(5).unwrap_err();
    assert!(
        matches!(err, StorageError::CompactTooFar { to: 5, .. }),
        "{err}"
    );

    let mut meta = SnapshotMetadata {
        index: 7,
        term: store.term(7).unwrap(),
        ..Default::default()
    };
    meta.mut_conf_state().voters = vec![1, 2];
    store
        .write(|b| {
            b.set_applied(7)?;
            b.store_snapshot(&meta, &compress_snapshot(b"state")?)
        })
        .unwrap();
    store.compact(5).unwrap();
    assert_eq!(store.first_index().unwrap(), 5);
    assert_eq!(store.term(4).unwrap(), 2);
    assert!(compacted(store.term(3)));
    assert!(compacted(store.entries(4, 6, None, ctx())));
    assert_eq!(
        indexes(&store.entries(5, 7, None, ctx()).unwrap()),
        vec![(5, 2), (6, 2)]
    );
    let err = store.compact(9).unwrap_err();
    assert!(
        matches!(err, StorageError::CompactTooFar { limit: 8, .. }),
        "{err}"
    );

    // Compacting up to the snapshot works, and survives a reopen.
    store.compact(8).unwrap();
    drop(store);
    let store = open(&dir);
    assert_eq!(store.first_index().unwrap(), 8);
    assert_eq!(store.last_index().unwrap(), 10);
    assert_eq!(store.term(7).unwrap(), 2);
    let snap = store.snapshot(0, 2).unwrap();
    assert_eq!(snap.get_metadata().index, 7);
    assert_eq!(decompress_snapshot(&snap.data).unwrap(), b"state");
}

#[test]
fn reopen_restores_log_hard_state_conf_state_and_applied_state() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = open(&dir);
        let cs = ConfState {
            voters: vec![1, 2, 3],
            ..Default::default()
        };
        store
            .write(|b| {
                b.set_conf_state(&cs)?;
                b.append(&[entry(1, 1), entry(2, 1), entry(3, 2)])?;
                b.set_hard_state(&hard_state(2, 3, 2))
            })
            .unwrap();
        store
            .write(|b| {
                b.state_txn()?
                    .open_table(STATE_MACHINE)?
                    .insert(b"k".as_slice(), b"v".as_slice())?;
                b.set_applied(2)
            })
            .unwrap();
    }
    let store = open(&dir);
    let state = store.initial_state().unwrap();
    assert_eq!(state.hard_state, hard_state(2, 3, 2));
    assert_eq!(state.conf_state.voters, vec![1, 2, 3]);
    assert_eq!(store.state().applied, 2);
    assert_eq!(
        indexes(&store.entries(1, 4, None, ctx()).unwrap()),
        vec![(1, 1), (2, 1), (3, 2)]
    );
    let txn = store.read().unwrap();
    let table = txn.open_table(STATE_MACHINE).unwrap();
    assert_eq!(table.get(b"k".as_slice()).unwrap().unwrap().value(), b"v");
}

#[test]
fn a_failed_batch_that_dropped_applies_stops_the_store_until_it_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    store
        .append_and_persist(&[entry(1, 1), entry(2, 1)], None)
        .unwrap();
    apply(&mut store, false, 1..=1);
    // A batch that fails before touching the state hands the open transaction back.
    assert!(store.write(|b| b.append(&[entry(5, 1)])).is_err());
    apply(&mut store, false, 2..=2);
    assert_eq!(applied_keys(&store), vec![1, 2]);
    // One that applied something and then failed took applies with it: no more batches.
    let result = store.write(|b| {
        b.set_applied(3)?;
        b.append(&[entry(9, 1)])
    });
    assert!(result.is_err());
    assert!(matches!(store.begin(), Err(StorageError::AppliesLost)));
    assert!(matches!(store.read(), Err(StorageError::AppliesLost)));
    // Reopened, it is as consistent as after a crash.
    drop(store);
    let store = open(&dir);
    let applied = store.state().applied;
    assert!(applied <= 2);
    assert_eq!(applied_keys(&store), (1..=applied).collect::<Vec<_>>());
}

#[test]
fn failed_batch_leaves_disk_and_cache_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    store.append_and_persist(&[entry(1, 1)], None).unwrap();
    let before = store.state().clone();
    let result = store.write(|b| {
        b.set_applied(1)?;
        b.append(&[entry(5, 1)])
    });
    assert!(result.is_err());
    assert_eq!(store.state(), &before);
    drop(store);
    assert_eq!(open(&dir).state(), &before);
}

#[test]
fn apply_snapshot_replaces_log_and_state_machine() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    store
        .append_and_persist(&[entry(1, 1), entry(2, 1)], Some(&hard_state(1, 0, 1)))
        .unwrap();
    let mut snapshot = Snapshot::default();
    snapshot.mut_metadata().index = 20;
    snapshot.mut_metadata().term = 3;
    snapshot.mut_metadata().mut_conf_state().voters = vec![1, 2, 3, 4];
    snapshot.data = compress_snapshot(b"restored").unwrap().into();
    store
        .apply_snapshot(&snapshot, |txn, data| {
            assert_eq!(data, b"restored");
            txn.open_table(STATE_MACHINE)?
                .insert(b"x".as_slice(), data)?;
            Ok(())
        })
        .unwrap();
    drop(store);
    let store = open(&dir);
    assert_eq!(store.first_index().unwrap(), 21);
    assert_eq!(store.last_index().unwrap(), 20);
    assert_eq!(store.term(20).unwrap(), 3);
    assert!(compacted(store.term(2)));
    let state = store.initial_state().unwrap();
    assert_eq!((state.hard_state.term, state.hard_state.commit), (3, 20));
    assert_eq!(state.conf_state.voters, vec![1, 2, 3, 4]);
    assert_eq!(store.state().applied, 20);
    // The node can serve the same snapshot on to other lagging peers.
    assert_eq!(store.snapshot(0, 4).unwrap(), snapshot);
    // A replica the snapshot does not name would refuse it: the node must build a newer one.
    assert!(matches!(
        store.snapshot(0, 5),
        Err(raft::Error::Store(
            RaftStorageError::SnapshotTemporarilyUnavailable
        ))
    ));
    assert!(store.take_snapshot_wanted());

    // An older snapshot is refused.
    let mut store = store;
    let mut old = snapshot.clone();
    old.mut_metadata().index = 10;
    let err = store.apply_snapshot(&old, |_, _| Ok(())).unwrap_err();
    assert!(
        matches!(err, StorageError::SnapshotOutOfDate { index: 10, .. }),
        "{err}"
    );
}

#[test]
fn missing_snapshot_is_temporarily_unavailable_and_flags_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    assert!(matches!(
        store.snapshot(0, 2),
        Err(raft::Error::Store(
            RaftStorageError::SnapshotTemporarilyUnavailable
        ))
    ));
    assert!(store.take_snapshot_wanted());
    assert!(!store.take_snapshot_wanted());
}

#[test]
fn snapshot_compression_round_trips_and_actually_compresses() {
    let data = b"key=value;".repeat(1000);
    let compressed = compress_snapshot(&data).unwrap();
    assert!(compressed.len() < data.len() / 10);
    // zstd frame magic number.
    assert_eq!(&compressed[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    assert_eq!(decompress_snapshot(&compressed).unwrap(), data);
    assert!(decompress_snapshot(b"not zstd").is_err());
}

/// Applies log entries `indexes` the way the node does: each entry's data under its index in the
/// state-machine table, and the applied index, in one batch; the state store is fsynced if
/// `sync`.
fn apply(store: &mut DiskStorage, sync: bool, indexes: std::ops::RangeInclusive<u64>) {
    let entries = store
        .entries(*indexes.start(), indexes.end() + 1, None, ctx())
        .unwrap();
    let mut batch = store.begin().unwrap();
    for entry in entries {
        batch
            .state_txn()
            .unwrap()
            .open_table(STATE_MACHINE)
            .unwrap()
            .insert(entry.index.to_be_bytes().as_slice(), &*entry.data)
            .unwrap();
        batch.set_applied(entry.index).unwrap();
    }
    if sync {
        batch.sync_state();
    }
    store.commit(batch).unwrap();
}

/// The indexes whose entries the state machine holds, in order.
fn applied_keys(store: &DiskStorage) -> Vec<u64> {
    let txn = store.read().unwrap();
    let table = txn.open_table(STATE_MACHINE).unwrap();
    table
        .iter()
        .unwrap()
        .map(|item| {
            let (key, _) = item.unwrap();
            u64::from_be_bytes(key.value().try_into().unwrap())
        })
        .collect()
}

/// SIGKILL of the process that has `store` open, then a restart (see `harness::crash`).
fn crash_and_reopen(store: DiskStorage, dir: &tempfile::TempDir) -> DiskStorage {
    crate::consensus::harness::crash(store, &dir.path().join("raft.redb"));
    open(dir)
}

#[test]
fn crash_loses_deferred_applies_only_back_to_a_consistent_state_and_the_log_replays_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    let log: Vec<_> = (1..=4).map(|i| entry(i, 1)).collect();
    store
        .append_and_persist(&log, Some(&hard_state(1, 1, 2)))
        .unwrap();
    apply(&mut store, true, 1..=2);
    // The commit index moves on alone: not written (Raft keeps it in volatile state).
    store.write(|b| b.set_commit(4)).unwrap();
    apply(&mut store, false, 3..=3);
    apply(&mut store, false, 4..=4);
    // A deferred apply is visible at once.
    assert_eq!(store.state().applied, 4);
    assert_eq!(store.state().durable_applied, 2);
    assert_eq!(applied_keys(&store), vec![1, 2, 3, 4]);

    let mut store = crash_and_reopen(store, &dir);
    // Both deferred commits are gone, and nothing else: the applied index and the state agree.
    assert_eq!(store.state().applied, 2);
    assert_eq!(applied_keys(&store), vec![1, 2]);
    // The log was fsynced, so everything past the applied index is there to re-apply once the
    // commit index is known again.
    let state = store.initial_state().unwrap();
    assert_eq!(state.hard_state, hard_state(1, 1, 2));
    assert_eq!(store.last_index().unwrap(), 4);
    apply(&mut store, false, 3..=4);
    assert_eq!(applied_keys(&store), vec![1, 2, 3, 4]);

    // An fsync of the state store makes the deferred applies before it durable.
    store.sync_state().unwrap();
    let store = crash_and_reopen(store, &dir);
    assert_eq!(store.state().applied, 4);
    assert_eq!(applied_keys(&store), vec![1, 2, 3, 4]);
    // The commit index on disk predates the last applies; opening raises it to the applied
    // index, as raft requires (committed entries were applied, so they were committed).
    assert_eq!(store.initial_state().unwrap().hard_state.commit, 4);
}

#[test]
fn the_log_is_fsynced_alone_and_a_log_commit_does_not_make_applies_durable() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    store
        .append_and_persist(&[entry(1, 1)], Some(&hard_state(1, 1, 1)))
        .unwrap();
    apply(&mut store, false, 1..=1);
    store
        .append_and_persist(&[entry(2, 1)], Some(&hard_state(1, 1, 2)))
        .unwrap();
    store
        .append_and_persist(&[entry(3, 2)], Some(&hard_state(2, 3, 2)))
        .unwrap();
    let store = crash_and_reopen(store, &dir);
    assert_eq!(store.last_index().unwrap(), 3);
    assert_eq!(store.state().applied, 0);
    assert_eq!(applied_keys(&store), Vec::<u64>::new());
    // Term and vote are written when they change, with the commit index of that moment; a new
    // commit index alone is not written (Raft keeps it in volatile state).
    assert_eq!(
        store.initial_state().unwrap().hard_state,
        hard_state(2, 3, 2)
    );
}

#[test]
fn a_new_commit_index_alone_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    store
        .append_and_persist(&[entry(1, 1), entry(2, 1)], Some(&hard_state(1, 1, 1)))
        .unwrap();
    store
        .append_and_persist(&[entry(3, 1)], Some(&hard_state(1, 1, 3)))
        .unwrap();
    assert_eq!(store.state().hard_state.commit, 3);
    let store = crash_and_reopen(store, &dir);
    assert_eq!(
        store.initial_state().unwrap().hard_state,
        hard_state(1, 1, 1)
    );
}

#[test]
fn compaction_fsyncs_the_state_first_so_no_entry_is_lost_from_both() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    let log: Vec<_> = (1..=6).map(|i| entry(i, 1)).collect();
    store
        .append_and_persist(&log, Some(&hard_state(1, 1, 6)))
        .unwrap();
    apply(&mut store, false, 1..=5);
    let meta = SnapshotMetadata {
        index: 5,
        term: 1,
        ..Default::default()
    };
    store
        .write(|b| b.store_snapshot(&meta, &compress_snapshot(b"state at 5")?))
        .unwrap();
    // A batch cannot compact past what the state store has fsynced ...
    let err = store.write(|b| b.compact(6)).unwrap_err();
    assert!(
        matches!(err, StorageError::CompactTooFar { limit: 1, .. }),
        "{err}"
    );
    // ... and compacting through the store fsyncs it first.
    store.compact(6).unwrap();

    let store = crash_and_reopen(store, &dir);
    assert_eq!(store.first_index().unwrap(), 6);
    assert_eq!(store.state().applied, 5);
    assert_eq!(applied_keys(&store), vec![1, 2, 3, 4, 5]);
    assert_eq!(
        indexes(&store.entries(6, 7, None, ctx()).unwrap()),
        vec![(6, 1)]
    );
}

#[test]
fn automatic_compaction_stops_at_the_state_stores_last_fsync_without_forcing_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    let log: Vec<_> = (1..=8).map(|i| entry(i, 1)).collect();
    store
        .append_and_persist(&log, Some(&hard_state(1, 1, 8)))
        .unwrap();
    apply(&mut store, true, 1..=3);
    apply(&mut store, false, 4..=6);
    assert_eq!(store.state().durable_applied, 3);
    // Asked for 7, it stops after the last durable apply and fsyncs nothing.
    assert_eq!(store.compact_durable(7).unwrap(), 4);
    assert_eq!(store.state().durable_applied, 3);

    let store = crash_and_reopen(store, &dir);
    assert_eq!(
        (store.first_index().unwrap(), store.state().applied),
        (4, 3)
    );
    assert_eq!(applied_keys(&store), vec![1, 2, 3]);
    // Every entry the crash un-applied is still in the log to be applied again.
    assert_eq!(
        indexes(&store.entries(4, 9, None, ctx()).unwrap()),
        (4..=8).map(|i| (i, 1)).collect::<Vec<_>>()
    );
}

#[test]
fn state_store_fsyncs_on_its_own_every_so_many_entries() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    let n = STATE_SYNC_ENTRIES + 2;
    let log: Vec<_> = (1..=n).map(|i| entry(i, 1)).collect();
    store
        .append_and_persist(&log, Some(&hard_state(1, 1, n)))
        .unwrap();
    for index in 1..=n {
        apply(&mut store, false, index..=index);
    }
    assert_eq!(store.state().durable_applied, STATE_SYNC_ENTRIES);
    let store = crash_and_reopen(store, &dir);
    assert_eq!(store.state().applied, STATE_SYNC_ENTRIES);
}

#[test]
fn applies_wait_in_one_open_transaction_that_a_crash_loses_and_a_close_commits() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    let log: Vec<_> = (1..=3).map(|i| entry(i, 1)).collect();
    store
        .append_and_persist(&log, Some(&hard_state(1, 1, 3)))
        .unwrap();
    apply(&mut store, false, 1..=1);
    apply(&mut store, false, 2..=2);
    // Never committed: a crash loses both.
    let mut store = crash_and_reopen(store, &dir);
    assert_eq!(store.state().applied, 0);
    apply(&mut store, false, 1..=3);
    // A clean close commits and fsyncs them.
    drop(store);
    let store = crash_and_reopen(open(&dir), &dir);
    assert_eq!(store.state().applied, 3);
    assert_eq!(applied_keys(&store), vec![1, 2, 3]);
}

#[test]
fn crash_inside_a_snapshot_install_leaves_the_state_behind_the_log_for_the_node_to_restore() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    let mut store = open(&dir);
    store
        .append_and_persist(&[entry(1, 1), entry(2, 1)], Some(&hard_state(1, 0, 1)))
        .unwrap();
    apply(&mut store, true, 1..=1);
    let mut snapshot = Snapshot::default();
    snapshot.mut_metadata().index = 20;
    snapshot.mut_metadata().term = 3;
    snapshot.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
    snapshot.data = compress_snapshot(b"restored").unwrap().into();
    // The crash image of the state file is taken before the install, the log is as after it:
    // as if the process died between the install's two commits.
    let [_, state_file] = DiskStorage::files(&path);
    let state_before = std::fs::read(&state_file).unwrap();
    store.apply_snapshot(&snapshot, |_, _| Ok(())).unwrap();
    drop(store);
    std::fs::write(&state_file, state_before).unwrap();

    let mut store = open(&dir);
    assert!(store.state_behind_log());
    assert_eq!(
        (store.state().applied, store.first_index().unwrap()),
        (1, 21)
    );
    let stored = store.stored_snapshot().unwrap().unwrap();
    store
        .write(|b| {
            b.restore_state(&stored, |txn, data| {
                txn.open_table(STATE_MACHINE)?
                    .insert(b"x".as_slice(), data)?;
                Ok(())
            })
        })
        .unwrap();
    assert!(!store.state_behind_log());
    assert_eq!(store.state().applied, 20);
    assert_eq!(store.state().conf_state.voters, vec![1, 2, 3]);
    assert_eq!(store.initial_state().unwrap().hard_state.commit, 20);
}

#[test]
fn a_store_written_in_one_redb_file_moves_its_log_to_the_wal_and_its_state_to_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    let mut meta = SnapshotMetadata {
        index: 1,
        term: 1,
        ..SnapshotMetadata::default()
    };
    meta.mut_conf_state().voters = vec![1, 2, 3];
    {
        // The layout before the split: log and state tables in one redb file.
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let mut log = txn.open_table(LOG).unwrap();
        for e in [entry(2, 1), entry(3, 2)] {
            log.insert(e.index, encode("log entry", &e).unwrap().as_slice())
                .unwrap();
        }
        drop(log);
        txn.open_table(LOG_TRUNCATED)
            .unwrap()
            .insert((), (1, 1))
            .unwrap();
        txn.open_table(SNAPSHOT_META)
            .unwrap()
            .insert((), encode("snapshot metadata", &meta).unwrap().as_slice())
            .unwrap();
        txn.open_table(SNAPSHOT_DATA)
            .unwrap()
            .insert((), compress_snapshot(b"at 1").unwrap().as_slice())
            .unwrap();
        txn.open_table(HARD_STATE)
            .unwrap()
            .insert(
                (),
                encode("hard state", &hard_state(2, 1, 2))
                    .unwrap()
                    .as_slice(),
            )
            .unwrap();
        txn.open_table(APPLIED).unwrap().insert((), 2).unwrap();
        let cs = ConfState {
            voters: vec![1, 2, 3],
            ..Default::default()
        };
        txn.open_table(CONF_STATE)
            .unwrap()
            .insert((), encode("conf state", &cs).unwrap().as_slice())
            .unwrap();
        txn.open_table(STATE_MACHINE)
            .unwrap()
            .insert(b"k".as_slice(), b"v".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let check = |store: &DiskStorage| {
        assert_eq!(store.state().applied, 2);
        assert_eq!(store.state().conf_state.voters, vec![1, 2, 3]);
        assert_eq!(
            (store.first_index().unwrap(), store.last_index().unwrap()),
            (2, 3)
        );
        assert_eq!((store.term(1).unwrap(), store.term(3).unwrap()), (1, 2));
        let hs = store.initial_state().unwrap().hard_state;
        assert_eq!((hs.term, hs.vote, hs.commit), (2, 1, 2));
        let snapshot = store.stored_snapshot().unwrap().unwrap();
        assert_eq!(snapshot.get_metadata(), &meta);
        assert_eq!(decompress_snapshot(&snapshot.data).unwrap(), b"at 1");
        let txn = store.read().unwrap();
        let table = txn.open_table(STATE_MACHINE).unwrap();
        assert_eq!(table.get(b"k".as_slice()).unwrap().unwrap().value(), b"v");
    };
    let store = open(&dir);
    check(&store);
    drop(store);
    // Moved, not copied: the redb file is gone, and a second open finds the same store.
    assert!(!path.exists());
    check(&open(&dir));
}

/// Review finding: a crash while the migration writes the first segment must leave the old
/// log to import again, and a segment file that is not a log must not let the old file go.
#[test]
fn a_migration_cut_short_is_done_again_and_a_bad_segment_keeps_the_old_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let mut log = txn.open_table(LOG).unwrap();
        for e in [entry(1, 1), entry(2, 2)] {
            log.insert(e.index, encode("log entry", &e).unwrap().as_slice())
                .unwrap();
        }
        drop(log);
        txn.open_table(HARD_STATE)
            .unwrap()
            .insert(
                (),
                encode("hard state", &hard_state(2, 1, 2))
                    .unwrap()
                    .as_slice(),
            )
            .unwrap();
        txn.commit().unwrap();
    }
    let [wal_dir, _] = DiskStorage::files(&path);
    std::fs::create_dir_all(&wal_dir).unwrap();
    // A segment being written when the process died: never renamed into place.
    std::fs::write(wal_dir.join("0000000000000000.wal.tmp"), b"").unwrap();
    let store = DiskStorage::open(&path).unwrap();
    assert_eq!(store.last_index().unwrap(), 2);
    assert_eq!(store.initial_state().unwrap().hard_state.vote, 1);
    drop(store);
    assert!(!path.exists());

    // An empty segment file (corruption: segments appear whole) with an old log beside it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    drop(Database::create(&path).unwrap());
    let [wal_dir, _] = DiskStorage::files(&path);
    std::fs::create_dir_all(&wal_dir).unwrap();
    std::fs::write(wal_dir.join("0000000000000000.wal"), b"").unwrap();
    assert!(DiskStorage::open(&path).is_err());
    assert!(path.exists(), "the old log file was removed");
}

#[test]
fn a_staged_state_flush_makes_nothing_durable_until_the_commit_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(&dir);
    let log: Vec<_> = (1..=4).map(|i| entry(i, 1)).collect();
    store
        .append_and_persist(&log, Some(&hard_state(1, 1, 4)))
        .unwrap();
    assert!(
        store.stage_state_sync().unwrap().is_none(),
        "nothing to flush"
    );
    apply(&mut store, false, 1..=2);
    // The pages go out, but redb's commit record does not: a crash still loses the applies.
    let file = store.stage_state_sync().unwrap().expect("applies to flush");
    file.sync_data().unwrap();
    let mut store = crash_and_reopen(store, &dir);
    assert_eq!(store.state().applied, 0);

    apply(&mut store, false, 1..=3);
    let file = store.stage_state_sync().unwrap().expect("applies to flush");
    file.sync_data().unwrap();
    // Applied while the flush ran; the commit after it covers these too.
    apply(&mut store, false, 4..=4);
    store.sync_state().unwrap();
    assert!(store.stage_state_sync().unwrap().is_none());
    let store = crash_and_reopen(store, &dir);
    assert_eq!(store.state().applied, 4);
    assert_eq!(applied_keys(&store), vec![1, 2, 3, 4]);
}

/// Found by the power-loss test: redb sizes a new state file before it writes its header and
/// magic number, and refuses a non-empty file without one. A crash during a fresh store's first
/// open (SIGKILL after that resize is enough) left a store that never opened again.
#[test]
fn a_state_file_whose_creation_a_crash_cut_short_is_created_again_but_not_beside_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    let [wal_dir, state_file] = DiskStorage::files(&path);
    // What redb's first resize leaves: zeroes, no header.
    std::fs::write(&state_file, vec![0; 64 << 10]).unwrap();
    let mut store = DiskStorage::open(&path).unwrap();
    store.append_and_persist(&[entry(1, 1)], None).unwrap();
    drop(store);
    assert_eq!(open(&dir).last_index().unwrap(), 1);

    // With a log beside it, such a file is not ours to replace: the store refuses it.
    std::fs::write(&state_file, vec![0; 64 << 10]).unwrap();
    assert!(wal_dir.is_dir());
    let error = DiskStorage::open(&path).unwrap_err();
    assert!(matches!(error, StorageError::Open { .. }), "{error}");
    assert_eq!(std::fs::read(&state_file).unwrap(), vec![0; 64 << 10]);
}
