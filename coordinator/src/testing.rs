//! Helpers for tests that run coordinator replicas: free ports, replica
//! configs with fast timers, clients, bounded waits. Used by the
//! coordinator's own cluster tests and by the site agent's; they panic on
//! failure, as test helpers do, and are not for production code.

use std::collections::HashMap;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::consensus::NodeConfig;
use crate::server::ReplicaConfig;
use crate::server::tls::TlsMaterial;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

/// Where [`free_addr`] looks for ports: below the kernels' ephemeral ranges
/// (32768 and up on Linux, 49152 and up elsewhere).
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

/// Fast timers for tests: 20 ms ticks, election after 10–20 ticks.
pub fn fast_node(id: u64) -> NodeConfig {
    NodeConfig {
        tick_interval: Duration::from_millis(20),
        ..NodeConfig::new(id)
    }
}

pub fn replica_configs(dir: &Path, n: u64) -> Vec<ReplicaConfig> {
    let addrs: Vec<SocketAddr> = (0..n).map(|_| free_addr()).collect();
    let cluster: HashMap<u64, String> = addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| (i as u64 + 1, format!("http://{addr}")))
        .collect();
    addrs
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            let id = i as u64 + 1;
            ReplicaConfig {
                id,
                data_dir: dir.join(format!("replica-{id}")),
                listen: *addr,
                initial_cluster: cluster.clone(),
                join: false,
                cluster_id: 7,
                node: fast_node(id),
                tls: None,
                lease_ttl: Duration::from_secs(3),
                faults: None,
            }
        })
        .collect()
}

pub async fn client(addr: SocketAddr) -> CoordinatorClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("test setup")
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy();
    CoordinatorClient::new(channel)
}

/// Retries `attempt` until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A certificate authority made for one test, and certificates it signs.
pub struct TestCa {
    ca_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new() -> Self {
        let key = rcgen::KeyPair::generate().expect("generate a CA key");
        let mut params = rcgen::CertificateParams::new(Vec::new()).expect("CA parameters");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).expect("self-sign the CA");
        Self {
            ca_pem: ca.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// The CA's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A certificate and its key (PEM) with these subject alternative names.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("generate a key");
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("certificate parameters");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign a certificate");
        (cert.pem(), key.serialize_pem())
    }

    /// [`TestCa::issue`] as the TLS material a replica or client is given.
    pub fn material(&self, names: &[&str]) -> TlsMaterial {
        let (cert, key) = self.issue(names);
        TlsMaterial::from_pem(self.ca_pem.clone(), cert, key)
    }

    /// A certificate for 127.0.0.1 and localhost, where test replicas listen.
    pub fn loopback(&self) -> TlsMaterial {
        self.material(&["127.0.0.1", "localhost"])
    }

    /// Writes `ca.pem`, `NAME.pem` and `NAME.key` (for these names) into `dir`.
    pub fn write(&self, dir: &Path, name: &str, names: &[&str]) {
        let (cert, key) = self.issue(names);
        std::fs::write(dir.join("ca.pem"), &self.ca_pem).expect("write ca.pem");
        std::fs::write(dir.join(format!("{name}.pem")), cert).expect("write a certificate");
        std::fs::write(dir.join(format!("{name}.key")), key).expect("write a key");
    }
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}
