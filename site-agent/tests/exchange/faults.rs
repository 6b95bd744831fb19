//! Faults: a dead peer reported, a killed sender resumed, corrupted
//! messages refused.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use longhaul_codec::EncoderConfig;
use longhaul_exchange::wire::{self, ChunkId, Header, Kind};
use longhaul_exchange::{CollectivePlan, Contributor, LinkCodecs, Phase};
use longhaul_site_agent::exchange::{ExchangeNode, ExchangeOptions};

use crate::{JOB, Pki, bounded, fragments, loopback, options, reference_hash, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_comes_up_is_reported_and_the_round_goes_on_without_it() {
    let pki = Pki::new("test CA");
    let n = 20_000;
    let fragments = fragments(16, &[("a", 1.0), ("b", 1.0), ("c", 1.0)], n);
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    let short = ExchangeOptions {
        peer_timeout: Duration::from_secs(2),
        ..options(1)
    };
    let a = Arc::new(ExchangeNode::bind(loopback(), &pki.agent("a"), short.clone()).unwrap());
    let b = Arc::new(ExchangeNode::bind(loopback(), &pki.agent("b"), short).unwrap());
    // c's address: a UDP port nobody answers on.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let peers: BTreeMap<String, std::net::SocketAddr> = [
        ("a".to_string(), a.local_addr().unwrap()),
        ("b".to_string(), b.local_addr().unwrap()),
        ("c".to_string(), silent.local_addr().unwrap()),
    ]
    .into();
    let all = CollectivePlan::new(&["a", "b", "c"], &[], n as u64, 2048).unwrap();
    let deadline = Duration::from_secs(60);
    let (first_a, first_b) = tokio::join!(
        run(&a, &all, &codecs, &fragments["a"], &peers, deadline),
        run(&b, &all, &codecs, &fragments["b"], &peers, deadline),
    );
    for outcome in [&first_a, &first_b] {
        assert_eq!(outcome.hash, None);
        assert_eq!(outcome.dead, ["c"], "{outcome:?}");
        assert!(outcome.unfinished.contains(&"c".to_string()), "{outcome:?}");
        let reason = outcome.reason.as_deref().unwrap();
        assert!(
            reason.contains("no working connection to [\"c\"]"),
            "{reason}"
        );
    }
    // The round excludes c; the fragment is planned again and exchanged.
    let without = CollectivePlan::new(&["a", "b", "c"], &["c"], n as u64, 2048).unwrap();
    let (again_a, again_b) = tokio::join!(
        run(&a, &without, &codecs, &fragments["a"], &peers, deadline),
        run(&b, &without, &codecs, &fragments["b"], &peers, deadline),
    );
    let expected = reference_hash(&without, &codecs, &fragments);
    assert_eq!(
        again_a.hash.as_deref(),
        Some(expected.as_str()),
        "{again_a:?}"
    );
    assert_eq!(again_b.hash, again_a.hash);
    // The second fragment rode the pool's connections of the first.
    assert!(first_a.peers["b"].handshakes >= 1, "{first_a:?}");
    assert_eq!(again_a.peers["b"].handshakes, 0, "{again_a:?}");
    assert!(again_a.peers["b"].connections >= 1, "{again_a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragment_tried_again_under_the_same_plan_resumes_once_the_peer_is_up() {
    let pki = Pki::new("test CA");
    let n = 20_000;
    let fragments = fragments(17, &[("a", 1.0), ("b", 1.0)], n);
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    let short = ExchangeOptions {
        peer_timeout: Duration::from_secs(2),
        ..options(1)
    };
    let a = ExchangeNode::bind(loopback(), &pki.agent("a"), short.clone()).unwrap();
    // b's address, free until b starts there.
    let b_addr = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let peers: BTreeMap<String, std::net::SocketAddr> = [
        ("a".to_string(), a.local_addr().unwrap()),
        ("b".to_string(), b_addr),
    ]
    .into();
    let plan = CollectivePlan::new(&["a", "b"], &[], n as u64, 2048).unwrap();
    let deadline = Duration::from_secs(60);
    let first = run(&a, &plan, &codecs, &fragments["a"], &peers, deadline).await;
    assert_eq!(first.dead, ["b"], "{first:?}");
    assert_eq!(first.hash, None);
    // b comes up; nothing excluded it, so a tries the same plan again:
    // the state of the first attempt is resumed, not refused as busy.
    let b = ExchangeNode::bind(b_addr, &pki.agent("b"), short).unwrap();
    let (again_a, again_b) = tokio::join!(
        run(&a, &plan, &codecs, &fragments["a"], &peers, deadline),
        run(&b, &plan, &codecs, &fragments["b"], &peers, deadline),
    );
    let expected = reference_hash(&plan, &codecs, &fragments);
    assert_eq!(
        again_a.hash.as_deref(),
        Some(expected.as_str()),
        "{again_a:?}"
    );
    assert_eq!(again_b.hash, again_a.hash, "{again_b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sites_that_finished_with_each_other_resume_with_a_third_that_came_late() {
    let pki = Pki::new("test CA");
    let n = 30_000;
    let fragments = fragments(18, &[("a", 1.0), ("b", 1.0), ("c", 1.0)], n);
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    let short = ExchangeOptions {
        peer_timeout: Duration::from_secs(2),
        ..options(1)
    };
    let a = ExchangeNode::bind(loopback(), &pki.agent("a"), short.clone()).unwrap();
    let b = ExchangeNode::bind(loopback(), &pki.agent("b"), short.clone()).unwrap();
    let c_addr = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let peers: BTreeMap<String, std::net::SocketAddr> = [
        ("a".to_string(), a.local_addr().unwrap()),
        ("b".to_string(), b.local_addr().unwrap()),
        ("c".to_string(), c_addr),
    ]
    .into();
    let plan = CollectivePlan::new(&["a", "b", "c"], &[], n as u64, 2048).unwrap();
    let deadline = Duration::from_secs(60);
    // a and b move what they have for each other, then give up on c.
    let (first_a, first_b) = tokio::join!(
        run(&a, &plan, &codecs, &fragments["a"], &peers, deadline),
        run(&b, &plan, &codecs, &fragments["b"], &peers, deadline),
    );
    for first in [&first_a, &first_b] {
        assert_eq!(first.dead, ["c"], "{first:?}");
    }
    // c comes up before any exclusion: all three under the same plan, a
    // and b resuming their states.
    let c = ExchangeNode::bind(c_addr, &pki.agent("c"), short).unwrap();
    let (again_a, again_b, again_c) = tokio::join!(
        run(&a, &plan, &codecs, &fragments["a"], &peers, deadline),
        run(&b, &plan, &codecs, &fragments["b"], &peers, deadline),
        run(&c, &plan, &codecs, &fragments["c"], &peers, deadline),
    );
    let expected = reference_hash(&plan, &codecs, &fragments);
    for again in [&again_a, &again_b, &again_c] {
        assert_eq!(again.hash.as_deref(), Some(expected.as_str()), "{again:?}");
    }
    // What b held from a before is not sent to it again.
    assert_eq!(again_a.peers["b"].resent_bytes, 0, "{again_a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_killed_mid_fragment_resumes_and_sends_nothing_the_receiver_held() {
    let pki = Pki::new("test CA");
    let n = 1 << 20;
    let fragments = fragments(17, &[("a", 1.0), ("b", 1.0)], n);
    let plan = CollectivePlan::new(&["a", "b"], &[], n as u64, 1 << 14).unwrap();
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    // a paces itself at 1 MB/s, so that it is killed mid-fragment: its
    // contribution to b's shard is 32 chunks, 0.53 MB.
    let paced = ExchangeOptions {
        pacing_bytes_per_second: Some(1_000_000),
        ..options(1)
    };
    let a_tls = pki.agent("a");
    let a1 = Arc::new(ExchangeNode::bind(loopback(), &a_tls, paced).unwrap());
    let b = Arc::new(ExchangeNode::bind(loopback(), &pki.agent("b"), options(2)).unwrap());
    let a_addr = a1.local_addr().unwrap();
    let peers: BTreeMap<String, std::net::SocketAddr> = [
        ("a".to_string(), a_addr),
        ("b".to_string(), b.local_addr().unwrap()),
    ]
    .into();
    let deadline = Duration::from_secs(90);
    let b_task = {
        let (b, plan, codecs, peers) =
            (Arc::clone(&b), plan.clone(), codecs.clone(), peers.clone());
        let values = fragments["b"].clone();
        tokio::spawn(async move { run(&b, &plan, &codecs, &values, &peers, deadline).await })
    };
    let a1_task = {
        let (a1, plan, codecs, peers) =
            (Arc::clone(&a1), plan.clone(), codecs.clone(), peers.clone());
        let values = fragments["a"].clone();
        tokio::spawn(async move { run(&a1, &plan, &codecs, &values, &peers, deadline).await })
    };
    // Kill a once b holds part of its contribution (a quarter of it).
    let total = {
        let chunks = Contributor::new(n as u64)
            .contributions(&plan, &codecs, "a", &fragments["a"])
            .unwrap();
        chunks
            .iter()
            .filter(|c| c.to == "b")
            .map(|c| c.frame.len() as u64)
            .sum::<u64>()
    };
    let held_before = bounded(60, async {
        loop {
            let held = b
                .progress(JOB, 1, 0, &plan)
                .and_then(|p| p.get("a").map(|r| r.received_bytes))
                .unwrap_or(0);
            if held >= total / 4 {
                return held;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    a1_task.abort();
    let _ = a1_task.await;
    let a1 = Arc::try_unwrap(a1).unwrap();
    bounded(10, a1.shutdown(Duration::from_secs(5))).await;
    println!("a killed with {held_before} of {total} bytes held by b");
    assert!(held_before < total, "a finished before it was killed");

    // a restarts on the same address, with a new incarnation and fresh
    // encoders (the same bytes: no residual yet), unpaced.
    let a2 = bounded(30, async {
        loop {
            match ExchangeNode::bind(a_addr, &a_tls, options(3)) {
                Ok(node) => return node,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
    let a2_outcome = run(&a2, &plan, &codecs, &fragments["a"], &peers, deadline).await;
    let b_outcome = bounded(120, b_task).await.unwrap();
    let expected = reference_hash(&plan, &codecs, &fragments);
    assert_eq!(
        a2_outcome.hash.as_deref(),
        Some(expected.as_str()),
        "{a2_outcome:?}"
    );
    assert_eq!(
        b_outcome.hash.as_deref(),
        Some(expected.as_str()),
        "{b_outcome:?}"
    );
    let from_a = &b_outcome.peers["a"];
    let to_b = &a2_outcome.peers["b"];
    println!("b from a: {from_a:?}\na2 to b: {to_b:?}");
    // Nothing b held was sent again; the restarted a sent only the rest.
    assert_eq!(from_a.duplicate_bytes, 0, "{from_a:?}");
    // a's contributions to b's shard, and a's averages of its own.
    let gather = codecs.gather().codec;
    let averages: u64 = plan
        .chunks(plan.shard_of("a").unwrap().index)
        .map(|r| gather.frame_bytes((r.end - r.start) as usize) as u64)
        .sum();
    assert_eq!(from_a.received_bytes, total + averages, "{from_a:?}");
    let header = (wire::FIXED_LEN + JOB.len() + 4) as u64;
    // a2's contributions (what b did not hold) and its averages.
    let data = to_b.sent_bytes - to_b.sent_messages * header;
    assert!(
        data <= total - held_before + averages,
        "a2 sent {data} data bytes; b held {held_before} of {total}, averages {averages}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_messages_are_refused_and_never_reach_the_sum() {
    let pki = Pki::new("test CA");
    let n = 30_000;
    let fragments = fragments(18, &[("a", 1.0), ("b", 1.0), ("c", 1.0)], n);
    let plan = CollectivePlan::new(&["a", "b", "c"], &[], n as u64, 4096).unwrap();
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    let nodes: Vec<Arc<ExchangeNode>> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(k, s)| {
            Arc::new(ExchangeNode::bind(loopback(), &pki.agent(s), options(k as u64 + 1)).unwrap())
        })
        .collect();
    let peers: BTreeMap<String, std::net::SocketAddr> = ["a", "b", "c"]
        .iter()
        .zip(&nodes)
        .map(|(s, node)| (s.to_string(), node.local_addr().unwrap()))
        .collect();
    let deadline = Duration::from_secs(60);
    let a_task = {
        let (a, plan, codecs, peers) = (
            Arc::clone(&nodes[0]),
            plan.clone(),
            codecs.clone(),
            peers.clone(),
        );
        let values = fragments["a"].clone();
        tokio::spawn(async move { run(&a, &plan, &codecs, &values, &peers, deadline).await })
    };

    // A client with b's certificate sends a's shard a chunk of b's whose
    // codec frame has a flipped bit (the wire's checksums made over it).
    let b_chunk = Contributor::new(n as u64)
        .contributions(&plan, &codecs, "b", &fragments["b"])
        .unwrap()
        .into_iter()
        .find(|c| c.to == "a")
        .unwrap();
    let mut bad_frame = b_chunk.frame.clone();
    let last = bad_frame.len() - 1;
    bad_frame[last] ^= 0x01;
    let client_config = pki
        .agent("b")
        .quinn_client_config(&[wire::ALPN], Arc::new(quinn::TransportConfig::default()))
        .unwrap();
    let endpoint = quinn::Endpoint::client(loopback()).unwrap();
    let connection = bounded(
        20,
        endpoint
            .connect_with(client_config, peers["a"], "a.site.longhaul")
            .unwrap(),
    )
    .await
    .unwrap();
    let (mut send, mut recv) = bounded(20, connection.open_bi()).await.unwrap();
    let header = |kind, chunk| Header {
        kind,
        job: JOB.to_string(),
        round: 1,
        plan: plan.digest(),
        chunk,
    };
    let none = ChunkId {
        phase: Phase::ReduceScatter,
        fragment: 0,
        shard: 0,
        offset: 0,
        length: 0,
    };
    let hello = wire::encode_to_vec(&header(Kind::Hello, none), b"b").unwrap();
    send.write_all(&hello).await.unwrap();
    let mut buffer = vec![0u8; wire::MAX_REASON_BYTES + 200];
    let welcome = bounded(20, read_one(&mut recv, &mut buffer)).await;
    assert_eq!(welcome.0, Kind::Welcome);
    let chunk = ChunkId {
        phase: Phase::ReduceScatter,
        fragment: 0,
        shard: b_chunk.shard,
        offset: b_chunk.offset,
        length: b_chunk.length,
    };
    let data = wire::encode_to_vec(&header(Kind::Data, chunk), &bad_frame).unwrap();
    send.write_all(&data).await.unwrap();
    let (kind, reason) = bounded(20, read_one(&mut recv, &mut buffer)).await;
    assert_eq!(kind, Kind::Refused);
    assert!(reason.contains("checksum"), "{reason}");
    // A message whose own payload checksum is wrong: refused, and the
    // connection closed (its framing cannot be trusted).
    let mut broken = wire::encode_to_vec(&header(Kind::Data, chunk), &b_chunk.frame).unwrap();
    let last = broken.len() - 1;
    broken[last] ^= 0x01;
    send.write_all(&broken).await.unwrap();
    let (kind, reason) = bounded(20, read_one(&mut recv, &mut buffer)).await;
    assert_eq!(kind, Kind::Refused);
    assert!(reason.contains("payload_crc32c"), "{reason}");
    let closed = bounded(20, connection.closed()).await.to_string();
    assert!(closed.contains("payload_crc32c"), "{closed}");

    // The real b and c: every hash is the clean reference's.
    let mut rest = Vec::new();
    for (k, site) in ["b", "c"].iter().enumerate() {
        let (node, plan, codecs, peers) = (
            Arc::clone(&nodes[k + 1]),
            plan.clone(),
            codecs.clone(),
            peers.clone(),
        );
        let values = fragments[*site].clone();
        rest.push(tokio::spawn(async move {
            run(&node, &plan, &codecs, &values, &peers, deadline).await
        }));
    }
    let expected = reference_hash(&plan, &codecs, &fragments);
    let a_outcome = bounded(120, a_task).await.unwrap();
    assert_eq!(
        a_outcome.hash.as_deref(),
        Some(expected.as_str()),
        "{a_outcome:?}"
    );
    assert_eq!(
        a_outcome.peers["b"].refused, 2,
        "{:?}",
        a_outcome.peers["b"]
    );
    for task in rest {
        let outcome = bounded(120, task).await.unwrap();
        assert_eq!(outcome.hash.as_deref(), Some(expected.as_str()));
    }
}

/// Reads one message: its kind and payload as text.
async fn read_one(recv: &mut quinn::RecvStream, buffer: &mut Vec<u8>) -> (Kind, String) {
    buffer.resize(wire::FIXED_LEN, 0);
    recv.read_exact(&mut buffer[..]).await.unwrap();
    let total = wire::message_length(buffer).unwrap();
    buffer.resize(total, 0);
    recv.read_exact(&mut buffer[wire::FIXED_LEN..])
        .await
        .unwrap();
    let message = wire::decode(buffer).unwrap();
    (
        message.header.kind,
        String::from_utf8_lossy(message.payload).into_owned(),
    )
}

/// Reads one message: its header and payload.
async fn read_header(
    recv: &mut quinn::RecvStream,
    buffer: &mut Vec<u8>,
) -> Option<(Header, Vec<u8>)> {
    buffer.resize(wire::FIXED_LEN, 0);
    recv.read_exact(&mut buffer[..]).await.ok()?;
    let total = wire::message_length(buffer).ok()?;
    buffer.resize(total, 0);
    recv.read_exact(&mut buffer[wire::FIXED_LEN..]).await.ok()?;
    let message = wire::decode(buffer).ok()?;
    Some((message.header.clone(), message.payload.to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_chunk_ends_the_exchange_with_the_reason_not_at_the_deadline() {
    let pki = Pki::new("test CA");
    let n = 10_000;
    let fragments = fragments(19, &[("a", 1.0), ("b", 1.0)], n);
    let plan = CollectivePlan::new(&["a", "b"], &[], n as u64, 4096).unwrap();
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    let a = ExchangeNode::bind(loopback(), &pki.agent("a"), options(1)).unwrap();
    // b: a receiver with b's certificate that welcomes every stream and
    // refuses every data message.
    let server = pki
        .agent("b")
        .quinn_server_config(&[wire::ALPN], Arc::new(quinn::TransportConfig::default()))
        .unwrap();
    let endpoint = quinn::Endpoint::server(server, loopback()).unwrap();
    let b_addr = endpoint.local_addr().unwrap();
    let receiver = tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            tokio::spawn(async move {
                let Ok(connection) = incoming.await else {
                    return;
                };
                while let Ok((mut send, mut recv)) = connection.accept_bi().await {
                    tokio::spawn(async move {
                        let mut buffer = Vec::new();
                        let Some((hello, _)) = read_header(&mut recv, &mut buffer).await else {
                            return;
                        };
                        let welcome = Header {
                            kind: Kind::Welcome,
                            ..hello.clone()
                        };
                        let bytes = wire::encode_to_vec(&welcome, &7u64.to_le_bytes()).unwrap();
                        if send.write_all(&bytes).await.is_err() {
                            return;
                        }
                        while let Some((data, _)) = read_header(&mut recv, &mut buffer).await {
                            let refused = Header {
                                kind: Kind::Refused,
                                ..data
                            };
                            let bytes =
                                wire::encode_to_vec(&refused, b"this receiver refuses everything")
                                    .unwrap();
                            if send.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            });
        }
    });
    let peers: BTreeMap<String, std::net::SocketAddr> = [
        ("a".to_string(), a.local_addr().unwrap()),
        ("b".to_string(), b_addr),
    ]
    .into();
    let deadline = Duration::from_secs(120);
    let outcome = bounded(
        100,
        run(&a, &plan, &codecs, &fragments["a"], &peers, deadline),
    )
    .await;
    receiver.abort();
    assert_eq!(outcome.hash, None, "{outcome:?}");
    assert_eq!(outcome.result, None);
    let reason = outcome.reason.as_deref().unwrap_or_default();
    assert!(
        reason.starts_with("b chunk") && reason.contains("this receiver refuses everything"),
        "{reason}"
    );
    assert!(outcome.peers["b"].refusals_received >= 1, "{outcome:?}");
    // Ended on the refusal: well before the deadline (a wide bound).
    assert!(outcome.elapsed < deadline / 2, "{:?}", outcome.elapsed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_leaves_the_pooled_connection_to_the_peers_other_streams() {
    let pki = Pki::new("test CA");
    let n = 10_000;
    let fragments = fragments(20, &[("a", 1.0), ("b", 1.0)], n);
    let plan = CollectivePlan::new(&["a", "b"], &[], n as u64, 4096).unwrap();
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    let a = Arc::new(ExchangeNode::bind(loopback(), &pki.agent("a"), options(1)).unwrap());
    // b's address for a's own sends: nobody answers; a keeps the fragment
    // open (its peer timeout is 20 s) while the client below talks to it.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let peers: BTreeMap<String, std::net::SocketAddr> = [
        ("a".to_string(), a.local_addr().unwrap()),
        ("b".to_string(), silent.local_addr().unwrap()),
    ]
    .into();
    let a_task = {
        let (a, plan, codecs, peers) =
            (Arc::clone(&a), plan.clone(), codecs.clone(), peers.clone());
        let values = fragments["a"].clone();
        tokio::spawn(async move {
            run(&a, &plan, &codecs, &values, &peers, Duration::from_secs(60)).await
        })
    };
    let client_config = pki
        .agent("b")
        .quinn_client_config(&[wire::ALPN], Arc::new(quinn::TransportConfig::default()))
        .unwrap();
    let endpoint = quinn::Endpoint::client(loopback()).unwrap();
    let connection = bounded(
        20,
        endpoint
            .connect_with(client_config, peers["a"], "a.site.longhaul")
            .unwrap(),
    )
    .await
    .unwrap();
    let header = |kind| Header {
        kind,
        job: JOB.to_string(),
        round: 1,
        plan: plan.digest(),
        chunk: ChunkId {
            phase: Phase::ReduceScatter,
            fragment: 0,
            shard: 0,
            offset: 0,
            length: 0,
        },
    };
    let hello = wire::encode_to_vec(&header(Kind::Hello), b"b").unwrap();
    let mut buffer = vec![0u8; wire::MAX_REASON_BYTES + 200];
    // A stream welcomed, then sent a message out of place (an ack, which
    // a receiver never takes): refused, and only that stream ends.
    let (mut send, mut recv) = bounded(20, connection.open_bi()).await.unwrap();
    send.write_all(&hello).await.unwrap();
    assert_eq!(
        bounded(20, read_one(&mut recv, &mut buffer)).await.0,
        Kind::Welcome
    );
    let ack = wire::encode_to_vec(
        &Header {
            chunk: ChunkId {
                length: 1,
                ..header(Kind::Ack).chunk
            },
            ..header(Kind::Ack)
        },
        &[],
    )
    .unwrap();
    send.write_all(&ack).await.unwrap();
    let (kind, reason) = bounded(20, read_one(&mut recv, &mut buffer)).await;
    assert_eq!(kind, Kind::Refused);
    assert!(reason.contains("a ack message"), "{reason}");
    // The same connection still carries a new stream, which is welcomed.
    let (mut send, mut recv) = bounded(20, connection.open_bi()).await.unwrap();
    send.write_all(&hello).await.unwrap();
    assert_eq!(
        bounded(20, read_one(&mut recv, &mut buffer)).await.0,
        Kind::Welcome
    );
    assert!(
        connection.close_reason().is_none(),
        "{:?}",
        connection.close_reason()
    );
    a_task.abort();
}
