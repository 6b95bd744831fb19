//! Durable Raft storage over redb.
//!
//! Every change goes through a [`Batch`]: one redb write transaction. A [`SyncMode::Durable`] batch
//! is committed with [`Durability::Immediate`], so when the commit returns the change is
//! fsynced. A [`SyncMode::Deferred`] batch is committed with [`Durability::None`]: it is visible at
//! once, and becomes durable with the next durable commit. redb commits are totally ordered and
//! a crash recovers the database as of the last durable commit, so a crash loses a suffix of
//! deferred batches, never a batch in the middle and never part of one. The node defers only
//! batches that raft allows to be lost (applying committed entries, moving the commit index);
//! see `ARCHITECTURE.md`, "Durability".
//!
//! The in-memory [`LogState`] cache is only replaced after a successful commit, so a failed
//! write never leaves the cache ahead of the last commit.
//!
//! Layout (one redb file per replica):
//!
//! | table                  | key    | value                                        |
//! |------------------------|--------|----------------------------------------------|
//! | `raft_log`             | index  | protobuf-encoded `Entry`                     |
//! | `raft_hard_state`      | `()`   | protobuf-encoded `HardState`                 |
//! | `raft_conf_state`      | `()`   | protobuf-encoded `ConfState`                 |
//! | `raft_applied_index`   | `()`   | last applied index                           |
//! | `raft_log_truncated`   | `()`   | (index, term) of the entry before the log    |
//! | `raft_snapshot_meta`   | `()`   | protobuf-encoded `SnapshotMetadata`          |
//! | `raft_snapshot_data`   | `()`   | zstd-compressed state-machine snapshot       |
//! | `state_machine`        | bytes  | opaque, owned by the [`StateMachine`](super::StateMachine) |

use std::io::Read;
use std::path::{Path, PathBuf};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState};
use redb::{
    Database, Durability, ReadTransaction, ReadableTable, TableDefinition, WriteTransaction,
};

const LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("raft_log");
const HARD_STATE: TableDefinition<'_, (), &[u8]> = TableDefinition::new("raft_hard_state");
const CONF_STATE: TableDefinition<'_, (), &[u8]> = TableDefinition::new("raft_conf_state");
const APPLIED: TableDefinition<'_, (), u64> = TableDefinition::new("raft_applied_index");
// The log start is kept apart from the snapshot because the log may be compacted up to (but
// not past) the snapshot, and raft still needs the term of the entry just before the log.
const LOG_TRUNCATED: TableDefinition<'_, (), (u64, u64)> =
    TableDefinition::new("raft_log_truncated");
const SNAPSHOT_META: TableDefinition<'_, (), &[u8]> = TableDefinition::new("raft_snapshot_meta");
const SNAPSHOT_DATA: TableDefinition<'_, (), &[u8]> = TableDefinition::new("raft_snapshot_data");

/// The table a [`StateMachine`](super::StateMachine) may use for its own data. It is written in
/// the same transaction as the applied index, so state and applied index never disagree.
pub const STATE_MACHINE: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("state_machine");

/// Index and term of the snapshot that founding replicas start from (see [`Batch::bootstrap`]).
pub const BOOTSTRAP_INDEX: u64 = 1;
pub const BOOTSTRAP_TERM: u64 = 1;

/// Upper bound on a decompressed snapshot, so a corrupt or hostile blob cannot exhaust memory.
pub const MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

/// zstd level for snapshots: level 3 is zstd's default speed/ratio trade-off.
const SNAPSHOT_ZSTD_LEVEL: i32 = 3;

/// Errors of the durable Raft store.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("cannot open raft store {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: Box<redb::DatabaseError>,
    },
    #[error("raft store transaction: {0}")]
    Transaction(#[from] Box<redb::TransactionError>),
    #[error("raft store table: {0}")]
    Table(#[from] Box<redb::TableError>),
    #[error("raft store I/O: {0}")]
    Storage(#[from] Box<redb::StorageError>),
    #[error("raft store commit: {0}")]
    Commit(#[from] Box<redb::CommitError>),
    #[error("corrupt {what} in raft store: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: protobuf::ProtobufError,
    },
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: protobuf::ProtobufError,
    },
    #[error("log entry {index} is missing although the log spans {first}..={last}")]
    MissingEntry { index: u64, first: u64, last: u64 },
    #[error("appended entries start at {first_new} but the log ends at {last}: a gap")]
    Gap { first_new: u64, last: u64 },
    #[error("appended entries start at {first_new} but the log is compacted up to {truncated}")]
    OverwriteCompacted { first_new: u64, truncated: u64 },
    #[error("cannot compact to {to}: {reason} (limit {limit})")]
    CompactTooFar {
        to: u64,
        limit: u64,
        reason: &'static str,
    },
    #[error("snapshot at index {index} is out of date: log is compacted up to {truncated}")]
    SnapshotOutOfDate { index: u64, truncated: u64 },
    #[error("snapshot data: {0}")]
    SnapshotData(#[source] std::io::Error),
    #[error("snapshot data exceeds {limit} bytes once decompressed")]
    SnapshotTooLarge { limit: u64 },
    #[error("state machine: {0}")]
    StateMachine(#[source] Box<dyn std::error::Error + Send + Sync>),
}

// redb's error types are large; boxing keeps `Result<_, StorageError>` small. These impls let `?`
// box them implicitly.
macro_rules! boxed_from {
    ($($t:ty),*) => {$(
        impl From<$t> for StorageError {
            fn from(e: $t) -> Self {
                Box::new(e).into()
            }
        }
    )*};
}
boxed_from!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

impl From<StorageError> for raft::Error {
    fn from(e: StorageError) -> Self {
        raft::Error::Store(raft::StorageError::Other(Box::new(e)))
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// What raft needs to know about the log without reading it: cached, and replaced only after
/// the transaction that changed it has committed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogState {
    pub hard_state: HardState,
    pub conf_state: ConfState,
    pub applied: u64,
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

/// When a committed [`Batch`] reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// fsynced before the commit returns ([`Durability::Immediate`]). Required for log entries,
    /// term and vote, snapshots and compaction: raft promises them to peers.
    Durable,
    /// Written without an fsync ([`Durability::None`]); durable with the next `Durable` commit.
    /// A crash before that loses this batch and every later deferred one, and nothing else.
    Deferred,
}

/// One atomic change to the store: a redb write transaction plus the cache as it will be after
/// commit. Obtain with [`RedbStorage::begin`] (durable) or [`RedbStorage::begin_with`], finish
/// with [`RedbStorage::commit`].
pub struct Batch {
    txn: WriteTransaction,
    state: LogState,
    sync: SyncMode,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("state", &self.state)
            .field("sync", &self.sync)
            .finish()
    }
}

fn encode<M: protobuf::Message>(what: &'static str, m: &M) -> Result<Vec<u8>> {
    m.write_to_bytes()
        .map_err(|source| StorageError::Encode { what, source })
}

fn decode<M: protobuf::Message>(what: &'static str, bytes: &[u8]) -> Result<M> {
    M::parse_from_bytes(bytes).map_err(|source| StorageError::Decode { what, source })
}

impl Batch {
    /// The underlying transaction, for state-machine writes (see [`STATE_MACHINE`]).
    pub fn txn(&self) -> &WriteTransaction {
        &self.txn
    }

    /// The state as it will be once this batch commits.
    pub fn state(&self) -> &LogState {
        &self.state
    }

    /// Whether this batch is fsynced when it commits.
    pub fn sync(&self) -> SyncMode {
        self.sync
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
        if first_new <= self.state.last_index {
            remove_entries(&self.txn, first_new..=self.state.last_index)?;
        }
        let mut log = self.txn.open_table(LOG)?;
        for entry in entries {
            log.insert(entry.index, encode("log entry", entry)?.as_slice())?;
        }
        self.state.last_index = entries.last().map_or(first_new, |e| e.index);
        Ok(())
    }

    pub fn set_hard_state(&mut self, hard_state: &HardState) -> Result<()> {
        let mut table = self.txn.open_table(HARD_STATE)?;
        table.insert((), encode("hard state", hard_state)?.as_slice())?;
        self.state.hard_state = hard_state.clone();
        Ok(())
    }

    /// Records a newer commit index (from a light ready) in the hard state.
    pub fn set_commit(&mut self, commit: u64) -> Result<()> {
        if commit > self.state.hard_state.commit {
            let mut hard_state = self.state.hard_state.clone();
            hard_state.commit = commit;
            self.set_hard_state(&hard_state)?;
        }
        Ok(())
    }

    pub fn set_conf_state(&mut self, conf_state: &ConfState) -> Result<()> {
        let mut table = self.txn.open_table(CONF_STATE)?;
        table.insert((), encode("conf state", conf_state)?.as_slice())?;
        self.state.conf_state = conf_state.clone();
        Ok(())
    }

    /// Records the applied index; write the state machine's changes in the same batch.
    pub fn set_applied(&mut self, index: u64) -> Result<()> {
        self.txn.open_table(APPLIED)?.insert((), index)?;
        self.state.applied = index;
        Ok(())
    }

    /// Stores a snapshot (metadata and compressed data) so it can be sent to lagging peers.
    pub fn store_snapshot(&mut self, meta: &SnapshotMetadata, data: &[u8]) -> Result<()> {
        self.txn
            .open_table(SNAPSHOT_META)?
            .insert((), encode("snapshot metadata", meta)?.as_slice())?;
        self.txn.open_table(SNAPSHOT_DATA)?.insert((), data)?;
        self.state.snapshot = meta.clone();
        Ok(())
    }

    /// Removes every log entry before `to`. `to` may not pass the stored snapshot (a peer that
    /// needs those entries must be able to get the snapshot instead), nor the applied index.
    pub fn compact(&mut self, to: u64) -> Result<()> {
        if to <= self.state.first_index() {
            return Ok(());
        }
        let limits = [
            (self.state.snapshot.index + 1, "past the stored snapshot"),
            (self.state.applied + 1, "past the applied index"),
            (self.state.last_index + 1, "past the end of the log"),
        ];
        for (limit, reason) in limits {
            if to > limit {
                return Err(StorageError::CompactTooFar { to, limit, reason });
            }
        }
        let truncated_index = to - 1;
        let truncated_term = if truncated_index == self.state.snapshot.index {
            self.state.snapshot.term
        } else {
            let log = self.txn.open_table(LOG)?;
            let bytes = log
                .get(truncated_index)?
                .ok_or(StorageError::MissingEntry {
                    index: truncated_index,
                    first: self.state.first_index(),
                    last: self.state.last_index,
                })?;
            decode::<Entry>("log entry", bytes.value())?.term
        };
        remove_entries(&self.txn, self.state.first_index()..=truncated_index)?;
        self.set_truncated(truncated_index, truncated_term)
    }

    fn set_truncated(&mut self, index: u64, term: u64) -> Result<()> {
        self.txn
            .open_table(LOG_TRUNCATED)?
            .insert((), (index, term))?;
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
        self.store_snapshot(&meta, &compress_snapshot(state_machine_data)?)?;
        self.set_truncated(BOOTSTRAP_INDEX, BOOTSTRAP_TERM)?;
        self.set_conf_state(conf_state)?;
        self.set_hard_state(&HardState {
            term: BOOTSTRAP_TERM,
            commit: BOOTSTRAP_INDEX,
            ..HardState::default()
        })?;
        self.set_applied(BOOTSTRAP_INDEX)
    }

    /// Installs a snapshot received from the leader: the log is replaced by the snapshot, the
    /// conf state, commit and applied index move to it, and `restore` rewrites the state
    /// machine from the decompressed data, all in this one transaction.
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
        let data = decompress_snapshot(&snapshot.data)?;
        restore(&self.txn, &data)?;
        // Raft only hands out a snapshot that does not match the local log, so the whole log
        // is replaced, as raft-rs's MemStorage does.
        remove_entries(&self.txn, self.state.first_index()..=self.state.last_index)?;
        self.state.last_index = meta.index;
        self.set_truncated(meta.index, meta.term)?;
        self.store_snapshot(meta, &snapshot.data)?;
        self.set_conf_state(meta.get_conf_state())?;
        let mut hard_state = self.state.hard_state.clone();
        hard_state.term = hard_state.term.max(meta.term);
        hard_state.commit = hard_state.commit.max(meta.index);
        self.set_hard_state(&hard_state)?;
        self.set_applied(meta.index)
    }
}

/// Removes the log entries at `indexes` (the log holds every index from its first to its last).
/// One `remove` per index rather than `retain_in`: redb 2.6's `retain_in` does not change the
/// transaction's own dirty pages in place but copies the path to every entry it deletes, which
/// made compacting ten thousand entries about seven times slower (~280 ms against ~40 ms).
fn remove_entries(txn: &WriteTransaction, indexes: std::ops::RangeInclusive<u64>) -> Result<()> {
    let mut log = txn.open_table(LOG)?;
    for index in indexes {
        log.remove(index)?;
    }
    Ok(())
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

/// A [`raft::Storage`] backed by one redb database.
pub struct RedbStorage {
    db: Database,
    state: LogState,
    // Set when raft asked for a snapshot that is not there yet; the node then builds one.
    snapshot_wanted: std::cell::Cell<bool>,
}

impl std::fmt::Debug for RedbStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStorage")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl RedbStorage {
    /// Opens (or creates) the store at `path` and restores its state from disk.
    pub fn open(path: &Path) -> Result<Self> {
        let db = Database::create(path).map_err(|source| StorageError::Open {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        // Create every table up front so that read transactions never meet a missing table.
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate);
        txn.open_table(LOG)?;
        txn.open_table(HARD_STATE)?;
        txn.open_table(CONF_STATE)?;
        txn.open_table(APPLIED)?;
        txn.open_table(LOG_TRUNCATED)?;
        txn.open_table(SNAPSHOT_META)?;
        txn.open_table(SNAPSHOT_DATA)?;
        txn.open_table(STATE_MACHINE)?;
        txn.commit()?;
        let state = Self::load(&db.begin_read()?)?;
        Ok(Self {
            db,
            state,
            snapshot_wanted: std::cell::Cell::new(false),
        })
    }

    fn load(txn: &ReadTransaction) -> Result<LogState> {
        let single = |def: TableDefinition<'_, (), &[u8]>| -> Result<Option<Vec<u8>>> {
            Ok(txn.open_table(def)?.get(())?.map(|v| v.value().to_vec()))
        };
        let mut state = LogState::default();
        if let Some(bytes) = single(HARD_STATE)? {
            state.hard_state = decode("hard state", &bytes)?;
        }
        if let Some(bytes) = single(CONF_STATE)? {
            state.conf_state = decode("conf state", &bytes)?;
        }
        if let Some(bytes) = single(SNAPSHOT_META)? {
            state.snapshot = decode("snapshot metadata", &bytes)?;
        }
        state.applied = txn.open_table(APPLIED)?.get(())?.map_or(0, |v| v.value());
        if let Some(v) = txn.open_table(LOG_TRUNCATED)?.get(())? {
            (state.truncated_index, state.truncated_term) = v.value();
        }
        state.last_index = match txn.open_table(LOG)?.last()? {
            Some((index, _)) => index.value(),
            None => state.truncated_index,
        };
        Ok(state)
    }

    /// The cached state: the store as of its last commit. After a deferred commit this is
    /// ahead of what a crash would leave (see [`SyncMode::Deferred`]).
    pub fn state(&self) -> &LogState {
        &self.state
    }

    /// Whether this store holds a configuration or a log (false for a fresh replica).
    pub fn is_initialized(&self) -> bool {
        self.state.conf_state != ConfState::default() || self.state.last_index > 0
    }

    /// Starts an atomic, durable change.
    pub fn begin(&self) -> Result<Batch> {
        self.begin_with(SyncMode::Durable)
    }

    /// Starts an atomic change that is fsynced on commit or not, as `sync` says.
    pub fn begin_with(&self, sync: SyncMode) -> Result<Batch> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(match sync {
            SyncMode::Durable => Durability::Immediate,
            SyncMode::Deferred => Durability::None,
        });
        Ok(Batch {
            txn,
            state: self.state.clone(),
            sync,
        })
    }

    /// Commits a batch and updates the cache. A durable batch is fsynced when this returns `Ok`,
    /// together with every deferred batch committed before it.
    pub fn commit(&mut self, batch: Batch) -> Result<()> {
        let started = std::time::Instant::now();
        batch.txn.commit()?;
        match batch.sync {
            // The commit is the fsync: its latency is what every acknowledged write waits for.
            SyncMode::Durable => metrics::histogram!("longhaul_fsync_seconds")
                .record(started.elapsed().as_secs_f64()),
            SyncMode::Deferred => metrics::histogram!("longhaul_deferred_commit_seconds")
                .record(started.elapsed().as_secs_f64()),
        }
        self.state = batch.state;
        Ok(())
    }

    /// Runs `f` in one batch and commits it.
    pub fn write<R>(&mut self, f: impl FnOnce(&mut Batch) -> Result<R>) -> Result<R> {
        let mut batch = self.begin()?;
        let out = f(&mut batch)?;
        self.commit(batch)?;
        Ok(out)
    }

    /// Persists new entries and the hard state in one fsynced transaction.
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

    /// Removes log entries before `to`; see [`Batch::compact`].
    pub fn compact(&mut self, to: u64) -> Result<()> {
        let started = std::time::Instant::now();
        self.write(|batch| batch.compact(to))?;
        metrics::histogram!("longhaul_log_compaction_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Records the applied index alone (for entries that change no state).
    pub fn set_applied(&mut self, index: u64) -> Result<()> {
        self.write(|batch| batch.set_applied(index))
    }

    /// Opens a read transaction, e.g. for the state machine to serialize itself.
    pub fn read(&self) -> Result<ReadTransaction> {
        Ok(self.db.begin_read()?)
    }

    /// The stored snapshot, data included, if there is one.
    pub fn stored_snapshot(&self) -> Result<Option<Snapshot>> {
        if self.state.snapshot.index == 0 {
            return Ok(None);
        }
        let txn = self.db.begin_read()?;
        let data = txn
            .open_table(SNAPSHOT_DATA)?
            .get(())?
            .map(|v| v.value().to_vec())
            .unwrap_or_default();
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

    fn entry(&self, txn: &ReadTransaction, index: u64) -> Result<Entry> {
        let log = txn.open_table(LOG)?;
        let bytes = log.get(index)?.ok_or_else(|| self.missing(index))?;
        decode("log entry", bytes.value())
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
        let txn = self.db.begin_read().map_err(StorageError::from)?;
        let log = txn.open_table(LOG).map_err(StorageError::from)?;
        let mut entries = Vec::with_capacity((high - low).min(1024) as usize);
        let mut size = 0u64;
        for item in log.range(low..high).map_err(StorageError::from)? {
            let (_, bytes) = item.map_err(StorageError::from)?;
            let entry: Entry = decode("log entry", bytes.value())?;
            size += u64::from(protobuf::Message::compute_size(&entry));
            // Same rule as raft-rs's `limit_size`: always return the first entry.
            if !entries.is_empty() && max_size.is_some_and(|max| size > max) {
                return Ok(entries);
            }
            let expected = low + entries.len() as u64;
            if entry.index != expected {
                return Err(self.missing(expected).into());
            }
            entries.push(entry);
        }
        let next = low + entries.len() as u64;
        if next < high {
            return Err(self.missing(next).into());
        }
        Ok(entries)
    }
}

impl raft::Storage for RedbStorage {
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
        let txn = self.db.begin_read().map_err(StorageError::from)?;
        Ok(self.entry(&txn, idx)?.term)
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
        match self.stored_snapshot()? {
            Some(snapshot) if usable => Ok(snapshot),
            _ => {
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
