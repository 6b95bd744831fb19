//! Tests of the real-time emulator, one binary. Everything runs on loopback
//! or, for `packet`, inside network namespaces the test creates.
//!
//! Modules:
//! - `udp`: one-way delay, rate and Bernoulli loss seen through the UDP proxy;
//! - `tcp`: delay of a request/response round trip, bytes intact and in order
//!   through loss, reordering and duplication;
//! - `protocols`: a QUIC connection (quinn) through the UDP proxy and a gRPC
//!   call (tonic) through the TCP proxy;
//! - `control`: the gRPC control API: cut, heal, set loss, validation;
//! - `scenario`: links, impairments and seeds from a scenario;
//! - `packet`: the packet-level mode, kernel UDP and TCP and QUIC between site
//!   namespaces (as root; skipped with the reason printed otherwise).
//!
//! Timing checks have a hard lower bound (the emulated delay) and a generous
//! upper bound for a slow shared machine; the tests that measure time take
//! the `timing` lock so they do not run against each other.

// clippy's allow-unwrap-in-tests does not reach through #[tokio::test] and
// helpers; a failed unwrap is how a test fails.
#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

mod control;
#[cfg(target_os = "linux")]
mod packet;
mod protocols;
mod scenario;
mod tcp;
mod udp;

use std::net::SocketAddr;

use longhaul_core::units::{ByteSize, DataRate, Distance, Duration};
use longhaul_simulations::emulator::{Emulator, LinkSpec};
use longhaul_simulations::link::LinkConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

static TIMING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Serialises the tests that measure time.
pub async fn timing() -> tokio::sync::MutexGuard<'static, ()> {
    TIMING.lock().await
}

/// A link of `bits_per_second` with a fixed one-way delay (no fibre) and a
/// buffer big enough that nothing is dropped by the queue.
pub fn link(bits_per_second: u64, one_way: Duration) -> LinkConfig {
    let mut config = LinkConfig::new(
        DataRate::from_bits_per_second(bits_per_second),
        Distance::from_km(0.0).unwrap(),
    );
    config.overhead = one_way;
    config.buffer = Some(ByteSize::from_bytes(64 << 20));
    config
}

/// An emulator with one link between sites "a" and "b".
pub fn emulator(config: LinkConfig) -> Emulator {
    Emulator::new(7, vec![LinkSpec::symmetric("a", "b", config)]).unwrap()
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A UDP server that sends every datagram back.
pub async fn udp_echo() -> SocketAddr {
    let socket = UdpSocket::bind(loopback()).await.unwrap();
    let address = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buffer = vec![0u8; 65_536];
        while let Ok((len, from)) = socket.recv_from(&mut buffer).await {
            let _ = socket.send_to(&buffer[..len], from).await;
        }
    });
    address
}

/// A TCP server that sends every byte back, on every connection.
pub async fn tcp_echo() -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 65_536];
                loop {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(len) => {
                            if stream.write_all(&buffer[..len]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    address
}

/// Deterministic pseudo-random bytes (xorshift64).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// FNV-1a, as a checksum.
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Fails a test that would otherwise hang.
pub async fn bounded<F: Future>(seconds: u64, future: F) -> F::Output {
    tokio::time::timeout(std::time::Duration::from_secs(seconds), future)
        .await
        .expect("test took too long")
}
