//! [`DiskStorage`], durable Raft storage in two parts on disk, the way etcd keeps a
//! write-ahead log and a backend:
//!
//! - the **log** ([`wal`]), in the directory `<path>.wal` beside the path given to
//!   [`DiskStorage::open`] (e.g. `store.wal` for `store.redb`): log entries, hard state (term,
//!   vote), where the log starts, and the stored snapshot. Each commit appends one record and
//!   fsyncs it: raft promises its contents to peers, and an acknowledged write is an entry in it
//!   on a quorum. The log is also kept in memory, so raft reads entries without touching disk.
//! - the **state store**, a redb file beside it ([`DiskStorage::files`], e.g.
//!   `store.state.redb`): the state machine's table, the applied index and the applied
//!   membership (conf state), which change together whenever committed entries are applied.
//!   Applies accumulate in one open write transaction of the state store (as etcd batches its
//!   backend), committed and fsynced once [`STATE_SYNC_ENTRIES`] entries were applied since the
//!   last time, on [`DiskStorage::sync_state`] (the runtime calls it on a timer), before the log
//!   is compacted, when a snapshot is installed, and when the store is closed. A read of the
//!   state store ([`DiskStorage::read`]) first commits the open transaction without an fsync
//!   ([`Durability::None`]), so readers see every apply.
//!
//! Two parts because an fsync flushes every page of its file written since the previous one: a
//! log append is a few hundred bytes at the end of one file, where a redb commit writes several
//! scattered B-tree pages (about 5 per write even with the state machine in another file).
//! Applying needs no fsync: the entries it applies are already durable in the log. One open
//! transaction because redb copies a page on its first change in each transaction: across many
//! applies, each page is written once.
//!
//! **Crash recovery.** The log replays to its last whole record (a torn record at its end was
//! never acknowledged; see [`wal`]). redb recovers the state store to its last fsynced commit
//! (through `redb_backend.rs`, which keeps redb 2 from trusting allocator state a crash left
//! stale), and its
//! commits are totally ordered, so a crash loses the open transaction and a suffix of unsynced
//! commits, never part of one: the state machine, applied index and membership on disk always
//! agree, only older. The log keeps every entry after the state store's durable applied index
//! (the log is only compacted after the state store was fsynced, see [`DiskStorage::compact`]),
//! so a restarted replica re-applies them once it learns the commit index again. On open: a
//! commit index below the applied index is raised to it (the hard state is written when its
//! term or vote changes, not for a new commit index, which Raft keeps in volatile state), and a
//! state store left behind the start of the log (a crash between the two commits of a snapshot
//! install) is restored from the stored snapshot by the node
//! ([`DiskStorage::state_behind_log`]).
//!
//! Every change goes through a [`Batch`], committed by [`DiskStorage::commit`]: its log part
//! first, then its state part. The in-memory [`LogState`] cache is replaced only after both
//! committed.
//!
//! State store layout:
//!
//! | table                  | key    | value                                        |
//! |------------------------|--------|----------------------------------------------|
//! | `raft_applied_index`   | `()`   | last applied index                           |
//! | `raft_conf_state`      | `()`   | protobuf-encoded `ConfState` as applied      |
//! | `state_machine`        | bytes  | opaque, owned by the [`StateMachine`](super::StateMachine) |
//!
//! Stores written before the log moved out of redb kept it in the redb file at the given path,
//! and before that the state tables too; [`DiskStorage::open`] moves them and removes that file
//! (`storage/migrate.rs`).

use std::cell::Cell;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState};
use redb::{Database, Durability, ReadTransaction, TableDefinition, WriteTransaction};

mod batch;
pub mod disk;
mod error;
mod migrate;
#[cfg(test)]
mod power_loss;
mod redb_backend;
#[cfg(test)]
mod sim_disk;
pub mod wal;

pub use batch::Batch;
use batch::PendingState;
use disk::Disk;
pub use disk::StateFlush;
pub use error::{Result, StorageError};
use wal::{LogOp, MemLog, Wal};

/// Locks a mutex of the store. Nothing panics while holding one, so a poisoned lock still
/// holds a sound value.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

const CONF_STATE: TableDefinition<'_, (), &[u8]> = TableDefinition::new("raft_conf_state");
const APPLIED: TableDefinition<'_, (), u64> = TableDefinition::new("raft_applied_index");

/// The table a [`StateMachine`](super::StateMachine) may use for its own data, in the state
/// store. It is written in the same transaction as the applied index, so state and applied index
/// never disagree.
pub const STATE_MACHINE: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("state_machine");

/// Index and term of the snapshot that founding replicas start from (see [`Batch::bootstrap`]).
pub const BOOTSTRAP_INDEX: u64 = 1;
pub const BOOTSTRAP_TERM: u64 = 1;

/// Upper bound on a decompressed snapshot, so a corrupt or hostile blob cannot exhaust memory.
pub const MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

/// zstd level for snapshots: level 3 is zstd's default speed/ratio trade-off.
const SNAPSHOT_ZSTD_LEVEL: i32 = 3;

/// The state store is committed and fsynced once this many entries were applied since its last
/// fsync, even if nothing else asks for it: this bounds the open transaction, the fsync that ends
/// it, and what a restart re-applies.
pub const STATE_SYNC_ENTRIES: u64 = 1024;

/// What raft needs to know about the log without reading it: cached, and replaced only after
/// the batch that changed it has committed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogState {
    /// The latest hard state. On disk its term and vote are always current; its commit index
    /// is only as of the last term or vote change (Raft keeps the commit index in volatile
    /// state: the leader tells it again).
    pub hard_state: HardState,
    /// The membership as of the applied index.
    pub conf_state: ConfState,
    pub applied: u64,
    /// The applied index as of the state store's last fsync: a crash rolls `applied` back no
    /// further, and the log is never compacted past it.
    pub durable_applied: u64,
    /// Index and term of the last entry removed from the log (0, 0 when nothing was).
    pub truncated_index: u64,
    pub truncated_term: u64,
    /// Index of the last entry in the log, or `truncated_index` when the log is empty.
    pub last_index: u64,
    /// Metadata of the stored snapshot (index 0 when there is none).
    pub snapshot: SnapshotMetadata,
}

impl LogState {
    pub fn first_index(&self) -> u64 {
        self.truncated_index + 1
    }
}

fn encode<M: protobuf::Message>(what: &'static str, m: &M) -> Result<Vec<u8>> {
    m.write_to_bytes()
        .map_err(|source| StorageError::Encode { what, source })
}

fn decode<M: protobuf::Message>(what: &'static str, bytes: &[u8]) -> Result<M> {
    M::parse_from_bytes(bytes).map_err(|source| StorageError::Decode { what, source })
}

/// Compresses a serialized state machine for a snapshot.
pub fn compress_snapshot(data: &[u8]) -> Result<Vec<u8>> {
    zstd::stream::encode_all(data, SNAPSHOT_ZSTD_LEVEL).map_err(StorageError::SnapshotData)
}

/// Decompresses snapshot data, refusing more than [`MAX_SNAPSHOT_BYTES`].
pub fn decompress_snapshot(data: &[u8]) -> Result<Vec<u8>> {
    let decoder = zstd::stream::read::Decoder::new(data).map_err(StorageError::SnapshotData)?;
    let mut out = Vec::new();
    decoder
        .take(MAX_SNAPSHOT_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(StorageError::SnapshotData)?;
    if out.len() as u64 > MAX_SNAPSHOT_BYTES {
        return Err(StorageError::SnapshotTooLarge {
            limit: MAX_SNAPSHOT_BYTES,
        });
    }
    Ok(out)
}

/// A [`raft::Storage`] over a write-ahead log and a redb state store (see the module
/// documentation).
pub struct DiskStorage {
    disk: Disk,
    wal: Wal,
    /// The log as committed to `wal`, shared with the batch in progress (which reads terms).
    log: Arc<Mutex<MemLog>>,
    state_db: Arc<Database>,
    state_path: PathBuf,
    state: LogState,
    /// The hard state as last written to the log.
    persisted_hard_state: HardState,
    /// The state store's open write transaction, shared with the batch that holds it.
    pending_state: Arc<PendingState>,
    /// Whether the state store holds changes a crash would lose (an open transaction, or
    /// commits not fsynced yet).
    state_unsynced: Cell<bool>,
    // Set when raft asked for a snapshot that is not there yet; the node then builds one.
    snapshot_wanted: Cell<bool>,
}

impl std::fmt::Debug for DiskStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStorage")
            .field("state", &self.state)
            .field("state_unsynced", &self.state_unsynced.get())
            .finish_non_exhaustive()
    }
}

fn open_database(disk: &Disk, path: &Path, fresh: bool) -> Result<Database> {
    disk.open_database(path, fresh)
        .map_err(|source| StorageError::Open {
            path: path.to_owned(),
            source: Box::new(source),
        })
}

fn durable_write(db: &Database) -> Result<WriteTransaction> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    Ok(txn)
}

impl DiskStorage {
    /// The log directory and the state file of the store opened at `path`: `path` with the
    /// extensions `wal` and `state.redb`.
    pub fn files(path: &Path) -> [PathBuf; 2] {
        [
            path.with_extension("wal"),
            path.with_extension("state.redb"),
        ]
    }

    /// Opens (or creates) the store at `path` (see [`DiskStorage::files`]) and restores its
    /// state from disk.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_on(Disk::Os, path)
    }

    /// [`DiskStorage::open`] on `disk` (tests put a simulated disk under the store).
    pub(crate) fn open_on(disk: Disk, path: &Path) -> Result<Self> {
        let [wal_dir, state_path] = Self::files(path);
        // No log yet (nor a store of an older version): the log is created, and its directory
        // fsynced, before the state store's first commit, so the state file then holds nothing
        // of ours and one whose creation a crash cut short is created again. Beside a log, a
        // state file without redb's magic number is left for redb to refuse.
        let fresh = !disk.exists(path) && !Wal::exists(&disk, &wal_dir)?;
        let state_db = open_database(&disk, &state_path, fresh)?;
        let (wal, mem) = migrate::open_log(&disk, path, &wal_dir, &state_db)?;
        // Create every table up front so that read transactions never meet a missing table.
        let txn = durable_write(&state_db)?;
        txn.open_table(APPLIED)?;
        txn.open_table(CONF_STATE)?;
        txn.open_table(STATE_MACHINE)?;
        txn.commit()?;
        let mut state = Self::load(&mem, &state_db.begin_read()?)?;
        let persisted_hard_state = state.hard_state.clone();
        if state.applied > state.last_index {
            return Err(StorageError::StateAheadOfLog {
                applied: state.applied,
                last: state.last_index,
            });
        }
        // Entries are applied only once committed, so the commit index is at least the applied
        // index, even when the hard state on disk predates the last commit-only change.
        if state.applied >= state.truncated_index {
            state.hard_state.commit = state.hard_state.commit.max(state.applied);
        }
        Ok(Self {
            disk,
            wal,
            log: Arc::new(Mutex::new(mem)),
            state_db: Arc::new(state_db),
            state_path,
            state,
            persisted_hard_state,
            pending_state: Arc::new(PendingState::default()),
            state_unsynced: Cell::new(false),
            snapshot_wanted: Cell::new(false),
        })
    }

    fn load(log: &MemLog, state_store: &ReadTransaction) -> Result<LogState> {
        let mut state = LogState {
            hard_state: log.hard_state.clone(),
            snapshot: log.snapshot.clone(),
            truncated_index: log.truncated.0,
            truncated_term: log.truncated.1,
            last_index: log.last_index(),
            ..LogState::default()
        };
        if let Some(bytes) = state_store.open_table(CONF_STATE)?.get(())? {
            state.conf_state = decode("conf state", bytes.value())?;
        }
        state.applied = state_store
            .open_table(APPLIED)?
            .get(())?
            .map_or(0, |v| v.value());
        state.durable_applied = state.applied;
        Ok(state)
    }

    /// The cached state: the store as of its last commit. The state store's part (applied
    /// index, membership) may be ahead of what a crash would leave; see
    /// [`LogState::durable_applied`].
    pub fn state(&self) -> &LogState {
        &self.state
    }

    /// Whether this store holds a configuration or a log (false for a fresh replica).
    pub fn is_initialized(&self) -> bool {
        self.state.conf_state != ConfState::default() || self.state.last_index > 0
    }

    /// Whether the state store is behind the start of the log: the entries it would need were
    /// replaced by the stored snapshot (a crash between the two commits of a snapshot install
    /// or of a bootstrap; compaction fsyncs the state store first, so it never causes this).
    /// The node then restores it from that snapshot, which starts the log in exactly these
    /// cases ([`Batch::restore_state`]).
    pub fn state_behind_log(&self) -> bool {
        self.state.applied < self.state.truncated_index
    }

    /// Starts a change. One batch at a time: it holds the state store's open transaction.
    pub fn begin(&self) -> Result<Batch> {
        if self.pending_state.is_lost() {
            return Err(StorageError::AppliesLost);
        }
        Ok(Batch::new(
            self.log.clone(),
            self.state_db.clone(),
            self.pending_state.clone(),
            self.state.clone(),
        ))
    }

    /// Commits a batch and updates the cache: first its log part, one fsynced record, then its
    /// state part. The log part is written when the batch changed the log or the term or vote.
    /// The hard state is written only when its term or vote changed: the commit index is
    /// volatile in Raft (the leader tells it again, and open raises it to the applied index),
    /// and leaving it out keeps the record small. The state part stays in the state store's
    /// open transaction, unless the batch asks for an fsync ([`Batch::sync_state`]) or
    /// [`STATE_SYNC_ENTRIES`] entries were applied since the last one: then that transaction is
    /// committed and fsynced, and with it everything the state store holds.
    ///
    /// After an error the store must be reopened: the log may have committed and the state
    /// store not, and the open transaction is gone.
    pub fn commit(&mut self, batch: Batch) -> Result<()> {
        let result = self.commit_parts(batch.into_parts());
        if result.is_err() {
            // The state store's open transaction went with the failed commit.
            self.pending_state.mark_lost();
        }
        result
    }

    fn commit_parts(&mut self, parts: batch::Parts) -> Result<()> {
        let mut state = parts.state;
        let mut log_ops = parts.log_ops;
        let term_or_vote_changed = state.hard_state.term != self.persisted_hard_state.term
            || state.hard_state.vote != self.persisted_hard_state.vote;
        if term_or_vote_changed {
            log_ops.push(LogOp::HardState(state.hard_state.clone()));
        }
        if !log_ops.is_empty() {
            let snapshot_changed = log_ops.iter().any(|op| matches!(op, LogOp::Snapshot(_)));
            if let Some(data) = &parts.snapshot_data {
                // Durable before the record that names it.
                self.wal.write_snapshot(&state.snapshot, data)?;
            }
            self.wal.commit(&log_ops)?;
            let mut log = lock(&self.log);
            for op in log_ops {
                log.apply(op)?;
            }
            self.wal.roll_over_if_full(&log)?;
            drop(log);
            if snapshot_changed
                && let Err(error) = self.wal.remove_unused_snapshots(&state.snapshot)
            {
                // Only clean-up: the next open tries again.
                tracing::warn!(%error, "could not remove an old snapshot file");
            }
            if term_or_vote_changed {
                self.persisted_hard_state = state.hard_state.clone();
            }
        }
        let sync = parts.sync_state || state.applied >= state.durable_applied + STATE_SYNC_ENTRIES;
        let state_txn = match parts.state_txn {
            Some(txn) => Some(txn),
            // Nothing open, but earlier commits must become durable.
            None if sync && self.state_unsynced.get() => Some(self.state_db.begin_write()?),
            None => None,
        };
        if let Some(mut txn) = state_txn {
            if sync {
                let started = std::time::Instant::now();
                txn.set_durability(Durability::Immediate);
                txn.commit()?;
                metrics::histogram!("longhaul_state_sync_seconds")
                    .record(started.elapsed().as_secs_f64());
                self.state_unsynced.set(false);
                state.durable_applied = state.applied;
            } else {
                self.pending_state.put(txn);
                self.state_unsynced.set(true);
            }
        }
        self.state = state;
        Ok(())
    }

    /// Runs `f` in one batch and commits it.
    pub fn write<R>(&mut self, f: impl FnOnce(&mut Batch) -> Result<R>) -> Result<R> {
        let mut batch = self.begin()?;
        let out = f(&mut batch)?;
        self.commit(batch)?;
        Ok(out)
    }

    /// Persists new entries and the hard state in one fsynced commit.
    pub fn append_and_persist(
        &mut self,
        entries: &[Entry],
        hard_state: Option<&HardState>,
    ) -> Result<()> {
        if entries.is_empty() && hard_state.is_none() {
            return Ok(());
        }
        self.write(|batch| {
            batch.append(entries)?;
            if let Some(hard_state) = hard_state {
                batch.set_hard_state(hard_state)?;
            }
            Ok(())
        })
    }

    /// Installs a snapshot; see [`Batch::apply_snapshot`].
    pub fn apply_snapshot(
        &mut self,
        snapshot: &Snapshot,
        restore: impl FnOnce(&WriteTransaction, &[u8]) -> Result<()>,
    ) -> Result<()> {
        self.write(|batch| batch.apply_snapshot(snapshot, restore))
    }

    /// Makes every state-store commit so far durable (one fsync, if any is deferred).
    pub fn sync_state(&mut self) -> Result<()> {
        self.write(|batch| {
            batch.sync_state();
            Ok(())
        })
    }

    /// Removes log entries before `to`; see [`Batch::compact`]. The state store is fsynced
    /// first, in a commit of its own: the entries removed must already be in durable state.
    pub fn compact(&mut self, to: u64) -> Result<()> {
        let started = std::time::Instant::now();
        self.sync_state()?;
        self.write(|batch| batch.compact(to))?;
        metrics::histogram!("longhaul_log_compaction_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Removes log entries before `to`, but none past the applied index as of the state
    /// store's last fsync, and without forcing one: nothing waits for the state file. The
    /// automatic compaction uses this; it keeps thousands of entries, far more than the state
    /// store trails by between its periodic fsyncs. Returns where the log now starts.
    pub fn compact_durable(&mut self, to: u64) -> Result<u64> {
        let started = std::time::Instant::now();
        let to = to.min(self.state.durable_applied + 1);
        self.write(|batch| batch.compact(to))?;
        metrics::histogram!("longhaul_log_compaction_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(self.state.first_index())
    }

    /// Records the applied index alone (for entries that change no state).
    pub fn set_applied(&mut self, index: u64) -> Result<()> {
        self.write(|batch| batch.set_applied(index))
    }

    /// Opens a read transaction on the state store, e.g. for the state machine to read or
    /// serialize itself. The open transaction is committed first (without an fsync), so the
    /// read sees every apply.
    pub fn read(&self) -> Result<ReadTransaction> {
        self.commit_pending_state()?;
        Ok(self.state_db.begin_read()?)
    }

    /// Commits the state store's open transaction without an fsync: its pages go to the OS,
    /// and it becomes durable with the next fsynced commit.
    fn commit_pending_state(&self) -> Result<()> {
        if self.pending_state.is_lost() {
            return Err(StorageError::AppliesLost);
        }
        if let Some(mut txn) = self.pending_state.take() {
            let started = std::time::Instant::now();
            txn.set_durability(Durability::None);
            if let Err(error) = txn.commit() {
                // The applies in it are gone while the cache counts them.
                self.pending_state.mark_lost();
                return Err(error.into());
            }
            metrics::histogram!("longhaul_deferred_commit_seconds")
                .record(started.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// The first half of making the applied state durable without holding up the caller for
    /// the bulk of the I/O: commits the open transaction without an fsync and returns a handle
    /// on the state file (`None` if nothing awaits an fsync). The caller fsyncs the handle
    /// elsewhere (`File::sync_data`), which writes out the pages of every commit so far, and
    /// then calls [`DiskStorage::sync_state`], whose own fsync is then small: redb's commit
    /// record and what was applied meanwhile. Only that second fsync makes anything durable;
    /// the first only moves the writing out of the way.
    pub fn stage_state_sync(&self) -> Result<Option<StateFlush>> {
        self.commit_pending_state()?;
        if !self.state_unsynced.get() {
            return Ok(None);
        }
        let file = self
            .disk
            .state_flush(&self.state_path)
            .map_err(StorageError::StateFile)?;
        Ok(Some(file))
    }

    /// The stored snapshot, data included, if there is one.
    pub fn stored_snapshot(&self) -> Result<Option<Snapshot>> {
        if self.state.snapshot.index == 0 {
            return Ok(None);
        }
        let data = self.wal.read_snapshot(&self.state.snapshot)?;
        let mut snapshot = Snapshot::default();
        snapshot.set_metadata(self.state.snapshot.clone());
        snapshot.data = data.into();
        Ok(Some(snapshot))
    }

    /// Whether raft asked for a snapshot newer than the stored one since the last call.
    pub fn take_snapshot_wanted(&self) -> bool {
        self.snapshot_wanted.replace(false)
    }

    fn missing(&self, index: u64) -> StorageError {
        StorageError::MissingEntry {
            index,
            first: self.state.first_index(),
            last: self.state.last_index,
        }
    }

    /// Entries in `[low, high)`, at least one if any, and at most `max_size` bytes after the
    /// first, with raft's `Compacted`/`Unavailable` errors for indexes outside the log.
    pub fn entries_in(
        &self,
        low: u64,
        high: u64,
        max_size: Option<u64>,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.state.first_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        if high > self.state.last_index + 1 || low > high {
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        let log = lock(&self.log);
        let mut entries = Vec::with_capacity((high - low).min(1024) as usize);
        let mut size = 0u64;
        for index in low..high {
            let entry = log.get(index).ok_or_else(|| self.missing(index))?;
            size += u64::from(protobuf::Message::compute_size(entry));
            // Same rule as raft-rs's `limit_size`: always return the first entry.
            if !entries.is_empty() && max_size.is_some_and(|max| size > max) {
                return Ok(entries);
            }
            entries.push(entry.clone());
        }
        let next = low + entries.len() as u64;
        if next < high {
            return Err(self.missing(next).into());
        }
        Ok(entries)
    }
}

/// Closing the store commits and fsyncs the state store's open transaction, so a clean shutdown
/// re-applies nothing on the next start. A crash skips this, which is safe (see the module
/// documentation).
impl Drop for DiskStorage {
    fn drop(&mut self) {
        if let Some(mut txn) = self.pending_state.take()
            && !self.pending_state.is_lost()
        {
            txn.set_durability(Durability::Immediate);
            if let Err(error) = txn.commit() {
                tracing::warn!(%error, "could not commit the applied state on close; it will be applied again on start");
            }
        }
    }
}

impl raft::Storage for DiskStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.state.hard_state.clone(),
            self.state.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into().filter(|&max| max != raft::NO_LIMIT);
        self.entries_in(low, high, max_size)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.state.truncated_index {
            return Ok(self.state.truncated_term);
        }
        if idx < self.state.first_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        if idx > self.state.last_index {
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        let log = lock(&self.log);
        Ok(log.get(idx).ok_or_else(|| self.missing(idx))?.term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.state.first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.state.last_index)
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        // Snapshots are built by the node (it owns the state machine), not here. Until a usable
        // one exists, tell raft to retry and flag the node to build one. Usable means recent
        // enough, and naming the receiver as a member: raft refuses a snapshot whose
        // configuration does not contain it, which is the case for a replica added after it.
        let meta = &self.state.snapshot;
        let cs = meta.get_conf_state();
        let names_receiver = [
            &cs.voters,
            &cs.learners,
            &cs.voters_outgoing,
            &cs.learners_next,
        ]
        .iter()
        .any(|ids| ids.contains(&to));
        let usable = meta.index >= request_index.max(self.state.truncated_index) && names_receiver;
        // raft-rs treats any other error as fatal, so a snapshot that cannot be read is one to
        // build again, not a reason to stop the leader.
        let stored = if usable {
            self.stored_snapshot().unwrap_or_else(|error| {
                tracing::warn!(%error, "the stored snapshot cannot be read; building a new one");
                None
            })
        } else {
            None
        };
        match stored {
            Some(snapshot) => Ok(snapshot),
            None => {
                self.snapshot_wanted.set(true);
                Err(raft::Error::Store(
                    raft::StorageError::SnapshotTemporarilyUnavailable,
                ))
            }
        }
    }
}

#[cfg(test)]
#[path = "storage_tests.rs"]
mod tests;
