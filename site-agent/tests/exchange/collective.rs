//! Fragments exchanged among sites over QUIC: the same hash everywhere,
//! the in-memory reference's; excluded sites left out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use longhaul_codec::EncoderConfig;
use longhaul_exchange::{CollectivePlan, LinkCodecs};
use longhaul_site_agent::exchange::ExchangeNode;

use crate::{Pki, fragments, loopback, options, reference_hash, run_fragment};

/// Nodes for `sites` (one test CA), and where each listens.
type Nodes = BTreeMap<String, Arc<ExchangeNode>>;
fn bind_nodes(sites: &[&str]) -> (Nodes, Arc<BTreeMap<String, std::net::SocketAddr>>) {
    let pki = Pki::new("test CA");
    let mut nodes = BTreeMap::new();
    let mut peers = BTreeMap::new();
    for (k, site) in sites.iter().enumerate() {
        let node = ExchangeNode::bind(loopback(), &pki.agent(site), options(k as u64 + 1)).unwrap();
        peers.insert(site.to_string(), node.local_addr().unwrap());
        nodes.insert(site.to_string(), Arc::new(node));
    }
    (nodes, Arc::new(peers))
}

/// Starts nodes for `sites`, runs the fragment at every one of them at
/// once, and returns their outcomes by site.
async fn exchange_all(
    sites: &[&str],
    plan: &CollectivePlan,
    codecs: &LinkCodecs,
    fragments: &BTreeMap<String, Vec<f32>>,
) -> Outcomes {
    let (nodes, peers) = bind_nodes(sites);
    exchange_on(&nodes, &peers, (plan, codecs, 0), fragments).await
}

type Outcomes = BTreeMap<String, longhaul_site_agent::exchange::ExchangeOutcome>;

/// Runs `fragment` at every one of `nodes` at once; their outcomes by site.
async fn exchange_on(
    nodes: &Nodes,
    peers: &Arc<BTreeMap<String, std::net::SocketAddr>>,
    (plan, codecs, fragment): (&CollectivePlan, &LinkCodecs, u32),
    fragments: &BTreeMap<String, Vec<f32>>,
) -> Outcomes {
    let mut tasks = tokio::task::JoinSet::new();
    for (site, node) in nodes {
        let (site, node, peers) = (site.clone(), Arc::clone(node), Arc::clone(peers));
        let (plan, codecs) = (plan.clone(), codecs.clone());
        let values = fragments[&site].clone();
        tasks.spawn(async move {
            let at = (&plan, &codecs, fragment);
            let outcome = run_fragment(&node, at, &values, &peers, Duration::from_secs(60)).await;
            (site, outcome)
        });
    }
    let mut outcomes = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let (site, outcome) = done.unwrap();
        outcomes.insert(site, outcome);
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sites_exchange_a_fragment_and_every_hash_is_the_references() {
    let sites = ["north", "south", "west"];
    let n = 300_000;
    let fragments = fragments(14, &[("north", 1.0), ("south", 2.0), ("west", 0.5)], n);
    let plan = CollectivePlan::new(&sites, &[], n as u64, 1 << 13).unwrap();
    // Another codec on one link: the averages are still one frame each.
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap()).with_link(
        "north",
        "west",
        EncoderConfig::new(4, 64, true, false).unwrap(),
    );
    let outcomes = exchange_all(&sites, &plan, &codecs, &fragments).await;
    let expected = reference_hash(&plan, &codecs, &fragments);
    for (site, outcome) in &outcomes {
        println!("{site}: {:?} in {:?}", outcome.hash, outcome.elapsed);
        assert_eq!(
            outcome.hash.as_deref(),
            Some(expected.as_str()),
            "{site}: {outcome:?}"
        );
        assert!(
            outcome.unfinished.is_empty(),
            "{site}: {:?}",
            outcome.unfinished
        );
        // Every milestone passed, in the order the collective passes
        // them, within the exchange's time.
        let p = outcome.phases;
        let at = [p.encoded, p.first_data, p.reduced, p.assembled];
        assert!(at.iter().all(Option::is_some), "{site}: {p:?}");
        assert!(
            at.windows(2).all(|w| w[0] <= w[1]) && p.assembled <= Some(outcome.elapsed),
            "{site}: {p:?} in {:?}",
            outcome.elapsed
        );
        for (peer, report) in &outcome.peers {
            assert!(
                report.finished && report.connections >= 1,
                "{site} → {peer}: {report:?}"
            );
            assert_eq!(report.refused, 0, "{site} → {peer}: {report:?}");
            assert!(
                report.sent_bytes > 0 && report.received_bytes > 0,
                "{site} → {peer}: {report:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_excluded_site_is_left_out_and_the_average_reweighted() {
    let participants = ["a", "b", "c", "d"];
    let n = 50_000;
    // d's values are a thousand times larger: counted, they would show.
    let fragments = fragments(15, &[("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 1000.0)], n);
    let plan = CollectivePlan::new(&participants, &["d"], n as u64, 4096).unwrap();
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, false, false).unwrap());
    let outcomes = exchange_all(&["a", "b", "c"], &plan, &codecs, &fragments).await;
    let expected = reference_hash(&plan, &codecs, &fragments);
    for (site, outcome) in &outcomes {
        assert_eq!(outcome.hash.as_deref(), Some(expected.as_str()), "{site}");
        assert!(!outcome.peers.contains_key("d"), "{site} exchanged with d");
    }
    // The average of the three live sites, weight 1/3 each.
    let result = outcomes["a"].result.as_ref().unwrap();
    for (i, value) in result.iter().enumerate() {
        let mean = (fragments["a"][i] + fragments["b"][i] + fragments["c"][i]) / 3.0;
        assert!(
            (value - mean).abs() < 0.02,
            "element {i}: {value} against {mean}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_of_the_pool_carries_chunks_not_one_connection_all() {
    // 25 chunks of about 8 KiB to each peer over a pool of 3. Without the
    // spreading, the first connection to run took every queued chunk into
    // its send buffer (the windows hold far more), and the pool's other
    // connections, with their own congestion controllers, carried none.
    let sites = ["north", "south"];
    let n = 400_000;
    let fragments = fragments(21, &[("north", 1.0), ("south", 1.5)], n);
    let plan = CollectivePlan::new(&sites, &[], n as u64, 1 << 13).unwrap();
    let codecs = LinkCodecs::uniform(EncoderConfig::new(8, 256, true, false).unwrap());
    let expected = reference_hash(&plan, &codecs, &fragments);
    let (nodes, peers) = bind_nodes(&sites);
    // The first fragment opens the pool (its connections come up one by
    // one, and the first may carry it alone); the second has it whole.
    for fragment in 0..2u32 {
        let outcomes = exchange_on(&nodes, &peers, (&plan, &codecs, fragment), &fragments).await;
        for (site, outcome) in outcomes {
            assert_eq!(outcome.hash.as_deref(), Some(expected.as_str()), "{site}");
            for (peer, report) in &outcome.peers {
                println!("fragment {fragment}, {site} → {peer}: {report:?}");
                if fragment == 1 {
                    assert_eq!(report.handshakes, 0, "{site} → {peer}: {report:?}");
                    assert_eq!(report.connections_used, 3, "{site} → {peer}: {report:?}");
                    // Each within its share of the pool's bytes in flight.
                    let share = options(1).pool_in_flight_bytes() / 3;
                    assert!(
                        report.peak_connection_in_flight_bytes <= share,
                        "{site} → {peer}: {report:?}, share {share}"
                    );
                }
            }
        }
    }
}
