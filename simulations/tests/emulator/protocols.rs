//! Real protocols through the proxies: QUIC (quinn) over the UDP proxy and
//! gRPC (tonic) over the TCP proxy.

use std::sync::Arc;
use std::time::Instant;

use longhaul_core::units::Duration;
use longhaul_proto::v1 as pb;
use longhaul_proto::v1::emulator_control_client::EmulatorControlClient;
use longhaul_simulations::emulator::control;
use longhaul_simulations::link::LossModel;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

use crate::{bounded, checksum, emulator, link, loopback, pattern};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_connection_works_through_the_udp_proxy() {
    // 5 ms each way and 1% loss: QUIC recovers the lost packets itself.
    let mut config = link(100_000_000, Duration::from_millis(5));
    config.loss = LossModel::Bernoulli { p: 0.01 };
    let emulator = emulator(config);

    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let certificate: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let server_config =
        quinn::ServerConfig::with_single_cert(vec![certificate.clone()], key.into()).unwrap();
    let server = quinn::Endpoint::server(server_config, loopback()).unwrap();
    let server_address = server.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        let connection = server.accept().await.unwrap().await.unwrap();
        let (mut send, mut receive) = connection.accept_bi().await.unwrap();
        let request = receive.read_to_end(1 << 20).await.unwrap();
        send.write_all(&request).await.unwrap();
        send.finish().unwrap();
        // Wait for the client to close, so the reply is not cut short.
        connection.closed().await;
    });

    let proxy = emulator
        .udp_proxy("a", "b", loopback(), server_address)
        .await
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certificate).unwrap();
    let mut client = quinn::Endpoint::client(loopback()).unwrap();
    client.set_default_client_config(
        quinn::ClientConfig::with_root_certificates(Arc::new(roots)).unwrap(),
    );

    let started = Instant::now();
    let data = pattern(200_000, 3);
    let echoed = bounded(30, async {
        let connection = client
            .connect(proxy.local_addr(), "localhost")
            .unwrap()
            .await
            .unwrap();
        let (mut send, mut receive) = connection.open_bi().await.unwrap();
        send.write_all(&data).await.unwrap();
        send.finish().unwrap();
        let echoed = receive.read_to_end(1 << 20).await.unwrap();
        connection.close(0u32.into(), b"done");
        echoed
    })
    .await;
    // The handshake and the exchange take at least two round trips of 10 ms.
    assert!(started.elapsed() >= std::time::Duration::from_millis(20));
    assert_eq!(checksum(&echoed), checksum(&data));
    bounded(10, serving).await.unwrap();
    let forward = emulator.pipe("a", "b").unwrap().status();
    assert!(forward.stats.packets_delivered > 0, "{forward:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_works_through_the_tcp_proxy() {
    let emulator = emulator(link(100_000_000, Duration::from_millis(10)));
    // The emulator's own control service is the gRPC server under test.
    let (address, server) = control::serve(emulator.clone(), loopback(), std::future::pending())
        .await
        .unwrap();
    tokio::spawn(server);
    let proxy = emulator
        .tcp_proxy("a", "b", loopback(), address)
        .await
        .unwrap();

    let started = Instant::now();
    let response = bounded(30, async {
        let mut client = EmulatorControlClient::connect(format!("http://{}", proxy.local_addr()))
            .await
            .unwrap();
        client
            .list_links(pb::EmulatorListLinksRequest {})
            .await
            .unwrap()
            .into_inner()
    })
    .await;
    // At least one round trip of 2 × 10 ms.
    assert!(started.elapsed() >= std::time::Duration::from_millis(20));
    assert_eq!(response.seed, 7);
    let ids: Vec<_> = response.links.iter().map(|l| l.id.as_str()).collect();
    assert_eq!(ids, ["a->b", "b->a"]);
    // The call's own bytes crossed the emulated link.
    assert!(response.links[0].packets_delivered > 0, "{response:?}");
}
