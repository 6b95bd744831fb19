//! The outbox against a model receiver: connections lost at random, acks
//! lost with them, the receiver's replay on every reconnect. Nothing the
//! receiver holds is ever sent to it again, and every chunk gets there.

use std::collections::BTreeSet;

use longhaul_core::rng::SeedRng;
use proptest::prelude::*;

use crate::plan::Phase;
use crate::*;

fn chunks(count: u32) -> Vec<ChunkId> {
    (0..count)
        .map(|k| ChunkId {
            phase: Phase::ReduceScatter,
            fragment: 0,
            shard: k % 3,
            offset: u64::from(k) * 10,
            length: 10,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_resumed_sender_sends_nothing_the_receiver_holds(
        count in 1u32..60,
        connections in 1u64..5,
        cap in prop_oneof![Just(1u64), 100u64..500, Just(u64::MAX)],
        seed in any::<u64>(),
    ) {
        let mut rng = SeedRng::new(seed);
        let mut outbox = Outbox::new();
        for c in chunks(count) {
            outbox.push(c, vec![0; 100]);
        }
        let mut ledger = AckLedger::new();
        // Acks on their way back, delivered later and out of order (or
        // lost with their connection).
        let mut pending: Vec<(u64, ChunkId)> = Vec::new();
        let mut received: BTreeSet<(u32, u64)> = BTreeSet::new();
        let mut live: Vec<u64> = (0..connections).collect();
        let mut next_connection = connections;
        let mut steps = 0;
        while !outbox.is_done() {
            steps += 1;
            prop_assert!(steps < 100_000, "seed {seed}: no progress");
            if !pending.is_empty() && rng.chance(0.3) {
                let (_, ack) = pending.swap_remove(rng.index(pending.len()));
                outbox.ack(&ack);
                continue;
            }
            if live.is_empty() || rng.chance(0.05) {
                // Lose a connection (its acks in flight with it), then
                // reconnect: replay, welcome.
                if let Some(&lost) = live.get(rng.index(live.len().max(1))) {
                    live.retain(|&c| c != lost);
                    pending.retain(|(c, _)| *c != lost);
                    outbox.connection_lost(lost);
                }
                for ack in ledger.replay("a") {
                    outbox.ack(&ack);
                }
                outbox.resumed();
                live.push(next_connection);
                next_connection += 1;
                continue;
            }
            let connection = live[rng.index(live.len())];
            // Within the cap, or one chunk when the cap is under one.
            prop_assert!(outbox.in_flight_bytes(connection) <= cap.max(100));
            let idle = outbox.in_flight_bytes(connection) == 0 && outbox.has_queued();
            let Some((chunk, _)) = outbox.next_within(connection, cap, live.len()) else {
                // An idle connection always gets a queued chunk.
                prop_assert!(!idle, "seed {}: idle connection {} got nothing", seed, connection);
                if pending.is_empty() {
                    // Everything left is in flight or uncertain: let some
                    // connection fail so it comes back.
                    let lost = live[rng.index(live.len())];
                    live.retain(|&c| c != lost);
                    outbox.connection_lost(lost);
                }
                continue;
            };
            // Delivered (most of the time) and acked (the ack may be lost).
            if rng.chance(0.9) {
                prop_assert!(
                    received.insert((chunk.shard, chunk.offset)),
                    "seed {seed}: {chunk:?} arrived twice"
                );
                ledger.record("a", &chunk);
                if rng.chance(0.8) {
                    pending.push((connection, chunk));
                }
            } else {
                // Lost on the way: its connection fails.
                live.retain(|&c| c != connection);
                pending.retain(|(c, _)| *c != connection);
                outbox.connection_lost(connection);
            }
        }
        prop_assert_eq!(received.len() as u32, count);
        prop_assert_eq!(outbox.stats().acked, u64::from(count));
        // Everything acknowledged: no connection holds bytes in flight.
        for c in 0..next_connection {
            prop_assert_eq!(outbox.in_flight_bytes(c), 0, "seed {}: connection {}", seed, c);
        }
    }
}

#[test]
fn acks_settle_every_chunk_they_cover_and_a_pushed_acked_chunk_is_never_queued() {
    let mut outbox = Outbox::new();
    let all = chunks(6);
    for c in &all {
        outbox.push(*c, vec![1; 10]);
    }
    // Shard 0 holds chunks 0 and 3 (offsets 0 and 30): one ack for 0..40.
    let wide = ChunkId {
        offset: 0,
        length: 40,
        ..all[0]
    };
    assert_eq!(outbox.ack(&wide), 2);
    assert_eq!(outbox.remaining(), 4);
    let mut sent = Vec::new();
    while let Some((c, _)) = outbox.next(1) {
        sent.push(c.offset);
    }
    assert_eq!(sent, [10, 20, 40, 50]);
    // Within shard 0's acked range: settled at once; beyond it: queued.
    let within = ChunkId {
        offset: 10,
        ..all[0]
    };
    outbox.push(within, vec![1; 10]);
    assert_eq!(outbox.remaining(), 4);
    let beyond = ChunkId {
        offset: 100,
        ..all[0]
    };
    outbox.push(beyond, vec![1; 10]);
    assert_eq!(outbox.remaining(), 5);
    let mut again = Outbox::new();
    again.ack(&wide);
    again.push(all[0], vec![1; 10]);
    assert!(again.is_done() && again.next(1).is_none());
    // A restarted peer: every acknowledgement forgotten, all sent again.
    assert_eq!(again.forget_acks(), 1);
    assert_eq!(again.remaining(), 1);
    assert_eq!(again.next(1).map(|(c, _)| c), Some(all[0]));
}

#[test]
fn chunks_in_flight_when_every_connection_is_gone_are_sent_again_after_a_welcome() {
    // An attempt stopped with chunks in flight on connections that will
    // never come back; the next attempt must still send them.
    let mut outbox = Outbox::new();
    for c in chunks(4) {
        outbox.push(c, vec![1; 10]);
    }
    let first = outbox.next(7).unwrap().0;
    let second = outbox.next(8).unwrap().0;
    outbox.ack(&second);
    assert_eq!(outbox.all_lost(), 1);
    // Uncertain until a welcome: nothing is handed out for it yet.
    let mut before = Vec::new();
    while let Some((c, _)) = outbox.next(9) {
        before.push(c);
    }
    assert!(!before.contains(&first), "{before:?}");
    assert_eq!(outbox.resumed(), 1);
    assert_eq!(outbox.next(10).map(|(c, _)| c), Some(first));
}

#[test]
fn chunks_are_spread_over_the_live_connections_each_within_its_cap() {
    let mut outbox = Outbox::new();
    let all = chunks(8);
    for c in &all {
        outbox.push(*c, vec![1; 100]);
    }
    assert_eq!(outbox.largest_message(), 100);
    // Two live connections: the first takes one chunk, and no second while
    // the other holds none.
    assert_eq!(outbox.next_within(1, 250, 2).map(|(c, _)| c), Some(all[0]));
    assert!(outbox.next_within(1, 250, 2).is_none());
    assert_eq!(outbox.next_within(2, 250, 2).map(|(c, _)| c), Some(all[1]));
    // Both busy: each fills to its cap, two chunks (200), not three (300).
    assert_eq!(outbox.next_within(1, 250, 2).map(|(c, _)| c), Some(all[2]));
    assert!(outbox.next_within(1, 250, 2).is_none());
    assert_eq!(outbox.next_within(2, 250, 2).map(|(c, _)| c), Some(all[3]));
    assert!(outbox.next_within(2, 250, 2).is_none());
    assert_eq!(outbox.in_flight_bytes(1), 200);
    // A third connection comes up: it takes one, and the busy ones wait
    // for it to have some before taking more, whatever their cap.
    assert_eq!(outbox.next_within(3, 250, 3).map(|(c, _)| c), Some(all[4]));
    // An ack of one of connection 1's chunks (on any connection) frees
    // its bytes: it takes the next chunk.
    outbox.ack(&all[0]);
    assert_eq!(outbox.in_flight_bytes(1), 100);
    assert_eq!(outbox.next_within(1, 250, 3).map(|(c, _)| c), Some(all[5]));
    assert_eq!(outbox.stats().peak_connection_in_flight_bytes, 200);
    // A lost connection holds nothing; its chunks wait for a welcome.
    assert_eq!(outbox.connection_lost(1), 2);
    assert_eq!(outbox.in_flight_bytes(1), 0);
    assert_eq!(outbox.in_flight_bytes(2), 200);
    // A chunk the connection no longer holds does not lower any count.
    outbox.ack(&all[2]);
    assert_eq!(outbox.in_flight_bytes(2), 200);
    outbox.ack(&all[1]);
    outbox.ack(&all[3]);
    assert_eq!(outbox.in_flight_bytes(2), 0);
    assert_eq!(outbox.stats().connections_used, 3);
    // Whatever the cap, an idle connection takes one chunk, and no second
    // one over the cap while chunks are still queued.
    assert_eq!(outbox.resumed(), 1);
    assert!(outbox.has_queued());
    assert!(outbox.next_within(4, 1, 1).is_some());
    assert!(outbox.has_queued());
    assert!(outbox.next_within(4, 1, 1).is_none());
    // The plain `next` knows no cap.
    assert!(outbox.next(4).is_some());
}
