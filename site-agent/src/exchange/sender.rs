//! One connection of the pool to one peer: connect (or take the pool's
//! connection of this slot, kept from the last fragment, so that its
//! congestion window carries over), open a stream, hello, the peer's
//! replayed acks and welcome, then chunks out and acks in until stopped;
//! reconnect with backoff after a failure.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use longhaul_exchange::Phase;
use longhaul_exchange::wire::{ChunkId, Kind};
use tokio::sync::watch;

use super::io::{MAX_CONTROL_MESSAGE_BYTES, ReadMessageError, read_message, write_message};
use super::node::NodeInner;
use super::state::FragmentState;
use crate::tls;

/// Connects to `peer` and serves the pool until `stop`, reconnecting
/// after failures.
pub(crate) async fn connection_loop(
    node: Arc<NodeInner>,
    state: Arc<FragmentState>,
    peer: String,
    addr: SocketAddr,
    slot: u32,
    mut stop: watch::Receiver<bool>,
) {
    let first = node.options.reconnect_backoff;
    let mut backoff = first;
    loop {
        if *stop.borrow() {
            return;
        }
        let id = node.next_connection.fetch_add(1, Ordering::Relaxed);
        let mut welcomed = false;
        let result = tokio::select! {
            result = run_connection(&node, &state, &peer, addr, slot, id, &mut welcomed) => Some(result),
            _ = stop.changed() => None,
        };
        let Some(result) = result else {
            // Stopped mid-connection: what was in flight on it is
            // uncertain, for a later attempt that resumes this state.
            let mut inner = state.lock();
            if let Some(p) = inner.peers.get_mut(&peer) {
                p.outbox.connection_lost(id);
                if welcomed {
                    p.connected = p.connected.saturating_sub(1);
                }
            }
            return;
        };
        let error = match result {
            Ok(()) => return,
            Err(error) => error,
        };
        node.evict_if_closed(addr, slot);
        {
            let mut inner = state.lock();
            if let Some(p) = inner.peers.get_mut(&peer) {
                p.outbox.connection_lost(id);
                if welcomed {
                    p.connected = p.connected.saturating_sub(1);
                    p.report.connections_lost += 1;
                    backoff = first;
                }
                p.report.last_error = Some(error.clone());
            }
        }
        state.notify();
        tracing::debug!(peer = %peer, %error, "exchange connection failed");
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn run_connection(
    node: &NodeInner,
    state: &FragmentState,
    peer: &str,
    addr: SocketAddr,
    slot: u32,
    id: u64,
    welcomed: &mut bool,
) -> Result<(), String> {
    let handshake = node.options.handshake_timeout;
    let connection = match node.pooled(addr, slot) {
        Some(connection) => connection,
        None => {
            let server_name = tls::site_name(peer).map_err(|e| e.to_string())?;
            let connecting = node
                .endpoint
                .connect_with(node.client_config.clone(), addr, &server_name.to_str())
                .map_err(|e| format!("connect to {addr}: {e}"))?;
            let connection = tokio::time::timeout(handshake, connecting)
                .await
                .map_err(|_| format!("handshake with {addr} timed out after {handshake:?}"))?
                .map_err(|e| format!("handshake with {addr}: {e}"))?;
            node.pool(addr, slot, connection.clone());
            if let Some(p) = state.lock().peers.get_mut(peer) {
                p.report.handshakes += 1;
            }
            connection
        }
    };
    let (mut send, mut recv) = tokio::time::timeout(handshake, connection.open_bi())
        .await
        .map_err(|_| "opening a stream timed out".to_string())?
        .map_err(|e| format!("open a stream: {e}"))?;
    let hello = state.header(
        Kind::Hello,
        ChunkId {
            phase: Phase::ReduceScatter,
            fragment: state.key.fragment,
            shard: 0,
            offset: 0,
            length: 0,
        },
    );
    write_message(&mut send, &hello, state.me.as_bytes()).await?;

    // The peer's acks of what it holds, then its welcome.
    let mut buffer = Vec::new();
    let mut replayed = Vec::new();
    let incarnation = loop {
        let message = tokio::time::timeout(
            handshake,
            read_message(&mut recv, &mut buffer, MAX_CONTROL_MESSAGE_BYTES),
        )
        .await
        .map_err(|_| format!("no welcome within {handshake:?}"))?
        .map_err(|e| format!("before the welcome: {e}"))?;
        match message.header.kind {
            Kind::Ack => replayed.push(message.header.chunk),
            Kind::Welcome => {
                let bytes: [u8; 8] = message
                    .payload
                    .try_into()
                    .map_err(|_| "a welcome without its incarnation".to_string())?;
                break u64::from_le_bytes(bytes);
            }
            Kind::Refused => {
                return Err(format!(
                    "refused: {}",
                    String::from_utf8_lossy(message.payload)
                ));
            }
            other => return Err(format!("a {} message before the welcome", other.name())),
        }
    };
    {
        let mut inner = state.lock();
        let Some(p) = inner.peers.get_mut(peer) else {
            return Err(format!("{peer:?} is not a peer"));
        };
        if p.incarnation.is_some_and(|known| known != incarnation) {
            // A restarted peer holds nothing its last incarnation acked.
            p.outbox.forget_acks();
        }
        p.incarnation = Some(incarnation);
        for chunk in &replayed {
            p.outbox.ack(chunk);
        }
        p.outbox.resumed();
        p.connected += 1;
        p.report.connections += 1;
        p.alive_at = Instant::now();
    }
    *welcomed = true;
    state.notify();

    let reader = async {
        let mut buffer = Vec::new();
        loop {
            let message =
                match read_message(&mut recv, &mut buffer, MAX_CONTROL_MESSAGE_BYTES).await {
                    Ok(message) => message,
                    Err(ReadMessageError::Finished) => {
                        return Err("the peer ended the stream".to_string());
                    }
                    Err(error) => return Err(format!("reading acks: {error}")),
                };
            let chunk = message.header.chunk;
            {
                let mut inner = state.lock();
                let Some(p) = inner.peers.get_mut(peer) else {
                    return Err(format!("{peer:?} is not a peer"));
                };
                p.alive_at = Instant::now();
                match message.header.kind {
                    Kind::Ack => {
                        p.outbox.ack(&chunk);
                    }
                    Kind::Refused => {
                        let reason = String::from_utf8_lossy(message.payload).into_owned();
                        p.report.refusals_received += 1;
                        let error = format!("chunk {chunk:?} refused: {reason}");
                        p.refused.get_or_insert_with(|| error.clone());
                        p.report.last_error = Some(error);
                    }
                    other => return Err(format!("a {} message among acks", other.name())),
                }
            }
            state.notify();
        }
    };
    let writer = async {
        let mut changes = state.subscribe();
        loop {
            // The pool's open connections count as live from the start of
            // a fragment, before each stream is welcomed: else the first
            // welcomed would take every chunk before the others could.
            let open = node.pooled_open(addr);
            // Read outside the fragment's lock: quinn's driver holds the
            // connection's own lock while it handles packets.
            let cwnd = connection.stats().path.cwnd;
            let next = {
                let mut inner = state.lock();
                let Some(p) = inner.peers.get_mut(peer) else {
                    return Err(format!("{peer:?} is not a peer"));
                };
                // Spread over the live connections, each within its cap:
                // see `Outbox::next_within` and `connection_cap`.
                let live = p.connected.max(open).max(1);
                let cap = connection_cap(
                    node.options.pool_in_flight_bytes() / u64::from(live),
                    cwnd,
                    p.outbox.largest_message(),
                );
                p.outbox
                    .next_within(id, cap, live as usize)
                    .map(|(_, message)| {
                        let wait = pace(
                            p,
                            message.len() as u64,
                            node.options.pacing_bytes_per_second,
                        );
                        (message, wait)
                    })
            };
            match next {
                Some((message, wait)) => {
                    if let Some(until) = wait {
                        tokio::time::sleep_until(until.into()).await;
                    }
                    send.write_all(&message)
                        .await
                        .map_err(|e| format!("sending a chunk: {e}"))?;
                }
                None => {
                    if changes.changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    };
    tokio::select! {
        result = reader => result,
        result = writer => result,
    }
}

/// Bytes one connection of the pool may have in flight (chunks handed to
/// it and not yet acknowledged): what its own congestion window carries
/// in [`CWND_ROUND_TRIPS`] round trips (a chunk's bytes cross the link,
/// then its ack comes back), at least two chunks (the next one queued
/// behind the one on the wire), at most its `share` of the pool's bytes.
///
/// Each connection's cap follows its own window, so a connection that a
/// loss has slowed down is not handed more than it can carry (beyond the
/// two-chunk floor). A chunk queued there finishes last while the pool's
/// other connections go idle, and the fragment waits for its slowest
/// chunk. The share alone, which is four BDPs of the configured link over
/// the live connections, queued most of a small fragment on each
/// connection at once.
///
/// The cap is per fragment: fragments exchanged at once over one pooled
/// connection may each queue this much on it.
fn connection_cap(share: u64, cwnd: u64, largest_message: u64) -> u64 {
    cwnd.saturating_mul(CWND_ROUND_TRIPS)
        .min(share)
        .max(largest_message.saturating_mul(2))
}

/// See [`connection_cap`].
const CWND_ROUND_TRIPS: u64 = 3;

/// When the next `bytes` may go to the peer at `rate` bytes per second
/// (`None`: now), counting them as sent. A pool idle for more than 10 ms
/// starts its count again, so pacing never allows a burst after a pause.
fn pace(peer: &mut super::state::Peer, bytes: u64, rate: Option<u64>) -> Option<Instant> {
    let rate = rate?;
    let now = Instant::now();
    let due = peer.paced_since + Duration::from_secs_f64(peer.paced_bytes as f64 / rate as f64);
    if due + Duration::from_millis(10) < now {
        peer.paced_since = now;
        peer.paced_bytes = 0;
    }
    let due = peer.paced_since + Duration::from_secs_f64(peer.paced_bytes as f64 / rate as f64);
    peer.paced_bytes += bytes;
    (due > now).then_some(due)
}

#[cfg(test)]
mod tests {
    use super::connection_cap;

    #[test]
    fn a_connection_is_capped_by_its_own_window_within_its_share() {
        let chunk = 136_000;
        // A small window: two chunks, not the share.
        assert_eq!(connection_cap(640_000, 40_000, chunk), 272_000);
        // A large one: three windows, below the share.
        assert_eq!(connection_cap(4_000_000, 800_000, chunk), 2_400_000);
        // The share bounds a window larger still.
        assert_eq!(connection_cap(3_000_000, 2_000_000, chunk), 3_000_000);
        // Two chunks whatever the share.
        assert_eq!(connection_cap(1_000, 1_000, chunk), 272_000);
    }
}
