//! The exchange of pseudo-gradient fragments between the sites of a DiLoCo
//! round, sans-IO: the collective's plan (who owns which shard, who sends
//! what to whom), the state machines that encode, reduce and assemble
//! fragments, the wire frames that carry them and the ranges a receiver
//! acknowledges. No sockets, no clock, no threads, no randomness: the agent's
//! QUIC transport (`longhaul_site_agent::exchange`) moves the bytes.
//!
//! - [`plan`] — [`CollectivePlan`]: shards (1/M of the fragment each, the
//!   remainder rule in its docs), chunks, transfers, the weight 1/M.
//! - [`collective`] — [`Contributor`] (a site's encoders and their
//!   error-feedback residuals), [`ShardReducer`] (an owner sums the M
//!   contributions of each chunk in site-id order and encodes the average
//!   once), [`Assembler`] (every site decodes the averages into its
//!   result, whose [`longhaul_codec::fragment_hash`] it reports).
//! - [`wire`] — the messages (hello, welcome, data, ack, refused): layout,
//!   bounds, [`wire::decode`] refusing by field.
//! - [`catchup`] — the catch-up transfer's request and response: a site
//!   that missed committed rounds fetches the trainers' state after the
//!   last of them from a site that applied it, size fixed by the request.
//! - [`ranges`] — [`RangeSet`] and the receiver's [`AckLedger`]: what it
//!   holds, acknowledged again on a duplicate, replayed on a reconnect.
//! - [`outbox`] — [`Outbox`]: a sender's chunks to one peer, handed to
//!   the pool's connections, settled by acks, uncertain while a lost
//!   connection's acks may be missing, never sent again once acknowledged.

pub mod catchup;
pub mod collective;
pub mod outbox;
pub mod plan;
pub mod ranges;
#[cfg(test)]
mod tests;
pub mod wire;

pub use collective::{
    Accepted, Assembler, Checkpoint, Chunk, CollectiveError, Contributor, LinkCodecs, ShardReducer,
    reduce_in_memory,
};
pub use outbox::{Outbox, OutboxStats};
pub use plan::{
    CollectivePlan, DEFAULT_CHUNK_ELEMENTS, MAX_CHUNK_ELEMENTS, MAX_FRAGMENT_ELEMENTS, Phase,
    PlanError, Shard, Transfer,
};
pub use ranges::{AckLedger, RangeSet, TransferKey};
pub use wire::{ChunkId, Header, Kind, Message, WireError};
