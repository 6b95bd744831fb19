//! Raft consensus for the coordinator: durable storage, the Ready-loop driver and the
//! state-machine seam.
//!
//! - [`storage`]: [`DiskStorage`], a `raft::Storage` in two parts: the log, a write-ahead log
//!   fsynced on every commit ([`storage::wal`]), and the applied state, one redb file fsynced now
//!   and then (see its documentation).
//! - [`node`]: [`Node`], a sans-IO driver around `raft::RawNode` that owns the Ready loop.
//! - [`kv`]: [`KvStateMachine`], a small key-value state machine used by tests and examples.
//! - [`logging`]: raft-rs's slog records, forwarded to `tracing`.
//! - `harness` (tests, and the test kit through the `testkit` feature): an in-process cluster in
//!   virtual time with seeded fault filters, and the transport's `MessageFilter` applied in
//!   virtual time.
//!
//! **Invariant:** nothing here does network I/O, reads a clock or spawns a task. Time enters as
//! `tick()`, peers' messages as `step()`, and outgoing messages leave as values.

#[cfg(any(test, feature = "testkit"))]
pub mod faults;
pub mod filter;
pub mod kv;
pub mod logging;
pub mod node;
pub mod storage;

#[cfg(any(test, feature = "testkit"))]
pub mod harness;
#[cfg(test)]
mod linearizability_sim;
#[cfg(test)]
mod linearizability_tests;
#[cfg(test)]
mod tests;

pub use kv::KvStateMachine;
pub use node::{Event, Node, NodeConfig, NodeError, Output};
pub use storage::{Batch, DiskStorage, LogState, StorageError};

/// Errors a state machine reports; boxed because each state machine has its own.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The replicated state machine the node applies committed commands to.
///
/// Its durable state lives in the store's state file, written through the transaction it is
/// handed, which also records the applied index: a crash never leaves the state machine and the
/// applied index out of step (it may roll both back together; the node then applies the log
/// again). Typical state machines use [`storage::STATE_MACHINE`].
pub trait StateMachine {
    /// Applies the committed command `data` at log `index` and returns the response for the
    /// proposer. Must be deterministic. An invalid command is answered in the response, not with
    /// `Err`: `Err` means the store failed, and stops the node.
    fn apply(
        &mut self,
        txn: &redb::WriteTransaction,
        index: u64,
        data: &[u8],
    ) -> Result<Vec<u8>, BoxError>;

    /// Serializes the whole state (as of the read transaction) for a snapshot. The node
    /// compresses it.
    fn snapshot(&self, txn: &redb::ReadTransaction) -> Result<Vec<u8>, BoxError>;

    /// Replaces the whole state with a (decompressed) snapshot.
    fn restore(&mut self, txn: &redb::WriteTransaction, data: &[u8]) -> Result<(), BoxError>;
}
