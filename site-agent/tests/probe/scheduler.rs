//! The scheduler: rounds at start and on demand, reports, failures, metrics.

use std::time::Duration;

use longhaul_site_agent::probe::metrics;
use longhaul_site_agent::probe::{
    ProbePeer, ProbeReport, ProbeResult, ProbeScheduler, ProbeServerOptions, SchedulerOptions,
    probe_seed,
};
use tokio::sync::mpsc;

use crate::{Pki, bounded, quick_options, server, timing};

async fn next_report(reports: &mut mpsc::Receiver<ProbeReport>) -> ProbeReport {
    bounded(60, reports.recv()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_are_probed_at_start_and_on_demand() {
    let _timing = timing().await;
    let pki = Pki::new("test CA");
    let server_b = server(&pki.agent("b"), ProbeServerOptions::default()).await;
    // Site c's agent answers where site c' is expected: its probes fail.
    let server_c = server(&pki.agent("c"), ProbeServerOptions::default()).await;
    let peers = vec![
        ProbePeer {
            site: "b".to_string(),
            addr: server_b.local_addr(),
        },
        ProbePeer {
            site: "d".to_string(),
            addr: server_c.local_addr(),
        },
    ];
    let base_seed = 42;
    let options = SchedulerOptions {
        // Only the first round is scheduled within the test.
        interval: Duration::from_secs(3600),
        probe: quick_options(base_seed),
        report_capacity: 8,
    };
    let (scheduler, mut reports) = ProbeScheduler::start(pki.agent("a"), peers, options).unwrap();

    let first_b = next_report(&mut reports).await;
    let first_d = next_report(&mut reports).await;
    println!("round 1 seeds: b {}, d {}", first_b.seed, first_d.seed);
    assert_eq!((first_b.peer.site.as_str(), first_b.round), ("b", 1));
    assert_eq!(first_b.seed, probe_seed(base_seed, "b", 1));
    let result = first_b.outcome.as_ref().unwrap();
    assert_eq!(result.samples, 10);
    assert_eq!(first_d.peer.site, "d");
    let failure = first_d.outcome.as_ref().unwrap_err();
    assert_eq!(failure.outcome, "handshake_failed");
    assert!(failure.message.contains("d.site.longhaul"), "{failure:?}");

    scheduler.probe_peer_now("b").unwrap();
    let second = next_report(&mut reports).await;
    println!("round 2 seed: b {}", second.seed);
    assert_eq!((second.peer.site.as_str(), second.round), ("b", 2));
    assert_ne!(second.seed, first_b.seed);
    assert!(second.outcome.is_ok());
    assert_eq!(scheduler.latest("b").unwrap().round, 2);
    assert_eq!(scheduler.latest("d").unwrap().round, 1);
    assert_eq!(scheduler.latest_all().len(), 2);

    // Bad requests and peer lists are refused and change nothing.
    let error = scheduler.probe_peer_now("x").unwrap_err();
    assert!(
        error.to_string().contains("\"x\" is not one of the peers"),
        "{error}"
    );
    let twice = vec![
        ProbePeer {
            site: "b".to_string(),
            addr: server_b.local_addr(),
        };
        2
    ];
    let error = scheduler.set_peers(twice).unwrap_err();
    assert!(
        error.to_string().contains("lists site \"b\" twice"),
        "{error}"
    );
    let own = vec![ProbePeer {
        site: "a".to_string(),
        addr: server_b.local_addr(),
    }];
    let error = scheduler.set_peers(own).unwrap_err();
    assert!(error.to_string().contains("own site \"a\""), "{error}");
    assert_eq!(scheduler.latest_all().len(), 2);

    // Dropping d forgets its report; a round now probes b only.
    scheduler
        .set_peers(vec![ProbePeer {
            site: "b".to_string(),
            addr: server_b.local_addr(),
        }])
        .unwrap();
    assert!(scheduler.latest("d").is_none());
    scheduler.probe_now().unwrap();
    let third = next_report(&mut reports).await;
    assert_eq!((third.peer.site.as_str(), third.round), ("b", 3));
    scheduler.stop();
}

#[test]
fn bad_scheduler_options_are_refused() {
    let pki = Pki::new("test CA");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = SchedulerOptions {
            interval: Duration::ZERO,
            ..SchedulerOptions::default()
        };
        let error = ProbeScheduler::start(pki.agent("a"), Vec::new(), options).unwrap_err();
        assert!(error.to_string().contains("`interval`"), "{error}");
        let peers = vec![ProbePeer {
            site: "not a site".to_string(),
            addr: "127.0.0.1:1".parse().unwrap(),
        }];
        let error =
            ProbeScheduler::start(pki.agent("a"), peers, SchedulerOptions::default()).unwrap_err();
        assert!(error.to_string().contains("\"not a site\""), "{error}");
    });
}

#[test]
fn probe_figures_are_exported_for_prometheus() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let result = ProbeResult {
        rtt_min_ns: 40_100_000,
        rtt_p50_ns: 41_000_000,
        rtt_p99_ns: 45_000_000,
        samples: 20,
        loss_rate: 0.05,
        sent: 2000,
        received: 1900,
        throughput_bps: 18.5e6,
        bytes: 4_625_000,
        duration_ns: 2_000_000_000,
    };
    ::metrics::with_local_recorder(&recorder, || {
        longhaul_site_agent::metrics::describe();
        metrics::record_probe("b", Ok(&result));
        metrics::record_probe("c", Err("timeout"));
    });
    let text = handle.render();
    println!("{text}");
    for line in [
        "longhaul_agent_probe_rtt_seconds{peer=\"b\",stat=\"p50\"} 0.041",
        "longhaul_agent_probe_rtt_seconds{peer=\"b\",stat=\"min\"} 0.0401",
        "longhaul_agent_probe_loss_ratio{peer=\"b\"} 0.05",
        "longhaul_agent_probe_throughput_bytes_per_second{peer=\"b\"} 2312500",
        "longhaul_agent_probes_total{peer=\"b\",outcome=\"ok\"} 1",
        "longhaul_agent_probes_total{peer=\"c\",outcome=\"timeout\"} 1",
        "# HELP longhaul_agent_probe_loss_ratio",
    ] {
        assert!(text.contains(line), "{line:?} missing from\n{text}");
    }
}
