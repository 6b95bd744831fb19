//! The TCP proxy: a byte stream cut into segments that go through the link
//! model, and put back together in order on the far side.
//!
//! TCP never loses bytes, so a segment the link drops (random loss, a full
//! buffer, a cut link) is offered again after a retransmission timeout of
//! max(RTT, 1 ms), doubled on each further drop of the same segment up to
//! 200 ms: loss costs time, as it does in a real TCP, and a cut link stalls
//! the stream until it heals. The writer on the far side reorders segments
//! by sequence number and drops duplicates.
//!
//! This is a relay, not an end-to-end TCP: the end hosts' TCP runs over
//! loopback and never sees a loss (the packet-level mode is what shows
//! that). Two things stand in for a sender's congestion control, so the
//! relay neither overruns the link nor collapses on a shallow buffer: a
//! per-connection window of bytes read but not yet written, sized to what
//! the link holds (rate × one-way delay + buffer, [`Pipe::tcp_window_bytes`]),
//! and pacing against the queue: a segment is offered only once the
//! link's egress buffer has room for it ([`Pipe::wait_for_room`]), so the
//! relay's own bursts are not dropped; random loss and other traffic's
//! queue still are. The connection handshake itself is not delayed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{JoinHandle, JoinSet};

use super::EmulatorError;
use super::pipe::{Payload, Pipe, TCP_READ_BYTES};

/// Largest segment offered to the link: a 1500-byte Ethernet MTU less IPv4,
/// TCP and timestamp headers.
pub const TCP_CHUNK_BYTES: usize = 1448;

/// A running TCP proxy; stops accepting and closes its connections when
/// dropped.
#[derive(Debug)]
pub struct TcpProxy {
    local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Binds `listen` and forwards each accepted connection to `target`:
    /// client → target bytes through `forward`, the reply stream through
    /// `backward`.
    pub async fn start(
        listen: SocketAddr,
        target: SocketAddr,
        forward: Arc<Pipe>,
        backward: Arc<Pipe>,
    ) -> Result<Self, EmulatorError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| EmulatorError::Io {
                what: format!("cannot listen on TCP {listen}"),
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| EmulatorError::Io {
            what: format!("cannot read the address of TCP listener {listen}"),
            source,
        })?;
        tracing::debug!(%local_addr, %target, link = %forward.id(), "TCP proxy started");
        let task = tokio::spawn(accept(listener, target, forward, backward));
        Ok(Self { local_addr, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    target: SocketAddr,
    forward: Arc<Pipe>,
    backward: Arc<Pipe>,
) {
    // Dropping the set (when this task is aborted) closes every connection.
    let mut connections = JoinSet::new();
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(error) => {
                tracing::warn!(%error, "TCP proxy accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
        connections.spawn(connect(
            client,
            target,
            Arc::clone(&forward),
            Arc::clone(&backward),
        ));
    }
}

async fn connect(client: TcpStream, target: SocketAddr, forward: Arc<Pipe>, backward: Arc<Pipe>) {
    let upstream = match TcpStream::connect(target).await {
        Ok(upstream) => upstream,
        Err(error) => {
            tracing::warn!(%error, %target, "TCP proxy cannot reach its target");
            return;
        }
    };
    // Segments are already paced by the link: Nagle would only add delay.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let mut directions = JoinSet::new();
    directions.spawn(stream(client_read, upstream_write, forward));
    directions.spawn(stream(upstream_read, client_write, backward));
    while directions.join_next().await.is_some() {}
}

/// Carries one direction of a connection through `pipe`.
async fn stream<R, W>(mut reader: R, writer: W, pipe: Arc<Pipe>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let window = Arc::new(Semaphore::new(pipe.tcp_window_bytes() as usize));
    let (sender, receiver) = mpsc::unbounded_channel();
    let writing = tokio::spawn(write_in_order(receiver, writer, Arc::clone(&window)));
    let mut buffer = vec![0u8; TCP_READ_BYTES];
    let mut sequence = 0u64;
    loop {
        let len = match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(len) => len,
        };
        // One window reservation and one batch per read: a wake-up of the
        // release thread per read, not per segment.
        let Ok(permit) = window.acquire_many(len as u32).await else {
            break; // Closed when the writer gave up: stop reading.
        };
        permit.forget();
        let mut batch = Vec::with_capacity(len.div_ceil(TCP_CHUNK_BYTES));
        let mut batch_bytes = 0u64;
        for chunk in buffer[..len].chunks(TCP_CHUNK_BYTES) {
            batch_bytes += chunk.len() as u64;
            // What the queue has no room for yet waits until it has: the
            // batch so far goes now, the rest after the wait. (No room
            // ever, `None`, means the batch is more than the buffer.)
            if pipe
                .wait_for_room(batch_bytes)
                .is_none_or(|wait| !wait.is_zero())
            {
                pipe.send_batch(batch.drain(..));
                batch_bytes = chunk.len() as u64;
                if let Some(wait) = pipe.wait_for_room(batch_bytes) {
                    tokio::time::sleep(wait).await;
                }
            }
            batch.push(Payload::Chunk {
                writer: sender.clone(),
                sequence,
                data: chunk.to_vec(),
            });
            sequence += 1;
        }
        pipe.send_batch(batch);
    }
    // The writer finishes once every chunk in flight has been delivered and
    // the last sender (held by those chunks) is gone.
    drop(sender);
    let _ = writing.await;
}

/// Most chunks gathered into one write: what has already arrived is written
/// with one system call instead of one per segment.
const MAX_GATHER: usize = 64;

/// Writes chunks in sequence order, returning window credit as it goes, and
/// half-closes the stream once every sender is gone.
async fn write_in_order<W: AsyncWrite + Unpin>(
    mut receiver: mpsc::UnboundedReceiver<(u64, Vec<u8>)>,
    mut writer: W,
    window: Arc<Semaphore>,
) {
    let mut next = 0u64;
    let mut waiting: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut gathered = Vec::with_capacity(MAX_GATHER * TCP_CHUNK_BYTES);
    while let Some(first) = receiver.recv().await {
        let mut item = Some(first);
        for _ in 0..MAX_GATHER {
            let Some((sequence, data)) = item.take() else {
                break;
            };
            // A sequence below `next` is a duplicate of a chunk already written.
            if sequence >= next {
                waiting.insert(sequence, data);
            }
            item = receiver.try_recv().ok();
        }
        if let Some((sequence, data)) = item
            && sequence >= next
        {
            waiting.insert(sequence, data);
        }
        while let Some(data) = waiting.remove(&next) {
            gathered.extend_from_slice(&data);
            next += 1;
        }
        if gathered.is_empty() {
            continue;
        }
        if writer.write_all(&gathered).await.is_err() {
            window.close();
            return;
        }
        window.add_permits(gathered.len());
        gathered.clear();
    }
    let _ = writer.shutdown().await;
}
