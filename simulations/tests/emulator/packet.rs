//! The packet-level mode: real kernel UDP and TCP, and QUIC, between two site
//! namespaces through TUN devices and the link model.
//!
//! These need root (network namespaces, TUN devices). Without it each
//! test prints why it is skipped and passes; as root (CI) a failure to set
//! up is a failure. Checks are on counts, or on times with a hard lower
//! bound (the emulated delay) and a wide upper one.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration as StdDuration, Instant};

use longhaul_core::units::{ByteSize, DataRate, Distance};
use longhaul_simulations::emulator::{
    Emulator, EmulatorError, LinkSpec, PacketEmulator, PacketOptions,
};
use longhaul_simulations::link::{LinkConfig, LossModel};

use crate::{TIMING, checksum, pattern};

const SEED: u64 = 16;

/// Whether the packet-level tests must run (`LONGHAUL_REQUIRE_PACKET=1`,
/// as `.ci/run` sets): then a machine that cannot run them fails them.
fn required() -> bool {
    std::env::var("LONGHAUL_REQUIRE_PACKET").is_ok_and(|v| v == "1")
}

/// Sites "a" and "b" in namespaces, joined by `config` both ways; `None`
/// (with the reason printed) where the machine does not allow it and the
/// tests are not [`required`].
fn sites(config: LinkConfig, seed: u64) -> Option<PacketEmulator> {
    let emulator = Emulator::new(seed, vec![LinkSpec::symmetric("a", "b", config)]).unwrap();
    match PacketEmulator::start(emulator, &PacketOptions::default()) {
        Ok(packet) => {
            println!(
                "packet-level emulator up, seed {seed}: {:?}",
                packet.sites()
            );
            Some(packet)
        }
        Err(error @ EmulatorError::PacketModeUnavailable { .. }) if !required() => {
            println!("skipped (LONGHAUL_REQUIRE_PACKET=1 makes this a failure): {error}");
            None
        }
        Err(error) => panic!("cannot start the packet-level emulator: {error}"),
    }
}

/// A link of `megabits` Mbit/s over `km` of fibre, with a buffer of
/// `buffer` bytes.
fn fibre(megabits: u64, km: f64, buffer: u64) -> LinkConfig {
    let mut config = LinkConfig::new(
        DataRate::from_bits_per_second(megabits * 1_000_000),
        Distance::from_km(km).unwrap(),
    );
    config.buffer = Some(ByteSize::from_bytes(buffer));
    config
}

fn address(packet: &PacketEmulator, site: &str, port: u16) -> SocketAddr {
    SocketAddr::new(packet.address(site).unwrap().into(), port)
}

/// A UDP socket of `site`, bound to its address.
fn udp(packet: &PacketEmulator, site: &str) -> UdpSocket {
    let local = address(packet, site, 0);
    let socket = packet.run_in(site, || UdpSocket::bind(local)).unwrap();
    let socket = socket.unwrap();
    socket
        .set_read_timeout(Some(StdDuration::from_secs(2)))
        .unwrap();
    socket
}

/// A TCP connection from `from` to a listener at `to`, both sides.
fn tcp_pair(packet: &PacketEmulator, from: &str, to: &str) -> (TcpStream, TcpStream) {
    let listen = address(packet, to, 0);
    let listener = packet
        .run_in(to, || TcpListener::bind(listen))
        .unwrap()
        .unwrap();
    let target = listener.local_addr().unwrap();
    let client = packet
        .run_in(from, || {
            TcpStream::connect_timeout(&target, StdDuration::from_secs(10))
        })
        .unwrap()
        .unwrap();
    let (server, _) = listener.accept().unwrap();
    for stream in [&client, &server] {
        stream
            .set_read_timeout(Some(StdDuration::from_secs(10)))
            .unwrap();
        stream
            .set_write_timeout(Some(StdDuration::from_secs(10)))
            .unwrap();
    }
    (client, server)
}

#[test]
fn udp_round_trip_is_twice_5_us_per_km() {
    let _timing = TIMING.blocking_lock();
    // 1000 km: 5 ms one way, 10 ms round trip.
    let Some(packet) = sites(fibre(100, 1000.0, 1 << 20), SEED) else {
        return;
    };
    let server = udp(&packet, "b");
    let server_address = server.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let mut buffer = [0u8; 2048];
        for _ in 0..20 {
            let Ok((len, from)) = server.recv_from(&mut buffer) else {
                return;
            };
            let _ = server.send_to(&buffer[..len], from);
        }
    });
    let client = udp(&packet, "a");
    client.connect(server_address).unwrap();
    let mut rtts = Vec::new();
    let mut buffer = [0u8; 2048];
    for i in 0..20u8 {
        let sent = Instant::now();
        client.send(&[i; 100]).unwrap();
        let len = client.recv(&mut buffer).unwrap();
        rtts.push(sent.elapsed());
        assert_eq!(&buffer[..len], &[i; 100]);
    }
    echo.join().unwrap();
    rtts.sort();
    let median = rtts[rtts.len() / 2];
    println!(
        "UDP ping-pong over 1000 km: median RTT {median:?}, min {:?}",
        rtts[0]
    );
    assert!(rtts[0] >= StdDuration::from_millis(10), "{rtts:?}");
    assert!(median < StdDuration::from_millis(20), "{rtts:?}");
}

#[test]
fn a_burst_leaves_at_the_link_rate() {
    let _timing = TIMING.blocking_lock();
    // 20 Mbit/s, a buffer that holds the whole burst.
    let Some(packet) = sites(fibre(20, 10.0, 8 << 20), SEED) else {
        return;
    };
    let receiver = udp(&packet, "b");
    receiver
        .set_read_timeout(Some(StdDuration::from_millis(500)))
        .unwrap();
    let target = receiver.local_addr().unwrap();
    let count = 1_000u32;
    let receiving = std::thread::spawn(move || {
        let mut arrivals = Vec::new();
        let mut buffer = [0u8; 2048];
        while receiver.recv(&mut buffer).is_ok() {
            arrivals.push(Instant::now());
        }
        arrivals
    });
    let sender = udp(&packet, "a");
    // 50 datagrams a millisecond, 400 Mbit/s offered: the queue builds.
    for number in 0..count {
        if number % 50 == 0 {
            std::thread::sleep(StdDuration::from_millis(1));
        }
        sender.send_to(&[0u8; 1000], target).unwrap();
    }
    let arrivals = receiving.join().unwrap();
    assert_eq!(arrivals.len(), count as usize);
    let span = arrivals[arrivals.len() - 1] - arrivals[0];
    // 999 packets of 1028 IP bytes after the first, at 20 Mbit/s: 411 ms.
    let at_rate = StdDuration::from_secs_f64(999.0 * 1028.0 * 8.0 / 20e6);
    println!("1000 datagrams at 20 Mbit/s: first to last {span:?} (at the rate {at_rate:?})");
    assert!(span >= at_rate.mul_f64(0.99), "{span:?}");
    assert!(span < at_rate * 2, "{span:?}");
}

/// Sends `count` numbered datagrams from a to b, 10 per millisecond, and
/// returns the numbers that did not arrive and the a→b link's loss drops.
fn lost_datagrams(packet: &PacketEmulator, count: u32) -> (Vec<u32>, u64) {
    let receiver = udp(packet, "b");
    receiver
        .set_read_timeout(Some(StdDuration::from_millis(500)))
        .unwrap();
    let target = receiver.local_addr().unwrap();
    let receiving = std::thread::spawn(move || {
        let mut seen = vec![false; count as usize];
        let mut buffer = [0u8; 2048];
        while let Ok(len) = receiver.recv(&mut buffer) {
            if len >= 4 {
                let number = u32::from_be_bytes(buffer[..4].try_into().unwrap());
                if let Some(slot) = seen.get_mut(number as usize) {
                    *slot = true;
                }
            }
        }
        seen
    });
    let sender = udp(packet, "a");
    let mut datagram = [0u8; 200];
    for number in 0..count {
        if number % 10 == 0 {
            std::thread::sleep(StdDuration::from_millis(1));
        }
        datagram[..4].copy_from_slice(&number.to_be_bytes());
        sender.send_to(&datagram, target).unwrap();
    }
    let seen = receiving.join().unwrap();
    let lost = (0..count).filter(|n| !seen[*n as usize]).collect();
    let status = packet.emulator().pipe("a", "b").unwrap().status();
    (lost, status.stats.drops.loss)
}

#[test]
fn udp_loss_is_the_configured_fraction_and_one_seed_gives_the_same_fates() {
    let _timing = TIMING.blocking_lock();
    let mut config = fibre(100, 100.0, 8 << 20);
    config.loss = LossModel::Bernoulli { p: 0.05 };
    let count = 4_000;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let Some(packet) = sites(config.clone(), SEED) else {
            return;
        };
        let (lost, link_drops) = lost_datagrams(&packet, count);
        // Every datagram missing is one the link model dropped.
        assert_eq!(lost.len() as u64, link_drops, "lost {lost:?}");
        assert_eq!(packet.unroutable_packets(), 0);
        runs.push(lost);
    }
    let expected = f64::from(count) * 0.05;
    let sigma = (f64::from(count) * 0.05 * 0.95).sqrt();
    let lost = runs[0].len() as f64;
    println!("lost {lost} of {count} at p = 0.05 (expected {expected}, sigma {sigma:.1})");
    assert!((lost - expected).abs() < 5.0 * sigma, "lost {lost}");
    assert_eq!(runs[0], runs[1], "seed {SEED} gave different fates");
}

#[test]
fn tcp_stream_arrives_intact_through_loss() {
    let _timing = TIMING.blocking_lock();
    let mut config = fibre(100, 200.0, 1 << 20);
    config.loss = LossModel::Bernoulli { p: 0.01 };
    let Some(packet) = sites(config, SEED) else {
        return;
    };
    let (mut client, mut server) = tcp_pair(&packet, "a", "b");
    let data = pattern(2 << 20, SEED);
    let expected = checksum(&data);
    let writer = std::thread::spawn(move || {
        client.write_all(&data).unwrap();
        client.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let mut received = Vec::new();
    server.read_to_end(&mut received).unwrap();
    writer.join().unwrap();
    assert_eq!(received.len(), 2 << 20);
    assert_eq!(checksum(&received), expected);
    let status = packet.emulator().pipe("a", "b").unwrap().status();
    println!(
        "2 MiB through 1 % loss: {} segments lost",
        status.stats.drops.loss
    );
    assert!(status.stats.drops.loss > 0, "the link dropped nothing");
}

/// Goodput of one TCP stream from a to b, Mbit/s, as the receiver sees it
/// (bytes over the time from the first read to the end of the stream):
/// the sender writes for `seconds`, and what its send buffer still holds
/// then arrives at the link's pace.
fn one_stream_megabits(packet: &PacketEmulator, congestion_control: &str, seconds: u64) -> f64 {
    let (mut client, mut server) = tcp_pair(packet, "a", "b");
    nix::sys::socket::setsockopt(
        &client,
        nix::sys::socket::sockopt::TcpCongestion,
        &std::ffi::OsString::from(congestion_control),
    )
    .unwrap();
    let reading = std::thread::spawn(move || {
        let mut buffer = vec![0u8; 1 << 16];
        let mut total = 0u64;
        let mut first = None;
        while let Ok(len) = server.read(&mut buffer) {
            if len == 0 {
                break;
            }
            first.get_or_insert_with(Instant::now);
            total += len as u64;
        }
        let elapsed = first.map_or(0.0, |first| first.elapsed().as_secs_f64());
        total as f64 * 8.0 / elapsed.max(1e-3) / 1e6
    });
    let chunk = vec![7u8; 1 << 16];
    let start = Instant::now();
    while start.elapsed() < StdDuration::from_secs(seconds) {
        if client.write_all(&chunk).is_err() {
            break;
        }
    }
    client.shutdown(std::net::Shutdown::Write).unwrap();
    reading.join().unwrap()
}

#[test]
fn one_tcp_stream_at_1_percent_loss_is_well_below_the_link_rate() {
    let _timing = TIMING.blocking_lock();
    // 100 Mbit/s over 1000 km (10 ms RTT), buffer one BDP (125 kB).
    let mut config = fibre(100, 1000.0, 125_000);
    config.loss = LossModel::Bernoulli { p: 0.01 };
    let Some(packet) = sites(config, SEED) else {
        return;
    };
    let megabits = one_stream_megabits(&packet, "reno", 4);
    // Mathis: 1448 B · 8 / 10 ms · 1.22 / √0.01 ≈ 14 Mbit/s for Reno (set
    // on the socket: the host's default may be BBR, which barely reacts to
    // random loss). The proxy mode's relay got 2–5× that.
    let status = packet.emulator().pipe("a", "b").unwrap().status();
    println!(
        "one Reno stream, 100 Mbit/s, 1000 km, 1 % loss: {megabits:.1} Mbit/s \
         ({} packets, {} bytes in, {} lost, {} queue drops)",
        status.stats.packets_in,
        status.stats.bytes_in,
        status.stats.drops.loss,
        status.stats.drops.queue
    );
    assert!(megabits > 0.5, "{megabits} Mbit/s");
    assert!(megabits < 50.0, "{megabits} Mbit/s");
}

#[test]
fn a_cut_stops_traffic_and_a_heal_restores_it() {
    let _timing = TIMING.blocking_lock();
    let Some(packet) = sites(fibre(100, 100.0, 1 << 20), SEED) else {
        return;
    };
    let receiver = udp(&packet, "b");
    receiver
        .set_read_timeout(Some(StdDuration::from_millis(300)))
        .unwrap();
    let sender = udp(&packet, "a");
    sender.connect(receiver.local_addr().unwrap()).unwrap();
    let mut buffer = [0u8; 64];
    let mut delivered = |sender: &UdpSocket| {
        let mut count = 0;
        for i in 0..20u8 {
            sender.send(&[i; 16]).unwrap();
        }
        while receiver.recv(&mut buffer).is_ok() {
            count += 1;
        }
        count
    };
    assert_eq!(delivered(&sender), 20);
    packet.emulator().set_down("a", Some("b"), true).unwrap();
    assert_eq!(delivered(&sender), 0);
    packet.emulator().set_down("a", Some("b"), false).unwrap();
    assert_eq!(delivered(&sender), 20);
    let status = packet.emulator().pipe("a", "b").unwrap().status();
    assert_eq!(status.stats.drops.down, 20);
}

#[test]
fn a_process_runs_in_its_site_and_namespaces_go_when_the_emulator_is_dropped() {
    let _timing = TIMING.blocking_lock();
    let Some(packet) = sites(fibre(100, 10.0, 1 << 20), SEED) else {
        return;
    };
    let names: Vec<String> = packet.sites().into_iter().map(|s| s.namespace).collect();
    assert_eq!(packet.address("a").unwrap(), Ipv4Addr::new(198, 18, 0, 1));
    let mut command = std::process::Command::new("ip");
    command
        .args(["-4", "-o", "addr", "show"])
        .stdout(std::process::Stdio::piped());
    let output = packet
        .spawn_in("b", &mut command)
        .unwrap()
        .wait_with_output()
        .unwrap();
    let addresses = String::from_utf8_lossy(&output.stdout);
    assert!(addresses.contains("198.18.0.2/24"), "{addresses}");
    assert!(!addresses.contains("198.18.0.1/"), "{addresses}");
    for name in &names {
        assert!(std::path::Path::new("/run/netns").join(name).exists());
    }
    drop(packet);
    for name in &names {
        assert!(
            !std::path::Path::new("/run/netns").join(name).exists(),
            "{name} left behind"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_connection_runs_between_site_namespaces() {
    use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
    let _timing = crate::timing().await;
    // 1000 km (10 ms RTT) and 1 % loss: quinn recovers what is lost.
    let mut config = fibre(100, 1000.0, 1 << 20);
    config.loss = LossModel::Bernoulli { p: 0.01 };
    let Some(packet) = sites(config, SEED) else {
        return;
    };
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let certificate: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let server_config =
        quinn::ServerConfig::with_single_cert(vec![certificate.clone()], key.into()).unwrap();
    let runtime = quinn::default_runtime().unwrap();
    // Each endpoint's socket is created inside its site.
    let (server_address, client_address) = (address(&packet, "b", 0), address(&packet, "a", 0));
    let server_socket = packet.run_in("b", || UdpSocket::bind(server_address));
    let client_socket = packet.run_in("a", || UdpSocket::bind(client_address));
    let server = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(server_config),
        server_socket.unwrap().unwrap(),
        runtime.clone(),
    )
    .unwrap();
    let target = server.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        let connection = server.accept().await.unwrap().await.unwrap();
        let (mut send, mut receive) = connection.accept_bi().await.unwrap();
        let request = receive.read_to_end(1 << 20).await.unwrap();
        send.write_all(&request).await.unwrap();
        send.finish().unwrap();
        connection.closed().await;
    });
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certificate).unwrap();
    let mut client = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        client_socket.unwrap().unwrap(),
        runtime,
    )
    .unwrap();
    client.set_default_client_config(
        quinn::ClientConfig::with_root_certificates(std::sync::Arc::new(roots)).unwrap(),
    );
    let data = pattern(200_000, SEED);
    let started = Instant::now();
    let echoed = crate::bounded(30, async {
        let connection = client.connect(target, "localhost").unwrap().await.unwrap();
        let (mut send, mut receive) = connection.open_bi().await.unwrap();
        send.write_all(&data).await.unwrap();
        send.finish().unwrap();
        let echoed = receive.read_to_end(1 << 20).await.unwrap();
        connection.close(0u32.into(), b"done");
        echoed
    })
    .await;
    // The handshake and the exchange: at least two round trips of 10 ms.
    assert!(started.elapsed() >= StdDuration::from_millis(20));
    assert_eq!(checksum(&echoed), checksum(&data));
    crate::bounded(10, serving).await.unwrap();
    let forward = packet.emulator().pipe("a", "b").unwrap().status();
    println!(
        "QUIC echo of 200 kB over 1000 km at 1 % loss: {:?}, {} packets a->b, {} lost",
        started.elapsed(),
        forward.stats.packets_in,
        forward.stats.drops.loss
    );
    assert!(forward.stats.packets_delivered > 100, "{forward:?}");
}
