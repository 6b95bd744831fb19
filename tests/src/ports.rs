//! Loopback ports for test servers.

use std::net::{SocketAddr, TcpListener};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where [`free_addr`] looks for ports: below the kernels' ephemeral ranges
/// (32768 and up on Linux, 49152 and up elsewhere), and above the ports a
/// rehearsal picks for its processes (10,000 to 20,000).
const TEST_PORTS: std::ops::Range<u32> = 20_000..32_000;

/// A loopback address with a port that was free a moment ago.
///
/// The port is not one the kernel hands out on its own: a port from
/// `bind(0)` comes from the ephemeral range, which outgoing connections draw
/// from too, so one of the many client connections a cluster test makes
/// could take it before the replica binds it ("address already in use").
/// Ports are tried in turn from a start that differs per process, so test
/// processes running side by side rarely try the same ones.
pub fn free_addr() -> SocketAddr {
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = *START.get_or_init(|| {
        std::process::id().wrapping_mul(7919)
            ^ SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
    });
    let span = TEST_PORTS.end - TEST_PORTS.start;
    for _ in 0..span {
        let offset = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let Ok(port) = u16::try_from(TEST_PORTS.start + offset) else {
            continue;
        };
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr().expect("test setup");
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("test setup");
    listener.local_addr().expect("test setup")
}
