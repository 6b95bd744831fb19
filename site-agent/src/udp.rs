//! UDP sockets for the agent's QUIC endpoints (the link probes today, the
//! data plane next), with buffers sized for a long fat link.
//!
//! The kernel's default UDP buffers (about 208 KiB, `net.core.rmem_default`)
//! hold a fraction of one QUIC burst on a fast link: the kernel drops the
//! rest before quinn reads it, and the connection sees losses the link never
//! had. [`bind_udp`] asks for [`QuicTuning::socket_buffer_bytes`]
//! (`[probe] socket_buffer` in the agent config) each way:
//! `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` where the process has `CAP_NET_ADMIN`
//! (they pass `net.core.rmem_max`/`wmem_max`), else
//! `SO_RCVBUF`/`SO_SNDBUF`, which the kernel caps at those limits. It logs
//! what the kernel granted, with a warning when it granted less.
//!
//! [`QuicTuning::socket_buffer_bytes`]: crate::probe::QuicTuning::socket_buffer_bytes

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};

/// What the kernel granted a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpBuffers {
    /// Bytes asked for, each way.
    pub requested: usize,
    /// Receive buffer as the kernel reports it (Linux reports twice what
    /// was set: its bookkeeping overhead).
    pub receive: usize,
    /// Send buffer as the kernel reports it.
    pub send: usize,
    /// Whether `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` were allowed.
    pub forced: bool,
}

impl UdpBuffers {
    /// Whether the kernel granted less than asked.
    pub fn capped(&self) -> bool {
        self.receive < self.requested || self.send < self.requested
    }
}

/// A UDP socket bound to `addr` with both buffers sized to `bytes`;
/// `what` names it in the log. An IPv6 wildcard is made dual-stack where
/// the system allows, as quinn's own client endpoints are.
pub fn bind_udp(
    addr: SocketAddr,
    bytes: usize,
    what: &str,
) -> io::Result<(std::net::UdpSocket, UdpBuffers)> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6()
        && let Err(error) = socket.set_only_v6(false)
    {
        tracing::debug!(%error, "cannot make the UDP socket dual-stack");
    }
    socket.bind(&addr.into())?;
    let buffers = size_buffers(&socket, bytes, what);
    Ok((socket.into(), buffers))
}

/// A quinn endpoint on a socket from [`bind_udp`]: a server when
/// `server_config` is given, a client only otherwise.
pub fn quic_endpoint(
    addr: SocketAddr,
    server_config: Option<quinn::ServerConfig>,
    socket_buffer_bytes: usize,
    what: &str,
) -> io::Result<(quinn::Endpoint, UdpBuffers)> {
    let (socket, buffers) = bind_udp(addr, socket_buffer_bytes, what)?;
    let endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        server_config,
        socket,
        Arc::new(quinn::TokioRuntime),
    )?;
    Ok((endpoint, buffers))
}

fn size_buffers(socket: &Socket, bytes: usize, what: &str) -> UdpBuffers {
    let forced = force(socket, bytes);
    if !forced {
        if let Err(error) = socket.set_recv_buffer_size(bytes) {
            tracing::warn!(%error, what, bytes, "cannot set SO_RCVBUF");
        }
        if let Err(error) = socket.set_send_buffer_size(bytes) {
            tracing::warn!(%error, what, bytes, "cannot set SO_SNDBUF");
        }
    }
    let granted = UdpBuffers {
        requested: bytes,
        receive: socket.recv_buffer_size().unwrap_or(0),
        send: socket.send_buffer_size().unwrap_or(0),
        forced,
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
        tracing::debug!(
            what,
            requested = bytes,
            receive = granted.receive,
            send = granted.send,
            forced,
            "UDP socket buffers sized"
        );
    }
    granted
}

/// `SO_RCVBUFFORCE` and `SO_SNDBUFFORCE`; false when not permitted.
#[cfg(target_os = "linux")]
fn force(socket: &Socket, bytes: usize) -> bool {
    use nix::errno::Errno;
    use nix::sys::socket::{setsockopt, sockopt};
    let receive = setsockopt(socket, sockopt::RcvBufForce, &bytes);
    let send = setsockopt(socket, sockopt::SndBufForce, &bytes);
    match (receive, send) {
        (Ok(()), Ok(())) => true,
        (Err(Errno::EPERM), _) | (_, Err(Errno::EPERM)) => {
            tracing::debug!("no CAP_NET_ADMIN: UDP buffers capped at rmem_max/wmem_max");
            false
        }
        (Err(error), _) | (_, Err(error)) => {
            tracing::warn!(%error, "SO_RCVBUFFORCE/SO_SNDBUFFORCE failed");
            false
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn force(_socket: &Socket, _bytes: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_socket_gets_the_buffers_asked_for_or_says_it_was_capped() {
        let (socket, granted) = bind_udp("127.0.0.1:0".parse().unwrap(), 4 << 20, "test").unwrap();
        assert!(socket.local_addr().unwrap().port() > 0);
        // Linux reports twice the size set; capped means rmem_max applied
        // (not root, and a low limit).
        assert!(
            granted.capped() || granted.receive >= 4 << 20,
            "{granted:?}"
        );
        assert!(granted.receive >= 200 << 10, "{granted:?}");
    }
}
