//! The UDP proxy: every datagram is one packet through the link model.
//!
//! The proxy listens on one socket. Each client address gets its own
//! upstream socket connected to the target (a NAT-style session), so the
//! target's replies find their way back: client → target datagrams go
//! through the forward pipe, replies through the backward pipe. Sessions
//! live as long as the proxy. ECN bits are not read from real datagrams:
//! every packet is offered as not ECN-capable.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::task::{JoinHandle, JoinSet};

use super::EmulatorError;
use super::pipe::{Payload, Pipe};

/// Largest datagram the proxy forwards (the UDP maximum).
const MAX_DATAGRAM: usize = 65_535;

/// A running UDP proxy; stops when dropped.
#[derive(Debug)]
pub struct UdpProxy {
    local_addr: SocketAddr,
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
        let (socket, sender) = bind(listen, None)?;
        let local_addr = socket.local_addr().map_err(|source| EmulatorError::Io {
            what: format!("cannot read the address of UDP socket {listen}"),
            source,
        })?;
        tracing::debug!(%local_addr, %target, link = %forward.id(), "UDP proxy started");
        let task = tokio::spawn(run(socket, sender, target, forward, backward));
        Ok(Self { local_addr, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for UdpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A non-blocking socket bound to `addr` (and connected to `peer`), as a
/// tokio socket to receive on and a std clone the release thread sends on.
fn bind(
    addr: SocketAddr,
    peer: Option<SocketAddr>,
) -> Result<(UdpSocket, Arc<std::net::UdpSocket>), EmulatorError> {
    let io = |what: String| move |source| EmulatorError::Io { what, source };
    let socket = std::net::UdpSocket::bind(addr).map_err(io(format!("cannot bind UDP {addr}")))?;
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
    Ok((socket, Arc::new(sender)))
}

/// Most datagrams passed to the link in one batch: those already waiting
/// after a wake-up are read without waiting, so a burst costs one lock and
/// one wake-up of the release thread.
const MAX_BATCH: usize = 32;

/// The next datagram: waits for the first of a batch, then only takes what
/// is already there (`None` when nothing is).
async fn receive(
    socket: &UdpSocket,
    buffer: &mut [u8],
    first: bool,
) -> Option<std::io::Result<(usize, SocketAddr)>> {
    if first {
        return Some(socket.recv_from(buffer).await);
    }
    match socket.try_recv_from(buffer) {
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => None,
        received => Some(received),
    }
}

async fn run(
    socket: UdpSocket,
    sender: Arc<std::net::UdpSocket>,
    target: SocketAddr,
    forward: Arc<Pipe>,
    backward: Arc<Pipe>,
) {
    let mut sessions: HashMap<SocketAddr, Arc<std::net::UdpSocket>> = HashMap::new();
    // Dropping the set (when this task is aborted) aborts the reply tasks.
    let mut replies = JoinSet::new();
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        for index in 0..MAX_BATCH {
            let (len, client) = match receive(&socket, &mut buffer, index == 0).await {
                None => break,
                Some(Ok(received)) => received,
                Some(Err(error)) => {
                    // ICMP errors from earlier sends surface here on some systems.
                    tracing::debug!(%error, "UDP proxy receive failed");
                    continue;
                }
            };
            let upstream = match sessions.get(&client) {
                Some(upstream) => Arc::clone(upstream),
                None => {
                    let (receiver, upstream) = match bind(local_for(target), Some(target)) {
                        Ok(bound) => bound,
                        Err(error) => {
                            tracing::warn!(%error, %client, "cannot open a UDP session");
                            continue;
                        }
                    };
                    replies.spawn(relay_replies(
                        receiver,
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
                data: buffer[..len].to_vec(),
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
    sender: Arc<std::net::UdpSocket>,
    client: SocketAddr,
    backward: Arc<Pipe>,
) {
    let mut buffer = vec![0u8; MAX_DATAGRAM];
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        for index in 0..MAX_BATCH {
            let len = if index == 0 {
                receiver.recv(&mut buffer).await
            } else {
                match receiver.try_recv(&mut buffer) {
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                    received => received,
                }
            };
            match len {
                Ok(len) => batch.push(Payload::Datagram {
                    socket: Arc::clone(&sender),
                    to: Some(client),
                    data: buffer[..len].to_vec(),
                }),
                // "Connection refused" when the target is not listening yet.
                Err(error) => tracing::debug!(%error, %client, "UDP reply receive failed"),
            }
        }
        backward.send_batch(batch.drain(..));
    }
}
