//! Where the rehearsal's processes live and how they, and the rehearsal's
//! console, reach each other: the emulator mode (`--mode`).
//!
//! - **proxy** (the default): every process listens on a loopback port;
//!   whatever crosses sites dials a proxy of that pair of sites
//!   ([`super::processes::Wan`]). TCP is relayed, so the processes' own TCP
//!   runs over loopback.
//! - **packet**: the packet emulator gives every site a network namespace
//!   with its address, `198.18.0.N`. Every replica and agent is started
//!   inside its site's namespace, listens on that address (fixed ports:
//!   the namespaces are new, so nothing else holds them) and reaches the
//!   others at their sites' addresses: the kernel's TCP (gRPC) and UDP
//!   (probes) run end to end through the link model, and a partition is a
//!   cut link the kernel sees.
//!
//! # How the console reaches the replicas in packet mode
//!
//! The console (leader polls, the watch, registering links and the job)
//! runs in this process, in the root namespace, which has no route to
//! `198.18.0.0/24`. Each of its connections to a replica is made from a
//! socket created *inside that replica's own namespace* (with
//! [`PacketEmulator::run_in`]) and connected to the replica's address
//! there; a socket keeps the namespace it was created in, so the rest of
//! the connection is ordinary tokio I/O in this process. That connection is
//! local to the replica's namespace and never crosses an emulated link, so
//! the console sees every replica directly and unimpaired, as it does in
//! proxy mode, and a partition cuts the sites off from each other but not
//! from the operator. Nothing is added to the emulated network (no veth,
//! route or extra site that the processes could use by mistake) and no
//! helper process runs; the cost is one short thread per connection the
//! console opens (to enter the namespace), a few a second.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use hyper_util::rt::TokioIo;
use longhaul_coordinator::process::KillOnDrop;
use longhaul_proto::v1::coordinator_client::CoordinatorClient;
use longhaul_proto::v1::site_agent_client::SiteAgentClient;
use longhaul_simulations::emulator::{Emulator, EmulatorError, PacketEmulator, PacketOptions};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::emulate::Mode;

/// Ports inside a site's namespace (packet mode): replica `i` listens on
/// `REPLICA_PORT + i`, the site's agent on `AGENT_DATA_PORT` (data and
/// probes) and `AGENT_STATUS_PORT`.
const REPLICA_PORT: u16 = 7700;
const AGENT_DATA_PORT: u16 = 7800;
const AGENT_STATUS_PORT: u16 = 7801;

/// The emulator mode of a rehearsal, cheap to clone into the processes and
/// observers. In packet mode it holds the packet emulator weakly: the
/// rehearsal owns it, so that dropping the rehearsal removes the
/// namespaces whatever task is still running.
#[derive(Debug, Clone)]
pub(super) enum Network {
    Proxy,
    Packet {
        emulator: Weak<PacketEmulator>,
        /// Each site's address, as the packet emulator gave them.
        sites: Arc<Vec<(String, Ipv4Addr)>>,
    },
}

/// Starts the packet-level mode over `emulator`, the sites' TCP with
/// `congestion_control` if given; the error names what is missing and
/// suggests `--mode proxy` when the machine cannot.
pub(super) fn start_packet(
    emulator: &Emulator,
    congestion_control: Option<&str>,
) -> anyhow::Result<Arc<PacketEmulator>> {
    let options = PacketOptions {
        congestion_control: congestion_control.map(str::to_string),
        ..PacketOptions::default()
    };
    let started = tokio::task::block_in_place(|| PacketEmulator::start(emulator.clone(), &options));
    match started {
        Ok(packet) => Ok(Arc::new(packet)),
        Err(error @ EmulatorError::PacketModeUnavailable { .. }) => {
            Err(anyhow!("--mode packet: {error} (--mode proxy)"))
        }
        Err(
            error @ EmulatorError::InvalidArgument {
                field: "congestion_control",
                ..
            },
        ) => Err(anyhow!("--congestion-control: {error}")),
        Err(error) => {
            Err(anyhow::Error::new(error).context("--mode packet: cannot set up the sites"))
        }
    }
}

impl Network {
    pub(super) fn packet(packet: &Arc<PacketEmulator>) -> Self {
        Self::Packet {
            emulator: Arc::downgrade(packet),
            sites: Arc::new(
                packet
                    .sites()
                    .into_iter()
                    .map(|s| (s.site, s.address))
                    .collect(),
            ),
        }
    }

    pub(super) fn mode(&self) -> Mode {
        match self {
            Self::Proxy => Mode::Proxy,
            Self::Packet { .. } => Mode::Packet,
        }
    }

    /// Packet mode: the address of `site`.
    fn site_address(&self, site: &str) -> anyhow::Result<Option<Ipv4Addr>> {
        match self {
            Self::Proxy => Ok(None),
            Self::Packet { sites, .. } => sites
                .iter()
                .find(|(s, _)| s == site)
                .map(|(_, a)| Some(*a))
                .ok_or_else(|| {
                    anyhow!("site {site} has no namespace: no WAN link of the topology names it")
                }),
        }
    }

    /// Where replica `index` at `site` listens.
    pub(super) fn replica_listen(&self, site: &str, index: usize) -> anyhow::Result<SocketAddr> {
        let port = u16::try_from(index)
            .ok()
            .and_then(|i| REPLICA_PORT.checked_add(i))
            .ok_or_else(|| anyhow!("too many replicas"))?;
        self.listen(site, port)
    }

    /// Where `site`'s agent listens: its data (and probe) address and its
    /// status address.
    pub(super) fn agent_listen(&self, site: &str) -> anyhow::Result<(SocketAddr, SocketAddr)> {
        Ok((
            self.listen(site, AGENT_DATA_PORT)?,
            self.listen(site, AGENT_STATUS_PORT)?,
        ))
    }

    fn listen(&self, site: &str, port: u16) -> anyhow::Result<SocketAddr> {
        match self.site_address(site)? {
            Some(address) => Ok(SocketAddr::new(IpAddr::V4(address), port)),
            None => super::processes::free_port(),
        }
    }

    /// Whether the processes reach other sites through proxies (proxy
    /// mode) or at the sites' addresses (packet mode).
    pub(super) fn uses_proxies(&self) -> bool {
        matches!(self, Self::Proxy)
    }

    /// Starts `command` at `site`: in packet mode inside the site's
    /// namespace.
    pub(super) fn spawn(
        &self,
        site: &str,
        name: String,
        command: &mut Command,
    ) -> anyhow::Result<KillOnDrop> {
        match self {
            Self::Proxy => Ok(KillOnDrop::spawn(name, command)?),
            Self::Packet { emulator, .. } => {
                let emulator = emulator
                    .upgrade()
                    .ok_or_else(|| anyhow!("cannot start {name}: the packet emulator stopped"))?;
                let child = tokio::task::block_in_place(|| {
                    emulator.run_in(site, || KillOnDrop::spawn(name.clone(), command))
                })
                .with_context(|| format!("cannot start {name} in {site}'s namespace"))??;
                Ok(child)
            }
        }
    }

    /// The console's client of the replica at `addr` (lazy; connecting is
    /// bounded by a 500 ms timeout).
    pub(super) fn client(&self, addr: SocketAddr) -> anyhow::Result<CoordinatorClient<Channel>> {
        Ok(CoordinatorClient::new(self.channel(addr)?).max_decoding_message_size(64 << 20))
    }

    /// The console's client of the status service of the agent at `addr`.
    pub(super) fn agent_client(
        &self,
        addr: SocketAddr,
    ) -> anyhow::Result<SiteAgentClient<Channel>> {
        Ok(SiteAgentClient::new(self.channel(addr)?).max_decoding_message_size(64 << 20))
    }

    /// A lazy channel to `addr`, from inside the namespace of the site it
    /// belongs to in packet mode.
    fn channel(&self, addr: SocketAddr) -> anyhow::Result<Channel> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_millis(500));
        Ok(match self {
            Self::Proxy => endpoint.connect_lazy(),
            Self::Packet { emulator, sites } => {
                let site = sites
                    .iter()
                    .find(|(_, a)| IpAddr::V4(*a) == addr.ip())
                    .map(|(s, _)| s.clone())
                    .ok_or_else(|| anyhow!("{addr} is no site's address"))?;
                let emulator = emulator.clone();
                endpoint.connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
                    connect_in(emulator.clone(), site.clone(), uri)
                }))
            }
        })
    }
}

/// Connects to `uri` from a socket created inside `site`'s namespace (see
/// the module's docs).
async fn connect_in(
    emulator: Weak<PacketEmulator>,
    site: String,
    uri: Uri,
) -> std::io::Result<TokioIo<tokio::net::TcpStream>> {
    let addr: SocketAddr = uri
        .authority()
        .and_then(|a| a.as_str().parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("{uri} names no socket address")))?;
    let socket = {
        // Held only while the socket is made, never across an await: the
        // rehearsal's reference stays the one that removes the namespaces.
        let emulator = emulator
            .upgrade()
            .ok_or_else(|| std::io::Error::other("the packet emulator stopped"))?;
        emulator
            .run_in(&site, tokio::net::TcpSocket::new_v4)
            .map_err(std::io::Error::other)??
    };
    let stream = socket.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(TokioIo::new(stream))
}
