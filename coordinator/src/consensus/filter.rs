//! The fate of raft messages between replicas, as tests decide it.

use std::time::Duration;

/// What happens to one outgoing raft message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Deliver,
    /// Deliver once this much time has passed since the message was queued.
    DeliverAfter(Duration),
    /// Lost, like a packet on a broken network.
    Drop,
}

/// Judges each raft message a replica is about to send to a peer (the
/// sender's side): the seam through which tests inject faults, over real
/// gRPC (`server::transport`'s `Outbox` asks before queueing) and in virtual
/// time (`harness::Cluster`'s network asks its `faults()`), with one
/// vocabulary of rules (`consensus::faults::Faults`). What a verdict means:
///
/// - a dropped message is a lost packet: nothing is reported and raft
///   retries by itself; a dropped snapshot is reported to raft as failed,
///   as the transport does when a transfer fails;
/// - a delayed message waits. On the transport it waits on its peer's queue,
///   so one peer's messages stay in order, as on a TCP stream, and other
///   peers are not held up. In virtual time it waits until that much virtual
///   time passed, rounded up to whole ticks, and later messages on the same
///   route overtake it: that network reorders, the transport does not;
/// - the verdict is given when the message is queued: a message queued (or
///   delayed) before a cut is still delivered, as a packet in flight would
///   be.
///
/// Only raft messages pass through it: a client request a follower forwards
/// to the leader does not.
pub trait MessageFilter: Send + Sync + std::fmt::Debug {
    /// The fate of a message from replica `from` to replica `to`, queued now.
    fn judge(&self, from: u64, to: u64) -> Verdict;
}
