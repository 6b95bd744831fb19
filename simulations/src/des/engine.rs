//! The event loop: links, packets in flight, timers, in virtual time.
//!
//! A [`Fabric`] owns the links and a queue of wake-ups
//! ([`super::queue::WakeQueue`]); the connections
//! (in [`super::connection`]) own their sender and receiver state and send
//! through the fabric. Queue entries are lazy: a link or a connection keeps
//! the time of its one live entry, and an entry whose time no longer matches
//! is skipped when it comes out. Ties in time come out in the order they
//! were pushed, so a run is a function of its inputs.

use super::queue::WakeQueue;
use crate::link::{DropCounts, Fate, Link};

/// Queues up to this long are asked whether a link is next anyway.
const SHORT_QUEUE: usize = 64;

/// What a packet carries; the link only sees its id and size.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payload {
    Data {
        segment: u32,
        transmission: u64,
        sent_ns: u64,
    },
    Ack {
        /// The segment whose arrival triggered this ACK (a one-block SACK).
        segment: u32,
        /// The transmission number of that arrival.
        transmission: u64,
        /// The data packet's send time, echoed (a timestamp option).
        echo_ns: u64,
        /// Every segment below this one has arrived (the cumulative ACK).
        cumulative: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct Packet {
    connection: u32,
    payload: Payload,
    /// Deliveries still to come (2 when the link duplicated it).
    copies: u8,
}

/// Packets in flight, indexed by the id the link carries; ids are reused.
#[derive(Debug, Default)]
struct PacketSlab {
    packets: Vec<Packet>,
    free: Vec<u32>,
}

impl PacketSlab {
    fn insert(&mut self, packet: Packet) -> u64 {
        match self.free.pop() {
            Some(id) => {
                self.packets[id as usize] = packet;
                u64::from(id)
            }
            None => {
                self.packets.push(packet);
                (self.packets.len() - 1) as u64
            }
        }
    }

    /// Takes one delivery of packet `id`; frees the slot after the last copy.
    fn take(&mut self, id: u64) -> Option<Packet> {
        let slot = self.packets.get_mut(usize::try_from(id).ok()?)?;
        let packet = *slot;
        slot.copies = slot.copies.saturating_sub(1);
        if slot.copies == 0 {
            self.free.push(id as u32);
        }
        Some(packet)
    }

    fn release(&mut self, id: u64) {
        self.free.push(id as u32);
    }
}

/// What a queue entry wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Wake {
    Link(u32),
    Connection(u32),
}

#[derive(Debug)]
struct LinkSlot {
    link: Link,
    /// The time of this link's live queue entry.
    armed_ns: Option<u64>,
}

/// A packet handed out by [`Fabric::next`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival {
    pub connection: u32,
    pub payload: Payload,
}

/// What the loop does next.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    Arrival(Arrival),
    Timer(u32),
}

/// The links of a run and everything scheduled on them.
#[derive(Debug)]
pub(crate) struct Fabric {
    links: Vec<LinkSlot>,
    packets: PacketSlab,
    queue: WakeQueue,
    now_ns: u64,
    /// Sends, deliveries and timer firings so far.
    pub events: u64,
    /// The link being drained at `now_ns`, if any.
    draining: Option<u32>,
}

impl Fabric {
    pub fn new(links: Vec<Link>) -> Self {
        Self {
            links: links
                .into_iter()
                .map(|link| LinkSlot {
                    link,
                    armed_ns: None,
                })
                .collect(),
            packets: PacketSlab::default(),
            queue: WakeQueue::new(),
            now_ns: 0,
            events: 0,
            draining: None,
        }
    }

    /// Something is still scheduled.
    pub fn has_pending(&self) -> bool {
        self.draining.is_some() || !self.queue.is_empty()
    }

    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    pub fn link(&self, index: usize) -> &Link {
        &self.links[index].link
    }

    pub fn links(&self) -> impl Iterator<Item = &Link> {
        self.links.iter().map(|slot| &slot.link)
    }

    /// Drops of every link, summed.
    pub fn drops(&self) -> DropCounts {
        self.links().fold(DropCounts::default(), |mut sum, link| {
            let drops = link.stats().drops;
            sum.queue += drops.queue;
            sum.loss += drops.loss;
            sum.down += drops.down;
            sum.trace += drops.trace;
            sum
        })
    }

    fn push(&mut self, at_ns: u64, wake: Wake) {
        self.queue.push(at_ns, wake);
    }

    /// Sends one packet on link `link` now; false if the link dropped it.
    pub fn send(&mut self, link: usize, connection: u32, payload: Payload, bytes: u64) -> bool {
        self.events += 1;
        let id = self.packets.insert(Packet {
            connection,
            payload,
            copies: 1,
        });
        let now = self.now_ns;
        let slot = &mut self.links[link];
        match slot.link.handle_send(now, id, bytes, false) {
            Fate::Dropped { .. } => {
                self.packets.release(id);
                false
            }
            Fate::Delivered {
                at_ns,
                duplicate_at_ns,
                ..
            } => {
                let mut earliest = at_ns;
                if let Some(copy_ns) = duplicate_at_ns {
                    self.packets.packets[id as usize].copies = 2;
                    earliest = earliest.min(copy_ns);
                }
                // While the link is being drained it re-arms itself after.
                if self.draining != Some(link as u32) && slot.armed_ns.is_none_or(|t| earliest < t)
                {
                    slot.armed_ns = Some(earliest);
                    self.push(earliest, Wake::Link(link as u32));
                }
                true
            }
        }
    }

    /// Asks for a timer wake-up of `connection` at `at_ns`. The connection
    /// keeps the time of its live entry in `armed_ns`; a later request than
    /// the live one is left to the connection to renew when it fires.
    pub fn arm_timer(&mut self, connection: u32, at_ns: u64, armed_ns: &mut Option<u64>) {
        if armed_ns.is_none_or(|t| at_ns < t) {
            *armed_ns = Some(at_ns);
            self.push(at_ns, Wake::Connection(connection));
        }
    }

    /// The next thing to happen, at or after `now`, or `None` when nothing is
    /// scheduled or the next event is later than `until_ns`. `timer_armed`
    /// says whether a connection's entry at a time is its live one.
    #[inline]
    pub fn next(
        &mut self,
        until_ns: u64,
        mut timer_live: impl FnMut(u32, u64) -> bool,
    ) -> Option<Step> {
        loop {
            if let Some(link) = self.draining {
                let slot = &mut self.links[link as usize];
                // Asking when the next packet is due is cheaper than a poll
                // that finds nothing, and most wake-ups deliver one packet.
                let due = slot.link.next_wakeup().is_some_and(|t| t <= self.now_ns);
                if due && let Some(delivery) = slot.link.poll_delivery(self.now_ns) {
                    self.events += 1;
                    let Some(packet) = self.packets.take(delivery.packet_id) else {
                        continue;
                    };
                    return Some(Step::Arrival(Arrival {
                        connection: packet.connection,
                        payload: packet.payload,
                    }));
                }
                self.draining = None;
                if let Some(wakeup) = slot.link.next_wakeup() {
                    // Strictly before everything queued (and within the
                    // bound), the link would come straight back out of the
                    // queue: keep draining it without the round trip. Only
                    // asked of a short queue (a transfer's), where it often
                    // holds; in a large mesh it rarely does, and asking
                    // costs more than it saves.
                    if wakeup <= until_ns
                        && self.queue.len() <= SHORT_QUEUE
                        && self.queue.next_time().is_none_or(|t| wakeup < t)
                    {
                        self.now_ns = self.now_ns.max(wakeup);
                        self.draining = Some(link);
                        continue;
                    }
                    self.links[link as usize].armed_ns = Some(wakeup);
                    self.push(wakeup, Wake::Link(link));
                }
            }
            let (at_ns, wake) = self.queue.pop_until(until_ns)?;
            self.now_ns = self.now_ns.max(at_ns);
            match wake {
                Wake::Link(link) => {
                    let slot = &mut self.links[link as usize];
                    if slot.armed_ns != Some(at_ns) {
                        continue;
                    }
                    slot.armed_ns = None;
                    self.draining = Some(link);
                }
                Wake::Connection(connection) => {
                    if timer_live(connection, at_ns) {
                        self.events += 1;
                        return Some(Step::Timer(connection));
                    }
                }
            }
        }
    }
}
