//! The agent's link probes, wired to the rest: beside the probe server for
//! the other agents, a scheduler that probes every other registered site
//! (peers come from the coordinator's site list, which the exchange reads
//! too), each result reported to the coordinator (stored beside the
//! configured link) and shown in the status.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use longhaul_proto::v1 as pb;
use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::coordinator::Coordinators;
use crate::probe::{
    ProbePeer, ProbeReport, ProbeScheduler, ProbeServer, ProbeServerOptions, SchedulerOptions,
};
use crate::status::{ProbeTrigger, SharedStatus, lock};
use crate::tls::AgentTls;

/// How often the peer list is read from the coordinator.
const PEER_REFRESH: Duration = Duration::from_secs(5);
/// The least time between two reads of the peer list, asked for or not.
const PEER_REFRESH_MIN: Duration = Duration::from_millis(500);

/// The running probe server and scheduler (stopped when dropped).
#[derive(Debug)]
pub struct Prober {
    pub server: ProbeServer,
    pub trigger: ProbeTrigger,
    /// Where every other site that is up is reached (its registered data
    /// address, or the configured override), refreshed every 5 s: the
    /// probes' peers, and the exchange's.
    pub peers: watch::Receiver<BTreeMap<String, SocketAddr>>,
    /// Reads the peer list now (at most every 500 ms) rather than at the
    /// next 5 s refresh: for a site the exchange has no address for yet.
    pub refresh_peers: Arc<Notify>,
}

fn peer_probe(report: &ProbeReport) -> pb::PeerProbe {
    let at = report
        .finished_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    match &report.outcome {
        Ok(result) => pb::PeerProbe {
            peer_site_id: report.peer.site.clone(),
            peer_address: report.peer.addr.to_string(),
            measurement: Some(pb::LinkMeasurement {
                rtt_ns: result.rtt_p50_ns,
                loss_rate: result.loss_rate,
                throughput_bps: result.throughput_bps.max(0.0).round() as u64,
                measured_at_unix_ms: at,
            }),
            error: String::new(),
        },
        Err(failure) => pb::PeerProbe {
            peer_site_id: report.peer.site.clone(),
            peer_address: report.peer.addr.to_string(),
            measurement: None,
            error: format!("{}: {}", failure.outcome, failure.message),
        },
    }
}

/// The probe server's options for a scheduler's: its socket buffers.
pub fn server_options(options: &SchedulerOptions) -> ProbeServerOptions {
    ProbeServerOptions {
        transport: crate::probe::QuicTuning {
            socket_buffer_bytes: options.probe.transport.socket_buffer_bytes,
            ..crate::probe::QuicTuning::default()
        },
        ..ProbeServerOptions::default()
    }
}

/// Starts the scheduler beside a running probe `server`.
pub fn start(
    site_id: String,
    server: ProbeServer,
    overrides: BTreeMap<String, SocketAddr>,
    tls: AgentTls,
    options: SchedulerOptions,
    coordinators: Coordinators,
    status: SharedStatus,
) -> Result<Prober, crate::probe::ProbeError> {
    let (scheduler, mut reports) = ProbeScheduler::start(tls, Vec::new(), options)?;
    let (peers_tx, peers) = watch::channel(BTreeMap::new());
    let refresh_peers = Arc::new(Notify::new());
    let (trigger, mut requests) = mpsc::channel::<oneshot::Sender<Vec<pb::PeerProbe>>>(8);
    let scheduler = Arc::new(scheduler);
    let peer_count = Arc::new(std::sync::atomic::AtomicUsize::new(0));

    // Peers: every other site that is up and says where its agent listens.
    {
        let scheduler = scheduler.clone();
        let site_id = site_id.clone();
        let mut coordinators = coordinators.clone();
        let peer_count = peer_count.clone();
        let refresh = Arc::clone(&refresh_peers);
        tokio::spawn(async move {
            let mut known: Vec<ProbePeer> = Vec::new();
            loop {
                let mut request = tonic::Request::new(pb::ListSitesRequest { allow_stale: true });
                request.set_timeout(Duration::from_secs(2));
                match coordinators.operator_client().list_sites(request).await {
                    Ok(response) => {
                        let mut peers: Vec<ProbePeer> = response
                            .into_inner()
                            .sites
                            .into_iter()
                            .filter(|s| s.state() == pb::SiteState::Up)
                            .filter_map(|s| {
                                let id = s.site?.id;
                                let addr = match overrides.get(&id) {
                                    Some(addr) => *addr,
                                    None => s.data_address.parse().ok()?,
                                };
                                (id != site_id).then_some(ProbePeer { site: id, addr })
                            })
                            .collect();
                        peers.sort_by(|a, b| a.site.cmp(&b.site));
                        peers_tx.send_if_modified(|current| {
                            let fresh: BTreeMap<String, SocketAddr> =
                                peers.iter().map(|p| (p.site.clone(), p.addr)).collect();
                            let changed = *current != fresh;
                            *current = fresh;
                            changed
                        });
                        if peers != known {
                            tracing::info!(peers = ?peers.iter().map(|p| &p.site).collect::<Vec<_>>(), "probe peers");
                            if scheduler.set_peers(peers.clone()).is_ok() {
                                peer_count.store(peers.len(), std::sync::atomic::Ordering::Relaxed);
                                // A site that appeared is probed now, not
                                // at the next scheduled round.
                                if peers.iter().any(|p| !known.contains(p)) {
                                    let _ = scheduler.probe_now();
                                }
                                known = peers;
                            }
                        }
                    }
                    Err(error) => {
                        tracing::debug!(code = ?error.code(), "cannot list sites for probes; trying the next replica");
                        coordinators.rotate();
                    }
                }
                tokio::time::sleep(PEER_REFRESH_MIN).await;
                tokio::select! {
                    _ = tokio::time::sleep(PEER_REFRESH - PEER_REFRESH_MIN) => {}
                    _ = refresh.notified() => {}
                }
            }
        });
    }

    // Reports: to the coordinator and the status board.
    {
        let site_id = site_id.clone();
        let mut coordinators = coordinators.clone();
        let status = status.clone();
        tokio::spawn(async move {
            while let Some(report) = reports.recv().await {
                let probe = peer_probe(&report);
                {
                    let mut board = lock(&status);
                    board
                        .probes
                        .retain(|p| p.peer_site_id != probe.peer_site_id);
                    board.probes.push(probe.clone());
                    board
                        .probes
                        .sort_by(|a, b| a.peer_site_id.cmp(&b.peer_site_id));
                }
                let Some(measurement) = probe.measurement else {
                    continue;
                };
                let mut request = tonic::Request::new(pb::LinkProbeReport {
                    site_id: site_id.clone(),
                    peer_site_id: probe.peer_site_id.clone(),
                    measurement: Some(measurement),
                });
                request.set_timeout(Duration::from_secs(5));
                match coordinators.client().report_link_probe(request).await {
                    Ok(_) => {}
                    // No link configured between the two sites: nothing to
                    // store the measurement beside.
                    Err(error) if error.code() == tonic::Code::NotFound => {
                        tracing::debug!(peer = %probe.peer_site_id, message = error.message(), "measurement not stored");
                    }
                    Err(error) => {
                        tracing::warn!(peer = %probe.peer_site_id, code = ?error.code(), message = error.message(), "measurement not reported");
                        if crate::coordinator::is_transient(&error) {
                            coordinators.rotate();
                        }
                    }
                }
            }
        });
    }

    // On demand: a round now, answered with the reports it produced.
    {
        let scheduler = scheduler.clone();
        tokio::spawn(async move {
            while let Some(reply) = requests.recv().await {
                let asked = SystemTime::now();
                let peers = peer_count.load(std::sync::atomic::Ordering::Relaxed);
                if peers == 0 || scheduler.probe_now().is_err() {
                    let _ = reply.send(Vec::new());
                    continue;
                }
                let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                let done = loop {
                    let latest: BTreeMap<String, ProbeReport> = scheduler
                        .latest_all()
                        .into_iter()
                        .map(|r| (r.peer.site.clone(), r))
                        .collect();
                    let fresh: Vec<&ProbeReport> =
                        latest.values().filter(|r| r.finished_at >= asked).collect();
                    if fresh.len() >= peers || tokio::time::Instant::now() >= deadline {
                        break fresh.into_iter().map(peer_probe).collect();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                let _ = reply.send(done);
            }
        });
    }
    Ok(Prober {
        server,
        trigger,
        peers,
        refresh_peers,
    })
}
