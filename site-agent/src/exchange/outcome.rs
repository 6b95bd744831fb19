//! How one attempt at a fragment's exchange ends: waiting for the result,
//! a dead or refusing peer or the deadline ([`wait`]), and what it
//! reports ([`outcome`]: per peer, the result, the milestones).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::node::NodeInner;
use super::state::FragmentState;
use super::{ExchangeOutcome, Phases};

/// Waits until the exchange is complete (`None`), a peer is dead, a peer
/// refused a chunk or the deadline passes (the reason).
pub(super) async fn wait(
    node: &NodeInner,
    state: &FragmentState,
    deadline: Instant,
) -> Option<String> {
    let mut changes = state.subscribe();
    // Timeouts are checked at least this often.
    let tick = Duration::from_millis(100);
    loop {
        {
            let inner = state.lock();
            if FragmentState::is_complete(&inner) {
                return None;
            }
            if let Some((site, refused)) = inner
                .peers
                .iter()
                .find_map(|(site, p)| p.refused.as_ref().map(|r| (site, r)))
            {
                return Some(format!("{site} {refused}"));
            }
            // A peer finished with is not waited on, reachable or not.
            let waiting = inner.reducer.waiting_on();
            let dead: Vec<&str> = inner
                .peers
                .iter()
                .filter(|(site, p)| {
                    p.connected == 0
                        && p.alive_at.elapsed() > node.options.peer_timeout
                        && !finished(state, &inner, &waiting, site, p)
                })
                .map(|(site, _)| site.as_str())
                .collect();
            if !dead.is_empty() {
                return Some(format!(
                    "no working connection to {dead:?} for {:?}",
                    node.options.peer_timeout
                ));
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Some("the exchange's deadline passed".to_string());
        }
        let _ = tokio::time::timeout(tick.min(deadline - now), changes.changed()).await;
    }
}

/// Whether `peer` acknowledged every chunk sent to it and sent every chunk
/// this node needs from it (`waiting`: the sites the reducer waits on).
fn finished(
    state: &FragmentState,
    inner: &super::state::Inner,
    waiting: &[&str],
    site: &str,
    peer: &super::state::Peer,
) -> bool {
    let owes_average = state
        .plan
        .position(site)
        .is_some_and(|k| !inner.assembler.shard_complete(k as u32));
    peer.outbox.is_done() && !waiting.contains(&site) && !owes_average
}

/// The peers with no working connection now (at the end of an attempt,
/// before its pool is stopped).
pub(super) fn disconnected(state: &FragmentState) -> Vec<String> {
    state
        .lock()
        .peers
        .iter()
        .filter(|(_, p)| p.connected == 0)
        .map(|(site, _)| site.clone())
        .collect()
}

/// The outcome of an attempt from `started` to `ended` (before its pool
/// stopped: what the server side takes later is not the attempt's);
/// `dead`: the peers [`disconnected`] when it ended.
pub(super) fn outcome(
    state: &FragmentState,
    reason: Option<String>,
    started: Instant,
    ended: Instant,
    dead: Vec<String>,
) -> ExchangeOutcome {
    let inner = state.lock();
    let since = |t: Option<Instant>| {
        t.filter(|t| *t <= ended)
            .map(|t| t.saturating_duration_since(started))
    };
    let phases = Phases {
        encoded: since(inner.timeline.encoded),
        first_data: since(inner.timeline.first_data),
        reduced: since(inner.timeline.reduced),
        assembled: since(inner.timeline.assembled),
    };
    let waiting: Vec<&str> = inner.reducer.waiting_on();
    let mut peers = BTreeMap::new();
    let mut unfinished = Vec::new();
    for (site, peer) in &inner.peers {
        let mut report = peer.report.clone();
        let stats = peer.outbox.stats();
        report.sent_messages = stats.sent;
        report.sent_bytes = stats.sent_bytes;
        report.resent_bytes = stats.resent_bytes;
        report.peak_connection_in_flight_bytes = stats.peak_connection_in_flight_bytes;
        report.connections_used = stats.connections_used;
        report.finished = finished(state, &inner, &waiting, site, peer);
        if !report.finished {
            unfinished.push(site.clone());
        }
        peers.insert(site.clone(), report);
    }
    // A result only when the exchange ended without a failure: a site that
    // applied one while the round re-plans without a dead peer would
    // diverge from the others.
    let (result, hash) = match reason {
        None => (
            inner.assembler.result().map(<[f32]>::to_vec),
            inner.assembler.hash(),
        ),
        Some(_) => (None, None),
    };
    let dead = if reason.is_some() {
        dead.into_iter()
            .filter(|s| unfinished.contains(s))
            .collect()
    } else {
        Vec::new()
    };
    ExchangeOutcome {
        hash,
        result,
        peers,
        unfinished,
        dead,
        reason,
        elapsed: ended.saturating_duration_since(started),
        phases,
    }
}
