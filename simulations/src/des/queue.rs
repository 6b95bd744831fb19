//! The event queue: wake-ups in time order, ties in the order they were
//! pushed.
//!
//! A few entries (a transfer's two links and its connections' timers) live
//! in a binary heap, whose one compact array is hard to beat at that size.
//! From [`RADIX_FROM`] entries on (a large round keeps thousands) the queue
//! moves them, once and for good, into a radix heap: virtual time never
//! goes back, so every time pushed is at least the last one taken out, and
//! a radix heap files each entry in the bucket of the highest bit where its
//! time differs from the last, finding the next one by spreading the lowest
//! non-empty bucket. Pushing is O(1) and an entry moves down at most 64
//! buckets in its life, where a binary heap of thousands pays a dozen
//! levels on every push and pop. Both give the first pushed of the entries
//! at one time first, so the order is the same either way: a binary heap's
//! on (time, push number).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::engine::Wake;

/// Bucket b ≥ 1 holds the entries whose highest bit of time that differs
/// from the last time is bit b − 1 of 64; bucket 0 (`due`) those at it.
const BUCKETS: usize = 65;

/// Entries from which the queue is a radix heap.
const RADIX_FROM: usize = 512;

#[derive(Debug, Clone, Copy)]
struct Entry {
    at_ns: u64,
    /// Push number: the order among entries at the same time.
    order: u64,
    wake: Wake,
}

#[derive(Debug)]
pub(crate) struct WakeQueue {
    /// While `radix` is `None`: every entry, as (time, push number, wake).
    heap: BinaryHeap<Reverse<(u64, u64, Wake)>>,
    radix: Option<Box<RadixHeap>>,
    pushes: u64,
}

impl WakeQueue {
    pub fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            radix: None,
            pushes: 0,
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        match &self.radix {
            Some(radix) => radix.len,
            None => self.heap.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Schedules `wake` at `at_ns`, after everything already at that time.
    #[inline]
    pub fn push(&mut self, at_ns: u64, wake: Wake) {
        self.pushes += 1;
        let order = self.pushes;
        match &mut self.radix {
            Some(radix) => radix.push(Entry { at_ns, order, wake }),
            None => {
                self.heap.push(Reverse((at_ns, order, wake)));
                if self.heap.len() >= RADIX_FROM {
                    self.become_radix();
                }
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn become_radix(&mut self) {
        // In order, from 0 (below every entry): the first look spreads them.
        let mut radix = Box::new(RadixHeap::new());
        let heap = std::mem::take(&mut self.heap);
        for Reverse((at_ns, order, wake)) in heap.into_sorted_vec().into_iter().rev() {
            radix.push(Entry { at_ns, order, wake });
        }
        self.radix = Some(radix);
    }

    /// The time of the earliest entry.
    #[inline]
    pub fn next_time(&mut self) -> Option<u64> {
        match &mut self.radix {
            Some(radix) => radix.next_time(),
            None => self.heap.peek().map(|Reverse((at_ns, _, _))| *at_ns),
        }
    }

    /// Takes the earliest entry out if it is due by `until_ns`.
    #[inline]
    pub fn pop_until(&mut self, until_ns: u64) -> Option<(u64, Wake)> {
        let Some(radix) = &mut self.radix else {
            let &Reverse((at_ns, _, wake)) = self.heap.peek()?;
            if at_ns > until_ns {
                return None;
            }
            self.heap.pop();
            return Some((at_ns, wake));
        };
        radix.pop_until(until_ns)
    }
}

#[derive(Debug)]
struct RadixHeap {
    /// The earliest time still in the queue or the last one taken out; no
    /// entry in the queue is earlier.
    last_ns: u64,
    /// The entries at `last_ns`, in push order. A symmetric run (every
    /// link of a mesh alike) puts hundreds of wake-ups at one instant.
    due: VecDeque<Entry>,
    /// Index 0 is unused: bucket 0 is `due`.
    buckets: Vec<Vec<Entry>>,
    /// Bit b − 1 is set when bucket b (b ≥ 1) holds something.
    occupied: u64,
    len: usize,
}

fn bucket_of(last_ns: u64, at_ns: u64) -> usize {
    (64 - (at_ns ^ last_ns).leading_zeros()) as usize
}

impl RadixHeap {
    fn new() -> Self {
        Self {
            last_ns: 0,
            due: VecDeque::new(),
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            occupied: 0,
            len: 0,
        }
    }

    /// Files an entry pushed after every one already in.
    fn push(&mut self, entry: Entry) {
        if entry.at_ns < self.last_ns {
            // Earlier than the entry last looked at: the engine never does
            // this (it pushes at or after now), but the order stays right
            // if it did, at the cost of refiling every entry.
            self.rebase(entry.at_ns);
        }
        self.file(entry);
        self.len += 1;
    }

    fn next_time(&mut self) -> Option<u64> {
        self.settle();
        self.due.front().map(|entry| entry.at_ns)
    }

    fn pop_until(&mut self, until_ns: u64) -> Option<(u64, Wake)> {
        self.settle();
        if self.due.front()?.at_ns > until_ns {
            return None;
        }
        let entry = self.due.pop_front()?;
        self.len -= 1;
        Some((entry.at_ns, entry.wake))
    }

    /// Files an entry later than `last_ns`, or at it when it was pushed
    /// after every entry already due (a push, not a refiling).
    fn file(&mut self, entry: Entry) {
        let bucket = bucket_of(self.last_ns, entry.at_ns);
        if bucket == 0 {
            self.due.push_back(entry);
        } else {
            self.buckets[bucket].push(entry);
            self.occupied |= 1 << (bucket - 1);
        }
    }

    /// Brings the earliest entries into `due`, in push order: their time
    /// becomes `last_ns`, and the rest of their bucket spreads over lower
    /// buckets (they share every bit above the bucket's with it).
    fn settle(&mut self) {
        if !self.due.is_empty() || self.occupied == 0 {
            return;
        }
        let bucket = self.occupied.trailing_zeros() as usize + 1;
        self.occupied &= !(1 << (bucket - 1));
        if self.buckets[bucket].len() == 1 {
            // The common case in a small run: the next entry alone.
            if let Some(entry) = self.buckets[bucket].pop() {
                self.last_ns = entry.at_ns;
                self.due.push_back(entry);
            }
            return;
        }
        let mut entries = std::mem::take(&mut self.buckets[bucket]);
        let Some(earliest) = entries.iter().map(|entry| entry.at_ns).min() else {
            return;
        };
        self.last_ns = earliest;
        for entry in entries.drain(..) {
            self.file(entry);
        }
        // Entries at one time can reach a bucket from different ones.
        if self.due.len() > 1 {
            self.due
                .make_contiguous()
                .sort_unstable_by_key(|entry| entry.order);
        }
        // Keep the bucket's allocation for its next entries.
        self.buckets[bucket] = entries;
    }

    /// Refiles everything against a new, earlier `last_ns`.
    fn rebase(&mut self, last_ns: u64) {
        self.last_ns = last_ns;
        self.occupied = 0;
        let mut all: Vec<Entry> = self.due.drain(..).collect();
        for bucket in &mut self.buckets {
            all.append(bucket);
        }
        all.sort_unstable_by_key(|entry| entry.order);
        for entry in all {
            self.file(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    use super::*;

    /// A pseudo-random schedule of pushes and pops, times at or after the
    /// last one popped (as the engine pushes them) with many ties and a few
    /// far-future timers, growing past `RADIX_FROM`: the queue gives exactly
    /// a binary heap's order on (time, push number), before and after it
    /// becomes a radix heap.
    #[test]
    fn the_order_is_a_binary_heaps_on_time_then_push_order() {
        let mut queue = WakeQueue::new();
        let mut heap = BinaryHeap::new();
        let mut pushes = 0u64;
        let mut now = 0u64;
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..20_000u32 {
            let r = next();
            if r % 3 != 0 || heap.is_empty() {
                let at = match r % 7 {
                    0 => now,
                    1 => now + 200_000_000,
                    _ => now + (r >> 40) % 5_000,
                };
                let wake = if r % 2 == 0 {
                    Wake::Link(round % 17)
                } else {
                    Wake::Connection(round % 29)
                };
                pushes += 1;
                queue.push(at, wake);
                heap.push(Reverse((at, pushes, wake)));
            } else {
                let Reverse((at, _, wake)) = heap.pop().unwrap();
                assert_eq!(queue.pop_until(u64::MAX), Some((at, wake)), "round {round}");
                now = at;
            }
        }
        assert!(queue.radix.is_some(), "{} entries", queue.len());
        while let Some(Reverse((at, _, wake))) = heap.pop() {
            assert_eq!(queue.pop_until(u64::MAX), Some((at, wake)));
        }
        assert!(queue.is_empty());
        assert_eq!(queue.pop_until(u64::MAX), None);
    }

    /// In the radix heap, a push earlier than the entry last looked at
    /// still comes out first, and nothing comes out before it is due.
    #[test]
    fn a_push_before_the_last_look_comes_out_first_and_nothing_early() {
        let entry = |at_ns, order, wake| Entry { at_ns, order, wake };
        let mut radix = RadixHeap::new();
        radix.push(entry(1_000, 1, Wake::Link(1)));
        radix.push(entry(5_000, 2, Wake::Link(3)));
        assert_eq!(radix.pop_until(999), None);
        assert_eq!(radix.next_time(), Some(1_000));
        radix.push(entry(10, 3, Wake::Connection(2)));
        assert_eq!(radix.pop_until(u64::MAX), Some((10, Wake::Connection(2))));
        assert_eq!(radix.pop_until(u64::MAX), Some((1_000, Wake::Link(1))));
        assert_eq!(radix.pop_until(u64::MAX), Some((5_000, Wake::Link(3))));
        assert_eq!(radix.pop_until(u64::MAX), None);
        assert_eq!(radix.len, 0);
    }
}
