//! Raft messages between replicas over gRPC (`longhaul.v1.RaftTransport`).
//!
//! Each peer has one sender task with a bounded queue and one long-lived
//! client stream; a message that cannot be queued or delivered is reported
//! to raft as unreachable (raft retries by itself). Snapshots travel on their
//! own call, cut into chunks with a CRC32 over the whole payload. Every
//! envelope carries the cluster id; a replica refuses traffic from another
//! cluster or addressed to another replica. Tests may put a
//! [`MessageFilter`] in front of the queues (drop, delay, cut); without one
//! nothing changes.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use longhaul_proto::v1::raft_transport_client::RaftTransportClient;
use longhaul_proto::v1::raft_transport_server::RaftTransport;
use longhaul_proto::v1::{RaftAck, RaftEnvelope, SnapshotChunk};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::raft_loop::RaftHandle;

/// Bytes of snapshot data per chunk.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;
/// Messages queued for one peer before further ones count as unreachable.
const PEER_QUEUE: usize = 4096;
/// A peer's stream that takes no message for this long (its queue of [`PEER_QUEUE`] full) is
/// dropped and reconnected: a stalled peer must not hold every later message behind it. Raft
/// sends again what was lost.
const STREAM_STALL: Duration = Duration::from_secs(5);
/// A snapshot transfer gets this long, plus [`snapshot_timeout`]'s allowance for its size,
/// then fails (and is reported failed, so raft sends another): a peer that accepts the
/// connection and never answers must not stop this peer's messages for good.
const SNAPSHOT_BASE_TIMEOUT: Duration = Duration::from_secs(10);
/// The slowest transfer rate a snapshot is given time for, bytes per second.
const SNAPSHOT_MIN_RATE: u64 = 4 << 20;

/// Peer id → peer URL (`http://host:port`), shared with the service so that
/// membership changes reach the transport.
#[derive(Debug, Clone, Default)]
pub struct PeerBook(Arc<RwLock<HashMap<u64, String>>>);

impl PeerBook {
    pub fn new(peers: HashMap<u64, String>) -> Self {
        Self(Arc::new(RwLock::new(peers)))
    }
    pub fn get(&self, id: u64) -> Option<String> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }
    pub fn insert(&self, id: u64, url: String) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, url);
    }
    pub fn all(&self) -> HashMap<u64, String> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

pub use crate::consensus::filter::{MessageFilter, Verdict};

/// An instant no test outlives (a year from now).
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

/// Where the consensus loop puts outgoing messages.
#[derive(Debug, Clone)]
pub struct Outbox {
    cluster_id: u64,
    peers: PeerBook,
    tls: Option<tonic::transport::ClientTlsConfig>,
    senders: Arc<std::sync::Mutex<HashMap<u64, mpsc::Sender<Queued>>>>,
    /// The server's runtime, where peer tasks run (not the consensus
    /// thread's, which only drives the node).
    runtime: tokio::runtime::Handle,
    /// Judges each message before it is queued (tests only).
    filter: Option<Arc<dyn MessageFilter>>,
}

/// A message on its peer's queue. The fault layer may hold it back until
/// `not_before`; the messages behind it wait too, as on a TCP stream.
#[derive(Debug)]
struct Queued {
    message: Message,
    not_before: Option<tokio::time::Instant>,
}

impl Outbox {
    /// An outbox whose peer tasks run on the current tokio runtime (call it
    /// from the server's).
    pub fn new(
        cluster_id: u64,
        peers: PeerBook,
        tls: Option<tonic::transport::ClientTlsConfig>,
    ) -> Self {
        Self {
            cluster_id,
            peers,
            tls,
            senders: Arc::default(),
            runtime: tokio::runtime::Handle::current(),
            filter: None,
        }
    }

    /// Judges every outgoing message by `filter` (tests only).
    pub fn with_filter(self, filter: Option<Arc<dyn MessageFilter>>) -> Self {
        Self { filter, ..self }
    }

    /// Queues messages for their peers; never blocks the consensus loop.
    pub(crate) fn send(&self, messages: Vec<Message>, handle: &RaftHandle) {
        let mut senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        for message in messages {
            let to = message.to;
            let verdict = match &self.filter {
                Some(filter) => filter.judge(message.from, to),
                None => Verdict::Deliver,
            };
            let not_before = match verdict {
                Verdict::Deliver => None,
                // A delay past the clock's range is a delay past the run.
                Verdict::DeliverAfter(delay) => Some(
                    tokio::time::Instant::now()
                        .checked_add(delay)
                        .unwrap_or_else(far_future),
                ),
                Verdict::Drop => {
                    // A lost packet: raft retries on its own, but waits for
                    // the outcome of a snapshot it sent.
                    if message.get_msg_type() == MessageType::MsgSnapshot {
                        handle.report_snapshot(to, false);
                    }
                    continue;
                }
            };
            let sender = senders.entry(to).or_insert_with(|| {
                let (tx, rx) = mpsc::channel(PEER_QUEUE);
                self.runtime.spawn(peer_task(
                    self.cluster_id,
                    to,
                    self.peers.clone(),
                    self.tls.clone(),
                    rx,
                    handle.clone(),
                ));
                tx
            });
            if sender
                .try_send(Queued {
                    message,
                    not_before,
                })
                .is_err()
            {
                handle.report_unreachable(to);
            }
        }
    }
}

/// Sends one peer's messages in order over a long-lived stream, reconnecting
/// after failures.
async fn peer_task(
    cluster_id: u64,
    to: u64,
    peers: PeerBook,
    tls: Option<tonic::transport::ClientTlsConfig>,
    mut queue: mpsc::Receiver<Queued>,
    handle: RaftHandle,
) {
    let mut client: Option<RaftTransportClient<tonic::transport::Channel>> = None;
    let mut stream: Option<mpsc::Sender<RaftEnvelope>> = None;
    while let Some(Queued {
        message,
        not_before,
    }) = queue.recv().await
    {
        if let Some(at) = not_before {
            tokio::time::sleep_until(at).await;
        }
        let Some(url) = peers.get(to) else {
            handle.report_unreachable(to);
            continue;
        };
        if client.is_none() {
            let endpoint = tonic::transport::Endpoint::from_shared(url.clone()).and_then(
                |endpoint| match &tls {
                    Some(tls) => endpoint.tls_config(tls.clone()),
                    None => Ok(endpoint),
                },
            );
            match endpoint {
                Ok(endpoint) => {
                    let endpoint = endpoint
                        .connect_timeout(Duration::from_secs(1))
                        .tcp_nodelay(true);
                    client = Some(
                        RaftTransportClient::new(endpoint.connect_lazy())
                            .max_decoding_message_size(usize::MAX)
                            .max_encoding_message_size(usize::MAX),
                    );
                }
                Err(error) => {
                    tracing::warn!(peer = to, %url, %error, "invalid peer URL");
                    handle.report_unreachable(to);
                    continue;
                }
            }
        }
        let Some(client_ref) = client.as_mut() else {
            continue;
        };
        if message.get_msg_type() == MessageType::MsgSnapshot {
            let timeout = snapshot_timeout(message.get_snapshot().get_data().len());
            let ok = send_snapshot(client_ref, cluster_id, &message, timeout).await;
            if !ok {
                client = None;
                stream = None;
            }
            handle.report_snapshot(to, ok);
            continue;
        }
        let bytes = match message.write_to_bytes() {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::error!(%error, "cannot encode a raft message");
                continue;
            }
        };
        let envelope = RaftEnvelope {
            from: message.from,
            to,
            message: bytes,
            cluster_id,
        };
        if stream.is_none() {
            let (tx, rx) = mpsc::channel(PEER_QUEUE);
            let mut call_client = client_ref.clone();
            let peer_handle = handle.clone();
            tokio::spawn(async move {
                if let Err(status) = call_client.send(ReceiverStream::new(rx)).await {
                    tracing::debug!(peer = to, %status, "raft stream ended");
                    peer_handle.report_unreachable(to);
                }
            });
            stream = Some(tx);
        }
        let Some(tx) = stream.as_ref() else { continue };
        let sent = tokio::time::timeout(STREAM_STALL, tx.send(envelope)).await;
        if !matches!(sent, Ok(Ok(()))) {
            // The stream's call ended (peer down) or stalled; the next message reconnects.
            stream = None;
            client = None;
            handle.report_unreachable(to);
        }
    }
}

/// How long a snapshot of `bytes` may take to send.
fn snapshot_timeout(bytes: usize) -> Duration {
    SNAPSHOT_BASE_TIMEOUT + Duration::from_secs(bytes as u64 / SNAPSHOT_MIN_RATE)
}

/// Sends a snapshot; false if it failed or took longer than `timeout`.
async fn send_snapshot(
    client: &mut RaftTransportClient<tonic::transport::Channel>,
    cluster_id: u64,
    message: &Message,
    timeout: Duration,
) -> bool {
    let Some(chunks) = snapshot_chunks(cluster_id, message) else {
        return false;
    };
    let call = client.install_snapshot(tokio_stream::iter(chunks));
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(_)) => true,
        Ok(Err(status)) => {
            tracing::warn!(peer = message.to, %status, "snapshot transfer failed");
            false
        }
        Err(_) => {
            tracing::warn!(peer = message.to, ?timeout, "snapshot transfer timed out");
            false
        }
    }
}

/// The chunks a snapshot message travels in: the message without its data in the first,
/// [`SNAPSHOT_CHUNK_BYTES`] of data in each, the CRC32 of all data in the last.
fn snapshot_chunks(cluster_id: u64, message: &Message) -> Option<Vec<SnapshotChunk>> {
    let data = message.get_snapshot().get_data();
    let mut header = message.clone();
    header.mut_snapshot().clear_data();
    let header = header.write_to_bytes().ok()?;
    let checksum = crc32fast::hash(data);
    let mut chunks = Vec::new();
    let mut offset = 0;
    loop {
        let end = (offset + SNAPSHOT_CHUNK_BYTES).min(data.len());
        let last = end == data.len();
        chunks.push(SnapshotChunk {
            from: message.from,
            to: message.to,
            cluster_id,
            message: if offset == 0 {
                header.clone()
            } else {
                Vec::new()
            },
            offset: offset as u64,
            data: data[offset..end].to_vec(),
            last,
            checksum: if last { checksum } else { 0 },
        });
        if last {
            return Some(chunks);
        }
        offset = end;
    }
}

/// The receiving side: decodes envelopes and steps them into the local node.
#[derive(Debug, Clone)]
pub struct TransportService {
    pub cluster_id: u64,
    pub id: u64,
    pub raft: RaftHandle,
}

/// Refuses traffic from another cluster, or addressed to another replica than `id`.
fn check_addressed(cluster_id: u64, id: u64, from_cluster: u64, to: u64) -> Result<(), Status> {
    if from_cluster != cluster_id {
        return Err(Status::permission_denied(format!(
            "cluster_id: message for cluster {from_cluster}, this replica belongs to cluster \
             {cluster_id}"
        )));
    }
    if to != id {
        return Err(Status::invalid_argument(format!(
            "to: message for replica {to} arrived at replica {id}"
        )));
    }
    Ok(())
}

/// Decodes one envelope of a `Send` stream arriving at replica `id` of cluster `cluster_id`
/// into the raft message to step. Pure (the bytes are a peer's), so that it can be fuzzed.
pub fn decode_envelope(
    cluster_id: u64,
    id: u64,
    envelope: &RaftEnvelope,
) -> Result<Message, Status> {
    check_addressed(cluster_id, id, envelope.cluster_id, envelope.to)?;
    let message = Message::parse_from_bytes(&envelope.message)
        .map_err(|e| Status::invalid_argument(format!("message: not a raft message: {e}")))?;
    if message.to != id {
        return Err(Status::invalid_argument(
            "message.to: does not match the envelope",
        ));
    }
    Ok(message)
}

/// The largest snapshot a replica assembles from a peer: 1 GiB of data. A snapshot is the
/// replicated state as JSON; at the bounds of `longhaul_core::limits` (1024 sites, each
/// registering at most a 4 MiB inventory) a legitimate one stays well below this, and the
/// bound keeps a peer from making a replica buffer without end.
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;
/// The most chunks one snapshot stream may hold: what the sender makes of a snapshot of
/// [`MAX_SNAPSHOT_BYTES`] (one per [`SNAPSHOT_CHUNK_BYTES`], one more for a cut at the end),
/// doubled for a sender that cuts smaller chunks. Without it a peer could stream empty
/// chunks for ever.
pub const MAX_SNAPSHOT_CHUNKS: u64 = 2 * (MAX_SNAPSHOT_BYTES / SNAPSHOT_CHUNK_BYTES as u64 + 1);

/// The bounds a [`SnapshotAssembly`] holds a peer's stream to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// Bytes of snapshot data in all chunks together.
    pub max_bytes: u64,
    /// Chunks in one stream, the last included.
    pub max_chunks: u64,
}

impl Default for SnapshotLimits {
    fn default() -> Self {
        Self {
            max_bytes: MAX_SNAPSHOT_BYTES,
            max_chunks: MAX_SNAPSHOT_CHUNKS,
        }
    }
}

/// Why a snapshot stream from a peer was refused, naming the chunk field at fault. Nothing of
/// a refused stream reaches raft: the message is stepped only once its last chunk passed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotRefusal {
    #[error("cluster_id: message for cluster {found}, this replica belongs to cluster {expected}")]
    OtherCluster { expected: u64, found: u64 },
    #[error("to: message for replica {found} arrived at replica {expected}")]
    OtherReplica { expected: u64, found: u64 },
    #[error("from: chunk {chunk} is from replica {found}, the stream's first from {expected}")]
    SenderChanged {
        chunk: u64,
        expected: u64,
        found: u64,
    },
    #[error("offset: chunk {chunk} expected at {expected}, found {found}")]
    Offset {
        chunk: u64,
        expected: u64,
        found: u64,
    },
    #[error("message: not a raft message: {0}")]
    NotAMessage(String),
    #[error("message.msg_type: a snapshot stream carries MsgSnapshot, found {0:?}")]
    NotASnapshot(MessageType),
    #[error("message.{field}: {found} does not match the chunk's {expected}")]
    HeaderMismatch {
        field: &'static str,
        expected: u64,
        found: u64,
    },
    #[error(
        "message: only the first chunk carries the raft message, chunk {chunk} has {bytes} bytes"
    )]
    MessageAfterFirst { chunk: u64, bytes: usize },
    #[error("checksum: only the last chunk carries the CRC32, chunk {chunk} has {found:#010x}")]
    ChecksumBeforeLast { chunk: u64, found: u32 },
    #[error("checksum: snapshot data does not match its CRC32")]
    Checksum,
    #[error(
        "data: chunk {chunk} brings the snapshot to {total} bytes, more than the {max} allowed"
    )]
    TooLarge { chunk: u64, total: u64, max: u64 },
    #[error("last: chunk {chunk} is not the last, and a snapshot holds at most {max} chunks")]
    TooManyChunks { chunk: u64, max: u64 },
    #[error("last: a chunk arrived after the stream had ended or been refused")]
    AfterEnd,
    #[error("last: the stream ended before the last chunk")]
    CutShort,
}

impl From<SnapshotRefusal> for Status {
    fn from(refusal: SnapshotRefusal) -> Self {
        let message = refusal.to_string();
        match refusal {
            SnapshotRefusal::OtherCluster { .. } => Status::permission_denied(message),
            SnapshotRefusal::Checksum => Status::data_loss(message),
            SnapshotRefusal::TooLarge { .. } | SnapshotRefusal::TooManyChunks { .. } => {
                Status::resource_exhausted(message)
            }
            _ => Status::invalid_argument(message),
        }
    }
}

/// The chunks of one `InstallSnapshot` stream arriving at replica `id` of cluster
/// `cluster_id`, put back together: all from one sender, in order (each chunk's offset is
/// where the data so far ends), the raft message (a `MsgSnapshot` from that sender to this
/// replica) in the first and only there, the CRC32 of the whole data in the last and only
/// there, within [`SnapshotLimits`]. The first refusal ends the assembly and frees what it
/// held. Pure (the chunks are a peer's), so that it can be fuzzed.
#[derive(Debug)]
pub struct SnapshotAssembly {
    cluster_id: u64,
    id: u64,
    limits: SnapshotLimits,
    header: Option<Message>,
    data: Vec<u8>,
    /// Chunks taken so far.
    chunks: u64,
    /// The last chunk came, or a chunk was refused.
    ended: bool,
}

impl SnapshotAssembly {
    pub fn new(cluster_id: u64, id: u64) -> Self {
        Self::with_limits(cluster_id, id, SnapshotLimits::default())
    }

    /// An assembly held to `limits` instead of the defaults (tests use small ones).
    pub fn with_limits(cluster_id: u64, id: u64, limits: SnapshotLimits) -> Self {
        Self {
            cluster_id,
            id,
            limits,
            header: None,
            data: Vec::new(),
            chunks: 0,
            ended: false,
        }
    }

    /// Takes the next chunk; once the last one has arrived, the snapshot message to step, its
    /// data in it.
    pub fn push(&mut self, chunk: SnapshotChunk) -> Result<Option<Message>, SnapshotRefusal> {
        if self.ended {
            return Err(SnapshotRefusal::AfterEnd);
        }
        let result = self.take(chunk);
        if !matches!(result, Ok(None)) {
            self.ended = true;
            self.header = None;
            self.data = Vec::new();
        }
        result
    }

    fn take(&mut self, chunk: SnapshotChunk) -> Result<Option<Message>, SnapshotRefusal> {
        let index = self.chunks;
        self.chunks += 1;
        if chunk.cluster_id != self.cluster_id {
            return Err(SnapshotRefusal::OtherCluster {
                expected: self.cluster_id,
                found: chunk.cluster_id,
            });
        }
        if chunk.to != self.id {
            return Err(SnapshotRefusal::OtherReplica {
                expected: self.id,
                found: chunk.to,
            });
        }
        let expected_offset = self.data.len() as u64;
        if chunk.offset != expected_offset {
            return Err(SnapshotRefusal::Offset {
                chunk: index,
                expected: expected_offset,
                found: chunk.offset,
            });
        }
        match &self.header {
            None => self.header = Some(self.first_message(&chunk)?),
            Some(header) => {
                if chunk.from != header.from {
                    return Err(SnapshotRefusal::SenderChanged {
                        chunk: index,
                        expected: header.from,
                        found: chunk.from,
                    });
                }
                if !chunk.message.is_empty() {
                    return Err(SnapshotRefusal::MessageAfterFirst {
                        chunk: index,
                        bytes: chunk.message.len(),
                    });
                }
            }
        }
        if !chunk.last && chunk.checksum != 0 {
            return Err(SnapshotRefusal::ChecksumBeforeLast {
                chunk: index,
                found: chunk.checksum,
            });
        }
        let total = expected_offset.saturating_add(chunk.data.len() as u64);
        if total > self.limits.max_bytes {
            return Err(SnapshotRefusal::TooLarge {
                chunk: index,
                total,
                max: self.limits.max_bytes,
            });
        }
        if !chunk.last && self.chunks >= self.limits.max_chunks {
            return Err(SnapshotRefusal::TooManyChunks {
                chunk: index,
                max: self.limits.max_chunks,
            });
        }
        self.data.extend_from_slice(&chunk.data);
        if !chunk.last {
            return Ok(None);
        }
        if crc32fast::hash(&self.data) != chunk.checksum {
            return Err(SnapshotRefusal::Checksum);
        }
        let Some(mut message) = self.header.take() else {
            return Err(SnapshotRefusal::NotAMessage(
                "missing in the first chunk".into(),
            ));
        };
        message
            .mut_snapshot()
            .set_data(std::mem::take(&mut self.data).into());
        Ok(Some(message))
    }

    /// The raft message of the first chunk: a `MsgSnapshot` from the chunk's sender to this
    /// replica.
    fn first_message(&self, chunk: &SnapshotChunk) -> Result<Message, SnapshotRefusal> {
        let message = Message::parse_from_bytes(&chunk.message)
            .map_err(|e| SnapshotRefusal::NotAMessage(e.to_string()))?;
        if message.get_msg_type() != MessageType::MsgSnapshot {
            return Err(SnapshotRefusal::NotASnapshot(message.get_msg_type()));
        }
        if message.from != chunk.from {
            return Err(SnapshotRefusal::HeaderMismatch {
                field: "from",
                expected: chunk.from,
                found: message.from,
            });
        }
        if message.to != self.id {
            return Err(SnapshotRefusal::HeaderMismatch {
                field: "to",
                expected: self.id,
                found: message.to,
            });
        }
        Ok(message)
    }

    /// What a stream that ended before its last chunk is refused with.
    pub fn cut_short() -> SnapshotRefusal {
        SnapshotRefusal::CutShort
    }
}

#[tonic::async_trait]
impl RaftTransport for TransportService {
    async fn send(
        &self,
        request: Request<Streaming<RaftEnvelope>>,
    ) -> Result<Response<RaftAck>, Status> {
        let mut stream = request.into_inner();
        while let Some(envelope) = stream.next().await {
            let message = decode_envelope(self.cluster_id, self.id, &envelope?)?;
            self.raft
                .step(message)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
        }
        Ok(Response::new(RaftAck {}))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftAck>, Status> {
        let mut stream = request.into_inner();
        let mut assembly = SnapshotAssembly::new(self.cluster_id, self.id);
        while let Some(chunk) = stream.next().await {
            if let Some(message) = assembly.push(chunk?)? {
                self.raft
                    .step(message)
                    .await
                    .map_err(|e| Status::unavailable(e.to_string()))?;
                return Ok(Response::new(RaftAck {}));
            }
        }
        Err(SnapshotAssembly::cut_short().into())
    }
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
