//! The exchange endpoint: the server side (peers' connections, their
//! hello, the replayed acks and welcome, data in and acks out) and
//! [`ExchangeNode::exchange`], which runs one fragment with a pool of
//! connections to every peer ([`super::sender`]); how an attempt ends, and
//! what it reports, is [`super::outcome`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use longhaul_core::limits::shorten;
use longhaul_exchange::wire::{ChunkId, Kind};
use longhaul_exchange::{
    Accepted, Checkpoint, CollectivePlan, Contributor, LinkCodecs, Phase, ShardReducer, wire,
};
use quinn::{Connection, RecvStream, SendStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::io::{MAX_CONTROL_MESSAGE_BYTES, ReadMessageError, expect, read_message, write_message};
use super::outcome::{disconnected, outcome, wait};
use super::state::{FragmentKey, FragmentState, Registry, Taken};
use super::{ExchangeError, ExchangeOptions, ExchangeOutcome, code, sender};
use crate::data_endpoint::{Pending, Source};
use crate::tls::{self, AgentTls};

/// Fragments one connection may carry at once (a stream each).
pub(crate) const MAX_FRAGMENTS_AT_ONCE: u32 = 64;

/// What the node and its tasks share.
#[derive(Debug)]
pub(crate) struct NodeInner {
    pub site: String,
    pub endpoint: quinn::Endpoint,
    pub client_config: quinn::ClientConfig,
    pub insecure: bool,
    pub options: ExchangeOptions,
    pub incarnation: u64,
    pub registry: Registry,
    pub next_connection: AtomicU64,
    /// The pool: a connection per peer address and slot, kept across
    /// fragments while it lives.
    pub connections: Mutex<HashMap<(SocketAddr, u32), Connection>>,
}

impl NodeInner {
    fn connections(&self) -> MutexGuard<'_, HashMap<(SocketAddr, u32), Connection>> {
        self.connections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The pool's live connection to `addr` in `slot`, if any.
    pub fn pooled(&self, addr: SocketAddr, slot: u32) -> Option<Connection> {
        let mut pool = self.connections();
        match pool.get(&(addr, slot)) {
            Some(connection) if connection.close_reason().is_none() => Some(connection.clone()),
            Some(_) => {
                pool.remove(&(addr, slot));
                None
            }
            None => None,
        }
    }

    /// How many of the pool's connections to `addr` are open.
    pub fn pooled_open(&self, addr: SocketAddr) -> u32 {
        let open = self
            .connections()
            .iter()
            .filter(|((a, _), c)| *a == addr && c.close_reason().is_none())
            .count();
        u32::try_from(open).unwrap_or(u32::MAX)
    }

    pub fn pool(&self, addr: SocketAddr, slot: u32, connection: Connection) {
        self.connections().insert((addr, slot), connection);
    }

    /// Drops the pool's connection in `slot` once it is closed.
    pub fn evict_if_closed(&self, addr: SocketAddr, slot: u32) {
        let mut pool = self.connections();
        if pool
            .get(&(addr, slot))
            .is_some_and(|c| c.close_reason().is_some())
        {
            pool.remove(&(addr, slot));
        }
    }
}

/// One agent's exchange endpoint (see the module docs of
/// [`crate::exchange`]). Dropping it closes the endpoint.
#[derive(Debug)]
pub struct ExchangeNode {
    inner: Arc<NodeInner>,
    accept: tokio::task::JoinHandle<()>,
    /// Whether dropping the node closes the endpoint (not a shared one).
    owns_endpoint: bool,
}

/// One fragment to exchange.
#[derive(Debug)]
pub struct FragmentRequest<'a> {
    pub job: &'a str,
    pub round: u64,
    pub fragment: u32,
    pub plan: &'a CollectivePlan,
    pub codecs: &'a LinkCodecs,
    /// This site's encoders of the fragment (their residuals carry over
    /// to the next round).
    pub contributor: &'a mut Contributor,
    /// This site's pseudo-gradient of the fragment.
    pub values: &'a [f32],
    /// Where every other live site's node listens.
    pub peers: &'a BTreeMap<String, SocketAddr>,
    /// How long the exchange may take at most.
    pub deadline: Duration,
}

/// The QUIC settings of the node's connections: each pooled connection
/// carries one bidirectional stream per fragment exchanged at once.
fn transport(options: &ExchangeOptions) -> Result<Arc<quinn::TransportConfig>, ExchangeError> {
    options
        .tuning()
        .transport_config(0, MAX_FRAGMENTS_AT_ONCE)
        .map_err(|error| ExchangeError::InvalidOptions {
            field: "transport",
            message: error.to_string(),
        })
}

impl ExchangeNode {
    /// Binds the endpoint on `addr` (inside a tokio runtime), with the UDP
    /// buffers and QUIC windows sized from `options`' link.
    pub fn bind(
        addr: SocketAddr,
        tls: &AgentTls,
        options: ExchangeOptions,
    ) -> Result<ExchangeNode, ExchangeError> {
        options.validate()?;
        let server_config = tls.quinn_server_config(&[wire::ALPN], transport(&options)?)?;
        let (endpoint, _buffers) = crate::udp::quic_endpoint(
            addr,
            Some(server_config),
            options.tuning().socket_buffer_bytes,
            "exchange",
        )
        .map_err(|source| ExchangeError::Bind { addr, source })?;
        let mut node =
            Self::on_endpoint(endpoint.clone(), Source::Endpoint(endpoint), tls, options)?;
        node.owns_endpoint = true;
        Ok(node)
    }

    /// Serves peers' connections from `source` and connects to peers from
    /// `endpoint` (shared, see [`crate::data_endpoint`]: the node then
    /// leaves the endpoint open when it is dropped).
    pub(crate) fn on_endpoint(
        endpoint: quinn::Endpoint,
        source: Source,
        tls: &AgentTls,
        options: ExchangeOptions,
    ) -> Result<ExchangeNode, ExchangeError> {
        options.validate()?;
        let client_config = tls.quinn_client_config(&[wire::ALPN], transport(&options)?)?;
        let incarnation = options.incarnation.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        let inner = Arc::new(NodeInner {
            site: tls.site().to_string(),
            endpoint,
            client_config,
            insecure: tls.is_insecure(),
            options,
            incarnation,
            registry: Registry::new(),
            next_connection: AtomicU64::new(1),
            connections: Mutex::new(HashMap::new()),
        });
        let accept = tokio::spawn(accept_loop(Arc::clone(&inner), source));
        Ok(ExchangeNode {
            inner,
            accept,
            owns_endpoint: false,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    pub fn site(&self) -> &str {
        &self.inner.site
    }

    /// What each peer's part of a fragment under `plan` has come to so far
    /// (for status pages and metrics); `None` when it is not exchanged here.
    pub fn progress(
        &self,
        job: &str,
        round: u64,
        fragment: u32,
        plan: &CollectivePlan,
    ) -> Option<BTreeMap<String, super::PeerReport>> {
        let key = FragmentKey {
            job: job.to_string(),
            round,
            fragment,
            plan: plan.digest(),
        };
        let state = self.inner.registry.get(&key)?;
        let inner = state.lock();
        Some(
            inner
                .peers
                .iter()
                .map(|(site, peer)| (site.clone(), peer.report.clone()))
                .collect(),
        )
    }

    /// The pool's live connections: each peer address and slot with
    /// quinn's figures of its path (congestion window, RTT, losses).
    pub fn pool_paths(&self) -> Vec<(SocketAddr, u32, quinn::PathStats)> {
        self.inner
            .connections()
            .iter()
            .filter(|(_, c)| c.close_reason().is_none())
            .map(|((addr, slot), c)| (*addr, *slot, c.stats().path))
            .collect()
    }

    /// A copy of the congestion controller of each of the pool's live
    /// connections (which one runs, and its state).
    pub fn pool_controllers(&self) -> Vec<Box<dyn quinn::congestion::Controller>> {
        self.inner
            .connections()
            .values()
            .filter(|c| c.close_reason().is_none())
            .map(Connection::congestion_state)
            .collect()
    }

    /// Closes the endpoint and waits (at most `wait`) until its
    /// connections are gone, so that the address can be bound again.
    pub async fn shutdown(self, wait: Duration) {
        // Its own connections, on a shared endpoint too.
        for connection in self.inner.connections().drain().map(|(_, c)| c) {
            connection.close(code::DONE.into(), b"shutdown");
        }
        if self.owns_endpoint {
            self.inner.endpoint.close(code::DONE.into(), b"shutdown");
            let _ = tokio::time::timeout(wait, self.inner.endpoint.wait_idle()).await;
        }
    }

    /// Forgets every fragment of `job`'s `round` (once the round is over:
    /// peers can no longer need their acks replayed).
    pub fn forget(&self, job: &str, round: u64) {
        self.inner.registry.forget(job, round);
    }

    /// Exchanges one fragment: contributes this site's values, reduces its
    /// shard, and returns the reduced fragment with its hash once every
    /// chunk is in and every peer acknowledged what it was sent; or, at the
    /// deadline or once a peer has had no working connection for
    /// [`ExchangeOptions::peer_timeout`], the peers that did not finish.
    ///
    /// Unless it returns a result, the contributor's error-feedback
    /// residuals are put back as they were (a copy is kept meanwhile, as
    /// large as the residuals), so the fragment planned again without a
    /// dead peer encodes the same residual, not one an abandoned attempt
    /// moved. Called again under the same plan (with the same values and
    /// codecs), it resumes the fragment's state: nothing held is sent
    /// again; once it returned a result, it returns that result again and
    /// leaves the residuals alone. A call while another runs is refused.
    pub async fn exchange(
        &self,
        mut request: FragmentRequest<'_>,
    ) -> Result<ExchangeOutcome, ExchangeError> {
        let checkpoint = request.contributor.checkpoint();
        let result = self.exchange_once(&mut request, &checkpoint).await;
        if !matches!(&result, Ok(outcome) if outcome.reason.is_none()) {
            request.contributor.restore(checkpoint);
        }
        result
    }

    async fn exchange_once(
        &self,
        request: &mut FragmentRequest<'_>,
        checkpoint: &Checkpoint,
    ) -> Result<ExchangeOutcome, ExchangeError> {
        let started = Instant::now();
        let node = &self.inner;
        let me = node.site.as_str();
        let plan = request.plan;
        if !plan.is_live(me) {
            return Err(ExchangeError::NotLive {
                site: me.to_string(),
            });
        }
        let peers: Vec<String> = plan.live().iter().filter(|s| *s != me).cloned().collect();
        let mut addresses = BTreeMap::new();
        for peer in &peers {
            let Some(addr) = request.peers.get(peer) else {
                return Err(ExchangeError::NoAddress { site: peer.clone() });
            };
            addresses.insert(peer.clone(), *addr);
        }
        let key = FragmentKey {
            job: request.job.to_string(),
            round: request.round,
            fragment: request.fragment,
            plan: plan.digest(),
        };
        // A fragment tried before under this plan (its exchange ended
        // without a result) is resumed: its state keeps what it holds and
        // what its peers acknowledged, so nothing held is sent again.
        let active = match node.registry.get(&key) {
            Some(state) => {
                if state.active.swap(true, Ordering::SeqCst) {
                    return Err(ExchangeError::Busy {
                        job: key.job,
                        round: key.round,
                        fragment: key.fragment,
                    });
                }
                let active = Active(state);
                if active.0.delivered.load(Ordering::SeqCst) {
                    // Its result was returned before: the result again,
                    // the residuals as the caller kept them after it.
                    return Ok(outcome(
                        &active.0,
                        None,
                        started,
                        Instant::now(),
                        Vec::new(),
                    ));
                }
                // Encoded again from the checkpoint only to move the
                // residuals as the first attempt did: the same values and
                // codecs give the same frames, which the state holds.
                request.contributor.contributions_from(
                    checkpoint,
                    plan,
                    request.codecs,
                    me,
                    request.values,
                )?;
                active.0.resume();
                active
            }
            None => Active(self.register(request, checkpoint, key, &peers)?),
        };
        let state = Arc::clone(&active.0);

        let (stop, stopped) = watch::channel(false);
        let mut pool = JoinSet::new();
        for (peer, addr) in &addresses {
            for slot in 0..node.options.connections_per_peer {
                pool.spawn(sender::connection_loop(
                    Arc::clone(node),
                    Arc::clone(&state),
                    peer.clone(),
                    *addr,
                    slot,
                    stopped.clone(),
                ));
            }
        }
        let reason = wait(node, &state, started + request.deadline).await;
        // The exchange's time, without the pool's shutdown.
        let ended = Instant::now();
        let dead = disconnected(&state);
        let _ = stop.send(true);
        // The pool ends at once on the stop signal; the bound is a guard.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while pool.join_next().await.is_some() {}
        })
        .await;
        pool.abort_all();
        let outcome = outcome(&state, reason, started, ended, dead);
        if outcome.reason.is_none() {
            state.delivered.store(true, Ordering::SeqCst);
        }
        super::metrics::record(&outcome);
        Ok(outcome)
    }

    /// A new fragment's state, its chunks encoded and queued, registered
    /// (and marked active) so that peers' hellos find it.
    fn register(
        &self,
        request: &mut FragmentRequest<'_>,
        checkpoint: &Checkpoint,
        key: FragmentKey,
        peers: &[String],
    ) -> Result<Arc<FragmentState>, ExchangeError> {
        let node = &self.inner;
        let me = node.site.as_str();
        let plan = request.plan;
        let reducer = ShardReducer::new(plan, me, request.codecs.gather())?;
        let state = Arc::new(FragmentState::new(
            key.clone(),
            me,
            plan.clone(),
            reducer,
            peers,
        ));
        let chunks = request.contributor.contributions_from(
            checkpoint,
            plan,
            request.codecs,
            me,
            request.values,
        )?;
        {
            let mut guard = state.lock();
            let inner = &mut *guard;
            for chunk in chunks {
                let id = ChunkId {
                    phase: Phase::ReduceScatter,
                    fragment: request.fragment,
                    shard: chunk.shard,
                    offset: chunk.offset,
                    length: chunk.length,
                };
                if chunk.to != me {
                    state.queue(inner, &chunk.to, id, &chunk.frame)?;
                    continue;
                }
                let accepted = inner.reducer.accept(
                    me,
                    chunk.shard,
                    chunk.offset,
                    chunk.length,
                    chunk.frame,
                )?;
                if let Accepted::Completed { chunk } = accepted {
                    state
                        .gathered(inner, chunk)
                        .map_err(|reason| ExchangeError::Average { reason })?;
                }
            }
            inner.timeline.encoded = Some(Instant::now());
            FragmentState::milestones(inner);
        }
        state.active.store(true, Ordering::SeqCst);
        if !node.registry.insert(Arc::clone(&state)) {
            return Err(ExchangeError::Busy {
                job: key.job,
                round: key.round,
                fragment: key.fragment,
            });
        }

        Ok(state)
    }
}

/// Marks a fragment's state as being exchanged while it lives.
struct Active(Arc<FragmentState>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.store(false, Ordering::SeqCst);
    }
}

impl Drop for ExchangeNode {
    fn drop(&mut self) {
        self.accept.abort();
        if self.owns_endpoint {
            self.inner.endpoint.close(code::DONE.into(), b"shutdown");
        }
    }
}

async fn accept_loop(node: Arc<NodeInner>, source: Source) {
    source
        .serve_each(
            usize::MAX,
            |incoming| serve_connection(Arc::clone(&node), incoming),
            |_| {},
        )
        .await;
}

async fn serve_connection(node: Arc<NodeInner>, incoming: Pending) {
    let handshake = node.options.handshake_timeout;
    let Ok(connecting) = incoming.accept() else {
        return;
    };
    let Ok(Ok(connection)) = tokio::time::timeout(handshake, connecting).await else {
        return;
    };
    let mut streams = JoinSet::new();
    loop {
        tokio::select! {
            accepted = connection.accept_bi() => match accepted {
                Ok((send, recv)) => {
                    streams.spawn(serve_stream(Arc::clone(&node), connection.clone(), send, recv));
                }
                Err(_) => break,
            },
            Some(_) = streams.join_next(), if !streams.is_empty() => {}
        }
    }
}

/// What a refusal ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Only the refused stream: the connection is pooled and carries the
    /// peer's other fragments, which one stale hello must not cut off.
    Stream,
    /// The whole connection: its certificate does not name the site it
    /// claims, or a message on it did not decode (a peer that frames
    /// wrongly once cannot be trusted on its other streams either).
    Connection,
}

/// Refuses a stream (or its connection, by `scope`): a refusal naming the
/// reason, then the end of the stream or a close carrying the reason too.
async fn refuse(
    connection: &Connection,
    (send, recv): (&mut SendStream, &mut RecvStream),
    header: wire::Header,
    reason: &str,
    code: u32,
    scope: Scope,
) {
    // shorten: at most 1 KiB, the wire's bound on a reason.
    let reason = shorten(reason.to_string());
    let _ = write_message(send, &header, reason.as_bytes()).await;
    // Let the refusal reach the peer before the close discards it.
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
    match scope {
        Scope::Stream => {
            let _ = recv.stop(code.into());
        }
        Scope::Connection => connection.close(code.into(), reason.as_bytes()),
    }
}

fn refusal(job: &str, round: u64, plan: u32, chunk: ChunkId) -> wire::Header {
    let mut chunk = chunk;
    if chunk.length == 0 {
        chunk.length = 1;
    }
    wire::Header {
        kind: Kind::Refused,
        job: if job.is_empty() {
            "?".to_string()
        } else {
            job.to_string()
        },
        round,
        plan,
        chunk,
    }
}

const NO_CHUNK: ChunkId = ChunkId {
    phase: Phase::ReduceScatter,
    fragment: 0,
    shard: 0,
    offset: 0,
    length: 1,
};

async fn serve_stream(
    node: Arc<NodeInner>,
    connection: Connection,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    let handshake = node.options.handshake_timeout;
    let mut buffer = Vec::new();
    let hello = match tokio::time::timeout(
        handshake,
        read_message(&mut recv, &mut buffer, MAX_CONTROL_MESSAGE_BYTES),
    )
    .await
    {
        Ok(Ok(message)) => message,
        Ok(Err(error)) => {
            let header = refusal("?", 0, 0, NO_CHUNK);
            refuse(
                &connection,
                (&mut send, &mut recv),
                header,
                &format!("hello: {error}"),
                code::PROTOCOL,
                Scope::Connection,
            )
            .await;
            return;
        }
        Err(_) => {
            let _ = send.reset(code::PROTOCOL.into());
            let _ = recv.stop(code::PROTOCOL.into());
            return;
        }
    };
    if let Err(error) = expect(&hello, Kind::Hello) {
        let header = refusal(
            &hello.header.job,
            hello.header.round,
            hello.header.plan,
            NO_CHUNK,
        );
        refuse(
            &connection,
            (&mut send, &mut recv),
            header,
            &error,
            code::PROTOCOL,
            Scope::Stream,
        )
        .await;
        return;
    }
    // The decoder checked the site id.
    let site = String::from_utf8_lossy(hello.payload).into_owned();
    let header = hello.header.clone();
    let refused = |reason: String| {
        (
            refusal(&header.job, header.round, header.plan, NO_CHUNK),
            reason,
        )
    };
    if !node.insecure
        && let Err(error) = tls::check_peer_site(&connection, &site)
    {
        tracing::warn!(remote = %connection.remote_address(), claimed_site = %site, %error, "exchange client refused");
        let (h, reason) = refused(error);
        refuse(
            &connection,
            (&mut send, &mut recv),
            h,
            &reason,
            code::WRONG_SITE,
            Scope::Connection,
        )
        .await;
        return;
    }
    let key = FragmentKey {
        job: header.job.clone(),
        round: header.round,
        fragment: header.chunk.fragment,
        plan: header.plan,
    };
    let Some(state) = node
        .registry
        .wait_for(&key, node.options.peer_timeout)
        .await
    else {
        let (h, reason) = refused(format!(
            "job {:?} round {} fragment {} plan {:#010x}: not exchanged by this node",
            key.job, key.round, key.fragment, key.plan
        ));
        refuse(
            &connection,
            (&mut send, &mut recv),
            h,
            &reason,
            code::UNKNOWN,
            Scope::Stream,
        )
        .await;
        return;
    };
    if site == state.me || !state.plan.is_live(&site) {
        let (h, reason) = refused(format!(
            "site {site:?} is not a peer under plan {:#010x}, whose live sites are {:?}",
            header.plan,
            state.plan.live()
        ));
        refuse(
            &connection,
            (&mut send, &mut recv),
            h,
            &reason,
            code::UNKNOWN,
            Scope::Stream,
        )
        .await;
        return;
    }
    // Replay what is held from this site, then welcome it.
    let replay = {
        let mut inner = state.lock();
        if let Some(peer) = inner.peers.get_mut(&site) {
            peer.alive_at = Instant::now();
        }
        inner.ledger.replay(&site)
    };
    for chunk in replay {
        if write_message(&mut send, &state.header(Kind::Ack, chunk), &[])
            .await
            .is_err()
        {
            return;
        }
    }
    let welcome = state.header(
        Kind::Welcome,
        ChunkId {
            length: 0,
            ..NO_CHUNK
        },
    );
    if write_message(&mut send, &welcome, &node.incarnation.to_le_bytes())
        .await
        .is_err()
    {
        return;
    }
    loop {
        let message = match read_message(&mut recv, &mut buffer, wire::MAX_MESSAGE_BYTES).await {
            Ok(message) => message,
            Err(ReadMessageError::Wire(error)) => {
                // The framing cannot be trusted past a message that does
                // not decode: refuse it and close.
                if let Some(peer) = state.lock().peers.get_mut(&site) {
                    peer.report.refused += 1;
                }
                state.notify();
                tracing::warn!(peer = %site, %error, "exchange message refused");
                let header = state.header(Kind::Refused, NO_CHUNK);
                refuse(
                    &connection,
                    (&mut send, &mut recv),
                    header,
                    &error.to_string(),
                    code::PROTOCOL,
                    Scope::Connection,
                )
                .await;
                return;
            }
            Err(_) => return,
        };
        let h = &message.header;
        if h.kind != Kind::Data || h.job != key.job || h.round != key.round {
            let reason = format!(
                "a {} message for job {:?} round {} on a stream of job {:?} round {}",
                h.kind.name(),
                h.job,
                h.round,
                key.job,
                key.round
            );
            let header = state.header(Kind::Refused, NO_CHUNK);
            refuse(
                &connection,
                (&mut send, &mut recv),
                header,
                &reason,
                code::PROTOCOL,
                Scope::Stream,
            )
            .await;
            return;
        }
        let chunk = h.chunk;
        let answer = match state.take(&site, h.plan, &chunk, message.payload) {
            Taken::Ack => write_message(&mut send, &state.header(Kind::Ack, chunk), &[]).await,
            Taken::Refused(reason) => {
                tracing::warn!(peer = %site, %reason, "exchange chunk refused");
                let reason = shorten(reason);
                write_message(
                    &mut send,
                    &state.header(Kind::Refused, chunk),
                    reason.as_bytes(),
                )
                .await
            }
        };
        if answer.is_err() {
            return;
        }
    }
}
