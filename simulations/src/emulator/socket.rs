//! The proxy's UDP sockets: buffers sized from the link they feed, the
//! kernel's receive-buffer drops counted, reads and writes in batches.
//!
//! # Why
//!
//! A QUIC sender releases a congestion window in bursts of a few hundred
//! datagrams; a socket with the kernel's default receive buffer (about
//! 208 KiB, `net.core.rmem_default`) overflows during one, and the kernel
//! drops the rest before the proxy sees them. Those losses are not the link
//! model's, so they must neither happen (the buffers are sized for a
//! window: [`socket_buffer_bytes`]) nor go uncounted (`SO_RXQ_OVFL`: each
//! datagram carries the socket's drop count so far, [`DropCounter`]).
//!
//! # Buffers
//!
//! `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` first (they pass `net.core.rmem_max`
//! and need `CAP_NET_ADMIN`), then `SO_RCVBUF`/`SO_SNDBUF`, which the kernel
//! caps at `rmem_max`/`wmem_max`. The size the kernel granted is read back
//! and logged; Linux reports twice the size asked for (its bookkeeping
//! overhead), so a grant below the request means the cap applied.
//!
//! # Batches
//!
//! On Linux a read is one `recvmmsg` of up to [`BATCH`] datagrams and a
//! write one `sendmmsg` per run of datagrams for one socket, so a burst
//! costs a few system calls rather than one per datagram. Elsewhere the
//! same functions read and write one datagram per call.

use std::io;
use std::net::{SocketAddr, UdpSocket};

/// The least buffer a proxy socket gets, whatever the link: several
/// bursts of a fast sender.
pub const MIN_SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// The most a proxy socket asks for.
pub const MAX_SOCKET_BUFFER_BYTES: usize = 512 << 20;
/// Datagrams read or written per system call.
pub const BATCH: usize = 32;
/// Largest datagram read (the UDP maximum).
pub const MAX_DATAGRAM: usize = 65_535;

/// Socket buffer bytes for the sockets that feed a link: twice its
/// bandwidth-delay product plus its egress buffer — a sender's window can
/// reach the BDP plus what the queue holds and arrive in one burst, and the
/// kernel charges each datagram about twice its payload (the `skb` around
/// it) — within [`MIN_SOCKET_BUFFER_BYTES`] and [`MAX_SOCKET_BUFFER_BYTES`].
pub fn socket_buffer_bytes(rate_bits_per_second: u64, rtt_ns: u64, buffer_bytes: u64) -> usize {
    let bdp = u128::from(rate_bits_per_second) * u128::from(rtt_ns) / 8 / 1_000_000_000;
    let wanted = (bdp + u128::from(buffer_bytes)).saturating_mul(2);
    usize::try_from(wanted)
        .unwrap_or(usize::MAX)
        .clamp(MIN_SOCKET_BUFFER_BYTES, MAX_SOCKET_BUFFER_BYTES)
}

/// What the kernel granted a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketBuffers {
    /// Bytes asked for, each way.
    pub requested: usize,
    /// Receive buffer as the kernel reports it (`SO_RCVBUF`).
    pub receive: usize,
    /// Send buffer as the kernel reports it (`SO_SNDBUF`).
    pub send: usize,
    /// Whether the `*FORCE` options were allowed (past `rmem_max`).
    pub forced: bool,
    /// Whether each datagram carries the socket's drop count
    /// (`SO_RXQ_OVFL`); when false, kernel drops go uncounted.
    pub counts_drops: bool,
}

impl SocketBuffers {
    /// Whether the kernel granted less than asked (Linux reports the
    /// doubled size, other systems the size set).
    pub fn capped(&self) -> bool {
        self.receive < self.requested || self.send < self.requested
    }
}

/// Sizes both buffers of `socket` to `bytes` and turns on drop counting;
/// logs what the kernel granted (a warning when it granted less). Failures
/// are logged, never fatal: a socket with small buffers still works.
pub fn size_buffers(socket: &UdpSocket, bytes: usize, what: &str) -> SocketBuffers {
    let (forced, counts_drops) = platform::force_buffers(socket, bytes);
    let reference = socket2::SockRef::from(socket);
    if !forced {
        if let Err(error) = reference.set_recv_buffer_size(bytes) {
            tracing::warn!(%error, what, bytes, "cannot set SO_RCVBUF");
        }
        if let Err(error) = reference.set_send_buffer_size(bytes) {
            tracing::warn!(%error, what, bytes, "cannot set SO_SNDBUF");
        }
    }
    let granted = SocketBuffers {
        requested: bytes,
        receive: reference.recv_buffer_size().unwrap_or(0),
        send: reference.send_buffer_size().unwrap_or(0),
        forced,
        counts_drops,
    };
    if granted.capped() {
        tracing::warn!(
            what,
            requested = bytes,
            receive = granted.receive,
            send = granted.send,
            "the kernel granted smaller UDP socket buffers than asked (raise net.core.rmem_max \
             and net.core.wmem_max, or run with CAP_NET_ADMIN): bursts may be dropped by the host"
        );
    } else {
        tracing::info!(
            what,
            requested = bytes,
            receive = granted.receive,
            send = granted.send,
            forced,
            counts_drops,
            "UDP socket buffers sized"
        );
    }
    granted
}

/// A non-blocking UDP socket bound to `addr` with buffers of `bytes` and
/// drop counting on: a receiver for tests and benchmarks that must not lose
/// datagrams itself, or whose losses must be counted.
pub fn bind_sized(
    addr: SocketAddr,
    bytes: usize,
    what: &str,
) -> io::Result<(UdpSocket, SocketBuffers)> {
    let socket = UdpSocket::bind(addr)?;
    let buffers = size_buffers(&socket, bytes, what);
    socket.set_nonblocking(true)?;
    Ok((socket, buffers))
}

/// Turns the cumulative drop counts datagrams carry into new drops.
#[derive(Debug, Default, Clone, Copy)]
pub struct DropCounter {
    last: u32,
}

impl DropCounter {
    /// New drops since the last count seen; the kernel's counter is a
    /// wrapping 32-bit number.
    pub fn observe(&mut self, cumulative: u32) -> u64 {
        let new = cumulative.wrapping_sub(self.last);
        self.last = cumulative;
        u64::from(new)
    }
}

/// One datagram read: its bytes, where from, and the socket's cumulative
/// drop count when it was queued (`None` where it is not reported).
#[derive(Debug)]
pub struct Received {
    pub data: Vec<u8>,
    pub from: SocketAddr,
    pub drops: Option<u32>,
}

/// Reusable receive buffers for [`recv_batch`].
#[derive(Debug)]
pub struct RecvBuffers {
    buffers: Vec<Vec<u8>>,
}

impl Default for RecvBuffers {
    fn default() -> Self {
        Self {
            buffers: (0..BATCH).map(|_| vec![0u8; MAX_DATAGRAM]).collect(),
        }
    }
}

/// Reads what is waiting on a non-blocking `socket` (at most [`BATCH`]
/// datagrams) into `out`, without waiting: `WouldBlock` when nothing is.
pub fn recv_batch(
    socket: &UdpSocket,
    buffers: &mut RecvBuffers,
    out: &mut Vec<Received>,
) -> io::Result<usize> {
    platform::recv_batch(socket, buffers, out)
}

/// Sends `datagrams` (destination, or the connected peer for `None`) on a
/// non-blocking `socket`; returns how many the host refused (a full send
/// buffer, an ICMP error surfacing): those are gone.
pub fn send_batch(socket: &UdpSocket, datagrams: &[(Option<SocketAddr>, &[u8])]) -> u64 {
    platform::send_batch(socket, datagrams)
}

/// Waits until `socket` is readable and reads what is waiting (one batch,
/// appended to `received`, which the caller empties between calls)
/// through `reader`, its std clone; new kernel drops go to `counter`.
/// Returns the new kernel drops. Receive errors (ICMP errors of earlier sends surface on connected
/// sockets) are logged and yield an empty batch.
pub async fn receive(
    socket: &tokio::net::UdpSocket,
    reader: &UdpSocket,
    buffers: &mut RecvBuffers,
    received: &mut Vec<Received>,
    counter: &mut DropCounter,
) -> u64 {
    if let Err(error) = socket.readable().await {
        tracing::debug!(%error, "UDP proxy socket not readable");
        tokio::task::yield_now().await;
        return 0;
    }
    match socket.try_io(tokio::io::Interest::READABLE, || {
        recv_batch(reader, buffers, received)
    }) {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
        // "Connection refused" when the target is not listening yet.
        Err(error) => tracing::debug!(%error, "UDP proxy receive failed"),
    }
    received
        .iter()
        .filter_map(|datagram| datagram.drops)
        .map(|drops| counter.observe(drops))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_counter_reports_new_drops_across_the_wrap() {
        let mut counter = DropCounter::default();
        assert_eq!(counter.observe(0), 0);
        assert_eq!(counter.observe(5), 5);
        assert_eq!(counter.observe(5), 0);
        assert_eq!(counter.observe(u32::MAX), u64::from(u32::MAX - 5));
        assert_eq!(counter.observe(2), 3);
    }

    #[test]
    fn socket_buffers_hold_twice_the_window_within_bounds() {
        // 1 Gbit/s at 25 ms: BDP 3.125 MB, buffer one BDP.
        assert_eq!(
            socket_buffer_bytes(1_000_000_000, 25_000_000, 3_125_000),
            12_500_000
        );
        // A slow short link still gets the floor.
        assert_eq!(
            socket_buffer_bytes(10_000_000, 1_000_000, 1_500),
            MIN_SOCKET_BUFFER_BYTES
        );
        assert_eq!(
            socket_buffer_bytes(u64::MAX, u64::MAX, u64::MAX),
            MAX_SOCKET_BUFFER_BYTES
        );
    }

    #[test]
    fn a_sized_socket_gets_at_least_the_default_and_counts_drops_on_linux() {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind a loopback socket");
        let granted = size_buffers(&socket, MIN_SOCKET_BUFFER_BYTES, "test");
        assert!(granted.receive >= 200 * 1024, "{granted:?}");
        assert_eq!(
            granted.counts_drops,
            cfg!(target_os = "linux"),
            "{granted:?}"
        );
    }
}

#[cfg(target_os = "linux")]
mod platform {
    use std::io::{self, IoSlice, IoSliceMut};
    use std::net::{SocketAddr, UdpSocket};
    use std::os::fd::AsRawFd;

    use nix::errno::Errno;
    use nix::sys::socket::{
        ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg,
        setsockopt, sockopt,
    };

    use super::{BATCH, Received, RecvBuffers};

    /// `SO_RCVBUFFORCE` and `SO_SNDBUFFORCE` (false when not permitted),
    /// and `SO_RXQ_OVFL`.
    pub(super) fn force_buffers(socket: &UdpSocket, bytes: usize) -> (bool, bool) {
        let receive = setsockopt(socket, sockopt::RcvBufForce, &bytes);
        let send = setsockopt(socket, sockopt::SndBufForce, &bytes);
        let forced = match (receive, send) {
            (Ok(()), Ok(())) => true,
            (Err(Errno::EPERM), _) | (_, Err(Errno::EPERM)) => {
                tracing::debug!("no CAP_NET_ADMIN: UDP buffers capped at rmem_max/wmem_max");
                false
            }
            (Err(error), _) | (_, Err(error)) => {
                tracing::warn!(%error, "SO_RCVBUFFORCE/SO_SNDBUFFORCE failed");
                false
            }
        };
        let counts_drops = match setsockopt(socket, sockopt::RxqOvfl, &1) {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, "cannot enable SO_RXQ_OVFL: kernel drops go uncounted");
                false
            }
        };
        (forced, counts_drops)
    }

    fn socket_addr(address: &SockaddrStorage) -> Option<SocketAddr> {
        if let Some(v4) = address.as_sockaddr_in() {
            return Some(SocketAddr::V4((*v4).into()));
        }
        address
            .as_sockaddr_in6()
            .map(|v6| SocketAddr::V6((*v6).into()))
    }

    pub(super) fn recv_batch(
        socket: &UdpSocket,
        buffers: &mut RecvBuffers,
        out: &mut Vec<Received>,
    ) -> io::Result<usize> {
        let fd = socket.as_raw_fd();
        // (index, length, source, drop count) of each datagram, read before
        // the buffers are borrowed again to copy them out.
        let mut got: Vec<(usize, usize, Option<SocketAddr>, Option<u32>)> =
            Vec::with_capacity(BATCH);
        {
            let mut headers =
                MultiHeaders::<SockaddrStorage>::preallocate(BATCH, Some(nix::cmsg_space!(u32)));
            let mut slices: Vec<[IoSliceMut<'_>; 1]> = buffers
                .buffers
                .iter_mut()
                .map(|buffer| [IoSliceMut::new(buffer)])
                .collect();
            let results = recvmmsg(
                fd,
                &mut headers,
                slices.iter_mut(),
                MsgFlags::MSG_DONTWAIT,
                None,
            )
            .map_err(io::Error::from)?;
            for (index, message) in results.enumerate() {
                let mut drops = None;
                if let Ok(cmsgs) = message.cmsgs() {
                    for cmsg in cmsgs {
                        if let ControlMessageOwned::RxqOvfl(count) = cmsg {
                            drops = Some(count);
                        }
                    }
                }
                let from = message.address.as_ref().and_then(socket_addr);
                got.push((index, message.bytes, from, drops));
            }
        }
        let count = got.len();
        for (index, len, from, drops) in got {
            // A connected socket's datagrams come from its peer; a source
            // that is neither IPv4 nor IPv6 cannot be answered: skip it.
            let Some(from) = from else { continue };
            let data = buffers.buffers[index][..len.min(super::MAX_DATAGRAM)].to_vec();
            out.push(Received { data, from, drops });
        }
        Ok(count)
    }

    pub(super) fn send_batch(socket: &UdpSocket, datagrams: &[(Option<SocketAddr>, &[u8])]) -> u64 {
        let fd = socket.as_raw_fd();
        let mut refused = 0;
        let mut rest = datagrams;
        while !rest.is_empty() {
            let chunk = &rest[..rest.len().min(BATCH)];
            let slices: Vec<[IoSlice<'_>; 1]> =
                chunk.iter().map(|(_, data)| [IoSlice::new(data)]).collect();
            let addresses: Vec<Option<SockaddrStorage>> = chunk
                .iter()
                .map(|(to, _)| to.map(SockaddrStorage::from))
                .collect();
            let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(chunk.len(), None);
            let sent = sendmmsg(
                fd,
                &mut headers,
                slices.iter(),
                &addresses,
                [],
                MsgFlags::MSG_DONTWAIT,
            )
            .map(Iterator::count);
            match sent {
                Ok(0) | Err(_) => {
                    // The first one was refused; go on with the others.
                    refused += 1;
                    rest = &rest[1..];
                }
                Ok(count) => rest = &rest[count.min(rest.len())..],
            }
        }
        refused
    }
}

#[cfg(not(target_os = "linux"))]
mod platform {
    use super::{BATCH, Received, RecvBuffers};
    use std::io;
    use std::net::{SocketAddr, UdpSocket};

    pub(super) fn force_buffers(_socket: &UdpSocket, _bytes: usize) -> (bool, bool) {
        (false, false)
    }

    pub(super) fn recv_batch(
        socket: &UdpSocket,
        buffers: &mut RecvBuffers,
        out: &mut Vec<Received>,
    ) -> io::Result<usize> {
        let mut count = 0;
        while count < BATCH {
            let buffer = &mut buffers.buffers[0];
            match socket.recv_from(buffer) {
                Ok((len, from)) => {
                    out.push(Received {
                        data: buffer[..len].to_vec(),
                        from,
                        drops: None,
                    });
                    count += 1;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock && count > 0 => break,
                Err(error) => return Err(error),
            }
        }
        Ok(count)
    }

    pub(super) fn send_batch(socket: &UdpSocket, datagrams: &[(Option<SocketAddr>, &[u8])]) -> u64 {
        datagrams
            .iter()
            .filter(|(to, data)| {
                let sent = match to {
                    Some(to) => socket.send_to(data, to),
                    None => socket.send(data),
                };
                sent.is_err()
            })
            .count() as u64
    }
}
