//! A sender's chunks to one peer, and which of them the peer holds.
//!
//! Each chunk is encoded once and kept, as its wire message, until the peer
//! acknowledges it. A connection of the pool takes the next queued chunk
//! ([`Outbox::next`]); an ack, on any connection, settles every chunk its
//! range covers. When a connection is lost, the chunks it had in flight are
//! *uncertain* (the peer may hold them, its acks lost with the connection):
//! they are queued again only once a new connection has been welcomed,
//! after the peer replayed the acks of everything it holds
//! ([`Outbox::resumed`]), so a resumed sender sends nothing the peer
//! acknowledged. An acknowledged chunk is never handed out again (the
//! receiver counts what arrives twice: the transport's tests check it).
//!
//! Chunks are spread over the pool ([`Outbox::next_within`]): a connection
//! with chunks in flight (handed out, not yet acknowledged) takes another
//! only when no live connection is idle, and within a cap of bytes in
//! flight. Without that, the first connection whose transport buffer has
//! room takes every queued chunk at once, and the rest of the pool (the
//! other congestion controllers, which are what carry a lossy link)
//! idles.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::plan::MAX_CHUNK_ELEMENTS;
use crate::ranges::{RangeSet, TransferKey};
use crate::wire::ChunkId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Queued,
    InFlight { connection: u64 },
    Uncertain,
    Acked,
}

#[derive(Debug)]
struct Outgoing {
    chunk: ChunkId,
    message: Arc<Vec<u8>>,
    state: State,
    sends: u32,
}

/// What the outbox handed out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Messages handed out, and their bytes.
    pub sent: u64,
    pub sent_bytes: u64,
    /// Bytes handed out again for a chunk sent before (its connection was
    /// lost before the ack came).
    pub resent_bytes: u64,
    /// Chunks acknowledged.
    pub acked: u64,
    /// The most bytes one connection had in flight at once.
    pub peak_connection_in_flight_bytes: u64,
    /// Connections that were handed at least one chunk.
    pub connections_used: u64,
}

/// A sender's chunks to one peer (see the module docs).
#[derive(Debug, Default)]
pub struct Outbox {
    chunks: Vec<Outgoing>,
    queue: VecDeque<usize>,
    /// Chunks by transfer and first element.
    by_start: BTreeMap<(TransferKey, u64), usize>,
    acked: BTreeMap<TransferKey, RangeSet>,
    remaining: usize,
    /// Bytes handed out and not yet acknowledged, per connection.
    in_flight: BTreeMap<u64, u64>,
    /// The largest message pushed, bytes.
    largest: u64,
    /// Connections handed a chunk.
    used: std::collections::BTreeSet<u64>,
    stats: OutboxStats,
}

impl Outbox {
    pub fn new() -> Outbox {
        Outbox::default()
    }

    /// Queues `message`, the wire message of `chunk`.
    pub fn push(&mut self, chunk: ChunkId, message: Vec<u8>) {
        let index = self.chunks.len();
        let acked = self.is_acked(&chunk);
        self.by_start
            .insert((TransferKey::from(&chunk), chunk.offset), index);
        self.largest = self.largest.max(message.len() as u64);
        self.chunks.push(Outgoing {
            chunk,
            message: Arc::new(message),
            state: if acked { State::Acked } else { State::Queued },
            sends: 0,
        });
        if !acked {
            self.queue.push_back(index);
            self.remaining += 1;
        }
    }

    fn is_acked(&self, chunk: &ChunkId) -> bool {
        self.acked
            .get(&TransferKey::from(chunk))
            .is_some_and(|set| set.contains(chunk.offset..chunk.offset + u64::from(chunk.length)))
    }

    /// The next chunk for `connection` to send, now in flight on it.
    pub fn next(&mut self, connection: u64) -> Option<(ChunkId, Arc<Vec<u8>>)> {
        self.next_within(connection, u64::MAX, 0)
    }

    /// [`Outbox::next`], spread over the `live` connections of the pool
    /// and within `cap` bytes each: a connection with nothing in flight
    /// takes a chunk whatever its size; one with chunks in flight takes
    /// another only when every live connection has some (else the idle
    /// one is left to take it) and the chunk keeps it within `cap`.
    pub fn next_within(
        &mut self,
        connection: u64,
        cap: u64,
        live: usize,
    ) -> Option<(ChunkId, Arc<Vec<u8>>)> {
        let held = self.in_flight_bytes(connection);
        if held > 0 && self.in_flight.len() < live {
            return None;
        }
        while let Some(&index) = self.queue.front() {
            if self.chunks[index].state != State::Queued {
                self.queue.pop_front();
                continue;
            }
            let bytes = self.chunks[index].message.len() as u64;
            if held > 0 && held.saturating_add(bytes) > cap {
                return None;
            }
            self.queue.pop_front();
            let outgoing = &mut self.chunks[index];
            if outgoing.sends > 0 {
                self.stats.resent_bytes += bytes;
            }
            outgoing.sends += 1;
            outgoing.state = State::InFlight { connection };
            self.used.insert(connection);
            let held = self.in_flight.entry(connection).or_default();
            *held += bytes;
            self.stats.peak_connection_in_flight_bytes =
                self.stats.peak_connection_in_flight_bytes.max(*held);
            self.stats.sent += 1;
            self.stats.sent_bytes += bytes;
            return Some((outgoing.chunk, Arc::clone(&outgoing.message)));
        }
        None
    }

    /// The peer holds `chunk`'s range: settles every chunk it covers.
    /// Returns how many were newly settled.
    pub fn ack(&mut self, chunk: &ChunkId) -> usize {
        let key = TransferKey::from(chunk);
        let end = chunk.offset.saturating_add(u64::from(chunk.length));
        self.acked.entry(key).or_default().insert(chunk.offset..end);
        // A chunk the new range completes intersects it, and starts at
        // most 2^24 elements before it.
        let from = chunk.offset.saturating_sub(u64::from(MAX_CHUNK_ELEMENTS));
        let candidates: Vec<usize> = self
            .by_start
            .range((key, from)..(key, end))
            .map(|(_, &index)| index)
            .collect();
        let mut settled = 0;
        for index in candidates {
            let outgoing = &self.chunks[index];
            if outgoing.state != State::Acked && self.is_acked(&outgoing.chunk) {
                if let State::InFlight { connection } = outgoing.state {
                    self.settle(connection, outgoing.message.len() as u64);
                }
                self.chunks[index].state = State::Acked;
                settled += 1;
            }
        }
        self.remaining -= settled;
        self.stats.acked += settled as u64;
        settled
    }

    /// `connection` is gone: its chunks in flight are uncertain until a
    /// new connection is welcomed.
    pub fn connection_lost(&mut self, connection: u64) -> usize {
        self.in_flight.remove(&connection);
        let mut count = 0;
        for outgoing in &mut self.chunks {
            if outgoing.state == (State::InFlight { connection }) {
                outgoing.state = State::Uncertain;
                count += 1;
            }
        }
        count
    }

    /// Every connection is gone (an attempt over, another to come): all
    /// chunks in flight are uncertain.
    pub fn all_lost(&mut self) -> usize {
        self.in_flight.clear();
        let mut count = 0;
        for outgoing in &mut self.chunks {
            if matches!(outgoing.state, State::InFlight { .. }) {
                outgoing.state = State::Uncertain;
                count += 1;
            }
        }
        count
    }

    /// A connection was welcomed, after the peer's replayed acks were
    /// applied: the uncertain chunks it does not hold are queued again,
    /// first.
    pub fn resumed(&mut self) -> usize {
        let mut again = Vec::new();
        for (index, outgoing) in self.chunks.iter_mut().enumerate() {
            if outgoing.state == State::Uncertain {
                outgoing.state = State::Queued;
                again.push(index);
            }
        }
        for &index in again.iter().rev() {
            self.queue.push_front(index);
        }
        again.len()
    }

    /// Forgets every acknowledgement (the peer restarted and holds none
    /// of it): acknowledged chunks are queued again, in order.
    pub fn forget_acks(&mut self) -> usize {
        self.acked.clear();
        let mut again = 0;
        for (index, outgoing) in self.chunks.iter_mut().enumerate() {
            if outgoing.state == State::Acked {
                outgoing.state = State::Queued;
                self.queue.push_back(index);
                again += 1;
            }
        }
        self.remaining += again;
        again
    }

    /// Bytes `connection` has in flight: handed out on it and not yet
    /// acknowledged (on any connection).
    pub fn in_flight_bytes(&self, connection: u64) -> u64 {
        self.in_flight.get(&connection).copied().unwrap_or(0)
    }

    /// The largest message pushed, bytes.
    pub fn largest_message(&self) -> u64 {
        self.largest
    }

    fn settle(&mut self, connection: u64, bytes: u64) {
        if let Some(held) = self.in_flight.get_mut(&connection) {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                self.in_flight.remove(&connection);
            }
        }
    }

    /// Chunks not yet acknowledged.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    pub fn is_done(&self) -> bool {
        self.remaining == 0
    }

    /// Whether a chunk waits to be sent now.
    pub fn has_queued(&self) -> bool {
        self.queue
            .iter()
            .any(|&index| self.chunks[index].state == State::Queued)
    }

    pub fn stats(&self) -> OutboxStats {
        OutboxStats {
            connections_used: self.used.len() as u64,
            ..self.stats
        }
    }
}
