//! [`StorageError`], what the durable Raft store reports, and its conversions.

use std::path::PathBuf;

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
    #[error(
        "the state store has applied entry {applied} but the log ends at {last}: the two files \
         of the store do not belong together"
    )]
    StateAheadOfLog { applied: u64, last: u64 },
    #[error("the state store is behind the log's start and there is no snapshot to restore")]
    NoSnapshotToRestore,
    #[error("a failed batch dropped applied entries that were not committed; reopen the store")]
    AppliesLost,
    #[error("cannot open the state file to flush it: {0}")]
    StateFile(#[source] std::io::Error),
    #[error("corrupt raft log: {0}")]
    CorruptLog(&'static str),
    #[error(
        "the raft log segment {path} is corrupt at byte {offset}: {reason}; it was left as it is \
         (restore this replica from a backup, or remove it from the cluster and add it again)"
    )]
    CorruptSegment {
        path: PathBuf,
        offset: usize,
        reason: &'static str,
    },
    #[error("a raft log record of {bytes} bytes exceeds the limit of {limit} bytes")]
    RecordTooLarge { bytes: usize, limit: u32 },
    #[error("an earlier write or fsync of the raft log failed; reopen the store")]
    LogFailed,
    #[error("cannot {what} ({path}): {source}")]
    LogFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
