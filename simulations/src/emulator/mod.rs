//! The real-time emulator: real processes talk through emulated links whose
//! packets go through the [link model](crate::link), in one of two modes:
//! the proxy mode (loopback proxies, no privileges; its TCP is a relay, so
//! the end hosts' TCP never sees a loss) and the packet-level mode
//! ([`packet`], Linux and root: each site in a network namespace behind a
//! TUN device, so kernel TCP and QUIC see the link end to end). Both use
//! the same pipes below, and the same control API.
//!
//! - [`Emulator`] holds, for every emulated link (a pair of sites), one
//!   [`Pipe`] per direction: a [`Link`](crate::link::Link) driven by the wall
//!   clock, with one release thread that sleeps until the link's next wake-up
//!   and releases every due packet ([`pipe`] says why a thread).
//! - [`UdpProxy`] (for QUIC) and [`TcpProxy`] (for gRPC) listen on a loopback
//!   address and forward to a target: requests go through the pipe from the
//!   client's site to the target's site, replies through the reverse pipe.
//!   UDP datagrams are packets; a TCP byte stream is cut into chunks of at
//!   most [`TCP_CHUNK_BYTES`], and a dropped chunk is retransmitted after a
//!   timeout (see [`tcp`]), since TCP never loses bytes.
//! - [`control`] serves `longhaul.v1.EmulatorControl`: list links with their
//!   counters, change rate, loss and delay live, cut and heal links or sites.
//!
//! Every link direction's RNG seed derives from one emulator seed and the
//! direction's name ([`direction_seed`]), so a seed replays the same fates for
//! the same traffic (real traffic's timing still varies run to run).

mod clock;
pub mod control;
mod ip;
mod lateness;
pub mod metrics;
#[cfg(target_os = "linux")]
pub mod packet;
pub mod pipe;
pub mod socket;
pub mod tcp;
pub mod udp;

use std::net::SocketAddr;
use std::sync::Arc;

use longhaul_core::scenario::Scenario;
use longhaul_core::topology::Topology;
use longhaul_core::units::Duration;

pub use clock::Clock;
pub use lateness::{LatenessHistogram, LatenessSummary};
#[cfg(target_os = "linux")]
pub use packet::{PacketEmulator, PacketOptions, PacketSite};
pub use pipe::{LinkChange, PacketSink, Payload, Pipe, PipeStatus};
pub use tcp::{TCP_CHUNK_BYTES, TcpProxy};
pub use udp::UdpProxy;

use crate::link::{Jitter, JitterMode, Link, LinkConfig, LinkConfigError, LossModel};

/// Why an emulator operation failed. Messages name the offending field,
/// site or address.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("link {link}: {source}")]
    LinkConfig {
        link: String,
        #[source]
        source: LinkConfigError,
    },
    #[error("no emulated link between {site_a:?} and {site_b:?}")]
    UnknownLink { site_a: String, site_b: String },
    #[error("no emulated link touches site {site:?}")]
    UnknownSite { site: String },
    #[error("`{field}` {message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },
    /// The packet-level mode cannot run here; the proxy mode can.
    #[error(
        "the packet-level emulator cannot run here: missing {missing}; run as root, or use the \
         proxy mode, which needs no privileges"
    )]
    PacketModeUnavailable { missing: String },
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
}

/// One emulated link: two sites and the configuration of each direction.
#[derive(Debug, Clone)]
pub struct LinkSpec {
    pub sites: [String; 2],
    /// From `sites[0]` to `sites[1]`.
    pub forward: LinkConfig,
    /// From `sites[1]` to `sites[0]`.
    pub backward: LinkConfig,
}

impl LinkSpec {
    /// The same configuration both ways.
    pub fn symmetric(site_a: &str, site_b: &str, config: LinkConfig) -> Self {
        Self {
            sites: [site_a.to_string(), site_b.to_string()],
            forward: config.clone(),
            backward: config,
        }
    }
}

/// The link specs of a scenario: one per WAN link of its topology (one
/// link of the bundle: [`LinkConfig::from_wan_link`]), with the scenario's
/// impairments applied (loss replaces the link's loss, jitter is added in
/// FIFO mode, rate replaces the link rate). The scenario's timeline is not
/// played here: that is the rehearsal harness's job.
pub fn scenario_links(topology: &Topology, scenario: Option<&Scenario>) -> Vec<LinkSpec> {
    topology
        .links
        .iter()
        .map(|wan| {
            let mut config = LinkConfig::from_wan_link(wan);
            for impairment in scenario.into_iter().flat_map(|s| s.impairments_of(wan)) {
                if let Some(loss) = impairment.loss {
                    config.loss = if loss > 0.0 {
                        LossModel::Bernoulli { p: loss }
                    } else {
                        LossModel::None
                    };
                }
                if let Some(max) = impairment.jitter {
                    config.jitter = Some(Jitter {
                        max,
                        mode: JitterMode::Fifo,
                    });
                }
                if let Some(rate) = impairment.rate {
                    config.rate = Some(rate);
                }
            }
            LinkSpec::symmetric(&wan.between[0], &wan.between[1], config)
        })
        .collect()
}

fn same_pair(a: &[String; 2], b: &[String; 2]) -> bool {
    (a[0] == b[0] && a[1] == b[1]) || (a[0] == b[1] && a[1] == b[0])
}

/// The seed of one link direction: SplitMix64 of the emulator seed mixed with
/// the FNV-1a hash of `"from->to"`, so it depends on the names only, not on
/// the order links are listed in.
pub fn direction_seed(seed: u64, from: &str, to: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in from.bytes().chain(*b"->").chain(to.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = (seed ^ hash).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Debug)]
struct Duplex {
    sites: [String; 2],
    forward: Arc<Pipe>,
    backward: Arc<Pipe>,
}

#[derive(Debug)]
struct Inner {
    seed: u64,
    links: Vec<Duplex>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for duplex in &self.links {
            duplex.forward.shutdown();
            duplex.backward.shutdown();
        }
    }
}

/// A set of emulated links sharing one clock. Cheap to clone; the release
/// threads stop when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Emulator {
    inner: Arc<Inner>,
}

impl Emulator {
    /// Validates every link and starts one release thread per direction.
    pub fn new(seed: u64, specs: Vec<LinkSpec>) -> Result<Self, EmulatorError> {
        let clock = Clock::new();
        let mut links: Vec<Duplex> = Vec::with_capacity(specs.len());
        for spec in specs {
            let [a, b] = &spec.sites;
            if a == b {
                return Err(EmulatorError::InvalidArgument {
                    field: "sites",
                    message: format!("a link joins two different sites, found {a:?} twice"),
                });
            }
            if links.iter().any(|d| same_pair(&d.sites, &spec.sites)) {
                return Err(EmulatorError::InvalidArgument {
                    field: "sites",
                    message: format!("two links between {a:?} and {b:?}"),
                });
            }
            let start = |from: &str, to: &str, config: LinkConfig| {
                let link = Link::new(config, direction_seed(seed, from, to)).map_err(|source| {
                    EmulatorError::LinkConfig {
                        link: format!("{from}->{to}"),
                        source,
                    }
                })?;
                Pipe::start(from, to, link, clock)
            };
            let forward = start(a, b, spec.forward)?;
            let backward = start(b, a, spec.backward)?;
            links.push(Duplex {
                sites: spec.sites,
                forward,
                backward,
            });
        }
        Ok(Self {
            inner: Arc::new(Inner { seed, links }),
        })
    }

    pub fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// The direction from `from` to `to`.
    pub fn pipe(&self, from: &str, to: &str) -> Result<Arc<Pipe>, EmulatorError> {
        self.inner
            .links
            .iter()
            .find_map(|d| {
                if d.sites[0] == from && d.sites[1] == to {
                    Some(Arc::clone(&d.forward))
                } else if d.sites[1] == from && d.sites[0] == to {
                    Some(Arc::clone(&d.backward))
                } else {
                    None
                }
            })
            .ok_or_else(|| EmulatorError::UnknownLink {
                site_a: from.to_string(),
                site_b: to.to_string(),
            })
    }

    /// Every link direction, in link order, forward before backward.
    pub fn statuses(&self) -> Vec<PipeStatus> {
        self.inner
            .links
            .iter()
            .flat_map(|d| [d.forward.status(), d.backward.status()])
            .collect()
    }

    /// The site pairs with a link, in order.
    pub fn site_pairs(&self) -> Vec<[String; 2]> {
        self.inner.links.iter().map(|d| d.sites.clone()).collect()
    }

    /// The directions a request names: `site_a → site_b` (and back unless
    /// `one_way`), or with no `site_b`, every direction touching `site_a`.
    pub fn select(
        &self,
        site_a: &str,
        site_b: Option<&str>,
        one_way: bool,
    ) -> Result<Vec<Arc<Pipe>>, EmulatorError> {
        if site_a.is_empty() {
            return Err(EmulatorError::InvalidArgument {
                field: "site",
                message: "is required: name a site of the scenario".to_string(),
            });
        }
        match site_b {
            Some(site_b) => {
                let forward = self.pipe(site_a, site_b)?;
                if one_way {
                    Ok(vec![forward])
                } else {
                    Ok(vec![forward, self.pipe(site_b, site_a)?])
                }
            }
            None => {
                let pipes: Vec<_> = self
                    .inner
                    .links
                    .iter()
                    .filter(|d| d.sites.iter().any(|s| s == site_a))
                    .flat_map(|d| [Arc::clone(&d.forward), Arc::clone(&d.backward)])
                    .filter(|p| !one_way || p.from_site() == site_a)
                    .collect();
                if pipes.is_empty() {
                    return Err(EmulatorError::UnknownSite {
                        site: site_a.to_string(),
                    });
                }
                Ok(pipes)
            }
        }
    }

    /// Applies a change to the named directions; checks it against all of
    /// them first, so a bad change alters nothing.
    pub fn set(
        &self,
        site_a: &str,
        site_b: &str,
        one_way: bool,
        change: &LinkChange,
    ) -> Result<Vec<PipeStatus>, EmulatorError> {
        if site_a.is_empty() {
            return Err(EmulatorError::InvalidArgument {
                field: "site_a",
                message: "is required: name one end of the link".to_string(),
            });
        }
        if site_b.is_empty() {
            return Err(EmulatorError::InvalidArgument {
                field: "site_b",
                message: "is required: name the other end of the link".to_string(),
            });
        }
        if change.is_empty() {
            return Err(EmulatorError::InvalidArgument {
                field: "rate_bits_per_second",
                message: "nothing to change: set at least one of `rate_bits_per_second`, `loss`, `extra_delay_ns`".to_string(),
            });
        }
        let pipes = self.select(site_a, Some(site_b), one_way)?;
        for pipe in &pipes {
            pipe.check(change)?;
        }
        for pipe in &pipes {
            pipe.apply(change)?;
        }
        Ok(pipes.iter().map(|p| p.status()).collect())
    }

    /// Cuts (`down`) or heals the link between `site` and `peer`, or every
    /// link of `site`; returns the direction ids changed.
    pub fn set_down(
        &self,
        site: &str,
        peer: Option<&str>,
        down: bool,
    ) -> Result<Vec<String>, EmulatorError> {
        let pipes = self.select(site, peer, false)?;
        for pipe in &pipes {
            pipe.set_down(down);
        }
        Ok(pipes.iter().map(|p| p.id()).collect())
    }

    /// Starts a UDP proxy on `listen` that forwards to `target`, for clients
    /// at site `from` reaching a service at site `to`.
    pub async fn udp_proxy(
        &self,
        from: &str,
        to: &str,
        listen: SocketAddr,
        target: SocketAddr,
    ) -> Result<UdpProxy, EmulatorError> {
        UdpProxy::start(listen, target, self.pipe(from, to)?, self.pipe(to, from)?).await
    }

    /// Starts a TCP proxy on `listen` that forwards to `target`, for clients
    /// at site `from` reaching a service at site `to`.
    pub async fn tcp_proxy(
        &self,
        from: &str,
        to: &str,
        listen: SocketAddr,
        target: SocketAddr,
    ) -> Result<TcpProxy, EmulatorError> {
        TcpProxy::start(listen, target, self.pipe(from, to)?, self.pipe(to, from)?).await
    }

    /// A TCP and a UDP proxy on the same port of `host` (a free one), both to
    /// `target`: one address reaches the service over either protocol.
    pub async fn expose(
        &self,
        from: &str,
        to: &str,
        host: std::net::IpAddr,
        target: SocketAddr,
    ) -> Result<(TcpProxy, UdpProxy), EmulatorError> {
        let mut last_error = None;
        // A port free for TCP may be taken for UDP: try a few.
        for _ in 0..16 {
            let tcp = self
                .tcp_proxy(from, to, SocketAddr::new(host, 0), target)
                .await?;
            match self.udp_proxy(from, to, tcp.local_addr(), target).await {
                Ok(udp) => return Ok((tcp, udp)),
                Err(error) => last_error = Some(error),
            }
        }
        Err(
            last_error.unwrap_or_else(|| EmulatorError::InvalidArgument {
                field: "listen",
                message: "no port free for both TCP and UDP".to_string(),
            }),
        )
    }
}

/// `Duration` in a readable form for logs and the address map.
pub fn human_ns(ns: u64) -> String {
    longhaul_core::units::human_seconds(Duration::from_nanos(ns).as_secs_f64())
}
