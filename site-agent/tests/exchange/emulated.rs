//! The exchange through the emulator's UDP proxy: a link cut mid-fragment
//! and healed; the dedicated-link controller through random loss.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use longhaul_codec::EncoderConfig;
use longhaul_core::units::{DataRate, Distance};
use longhaul_exchange::{CollectivePlan, Contributor, LinkCodecs};
use longhaul_simulations::emulator::{Emulator, LinkSpec, UdpProxy};
use longhaul_simulations::link::{LinkConfig, LossModel};
use longhaul_site_agent::exchange::{Congestion, ExchangeNode, ExchangeOptions};

use crate::{JOB, Pki, bounded, fragments, loopback, options, reference_hash, run};

type Peers = BTreeMap<String, std::net::SocketAddr>;

/// Proxies of the emulated link a–b each way (to keep alive), and where a
/// and b reach each other through them.
async fn through_link(
    emulator: &Emulator,
    a: &ExchangeNode,
    b: &ExchangeNode,
) -> ([UdpProxy; 2], Peers, Peers) {
    let to_b = emulator
        .udp_proxy("a", "b", loopback(), b.local_addr().unwrap())
        .await
        .unwrap();
    let to_a = emulator
        .udp_proxy("b", "a", loopback(), a.local_addr().unwrap())
        .await
        .unwrap();
    let peers_of_a: Peers = [
        ("a".to_string(), a.local_addr().unwrap()),
        ("b".to_string(), to_b.local_addr()),
    ]
    .into();
    let peers_of_b: Peers = [
        ("a".to_string(), to_a.local_addr()),
        ("b".to_string(), b.local_addr().unwrap()),
    ]
    .into();
    ([to_b, to_a], peers_of_a, peers_of_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_mid_fragment_and_healed_resumes_without_duplicates() {
    let seed = 19;
    println!("emulator seed {seed}");
    let link = LinkConfig::new(
        DataRate::from_bits_per_second(200_000_000),
        Distance::from_km(100.0).unwrap(),
    );
    let emulator = Emulator::new(seed, vec![LinkSpec::symmetric("a", "b", link)]).unwrap();
    let pki = Pki::new("test CA");
    let n = 1 << 20;
    let fragments = fragments(seed, &[("a", 1.0), ("b", 1.0)], n);
    let plan = CollectivePlan::new(&["a", "b"], &[], n as u64, 1 << 14).unwrap();
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    // Short idle timeouts, so that the cut ends the connections; a paced
    // at 1 MB/s, so that the cut comes mid-fragment; a peer timeout well
    // past the cut, so that nobody is reported dead.
    let quick = |incarnation, pacing| ExchangeOptions {
        connections_per_peer: 2,
        idle_timeout: Duration::from_secs(2),
        keep_alive_interval: Duration::from_millis(300),
        peer_timeout: Duration::from_secs(60),
        pacing_bytes_per_second: pacing,
        ..options(incarnation)
    };
    let a = Arc::new(
        ExchangeNode::bind(loopback(), &pki.agent("a"), quick(1, Some(1_000_000))).unwrap(),
    );
    let b = Arc::new(ExchangeNode::bind(loopback(), &pki.agent("b"), quick(2, None)).unwrap());
    let (_proxies, peers_of_a, peers_of_b) = through_link(&emulator, &a, &b).await;
    let deadline = Duration::from_secs(90);
    let spawn =
        |node: &Arc<ExchangeNode>, site: &str, peers: BTreeMap<String, std::net::SocketAddr>| {
            let (node, plan, codecs) = (Arc::clone(node), plan.clone(), codecs.clone());
            let values = fragments[site].clone();
            tokio::spawn(async move { run(&node, &plan, &codecs, &values, &peers, deadline).await })
        };
    let a_task = spawn(&a, "a", peers_of_a);
    let b_task = spawn(&b, "b", peers_of_b);

    let total: u64 = Contributor::new(n as u64)
        .contributions(&plan, &codecs, "a", &fragments["a"])
        .unwrap()
        .iter()
        .filter(|c| c.to == "b")
        .map(|c| c.frame.len() as u64)
        .sum();
    let held = bounded(60, async {
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
    emulator.set_down("a", Some("b"), true).unwrap();
    println!("cut with {held} of {total} bytes held by b");
    // Past both sides' idle timeouts: every connection is gone.
    tokio::time::sleep(Duration::from_secs(4)).await;
    emulator.set_down("a", Some("b"), false).unwrap();

    let a_outcome = bounded(120, a_task).await.unwrap();
    let b_outcome = bounded(120, b_task).await.unwrap();
    let expected = reference_hash(&plan, &codecs, &fragments);
    assert_eq!(
        a_outcome.hash.as_deref(),
        Some(expected.as_str()),
        "{a_outcome:?}"
    );
    assert_eq!(
        b_outcome.hash.as_deref(),
        Some(expected.as_str()),
        "{b_outcome:?}"
    );
    let to_b = &a_outcome.peers["b"];
    let from_a = &b_outcome.peers["a"];
    println!("a to b: {to_b:?}\nb from a: {from_a:?}");
    assert!(
        to_b.connections_lost >= 1,
        "the cut ended no connection: {to_b:?}"
    );
    assert!(
        to_b.connections > to_b.connections_lost,
        "no connection after the heal: {to_b:?}"
    );
    // Nothing b held before the cut was sent to it again.
    assert_eq!(from_a.duplicate_bytes, 0, "{from_a:?}");
}

/// Two nodes running `congestion` exchange a fragment through a 500 km,
/// 200 Mbit/s emulated link losing 2 % of its packets; both get the
/// reference's hash and the link did lose packets. Returns both nodes and
/// the link, still up, for what node a's pool ran.
async fn through_random_loss(seed: u64, congestion: Congestion) -> LossyPair {
    println!("emulator seed {seed}");
    let mut link = LinkConfig::new(
        DataRate::from_bits_per_second(200_000_000),
        Distance::from_km(500.0).unwrap(),
    );
    link.loss = LossModel::Bernoulli { p: 0.02 };
    let emulator = Emulator::new(seed, vec![LinkSpec::symmetric("a", "b", link)]).unwrap();
    let pki = Pki::new("test CA");
    let n = 1 << 20;
    let fragments = fragments(seed, &[("a", 1.0), ("b", 1.0)], n);
    let plan = CollectivePlan::new(&["a", "b"], &[], n as u64, 1 << 14).unwrap();
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    let with = |incarnation| ExchangeOptions {
        connections_per_peer: 2,
        link_rate_bits_per_second: 200_000_000,
        link_rtt: Duration::from_millis(5),
        peer_timeout: Duration::from_secs(60),
        congestion,
        ..options(incarnation)
    };
    let a = Arc::new(ExchangeNode::bind(loopback(), &pki.agent("a"), with(1)).unwrap());
    let b = Arc::new(ExchangeNode::bind(loopback(), &pki.agent("b"), with(2)).unwrap());
    let (proxies, peers_of_a, peers_of_b) = through_link(&emulator, &a, &b).await;
    let deadline = Duration::from_secs(90);
    let (a_outcome, b_outcome) = tokio::join!(
        run(&a, &plan, &codecs, &fragments["a"], &peers_of_a, deadline),
        run(&b, &plan, &codecs, &fragments["b"], &peers_of_b, deadline),
    );
    let expected = reference_hash(&plan, &codecs, &fragments);
    for outcome in [&a_outcome, &b_outcome] {
        assert_eq!(
            outcome.hash.as_deref(),
            Some(expected.as_str()),
            "{outcome:?}"
        );
    }
    // The link did lose packets: the result is QUIC's retransmissions'.
    let lost: u64 = emulator.statuses().iter().map(|s| s.stats.drops.loss).sum();
    assert!(lost > 0, "the emulator lost nothing");
    LossyPair {
        a,
        _b: b,
        _proxies: proxies,
        _emulator: emulator,
    }
}

/// What [`through_random_loss`] leaves up: node a, and what keeps its
/// pooled connections open (node b, the link's proxies, the emulator).
struct LossyPair {
    a: Arc<ExchangeNode>,
    _b: Arc<ExchangeNode>,
    _proxies: [UdpProxy; 2],
    _emulator: Emulator,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dedicated_link_controller_carries_a_fragment_through_random_loss() {
    let pair = through_random_loss(23, Congestion::Dedicated).await;
    let a = &pair.a;
    // The pool ran the dedicated controller: no window past its share of
    // 1.25 × BDP (200 Mbit/s × 5 ms = 125 kB, over 2 connections), and
    // one at exactly that share after the losses (Cubic halves on loss
    // and never sits on this figure).
    let target = 78_125;
    let windows: Vec<u64> = a.pool_paths().iter().map(|(_, _, p)| p.cwnd).collect();
    assert!(
        !windows.is_empty() && windows.iter().all(|w| *w <= target),
        "{windows:?}"
    );
    assert!(windows.contains(&target), "{windows:?}");
}

/// Whether every open connection of `node`'s pool runs the controller
/// `C` (and there is one).
fn every_pooled_connection_runs<C: quinn::congestion::Controller + 'static>(
    node: &ExchangeNode,
) -> bool {
    let controllers = node.pool_controllers();
    !controllers.is_empty()
        && controllers
            .into_iter()
            .all(|controller| controller.into_any().downcast::<C>().is_ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quinns_bbr_carries_a_fragment_through_random_loss() {
    let pair = through_random_loss(29, Congestion::Bbr).await;
    // Every connection of the pool ran quinn's BBR, not its Cubic.
    assert!(
        every_pooled_connection_runs::<quinn::congestion::Bbr>(&pair.a),
        "a pooled connection does not run BBR, or none is open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quinns_new_reno_carries_a_fragment_through_random_loss() {
    let pair = through_random_loss(31, Congestion::NewReno).await;
    assert!(
        every_pooled_connection_runs::<quinn::congestion::NewReno>(&pair.a),
        "a pooled connection does not run NewReno, or none is open"
    );
}
