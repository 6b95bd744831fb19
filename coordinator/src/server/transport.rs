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
            let ok = send_snapshot(client_ref, cluster_id, &message).await;
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
        if tx.send(envelope).await.is_err() {
            // The stream's call ended (peer down); the next message reconnects.
            stream = None;
            client = None;
            handle.report_unreachable(to);
        }
    }
}

async fn send_snapshot(
    client: &mut RaftTransportClient<tonic::transport::Channel>,
    cluster_id: u64,
    message: &Message,
) -> bool {
    let data = message.get_snapshot().get_data().to_vec();
    let mut header = message.clone();
    header.mut_snapshot().clear_data();
    let Ok(header) = header.write_to_bytes() else {
        return false;
    };
    let checksum = crc32fast::hash(&data);
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
            break;
        }
        offset = end;
    }
    match client.install_snapshot(tokio_stream::iter(chunks)).await {
        Ok(_) => true,
        Err(status) => {
            tracing::warn!(peer = message.to, %status, "snapshot transfer failed");
            false
        }
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

/// The chunks of one `InstallSnapshot` stream arriving at replica `id` of cluster
/// `cluster_id`, put back together: in order (each chunk's offset is where the data so far
/// ends), the raft message in the first, the CRC32 of the whole data in the last. Pure (the
/// chunks are a peer's), so that it can be fuzzed.
#[derive(Debug)]
pub struct SnapshotAssembly {
    cluster_id: u64,
    id: u64,
    header: Option<Message>,
    data: Vec<u8>,
}

impl SnapshotAssembly {
    pub fn new(cluster_id: u64, id: u64) -> Self {
        Self {
            cluster_id,
            id,
            header: None,
            data: Vec::new(),
        }
    }

    /// Takes the next chunk; once the last one has arrived, the snapshot message to step, its
    /// data in it.
    pub fn push(&mut self, chunk: SnapshotChunk) -> Result<Option<Message>, Status> {
        check_addressed(self.cluster_id, self.id, chunk.cluster_id, chunk.to)?;
        if chunk.offset != self.data.len() as u64 {
            return Err(Status::invalid_argument(format!(
                "offset: expected {}, found {}",
                self.data.len(),
                chunk.offset
            )));
        }
        if self.header.is_none() {
            let message = Message::parse_from_bytes(&chunk.message).map_err(|e| {
                Status::invalid_argument(format!("message: not a raft message: {e}"))
            })?;
            self.header = Some(message);
        }
        self.data.extend_from_slice(&chunk.data);
        if !chunk.last {
            return Ok(None);
        }
        if crc32fast::hash(&self.data) != chunk.checksum {
            return Err(Status::data_loss(
                "checksum: snapshot data does not match its CRC32",
            ));
        }
        let Some(mut message) = self.header.take() else {
            return Err(Status::invalid_argument(
                "message: missing in the first chunk",
            ));
        };
        message
            .mut_snapshot()
            .set_data(std::mem::take(&mut self.data).into());
        Ok(Some(message))
    }

    /// What a stream that ended before its last chunk is refused with.
    pub fn cut_short() -> Status {
        Status::invalid_argument("last: the stream ended before the last chunk")
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
        Err(SnapshotAssembly::cut_short())
    }
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
