//! Loopback ports for test servers.

use std::net::SocketAddr;

/// Where [`free_addr`] looks for ports: below the kernels' ephemeral ranges
/// (32768 and up on Linux, 49152 and up elsewhere), and above the ports a
/// rehearsal picks for its processes (10,000 to 20,000).
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A loopback address with a port that was free (TCP and UDP) a moment
/// ago, from [`TEST_PORTS`]: see
/// [`longhaul_coordinator::process::free_loopback_port`], which says why
/// not a port from `bind(0)`.
pub fn free_addr() -> SocketAddr {
    longhaul_coordinator::process::free_loopback_port(TEST_PORTS).expect("test setup")
}
