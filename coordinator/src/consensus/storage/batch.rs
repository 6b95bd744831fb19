//! [`Batch`]: one atomic change to the store, spanning its two parts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use redb::{Database, WriteTransaction};

use super::wal::{LogOp, MemLog};
use super::{
    APPLIED, BOOTSTRAP_INDEX, BOOTSTRAP_TERM, CONF_STATE, LogState, Result, StorageError,
    compress_snapshot, decompress_snapshot, encode, lock,
};

/// One change to the store: the ops it adds to the log (one record, fsynced), and the state
/// store's open write transaction (begun if there is none), plus the cache as it will be after
/// commit. Obtain with [`DiskStorage::begin`](super::DiskStorage::begin), finish with
/// [`DiskStorage::commit`](super::DiskStorage::commit), which commits the log part (fsynced),
/// then keeps or commits the state part. Each part is atomic; a crash between them is
/// recovered on open.
pub struct Batch {
    log: Arc<Mutex<MemLog>>,
    state_db: Arc<Database>,
    log_ops: Vec<LogOp>,
    /// Compressed data of the snapshot a [`LogOp::Snapshot`] in `log_ops` names.
    snapshot_data: Option<Vec<u8>>,
    state_txn: Option<WriteTransaction>,
    /// Whether `state_txn` was handed out for writing.
    state_changed: bool,
    pending: Arc<PendingState>,
    sync_state: bool,
    state: LogState,
}

/// The state store's open write transaction, between batches. A batch that fails (is dropped
/// without being committed) hands it back if it did not change it; if it did, the applies in it
/// are gone while the store's cache counts them, and the store refuses further batches until
/// it is reopened.
#[derive(Default)]
pub(super) struct PendingState {
    txn: Mutex<Option<WriteTransaction>>,
    lost: AtomicBool,
}

impl PendingState {
    pub(super) fn take(&self) -> Option<WriteTransaction> {
        lock(&self.txn).take()
    }

    pub(super) fn put(&self, txn: WriteTransaction) {
        *lock(&self.txn) = Some(txn);
    }

    pub(super) fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }

    pub(super) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

/// What [`DiskStorage::commit`](super::DiskStorage::commit) takes apart.
pub(super) struct Parts {
    pub(super) log_ops: Vec<LogOp>,
    pub(super) snapshot_data: Option<Vec<u8>>,
    pub(super) state_txn: Option<WriteTransaction>,
    pub(super) sync_state: bool,
    pub(super) state: LogState,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("state", &self.state)
            .field("log_ops", &self.log_ops.len())
            .field("writes_state", &self.state_txn.is_some())
            .field("sync_state", &self.sync_state)
            .finish()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Still here: the batch was not committed (into_parts takes it).
        if let Some(txn) = self.state_txn.take() {
            if self.state_changed {
                self.pending.mark_lost();
            } else {
                self.pending.put(txn);
            }
        }
    }
}

impl Batch {
    pub(super) fn new(
        log: Arc<Mutex<MemLog>>,
        state_db: Arc<Database>,
        pending: Arc<PendingState>,
        state: LogState,
    ) -> Self {
        Self {
            log,
            state_db,
            log_ops: Vec::new(),
            snapshot_data: None,
            state_txn: pending.take(),
            state_changed: false,
            pending,
            sync_state: false,
            state,
        }
    }

    pub(super) fn into_parts(mut self) -> Parts {
        Parts {
            log_ops: std::mem::take(&mut self.log_ops),
            snapshot_data: self.snapshot_data.take(),
            state_txn: self.state_txn.take(),
            sync_state: self.sync_state,
            state: std::mem::take(&mut self.state),
        }
    }

    /// The state store's transaction, for the state machine's writes (see
    /// [`STATE_MACHINE`](super::STATE_MACHINE)); the applied index is written in it too.
    pub fn state_txn(&mut self) -> Result<&WriteTransaction> {
        let txn = match self.state_txn.take() {
            Some(txn) => txn,
            None => self.state_db.begin_write()?,
        };
        self.state_changed = true;
        Ok(self.state_txn.insert(txn))
    }

    /// Asks for the state part to be fsynced on commit, and with it every state-store commit
    /// before it.
    pub fn sync_state(&mut self) {
        self.sync_state = true;
    }

    /// The state as it will be once this batch commits.
    pub fn state(&self) -> &LogState {
        &self.state
    }

    /// Appends entries, first removing any conflicting suffix of the log (entries at or after
    /// the first new index), as raft requires when a new leader overwrites uncommitted entries.
    pub fn append(&mut self, entries: &[Entry]) -> Result<()> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        let first_new = first.index;
        if first_new <= self.state.truncated_index {
            return Err(StorageError::OverwriteCompacted {
                first_new,
                truncated: self.state.truncated_index,
            });
        }
        if first_new > self.state.last_index + 1 {
            return Err(StorageError::Gap {
                first_new,
                last: self.state.last_index,
            });
        }
        self.log_ops.push(LogOp::Append(entries.to_vec()));
        self.state.last_index = entries.last().map_or(first_new, |e| e.index);
        Ok(())
    }

    /// Sets the hard state. A new term or vote is written (and fsynced) with this batch, with
    /// the commit index of the moment; a new commit index alone is not written (see
    /// [`DiskStorage::commit`](super::DiskStorage::commit)).
    pub fn set_hard_state(&mut self, hard_state: &HardState) -> Result<()> {
        self.state.hard_state = hard_state.clone();
        Ok(())
    }

    /// Records a newer commit index (from a light ready) in the hard state.
    pub fn set_commit(&mut self, commit: u64) -> Result<()> {
        if commit > self.state.hard_state.commit {
            self.state.hard_state.commit = commit;
        }
        Ok(())
    }

    /// Records the membership as of the applied index, with the applied index.
    pub fn set_conf_state(&mut self, conf_state: &ConfState) -> Result<()> {
        let bytes = encode("conf state", conf_state)?;
        self.state_txn()?
            .open_table(CONF_STATE)?
            .insert((), bytes.as_slice())?;
        self.state.conf_state = conf_state.clone();
        Ok(())
    }

    /// Records the applied index; write the state machine's changes in the same batch.
    pub fn set_applied(&mut self, index: u64) -> Result<()> {
        self.state_txn()?.open_table(APPLIED)?.insert((), index)?;
        self.state.applied = index;
        Ok(())
    }

    /// Stores a snapshot (metadata and compressed data) so it can be sent to lagging peers.
    pub fn store_snapshot(&mut self, meta: &SnapshotMetadata, data: &[u8]) -> Result<()> {
        self.log_ops.push(LogOp::Snapshot(meta.clone()));
        self.snapshot_data = Some(data.to_vec());
        self.state.snapshot = meta.clone();
        Ok(())
    }

    /// The term of the entry at `index` as the log will hold it once this batch commits.
    fn term_of(&self, index: u64) -> Option<u64> {
        let appended = self.log_ops.iter().rev().find_map(|op| match op {
            LogOp::Append(entries) => entries.iter().find(|e| e.index == index).map(|e| e.term),
            _ => None,
        });
        appended.or_else(|| lock(&self.log).get(index).map(|e| e.term))
    }

    /// Removes every log entry before `to`. `to` may not pass the applied index as of the state
    /// store's last fsync: a crash must find every entry it re-applies. It may pass the stored
    /// snapshot: a peer that needs the removed entries gets a new snapshot, which the node
    /// builds from the applied state when raft asks for it (see `raft::Storage::snapshot`).
    pub fn compact(&mut self, to: u64) -> Result<()> {
        if to <= self.state.first_index() {
            return Ok(());
        }
        let limits = [
            (
                self.state.durable_applied + 1,
                "past the applied index on disk",
            ),
            (self.state.last_index + 1, "past the end of the log"),
        ];
        for (limit, reason) in limits {
            if to > limit {
                return Err(StorageError::CompactTooFar { to, limit, reason });
            }
        }
        let truncated_index = to - 1;
        let first = self.state.first_index();
        let truncated_term = if truncated_index == self.state.snapshot.index {
            self.state.snapshot.term
        } else {
            let missing = StorageError::MissingEntry {
                index: truncated_index,
                first,
                last: self.state.last_index,
            };
            self.term_of(truncated_index).ok_or(missing)?
        };
        self.log_ops.push(LogOp::Compact {
            index: truncated_index,
            term: truncated_term,
        });
        self.set_truncated(truncated_index, truncated_term)
    }

    /// Empties the log, which then starts after `index` (of `term`).
    fn reset_log(&mut self, index: u64, term: u64) -> Result<()> {
        self.log_ops.push(LogOp::Reset { index, term });
        self.state.last_index = index;
        self.set_truncated(index, term)
    }

    fn set_truncated(&mut self, index: u64, term: u64) -> Result<()> {
        self.state.truncated_index = index;
        self.state.truncated_term = term;
        self.state.last_index = self.state.last_index.max(index);
        Ok(())
    }

    /// Initializes a fresh store of a founding replica. The founding configuration is written
    /// as a snapshot at index 1 (term 1) rather than as bare conf state, the way tikv starts
    /// its regions: a replica that joins later starts with an empty log, so the leader must send
    /// it that snapshot, and it learns the founding members from it. Replaying the log from an
    /// empty configuration instead would leave it with only the members added since.
    pub fn bootstrap(&mut self, conf_state: &ConfState, state_machine_data: &[u8]) -> Result<()> {
        let mut meta = SnapshotMetadata {
            index: BOOTSTRAP_INDEX,
            term: BOOTSTRAP_TERM,
            ..SnapshotMetadata::default()
        };
        meta.set_conf_state(conf_state.clone());
        self.reset_log(BOOTSTRAP_INDEX, BOOTSTRAP_TERM)?;
        self.store_snapshot(&meta, &compress_snapshot(state_machine_data)?)?;
        self.set_conf_state(conf_state)?;
        self.set_hard_state(&HardState {
            term: BOOTSTRAP_TERM,
            commit: BOOTSTRAP_INDEX,
            ..HardState::default()
        })?;
        self.sync_state();
        self.set_applied(BOOTSTRAP_INDEX)
    }

    /// Installs a snapshot received from the leader: the log is replaced by the snapshot, the
    /// conf state, commit and applied index move to it, and `restore` rewrites the state
    /// machine from the decompressed data. The log part commits first, with the snapshot
    /// stored: if a crash comes before the state part, the state store is behind the log's
    /// start on open and is restored from that stored snapshot.
    pub fn apply_snapshot(
        &mut self,
        snapshot: &Snapshot,
        restore: impl FnOnce(&WriteTransaction, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let meta = snapshot.get_metadata();
        if meta.index <= self.state.truncated_index {
            return Err(StorageError::SnapshotOutOfDate {
                index: meta.index,
                truncated: self.state.truncated_index,
            });
        }
        // Raft only hands out a snapshot that does not match the local log, so the whole log
        // is replaced, as raft-rs's MemStorage does.
        self.reset_log(meta.index, meta.term)?;
        self.store_snapshot(meta, &snapshot.data)?;
        let mut hard_state = self.state.hard_state.clone();
        if meta.term > hard_state.term {
            // A vote belongs to its term; in the new one this replica has not voted.
            hard_state.term = meta.term;
            hard_state.vote = 0;
        }
        hard_state.commit = hard_state.commit.max(meta.index);
        self.set_hard_state(&hard_state)?;
        self.restore_state(snapshot, restore)
    }

    /// Rewrites the state store from `snapshot`: `restore` gets the decompressed data, and the
    /// applied index and membership move to the snapshot's; fsynced on commit.
    pub fn restore_state(
        &mut self,
        snapshot: &Snapshot,
        restore: impl FnOnce(&WriteTransaction, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let meta = snapshot.get_metadata();
        let data = decompress_snapshot(&snapshot.data)?;
        restore(self.state_txn()?, &data)?;
        self.set_conf_state(meta.get_conf_state())?;
        self.set_applied(meta.index)?;
        self.state.hard_state.commit = self.state.hard_state.commit.max(meta.index);
        self.sync_state();
        Ok(())
    }
}
