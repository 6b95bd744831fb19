//! Probing a set of peers every interval and on demand.
//!
//! One task runs rounds: at start, every `interval` after that, and when
//! asked ([`ProbeScheduler::probe_now`]). A round probes its peers one after
//! the other, not at once, so that throughput tests do not share this site's
//! uplink and measure each other. Each probe gets its own seed,
//! [`probe_seed`]`(options.probe.seed, peer, round)`, which its report
//! carries. The latest report per peer is kept, every report is also sent on
//! a channel (for the agent to pass to the coordinator), and metrics are
//! recorded.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::{ProbeError, ProbeOptions, ProbeResult, client, metrics};
use crate::tls::{self, AgentTls};
use longhaul_core::rng;

/// Another site's agent to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePeer {
    pub site: String,
    /// Its probe server's address.
    pub addr: SocketAddr,
}

/// How the scheduler runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerOptions {
    /// Time between the starts of scheduled rounds. Default 60 s; a round
    /// that runs longer delays the next one rather than overlapping it.
    pub interval: Duration,
    /// Options of every probe; `probe.seed` is the base of the per-probe seeds.
    pub probe: ProbeOptions,
    /// Reports buffered on the channel for a slow reader; more are dropped
    /// (with a warning) and only kept as the latest. Default 64.
    pub report_capacity: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            probe: ProbeOptions::default(),
            report_capacity: 64,
        }
    }
}

/// Why a probe failed, in a form that can be cloned and reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    /// [`ProbeError::outcome`].
    pub outcome: &'static str,
    pub message: String,
}

/// One probe's result, as the scheduler reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeReport {
    pub peer: ProbePeer,
    /// The round (1 for the first).
    pub round: u64,
    /// The seed the probe ran with.
    pub seed: u64,
    pub finished_at: SystemTime,
    pub outcome: Result<ProbeResult, ProbeFailure>,
}

/// The seed of the probe of `peer_site` in `round`.
pub fn probe_seed(base: u64, peer_site: &str, round: u64) -> u64 {
    rng::derive(base, peer_site, round)
}

/// Rounds requested on demand: `None` for every peer.
type Request = Option<String>;

/// Requests waiting while a round runs; more are folded into those.
const PENDING_REQUESTS: usize = 8;

/// A running scheduler; stops when dropped.
#[derive(Debug)]
pub struct ProbeScheduler {
    site: String,
    requests: mpsc::Sender<Request>,
    peers: Arc<Mutex<Vec<ProbePeer>>>,
    latest: Arc<Mutex<BTreeMap<String, ProbeReport>>>,
    task: JoinHandle<()>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ProbeScheduler {
    /// Checks the options and peers and starts probing (a first round right
    /// away). Returns the scheduler and the channel of reports.
    pub fn start(
        tls: AgentTls,
        peers: Vec<ProbePeer>,
        options: SchedulerOptions,
    ) -> Result<(Self, mpsc::Receiver<ProbeReport>), ProbeError> {
        options.probe.validate()?;
        if options.interval < Duration::from_millis(10) {
            return Err(ProbeError::InvalidOptions {
                field: "interval",
                message: format!("is {:?}; it must be at least 10 ms", options.interval),
            });
        }
        if options.report_capacity == 0 {
            return Err(ProbeError::InvalidOptions {
                field: "report_capacity",
                message: "must be at least 1".to_string(),
            });
        }
        check_peers(tls.site(), &peers)?;
        let (requests, request_receiver) = mpsc::channel(PENDING_REQUESTS);
        let (reports, report_receiver) = mpsc::channel(options.report_capacity);
        let peers = Arc::new(Mutex::new(peers));
        let latest = Arc::new(Mutex::new(BTreeMap::new()));
        let site = tls.site().to_string();
        let task = tokio::spawn(run(
            tls,
            options,
            Arc::clone(&peers),
            Arc::clone(&latest),
            request_receiver,
            reports,
        ));
        Ok((
            Self {
                site,
                requests,
                peers,
                latest,
                task,
            },
            report_receiver,
        ))
    }

    /// Asks for a round of every peer as soon as the current one (if any)
    /// ends. Requests made while one is already waiting are folded into it.
    pub fn probe_now(&self) -> Result<(), ProbeError> {
        self.request(None)
    }

    /// Asks for a probe of one peer, as [`ProbeScheduler::probe_now`].
    pub fn probe_peer_now(&self, site: &str) -> Result<(), ProbeError> {
        if !lock(&self.peers).iter().any(|peer| peer.site == site) {
            return Err(ProbeError::InvalidOptions {
                field: "site",
                message: format!("{site:?} is not one of the peers being probed"),
            });
        }
        self.request(Some(site.to_string()))
    }

    fn request(&self, request: Request) -> Result<(), ProbeError> {
        match self.requests.try_send(request) {
            Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(ProbeError::Scheduler(
                "the probe scheduler has stopped".to_string(),
            )),
        }
    }

    /// Replaces the peers (from the next probe on); reports of peers no
    /// longer present are forgotten. A bad list changes nothing.
    pub fn set_peers(&self, peers: Vec<ProbePeer>) -> Result<(), ProbeError> {
        check_peers(&self.site, &peers)?;
        let sites: HashSet<&str> = peers.iter().map(|peer| peer.site.as_str()).collect();
        lock(&self.latest).retain(|site, _| sites.contains(site.as_str()));
        *lock(&self.peers) = peers;
        Ok(())
    }

    /// The latest report of `site`.
    pub fn latest(&self, site: &str) -> Option<ProbeReport> {
        lock(&self.latest).get(site).cloned()
    }

    /// The latest report of every peer probed so far, by site.
    pub fn latest_all(&self) -> Vec<ProbeReport> {
        lock(&self.latest).values().cloned().collect()
    }

    /// Stops probing (a probe in progress is abandoned).
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for ProbeScheduler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn check_peers(own_site: &str, peers: &[ProbePeer]) -> Result<(), ProbeError> {
    let invalid = |message: String| {
        Err(ProbeError::InvalidOptions {
            field: "peers",
            message,
        })
    };
    let mut seen = HashSet::new();
    for peer in peers {
        tls::site_name(&peer.site)?;
        if peer.site == own_site {
            return invalid(format!("lists this agent's own site {own_site:?}"));
        }
        if !seen.insert(peer.site.as_str()) {
            return invalid(format!("lists site {:?} twice", peer.site));
        }
    }
    Ok(())
}

async fn run(
    tls: AgentTls,
    options: SchedulerOptions,
    peers: Arc<Mutex<Vec<ProbePeer>>>,
    latest: Arc<Mutex<BTreeMap<String, ProbeReport>>>,
    mut requests: mpsc::Receiver<Request>,
    reports: mpsc::Sender<ProbeReport>,
) {
    let mut ticker = tokio::time::interval(options.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut round: u64 = 0;
    loop {
        let only: Request = tokio::select! {
            _ = ticker.tick() => None,
            request = requests.recv() => match request {
                Some(request) => request,
                None => break,
            },
        };
        round += 1;
        let targets: Vec<ProbePeer> = lock(&peers)
            .iter()
            .filter(|peer| only.as_ref().is_none_or(|site| *site == peer.site))
            .cloned()
            .collect();
        for peer in targets {
            let seed = probe_seed(options.probe.seed, &peer.site, round);
            let probe_options = ProbeOptions {
                seed,
                ..options.probe.clone()
            };
            let outcome = client::probe(peer.addr, &peer.site, &tls, &probe_options).await;
            let outcome = match outcome {
                Ok(result) => {
                    tracing::info!(
                        peer = %peer.site, round, seed,
                        rtt_p50_ms = result.rtt_p50_ns as f64 / 1e6,
                        loss = result.loss_rate,
                        throughput_mbps = result.throughput_bps / 1e6,
                        "probe done"
                    );
                    metrics::record_probe(&peer.site, Ok(&result));
                    Ok(result)
                }
                Err(error) => {
                    tracing::warn!(peer = %peer.site, round, seed, %error, "probe failed");
                    metrics::record_probe(&peer.site, Err(error.outcome()));
                    Err(ProbeFailure {
                        outcome: error.outcome(),
                        message: error.to_string(),
                    })
                }
            };
            let report = ProbeReport {
                peer,
                round,
                seed,
                finished_at: SystemTime::now(),
                outcome,
            };
            {
                let mut latest = lock(&latest);
                // A peer removed while it was being probed stays removed.
                if lock(&peers).iter().any(|p| p.site == report.peer.site) {
                    latest.insert(report.peer.site.clone(), report.clone());
                }
            }
            match reports.try_send(report) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
                Err(mpsc::error::TrySendError::Full(report)) => tracing::warn!(
                    peer = %report.peer.site,
                    "probe report dropped: the report channel is full"
                ),
            }
        }
    }
}
