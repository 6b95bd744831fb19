//! The UDP proxy: every datagram is one packet through the link model.
//!
//! The proxy listens on one socket. Each client address gets its own
//! upstream socket connected to the target (a NAT-style session), so the
//! target's replies find their way back: client → target datagrams go
//! through the forward pipe, replies through the backward pipe. Sessions
//! live as long as the proxy. ECN bits are not read from real datagrams:
//! every packet is offered as not ECN-capable.
//!
//! Every socket's buffers are sized from the link ([`socket`]): the
//! listening socket and each upstream socket carry one direction in and the
//! other out, so they get the larger of the two directions' sizes. A
//! datagram the kernel dropped at the listening socket counts as a kernel
//! drop of the forward direction, one dropped at an upstream socket of the
//! backward direction ([`Pipe::count_kernel_drops`]). Reads and writes go
//! in batches of up to [`socket::BATCH`] datagrams.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::task::{JoinHandle, JoinSet};

use super::EmulatorError;
use super::pipe::{Payload, Pipe};
use super::socket::{self, DropCounter, RecvBuffers, SocketBuffers, receive};

/// A running UDP proxy; stops when dropped.
#[derive(Debug)]
pub struct UdpProxy {
    local_addr: SocketAddr,
    buffers: SocketBuffers,
    task: JoinHandle<()>,
}

impl UdpProxy {
    /// Binds `listen` and forwards datagrams to `target` through `forward`,
    /// replies back through `backward`.
    pub async fn start(
        listen: SocketAddr,
        target: SocketAddr,
        forward: Arc<Pipe>,
        backward: Arc<Pipe>,
    ) -> Result<Self, EmulatorError> {
        let buffer_bytes = forward
            .socket_buffer_bytes()
            .max(backward.socket_buffer_bytes());
        let what = format!("UDP proxy {} listening on {listen}", forward.id());
        let (socket, sender, buffers) = bind(listen, None, buffer_bytes, &what)?;
        let local_addr = socket.local_addr().map_err(|source| EmulatorError::Io {
            what: format!("cannot read the address of UDP socket {listen}"),
            source,
        })?;
        tracing::debug!(%local_addr, %target, link = %forward.id(), "UDP proxy started");
        let task = tokio::spawn(run(socket, sender, target, forward, backward, buffer_bytes));
        Ok(Self {
            local_addr,
            buffers,
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// What the kernel granted the listening socket.
    pub fn socket_buffers(&self) -> SocketBuffers {
        self.buffers
    }
}

impl Drop for UdpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A non-blocking socket bound to `addr` (and connected to `peer`) with
/// buffers of `buffer_bytes`, as a tokio socket that says when to read and
/// a std clone that reads in batches and that the release thread sends on.
fn bind(
    addr: SocketAddr,
    peer: Option<SocketAddr>,
    buffer_bytes: usize,
    what: &str,
) -> Result<(UdpSocket, Arc<std::net::UdpSocket>, SocketBuffers), EmulatorError> {
    let io = |what: String| move |source| EmulatorError::Io { what, source };
    let socket = std::net::UdpSocket::bind(addr).map_err(io(format!("cannot bind UDP {addr}")))?;
    let buffers = socket::size_buffers(&socket, buffer_bytes, what);
    if let Some(peer) = peer {
        socket
            .connect(peer)
            .map_err(io(format!("cannot connect UDP to {peer}")))?;
    }
    socket
        .set_nonblocking(true)
        .map_err(io(format!("cannot make UDP {addr} non-blocking")))?;
    let sender = socket
        .try_clone()
        .map_err(io(format!("cannot clone UDP socket {addr}")))?;
    let socket =
        UdpSocket::from_std(socket).map_err(io(format!("cannot register UDP socket {addr}")))?;
    Ok((socket, Arc::new(sender), buffers))
}

async fn run(
    socket: UdpSocket,
    sender: Arc<std::net::UdpSocket>,
    target: SocketAddr,
    forward: Arc<Pipe>,
    backward: Arc<Pipe>,
    buffer_bytes: usize,
) {
    let mut sessions: HashMap<SocketAddr, Arc<std::net::UdpSocket>> = HashMap::new();
    // Dropping the set (when this task is aborted) aborts the reply tasks.
    let mut replies = JoinSet::new();
    let mut buffers = RecvBuffers::default();
    let mut received = Vec::with_capacity(socket::BATCH);
    let mut counter = DropCounter::default();
    let mut batch = Vec::with_capacity(socket::BATCH);
    loop {
        let kernel_drops =
            receive(&socket, &sender, &mut buffers, &mut received, &mut counter).await;
        forward.count_kernel_drops(kernel_drops);
        for datagram in received.drain(..) {
            let client = datagram.from;
            let upstream = match sessions.get(&client) {
                Some(upstream) => Arc::clone(upstream),
                None => {
                    let what = format!("UDP proxy {} session of {client}", forward.id());
                    let bound = bind(local_for(target), Some(target), buffer_bytes, &what);
                    let (receiver, upstream, _) = match bound {
                        Ok(bound) => bound,
                        Err(error) => {
                            tracing::warn!(%error, %client, "cannot open a UDP session");
                            continue;
                        }
                    };
                    replies.spawn(relay_replies(
                        receiver,
                        Arc::clone(&upstream),
                        Arc::clone(&sender),
                        client,
                        Arc::clone(&backward),
                    ));
                    sessions.insert(client, Arc::clone(&upstream));
                    upstream
                }
            };
            batch.push(Payload::Datagram {
                socket: upstream,
                to: None,
                data: datagram.data,
            });
        }
        forward.send_batch(batch.drain(..));
    }
}

/// Where a session's upstream socket binds: loopback for a loopback target,
/// any address otherwise.
fn local_for(target: SocketAddr) -> SocketAddr {
    let ip = match target.ip() {
        IpAddr::V4(ip) if ip.is_loopback() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(ip) if ip.is_loopback() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(ip, 0)
}

/// Sends the target's replies on one session back to `client`.
async fn relay_replies(
    receiver: UdpSocket,
    reader: Arc<std::net::UdpSocket>,
    sender: Arc<std::net::UdpSocket>,
    client: SocketAddr,
    backward: Arc<Pipe>,
) {
    let mut buffers = RecvBuffers::default();
    let mut received = Vec::with_capacity(socket::BATCH);
    let mut counter = DropCounter::default();
    let mut batch = Vec::with_capacity(socket::BATCH);
    loop {
        let kernel_drops = receive(
            &receiver,
            &reader,
            &mut buffers,
            &mut received,
            &mut counter,
        )
        .await;
        backward.count_kernel_drops(kernel_drops);
        batch.extend(received.drain(..).map(|datagram| Payload::Datagram {
            socket: Arc::clone(&sender),
            to: Some(client),
            data: datagram.data,
        }));
        backward.send_batch(batch.drain(..));
    }
}
