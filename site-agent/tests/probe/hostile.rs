//! Clients that do not follow the protocol: raw QUIC connections speaking
//! the wire format by hand. The server refuses them with a reason and keeps
//! serving others.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use longhaul_site_agent::probe::wire::{self, Frame, code};
use longhaul_site_agent::probe::{ProbeError, ProbeServer, ProbeServerOptions, probe};
use longhaul_site_agent::tls::AgentTls;
use quinn::{ConnectionError, VarInt};

use crate::{Pki, bounded, loopback, quick_options, server, timing};

/// A raw probe connection from `tls`'s agent to the server of `site`.
async fn connect(
    tls: &AgentTls,
    server: SocketAddr,
    site: &str,
) -> (quinn::Endpoint, quinn::Connection) {
    let config = tls
        .quinn_client_config(&[wire::ALPN], Arc::new(quinn::TransportConfig::default()))
        .unwrap();
    let endpoint = quinn::Endpoint::client(loopback()).unwrap();
    let connection = bounded(
        10,
        endpoint
            .connect_with(config, server, &format!("{site}.site.longhaul"))
            .unwrap(),
    )
    .await
    .unwrap();
    (endpoint, connection)
}

/// The application close the server ended `connection` with.
async fn closed_by_server(connection: &quinn::Connection) -> (u32, String) {
    match bounded(10, connection.closed()).await {
        ConnectionError::ApplicationClosed(close) => (
            u32::try_from(close.error_code.into_inner()).unwrap(),
            String::from_utf8(close.reason.to_vec()).unwrap(),
        ),
        other => panic!("not closed by the server's application: {other:?}"),
    }
}

/// The last finished session of `server`.
async fn last_session(server: &ProbeServer) -> longhaul_site_agent::probe::SessionRecord {
    bounded(10, async {
        loop {
            if let Some(last) = server.recent_sessions().pop() {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_claiming_to_be_another_site_is_refused() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let server_b = server(&pki.agent("b"), ProbeServerOptions::default()).await;
    // Site c's genuine certificate, claiming to be site a.
    let (_endpoint, connection) = connect(&pki.agent("c"), server_b.local_addr(), "b").await;
    let (mut send, _recv) = connection.open_bi().await.unwrap();
    wire::write_frame(
        &mut send,
        &Frame::Hello {
            site: "a".to_string(),
        },
    )
    .await
    .unwrap();
    let (close_code, reason) = closed_by_server(&connection).await;
    println!("{reason}");
    assert_eq!(close_code, code::WRONG_SITE);
    assert!(reason.contains("does not name site \"a\""), "{reason}");
    assert!(reason.contains("a.site.longhaul"), "{reason}");
    let session = last_session(&server_b).await;
    assert_eq!(session.peer_site.as_deref(), Some("a"));
    assert!(!session.verified);
    assert!(session.error.unwrap().contains("does not name site"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_control_frames_close_the_connection_with_a_reason() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let site_a = pki.agent("a");
    let server_b = server(&pki.agent("b"), ProbeServerOptions::default()).await;
    let hello = Frame::Hello {
        site: "a".to_string(),
    }
    .encode();
    let cases: [(&str, Vec<u8>, &str); 5] = [
        (
            "unknown tag",
            vec![0, 0, 0, 1, 0x7f],
            "unknown control frame tag 0x7f",
        ),
        (
            "huge length",
            vec![0xff, 0xff, 0xff, 0xff],
            "more than the limit",
        ),
        ("truncated hello", vec![0, 0, 0, 3, 1, 0, 9], "truncated"),
        (
            "not hello first",
            Frame::LossDone { sent: 1 }.encode(),
            "expected Hello first, got LossDone",
        ),
        (
            "a server frame after hello",
            [
                hello.clone(),
                Frame::ThroughputReport {
                    bytes: 1,
                    streams: 1,
                    span_ns: 1,
                }
                .encode(),
            ]
            .concat(),
            "unexpected ThroughputReport",
        ),
    ];
    for (name, bytes, expected) in cases {
        let (_endpoint, connection) = connect(&site_a, server_b.local_addr(), "b").await;
        let (mut send, _recv) = connection.open_bi().await.unwrap();
        send.write_all(&bytes).await.unwrap();
        let (close_code, reason) = closed_by_server(&connection).await;
        println!("{name}: {reason}");
        assert_eq!(close_code, code::PROTOCOL, "{name}");
        assert!(reason.contains(expected), "{name}: {reason}");
    }
    // The server still serves a well-behaved prober.
    let result = bounded(
        60,
        probe(server_b.local_addr(), "b", &site_a, &quick_options(6)),
    )
    .await
    .unwrap();
    assert_eq!(result.samples, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_is_not_a_sink_is_stopped_and_the_session_goes_on() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let server_b = server(&pki.agent("b"), ProbeServerOptions::default()).await;
    let (_endpoint, connection) = connect(&pki.agent("a"), server_b.local_addr(), "b").await;
    let (mut send, mut recv) = connection.open_bi().await.unwrap();
    wire::write_frame(
        &mut send,
        &Frame::Hello {
            site: "a".to_string(),
        },
    )
    .await
    .unwrap();
    let welcome = bounded(10, wire::read_frame(&mut recv, 1024))
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(welcome, Frame::Welcome { ref site, .. } if site == "b"),
        "{welcome:?}"
    );

    let mut stray = connection.open_uni().await.unwrap();
    stray.write_all(&[0x00, 1, 2, 3]).await.unwrap();
    let stopped = bounded(10, stray.stopped()).await.unwrap();
    assert_eq!(stopped, Some(VarInt::from_u32(code::PROTOCOL)));

    // The control stream still answers.
    wire::write_frame(&mut send, &Frame::ThroughputDone)
        .await
        .unwrap();
    let report = bounded(10, wire::read_frame(&mut recv, 1024))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        report,
        Frame::ThroughputReport {
            bytes: 0,
            streams: 0,
            span_ns: 0
        }
    );
    connection.close(VarInt::from_u32(code::DONE), b"done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_overstays_is_closed_at_the_limit() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let options = ProbeServerOptions {
        max_probe_duration: Duration::from_secs(1),
        ..ProbeServerOptions::default()
    };
    let server_b = server(&pki.agent("b"), options).await;
    let (_endpoint, connection) = connect(&pki.agent("a"), server_b.local_addr(), "b").await;
    let (mut send, _recv) = connection.open_bi().await.unwrap();
    wire::write_frame(
        &mut send,
        &Frame::Hello {
            site: "a".to_string(),
        },
    )
    .await
    .unwrap();
    // ... and then nothing.
    let (close_code, reason) = closed_by_server(&connection).await;
    println!("{reason}");
    assert_eq!(close_code, code::LIMIT);
    assert!(reason.contains("limit of 1s"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_budget_stops_sink_streams() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let max_bytes = 256 << 10;
    let options = ProbeServerOptions {
        max_bytes,
        ..ProbeServerOptions::default()
    };
    let server_b = server(&pki.agent("b"), options).await;
    let result = bounded(
        60,
        probe(
            server_b.local_addr(),
            "b",
            &pki.agent("a"),
            &quick_options(7),
        ),
    )
    .await
    .unwrap();
    println!("{result:?}");
    // Streams are stopped once the budget is spent; chunks already read on
    // other streams may go a little over.
    assert!(result.bytes >= max_bytes, "{result:?}");
    assert!(result.bytes < max_bytes + (2 << 20), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_beyond_the_servers_limits_fail_before_testing() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let options = ProbeServerOptions {
        max_streams: 2,
        max_loss_datagrams: 100,
        ..ProbeServerOptions::default()
    };
    let server_b = server(&pki.agent("b"), options).await;
    let site_a = pki.agent("a");
    let error = bounded(
        30,
        probe(server_b.local_addr(), "b", &site_a, &quick_options(8)),
    )
    .await
    .unwrap_err();
    println!("{error}");
    assert!(matches!(error, ProbeError::PeerLimit { .. }), "{error:?}");
    assert!(
        error.to_string().contains("`loss_datagrams` is 200"),
        "{error}"
    );
    assert!(error.to_string().contains("allows (100)"), "{error}");
    let mut options = quick_options(9);
    options.loss_datagrams = 100;
    let error = bounded(30, probe(server_b.local_addr(), "b", &site_a, &options))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("`throughput_streams` is 4"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_refuses_extra_probes() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let options = ProbeServerOptions {
        max_connections: 1,
        ..ProbeServerOptions::default()
    };
    let server_b = server(&pki.agent("b"), options).await;
    let site_a = pki.agent("a");
    // One session holds the only slot.
    let (_endpoint, connection) = connect(&site_a, server_b.local_addr(), "b").await;
    let (mut send, mut recv) = connection.open_bi().await.unwrap();
    wire::write_frame(
        &mut send,
        &Frame::Hello {
            site: "a".to_string(),
        },
    )
    .await
    .unwrap();
    bounded(10, wire::read_frame(&mut recv, 1024))
        .await
        .unwrap()
        .unwrap();
    let error = bounded(
        30,
        probe(server_b.local_addr(), "b", &site_a, &quick_options(10)),
    )
    .await
    .unwrap_err();
    println!("{error}");
    assert!(matches!(error, ProbeError::Refused { .. }), "{error:?}");
    assert!(error.to_string().contains("connection limit"), "{error}");
    // Once the slot is free, probes are served again.
    connection.close(VarInt::from_u32(code::DONE), b"done");
    bounded(30, async {
        loop {
            match probe(server_b.local_addr(), "b", &site_a, &quick_options(11)).await {
                Ok(_) => break,
                Err(ProbeError::Refused { .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(other) => panic!("{other}"),
            }
        }
    })
    .await;
}
