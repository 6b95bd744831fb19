//! Mutual TLS between agents: who may probe whom, and what the errors say.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use longhaul_site_agent::probe::{ProbeError, ProbeServerOptions, probe};
use longhaul_site_agent::tls::{AgentTls, INSECURE_WARNING, TlsError};

use crate::{Pki, bounded, quick_options, server, timing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_between_two_sites_measures_the_loopback_link() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let site_a = pki.agent("a");
    let site_b = pki.agent("b");
    let server_b = server(&site_b, ProbeServerOptions::default()).await;
    let seed = 11;
    println!("probe seed {seed}");
    let result = bounded(
        60,
        probe(server_b.local_addr(), "b", &site_a, &quick_options(seed)),
    )
    .await
    .unwrap();
    println!("loopback: {result:?}");
    assert_eq!(result.samples, 10);
    assert!(result.rtt_min_ns > 0 && result.rtt_min_ns <= result.rtt_p50_ns);
    assert!(result.rtt_p50_ns <= result.rtt_p99_ns);
    // Loopback, even on a loaded machine with a debug build.
    assert!(result.rtt_p50_ns < 100_000_000, "{result:?}");
    assert_eq!((result.sent, result.received), (200, 200));
    assert_eq!(result.loss_rate, 0.0);
    assert!(
        result.bytes > 0 && result.throughput_bps > 0.0,
        "{result:?}"
    );
    assert!(result.duration_ns > 0);

    // The server knows, from the certificate, that site a dialled.
    let sessions = bounded(10, async {
        loop {
            let sessions = server_b.recent_sessions();
            if !sessions.is_empty() {
                return sessions;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(sessions[0].peer_site.as_deref(), Some("a"));
    assert!(sessions[0].verified);
    assert_eq!(sessions[0].error, None, "{sessions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_certificate_names_another_site_is_refused() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let site_a = pki.agent("a");
    // Site c's agent answers on the address where a expects site b.
    let server_c = server(&pki.agent("c"), ProbeServerOptions::default()).await;
    let error = bounded(
        30,
        probe(server_c.local_addr(), "b", &site_a, &quick_options(1)),
    )
    .await
    .unwrap_err();
    let message = error.to_string();
    println!("{message}");
    assert!(matches!(error, ProbeError::Handshake { .. }), "{error:?}");
    assert!(message.contains("b.site.longhaul"), "{message}");
    assert!(message.contains("not valid for name"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_another_ca_is_refused() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let rogue = Pki::new("rogue CA");
    let server_b = server(&pki.agent("b"), ProbeServerOptions::default()).await;
    // A certificate naming site a, but signed by a CA b does not trust; it
    // trusts b's certificate, so only the server side can refuse.
    let leaf = rogue.leaf("a");
    let mut ca_pem = rogue.ca_pem.clone();
    ca_pem.push_str(&pki.ca_pem);
    let impostor = AgentTls::from_pem(
        "a",
        ca_pem.as_bytes(),
        leaf.cert_pem.as_bytes(),
        leaf.key_pem.as_bytes(),
    )
    .unwrap();
    let error = bounded(
        30,
        probe(server_b.local_addr(), "b", &impostor, &quick_options(2)),
    )
    .await
    .unwrap_err();
    let message = error.to_string();
    println!("{message}");
    assert!(matches!(error, ProbeError::Handshake { .. }), "{error:?}");
    assert!(
        message.contains("rejected this agent's certificate"),
        "{message}"
    );
}

#[test]
fn pem_files_that_do_not_fit_are_refused_naming_the_file() {
    let pki = Pki::new("test CA");
    let rogue = Pki::new("rogue CA");
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca = write("ca.pem", &pki.ca_pem);
    let a = pki.leaf("a");
    let c = pki.leaf("c");
    let foreign = rogue.leaf("a");
    let a_cert = write("a.pem", &a.cert_pem);
    let a_key = write("a.key", &a.key_pem);
    let c_cert = write("c.pem", &c.cert_pem);
    let c_key = write("c.key", &c.key_pem);
    let foreign_cert = write("foreign.pem", &foreign.cert_pem);
    let foreign_key = write("foreign.key", &foreign.key_pem);

    let tls = AgentTls::from_pem_files("a", &ca, &a_cert, &a_key).unwrap();
    assert_eq!(tls.site(), "a");
    assert!(!tls.is_insecure());

    let check = |result: Result<AgentTls, TlsError>, needles: &[&str]| {
        let message = result.unwrap_err().to_string();
        println!("{message}");
        for needle in needles {
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
        }
    };
    // Site c's certificate configured for site a.
    check(
        AgentTls::from_pem_files("a", &ca, &c_cert, &c_key),
        &["c.pem", "does not name site \"a\"", "a.site.longhaul"],
    );
    // Signed by a CA the agent does not trust.
    check(
        AgentTls::from_pem_files("a", &ca, &foreign_cert, &foreign_key),
        &["foreign.pem", "ca.pem", "UnknownIssuer"],
    );
    // The key of another certificate.
    check(
        AgentTls::from_pem_files("a", &ca, &a_cert, &c_key),
        &["c.key", "a.pem", "does not fit"],
    );
    // A missing file, and a key file that holds a certificate.
    check(
        AgentTls::from_pem_files("a", &dir.path().join("nope.pem"), &a_cert, &a_key),
        &["CA file", "nope.pem"],
    );
    check(
        AgentTls::from_pem_files("a", &ca, &a_cert, &a_cert),
        &["a.pem", "no PRIVATE KEY"],
    );
    check(
        AgentTls::from_pem_files("a.b", &ca, &a_cert, &a_key),
        &["\"a.b\""],
    );
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_local_mode_probes_and_says_so_loudly() {
    let _timing = timing().await;
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let (site_a, site_b) = tracing::subscriber::with_default(subscriber, || {
        (
            AgentTls::insecure_local("a").unwrap(),
            AgentTls::insecure_local("b").unwrap(),
        )
    });
    let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    println!("{logged}");
    assert_eq!(logged.matches("UNAUTHENTICATED").count(), 2, "{logged}");
    assert!(logged.contains("WARN"), "{logged}");
    assert!(logged.contains(INSECURE_WARNING), "{logged}");
    assert!(site_a.is_insecure());

    let server_b = server(&site_b, ProbeServerOptions::default()).await;
    let result = bounded(
        60,
        probe(server_b.local_addr(), "b", &site_a, &quick_options(3)),
    )
    .await
    .unwrap();
    assert_eq!(result.samples, 10);
    let sessions = bounded(10, async {
        loop {
            let sessions = server_b.recent_sessions();
            if !sessions.is_empty() {
                return sessions;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // The claim is recorded but could not be checked.
    assert_eq!(sessions[0].peer_site.as_deref(), Some("a"));
    assert!(!sessions[0].verified);

    // A verifying agent does not trust an insecure one: it fails closed.
    let pki = Pki::new("test CA");
    let error = bounded(
        30,
        probe(
            server_b.local_addr(),
            "b",
            &pki.agent("a"),
            &quick_options(4),
        ),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ProbeError::Handshake { .. }), "{error:?}");
    // An insecure server still checks the site it answers for.
    let error = bounded(
        30,
        probe(server_b.local_addr(), "z", &site_a, &quick_options(5)),
    )
    .await
    .unwrap_err();
    assert!(
        error.to_string().contains("says it is site \"b\""),
        "{error}"
    );
}
