//! The catch-up transfer between agents, over QUIC (ALPN
//! [`longhaul_exchange::catchup::ALPN`], the messages and their bounds
//! there). A site that missed committed rounds of a job is named by the
//! next round with where to catch up: the state (the trainers' parameters
//! and outer-optimiser state, f32) after round R at site S. Its agent
//! [`fetch`]es that state from S's agent, which serves what its trainers
//! published in its [`StateStore`] ([`CatchUpServer`]).
//!
//! - **Who may fetch**: the request names the requester's site; its
//!   certificate must name that site (with mTLS), and the store must have
//!   been told that this site catches up from this state
//!   ([`StateStore::allow`], from the round that names it). Anything else
//!   is refused with a reason.
//! - **Waiting**: a request that comes before the state is published or
//!   allowed waits for both, at most [`CatchUpOptions::wait`], then is
//!   refused saying which is missing.
//! - **Bounds**: a request is at most
//!   [`longhaul_exchange::catchup::MAX_REQUEST_BYTES`] and must arrive
//!   within [`CatchUpOptions::handshake_timeout`]; the requester allocates
//!   the size it asked for and refuses a response of any other, a payload
//!   whose CRC-32C differs, and bytes after it.
//! - **One stream**: the state crosses on one stream of one connection (a
//!   catch-up is rare; a failed one is fetched again from the start).
//!
//! Wired into the agent: the data endpoint routes this ALPN to a
//! [`CatchUpServer`] of the trainer hub's store, the hub allows the sites
//! an open round names as catching up from this one and keeps what its
//! trainers publish (`PublishState`), and the round driver fetches this
//! site's catch-up for its trainers (`CatchUp`); see
//! [`crate::trainer::catch_up`].

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use longhaul_exchange::catchup::{
    self, CatchUpRequest, MAX_REQUEST_BYTES, REQUEST_FIXED_LEN, RESPONSE_HEADER_LEN, ResponseHeader,
};
use quinn::{Connection, RecvStream, SendStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

use crate::data_endpoint::{Pending, Source};
use crate::tls::{self, AgentTls};

/// How a server serves and a client fetches.
#[derive(Debug, Clone)]
pub struct CatchUpOptions {
    /// For a handshake, and for a request to arrive once connected.
    pub handshake_timeout: Duration,
    /// How long a request waits for its state to be published and allowed.
    pub wait: Duration,
    /// How long the server spends sending one state at most (a peer that
    /// stops reading is dropped then).
    pub transfer_timeout: Duration,
}

impl Default for CatchUpOptions {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            wait: Duration::from_secs(30),
            transfer_timeout: Duration::from_secs(600),
        }
    }
}

/// What an agent fetches catch-up states with: an endpoint (the data
/// endpoint's, so the transfer takes the link the exchange takes) and its
/// identity.
#[derive(Debug, Clone)]
pub struct CatchUpClient {
    pub endpoint: quinn::Endpoint,
    pub tls: AgentTls,
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum CatchUpError {
    #[error("request: {0}")]
    Request(#[from] catchup::CatchUpWireError),
    #[error("connect to {addr}: {message}")]
    Connect { addr: SocketAddr, message: String },
    #[error("the peer refused: {0}")]
    Refused(String),
    #[error("response: {0}")]
    Response(String),
    #[error("the fetch took longer than {0:?}")]
    Timeout(Duration),
    #[error("cannot configure the client: {0}")]
    Tls(#[from] tls::TlsError),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Default)]
struct Entry {
    /// The state after `round`, once published.
    state: Option<(u64, Arc<Vec<f32>>)>,
    /// (round, site): who may fetch the state after which round.
    allowed: BTreeSet<(u64, String)>,
}

/// The state this site's trainers published, per job (the latest round
/// only), and who may fetch it.
#[derive(Debug, Default)]
pub struct StateStore {
    jobs: Mutex<HashMap<String, Entry>>,
    changed: Notify,
}

impl StateStore {
    pub fn new() -> Arc<StateStore> {
        Arc::new(StateStore::default())
    }

    /// Keeps `state` as the job's state after `round`, replacing an
    /// earlier round's (a state after an earlier round than the one kept
    /// is ignored: the store never goes back).
    pub fn publish(&self, job: &str, round: u64, state: Vec<f32>) {
        let mut jobs = lock(&self.jobs);
        let entry = jobs.entry(job.to_string()).or_default();
        if entry.state.as_ref().is_some_and(|(kept, _)| *kept > round) {
            return;
        }
        entry.state = Some((round, Arc::new(state)));
        entry.allowed.retain(|(r, _)| *r >= round);
        drop(jobs);
        self.changed.notify_waiters();
    }

    /// Lets `site` fetch the job's state after `round`. A later round's
    /// catch-up makes an earlier one's moot: its permissions go.
    pub fn allow(&self, job: &str, round: u64, site: &str) {
        let mut jobs = lock(&self.jobs);
        let allowed = &mut jobs.entry(job.to_string()).or_default().allowed;
        if allowed.insert((round, site.to_string())) {
            allowed.retain(|(r, _)| *r >= round);
            drop(jobs);
            self.changed.notify_waiters();
        }
    }

    /// Whether the job's state after `round` is published here.
    pub fn has(&self, job: &str, round: u64) -> bool {
        lock(&self.jobs)
            .get(job)
            .and_then(|entry| entry.state.as_ref())
            .is_some_and(|(r, _)| *r == round)
    }

    /// Forgets the job (it left this site).
    pub fn forget(&self, job: &str) {
        lock(&self.jobs).remove(job);
    }

    /// The state `site` may fetch after `round`, or what is missing.
    pub(crate) fn lookup(
        &self,
        job: &str,
        round: u64,
        site: &str,
    ) -> Result<Arc<Vec<f32>>, String> {
        let jobs = lock(&self.jobs);
        let Some(entry) = jobs.get(job) else {
            return Err(format!("job {job:?} has no state published here"));
        };
        // A newer round's state replaced the one asked for: say so, since
        // waiting cannot help.
        if let Some((r, _)) = &entry.state
            && *r > round
        {
            return Err(format!(
                "the state published here is after round {r} of job {job:?}, which replaced round {round}'s"
            ));
        }
        if !entry.allowed.contains(&(round, site.to_string())) {
            return Err(format!(
                "no round names site {site:?} as catching up from this site after round {round} of job {job:?}"
            ));
        }
        match &entry.state {
            Some((r, state)) if *r == round => Ok(Arc::clone(state)),
            Some((r, _)) => Err(format!(
                "the state published here is after round {r} of job {job:?}, not {round}"
            )),
            None => Err(format!("job {job:?} has no state published here yet")),
        }
    }

    /// [`Self::lookup`], waiting up to `wait` for it to succeed.
    async fn wait_for(
        &self,
        job: &str,
        round: u64,
        site: &str,
        wait: Duration,
    ) -> Result<Arc<Vec<f32>>, String> {
        let give_up = tokio::time::Instant::now() + wait;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.lookup(job, round, site) {
                Ok(state) => return Ok(state),
                Err(missing) => {
                    if tokio::time::timeout_at(give_up, changed).await.is_err() {
                        return Err(format!("{missing} (waited {wait:?})"));
                    }
                }
            }
        }
    }
}

/// Serves the store's states to the sites allowed to fetch them.
#[derive(Debug)]
pub struct CatchUpServer {
    accept: JoinHandle<()>,
    endpoint: Option<quinn::Endpoint>,
}

impl CatchUpServer {
    /// Binds `addr` (inside a tokio runtime) and serves there alone.
    pub fn bind(
        addr: SocketAddr,
        tls: &AgentTls,
        store: Arc<StateStore>,
        options: CatchUpOptions,
    ) -> Result<CatchUpServer, CatchUpError> {
        let server_config = tls.quinn_server_config(
            &[catchup::ALPN],
            Arc::new(quinn::TransportConfig::default()),
        )?;
        let (endpoint, _) =
            crate::udp::quic_endpoint(addr, Some(server_config), 4 << 20, "catch-up").map_err(
                |error| CatchUpError::Connect {
                    addr,
                    message: format!("cannot bind: {error}"),
                },
            )?;
        let mut server = Self::on_source(Source::Endpoint(endpoint.clone()), tls, store, options);
        server.endpoint = Some(endpoint);
        Ok(server)
    }

    /// Serves the connections `source` hands on (a shared endpoint's).
    pub(crate) fn on_source(
        source: Source,
        tls: &AgentTls,
        store: Arc<StateStore>,
        options: CatchUpOptions,
    ) -> CatchUpServer {
        let served = Arc::new(Served {
            store,
            options,
            insecure: tls.is_insecure(),
        });
        CatchUpServer {
            accept: tokio::spawn(accept_loop(served, source)),
            endpoint: None,
        }
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.endpoint.as_ref()?.local_addr().ok()
    }
}

impl Drop for CatchUpServer {
    fn drop(&mut self) {
        self.accept.abort();
        if let Some(endpoint) = &self.endpoint {
            endpoint.close(0u32.into(), b"shutdown");
        }
    }
}

#[derive(Debug)]
struct Served {
    store: Arc<StateStore>,
    options: CatchUpOptions,
    insecure: bool,
}

/// Connections served at once; more are refused.
pub const MAX_CONNECTIONS: usize = 64;
/// Streams of one connection served at once; more wait.
pub const MAX_STREAMS_PER_CONNECTION: usize = 4;

async fn accept_loop(served: Arc<Served>, source: Source) {
    source
        .serve_each(
            MAX_CONNECTIONS,
            |incoming| serve_connection(Arc::clone(&served), incoming),
            |incoming| {
                tracing::warn!(remote = %incoming.remote_address(), limit = MAX_CONNECTIONS, "catch-up connection refused: too many at once");
            },
        )
        .await;
}

async fn serve_connection(served: Arc<Served>, incoming: Pending) {
    let handshake = served.options.handshake_timeout;
    let Ok(connecting) = incoming.accept() else {
        return;
    };
    let Ok(Ok(connection)) = tokio::time::timeout(handshake, connecting).await else {
        return;
    };
    let mut streams = JoinSet::new();
    // A few streams at once at most: one per catch-up the peer needs.
    while let Ok((send, recv)) = connection.accept_bi().await {
        if streams.len() >= MAX_STREAMS_PER_CONNECTION {
            let _ = streams.join_next().await;
        }
        streams.spawn(serve_stream(
            Arc::clone(&served),
            connection.clone(),
            send,
            recv,
        ));
    }
}

async fn serve_stream(
    served: Arc<Served>,
    connection: Connection,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    let request =
        match tokio::time::timeout(served.options.handshake_timeout, read_request(&mut recv)).await
        {
            Ok(Ok(request)) => request,
            Ok(Err(reason)) => return refuse(&mut send, 0, &reason).await,
            Err(_) => {
                return refuse(&mut send, 0, "request: none within the handshake timeout").await;
            }
        };
    if !served.insecure
        && let Err(reason) = tls::check_peer_site(&connection, &request.site)
    {
        return refuse(&mut send, request.round, &reason).await;
    }
    let state = match served
        .store
        .wait_for(
            &request.job,
            request.round,
            &request.site,
            served.options.wait,
        )
        .await
    {
        Ok(state) => state,
        Err(reason) => return refuse(&mut send, request.round, &reason).await,
    };
    if state.len() as u64 != request.elements {
        let reason = format!(
            "elements: the state after round {} holds {} values, the request asked for {}",
            request.round,
            state.len(),
            request.elements
        );
        return refuse(&mut send, request.round, &reason).await;
    }
    let bytes: &[u8] = bytemuck::cast_slice(state.as_slice());
    let header = ResponseHeader::state(request.round, bytes);
    let Ok(header) = catchup::encode_response_header(&header) else {
        return;
    };
    let transfer = async {
        send.write_all(&header).await.ok()?;
        send.write_all(bytes).await.ok()?;
        send.finish().ok()?;
        // Until the peer has it all (or goes), so the state is not cut off.
        send.stopped().await.ok()
    };
    match tokio::time::timeout(served.options.transfer_timeout, transfer).await {
        Ok(Some(_)) => {
            tracing::info!(job = %request.job, round = request.round, site = %request.site, elements = request.elements, "catch-up state served");
        }
        Ok(None) => {
            tracing::debug!(job = %request.job, site = %request.site, "catch-up peer went away mid-transfer");
        }
        Err(_) => {
            tracing::warn!(job = %request.job, site = %request.site, timeout = ?served.options.transfer_timeout, "catch-up transfer too slow: stream reset");
            let _ = send.reset(0u32.into());
        }
    }
}

async fn read_request(recv: &mut RecvStream) -> Result<CatchUpRequest, String> {
    let mut buffer = vec![0u8; REQUEST_FIXED_LEN];
    recv.read_exact(&mut buffer)
        .await
        .map_err(|error| format!("request: {error}"))?;
    let total = catchup::request_length(&buffer).map_err(|error| error.to_string())?;
    debug_assert!(total <= MAX_REQUEST_BYTES);
    buffer.resize(total, 0);
    recv.read_exact(&mut buffer[REQUEST_FIXED_LEN..])
        .await
        .map_err(|error| format!("request: {error}"))?;
    catchup::decode_request(&buffer).map_err(|error| error.to_string())
}

async fn refuse(send: &mut SendStream, round: u64, reason: &str) {
    tracing::debug!(round, reason, "catch-up request refused");
    let (header, reason) = catchup::refusal(round, reason);
    if send.write_all(&header).await.is_ok() && send.write_all(&reason).await.is_ok() {
        let _ = send.finish();
        let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
    }
}

/// Fetches `request`'s state from the agent of `peer` at `addr`, through
/// `endpoint` (any of this agent's client-capable endpoints), within
/// `deadline`: exactly `request.elements` values, checked against the
/// response's CRC-32C.
pub async fn fetch(
    endpoint: &quinn::Endpoint,
    tls: &AgentTls,
    peer: &str,
    addr: SocketAddr,
    request: &CatchUpRequest,
    deadline: Duration,
) -> Result<Vec<f32>, CatchUpError> {
    let bytes = catchup::encode_request(request)?;
    let client_config = tls.quinn_client_config(
        &[catchup::ALPN],
        Arc::new(quinn::TransportConfig::default()),
    )?;
    let server_name = tls::site_name(peer)?;
    let run = async {
        let connect = |message: String| CatchUpError::Connect { addr, message };
        let connection = endpoint
            .connect_with(client_config, addr, &server_name.to_str())
            .map_err(|error| connect(error.to_string()))?
            .await
            .map_err(|error| connect(error.to_string()))?;
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(|error| connect(error.to_string()))?;
        let response = |message: String| CatchUpError::Response(message);
        send.write_all(&bytes)
            .await
            .map_err(|error| response(format!("write the request: {error}")))?;
        let _ = send.finish();
        let mut header = [0u8; RESPONSE_HEADER_LEN];
        recv.read_exact(&mut header)
            .await
            .map_err(|error| response(format!("header: {error}")))?;
        let header = catchup::decode_response_header(&header, request)
            .map_err(|error| response(error.to_string()))?;
        let outcome = match header {
            ResponseHeader::Refused { .. } => {
                let mut reason = vec![0u8; header.payload_bytes() as usize];
                recv.read_exact(&mut reason)
                    .await
                    .map_err(|error| response(format!("reason: {error}")))?;
                catchup::check_payload(&header, &reason)
                    .map_err(|error| response(error.to_string()))?;
                Err(CatchUpError::Refused(
                    String::from_utf8_lossy(&reason).into_owned(),
                ))
            }
            ResponseHeader::State { elements, .. } => {
                // The size asked for (the header was checked against it).
                let mut values = vec![0f32; elements as usize];
                recv.read_exact(bytemuck::cast_slice_mut(&mut values))
                    .await
                    .map_err(|error| response(format!("state: {error}")))?;
                catchup::check_payload(&header, bytemuck::cast_slice(&values))
                    .map_err(|error| response(error.to_string()))?;
                Ok(values)
            }
        };
        // Nothing may follow.
        match recv.read_to_end(0).await {
            Ok(_) => {}
            Err(error) => {
                return Err(response(format!("after the payload: {error}")));
            }
        }
        connection.close(0u32.into(), b"done");
        outcome
    };
    tokio::time::timeout(deadline, run)
        .await
        .map_err(|_| CatchUpError::Timeout(deadline))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    fn request(site: &str, round: u64, elements: u64) -> CatchUpRequest {
        CatchUpRequest {
            job: "chars".into(),
            site: site.into(),
            round,
            elements,
        }
    }

    /// The reason the server at `addr` refused south's request, or a
    /// panic if it did not refuse it.
    async fn refused(
        client: &quinn::Endpoint,
        addr: SocketAddr,
        round: u64,
        elements: u64,
    ) -> String {
        let south = AgentTls::insecure_local("south").unwrap();
        let request = request("south", round, elements);
        match fetch(
            client,
            &south,
            "north",
            addr,
            &request,
            Duration::from_secs(20),
        )
        .await
        {
            Err(CatchUpError::Refused(reason)) => reason,
            other => panic!("round {round}, {elements} values: not refused: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_site_named_by_a_round_fetches_the_state_and_nothing_else_is_served() {
        let north = AgentTls::insecure_local("north").unwrap();
        let south = AgentTls::insecure_local("south").unwrap();
        let store = StateStore::new();
        let options = CatchUpOptions {
            handshake_timeout: Duration::from_secs(5),
            wait: Duration::from_millis(300),
            ..CatchUpOptions::default()
        };
        let server = CatchUpServer::bind(loopback(), &north, Arc::clone(&store), options).unwrap();
        let addr = server.local_addr().unwrap();
        let client = quinn::Endpoint::client(loopback()).unwrap();
        let deadline = Duration::from_secs(20);
        let state: Vec<f32> = (0..300_001).map(|i| i as f32 * 0.5 - 7.25).collect();
        let n = state.len() as u64;

        // Nothing published: refused, saying so, after the wait.
        let reason = refused(&client, addr, 3, n).await;
        assert!(reason.contains("no state published"), "{reason}");
        // Published but no round names south: refused.
        store.publish("chars", 3, state.clone());
        let reason = refused(&client, addr, 3, n).await;
        assert!(reason.contains("no round names site \"south\""), "{reason}");
        // Allowed: the whole state, bit for bit.
        store.allow("chars", 3, "south");
        let fetched = fetch(
            &client,
            &south,
            "north",
            addr,
            &request("south", 3, n),
            deadline,
        )
        .await
        .unwrap();
        assert_eq!(fetched, state);
        // Another size or round than the state's: refused by field.
        let reason = refused(&client, addr, 3, n - 1).await;
        assert!(reason.starts_with("elements:"), "{reason}");
        store.allow("chars", 2, "south");
        let reason = refused(&client, addr, 2, n).await;
        assert!(reason.contains("after round 3"), "{reason}");

        // A request that comes first is served once the state is published.
        let waiting = {
            let (client, south) = (client.clone(), south.clone());
            tokio::spawn(async move {
                let request = request("south", 4, 10);
                fetch(&client, &south, "north", addr, &request, deadline).await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.allow("chars", 4, "south");
        store.publish("chars", 4, vec![1.5; 10]);
        assert_eq!(waiting.await.unwrap().unwrap(), vec![1.5; 10]);
        // The newer state replaced the older one.
        let reason = refused(&client, addr, 3, n).await;
        assert!(reason.contains("after round 4"), "{reason}");
    }

    #[tokio::test]
    async fn a_peer_that_answers_garbage_or_nothing_fails_the_fetch_within_its_deadline() {
        let south = AgentTls::insecure_local("south").unwrap();
        // A server of the catch-up ALPN that writes garbage, then one that
        // never answers.
        let north = AgentTls::insecure_local("north").unwrap();
        let config = north
            .quinn_server_config(
                &[catchup::ALPN],
                Arc::new(quinn::TransportConfig::default()),
            )
            .unwrap();
        let server = quinn::Endpoint::server(config, loopback()).unwrap();
        let addr = server.local_addr().unwrap();
        let garbage = tokio::spawn(async move {
            let mut kept = Vec::new();
            for answer in [true, false] {
                let connection = server.accept().await.unwrap().await.unwrap();
                let (mut send, mut recv) = connection.accept_bi().await.unwrap();
                let mut request = vec![0u8; 10];
                let _ = recv.read_exact(&mut request).await;
                if answer {
                    send.write_all(&[0x55; RESPONSE_HEADER_LEN + 8])
                        .await
                        .unwrap();
                    let _ = send.finish();
                }
                kept.push((connection, send, recv));
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(kept);
        });
        let client = quinn::Endpoint::client(loopback()).unwrap();
        let error = fetch(
            &client,
            &south,
            "north",
            addr,
            &request("south", 1, 4),
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(error, CatchUpError::Response(ref r) if r.contains("magic")),
            "{error}"
        );
        let error = fetch(
            &client,
            &south,
            "north",
            addr,
            &request("south", 1, 4),
            Duration::from_millis(500),
        )
        .await
        .unwrap_err();
        assert!(matches!(error, CatchUpError::Timeout(_)), "{error}");
        garbage.abort();
    }
}
