//! The packet-level mode: each emulated site in its own network namespace
//! behind a TUN device, as mahimahi does it, so the end hosts' kernel TCP
//! and QUIC see the link's loss, queue and delay themselves.
//!
//! - Every site of the [`Emulator`]'s links gets a namespace
//!   ([`netns`]) with loopback up and a TUN device `lh0` holding the
//!   site's address, `198.18.0.N/24` (the benchmarking range, RFC 2544;
//!   sites numbered from 1 in the order the links name them). The /24
//!   sends every other site's address into the TUN device.
//! - One reader thread per site waits on its TUN device (mio), reads every
//!   packet waiting, and offers each to the [`Pipe`] from its site to the
//!   site its destination address belongs to, in batches
//!   ([`Pipe::send_batch`]). The pipe's release thread writes the packet
//!   into the destination's TUN device when the link model releases it.
//!   There is no second link model: the proxies' pipes carry these packets.
//! - Packets for an address no site has, or between sites without a
//!   link, and anything not IPv4 are dropped and counted
//!   ([`PacketEmulator::unroutable_packets`]); IPv6 is turned off on the
//!   TUN devices, so a kernel does not send any.
//!
//! Live control (`set`, `cut`, `heal`) and the counters are the
//! [`Emulator`]'s, the same in both modes. Dropping the [`PacketEmulator`]
//! stops its readers, closes the TUN devices and removes the namespaces.
//!
//! Root, or CAP_SYS_ADMIN and CAP_NET_ADMIN, is needed;
//! [`PacketEmulator::start`] checks first and returns
//! [`EmulatorError::PacketModeUnavailable`], naming what is missing, so a
//! caller can fall back to the proxies.

pub mod netns;

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd as _;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use tun::AbstractDevice as _;

pub use netns::Namespace;

use super::pipe::{PacketSink, Payload, Pipe};
use super::{Emulator, EmulatorError, ip, socket};

/// The TUN device's name inside every site's namespace.
pub const TUN_NAME: &str = "lh0";
/// The network the sites' addresses come from (`198.18.0.0/24`).
pub const SITE_NETWORK: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);
/// At most this many sites: one /24.
pub const MAX_SITES: usize = 254;
/// Largest packet read from a TUN device.
const MAX_PACKET: usize = 65_535;

const TUN_TOKEN: Token = Token(0);
const WAKE_TOKEN: Token = Token(1);

/// Counts of emulator runs in this process, so namespace names differ.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// How the packet-level mode names and sizes what it creates.
#[derive(Debug, Clone)]
pub struct PacketOptions {
    /// Namespace names start with this (letters, digits, `_`; at most 16).
    pub prefix: String,
    /// The TUN devices' MTU: the largest IP packet the end hosts send.
    pub mtu: u16,
    /// The sites' default TCP congestion control (`reno`, `cubic`, `bbr`:
    /// one of `net.ipv4.tcp_available_congestion_control`); a new
    /// namespace otherwise takes the host's, which may be BBR, and BBR
    /// barely slows down for random loss.
    pub congestion_control: Option<String>,
}

impl Default for PacketOptions {
    fn default() -> Self {
        Self {
            prefix: "lh".to_string(),
            mtu: 1500,
            congestion_control: None,
        }
    }
}

/// One emulated site as the packet-level mode sets it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketSite {
    pub site: String,
    pub address: Ipv4Addr,
    /// The namespace's name (`ip netns exec NAME ...` runs a command there).
    pub namespace: String,
    /// The namespace's default TCP congestion control.
    pub congestion_control: String,
}

/// A site's TUN device, shared by its reader thread and the release
/// threads that write into it.
struct Tun {
    device: tun::Device,
}

impl std::fmt::Debug for Tun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tun")
            .field("fd", &self.device.as_raw_fd())
            .finish()
    }
}

impl PacketSink for Tun {
    fn send_packet(&self, packet: &[u8]) -> std::io::Result<()> {
        self.device.send(packet).map(|_| ())
    }
}

#[derive(Debug)]
struct Site {
    info: PacketSite,
    /// Dropped before the namespace (fields drop in order).
    tun: Arc<Tun>,
    namespace: Namespace,
}

#[derive(Debug)]
struct Reader {
    stop: Arc<AtomicBool>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

/// Where a reader sends packets for one destination address.
#[derive(Debug)]
struct Route {
    destination: Ipv4Addr,
    pipe: Arc<Pipe>,
    sink: Weak<dyn PacketSink>,
}

/// The packet-level emulator: namespaces, TUN devices and reader threads
/// around an [`Emulator`]'s pipes. Removes everything it created when
/// dropped.
#[derive(Debug)]
pub struct PacketEmulator {
    emulator: Emulator,
    /// Stopped and joined before the sites are dropped.
    readers: Vec<Reader>,
    sites: Vec<Site>,
    unroutable: Arc<AtomicU64>,
}

impl PacketEmulator {
    /// Checks the privileges it needs, then creates a namespace, address
    /// and TUN device per site of `emulator`'s links and starts reading.
    pub fn start(emulator: Emulator, options: &PacketOptions) -> Result<Self, EmulatorError> {
        validate(&options.prefix, options.mtu)?;
        netns::check_support()?;
        netns::remove_stale(&options.prefix);
        let mut names: Vec<String> = Vec::new();
        for pair in emulator.site_pairs() {
            for site in pair {
                if !names.contains(&site) {
                    names.push(site);
                }
            }
        }
        if names.len() > MAX_SITES {
            return Err(EmulatorError::InvalidArgument {
                field: "sites",
                message: format!(
                    "the packet-level mode emulates at most {MAX_SITES} sites, found {}",
                    names.len()
                ),
            });
        }
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let mut packet = Self {
            emulator,
            readers: Vec::new(),
            sites: Vec::with_capacity(names.len()),
            unroutable: Arc::new(AtomicU64::new(0)),
        };
        // Whatever fails from here on, dropping `packet` undoes what was
        // created so far.
        for (index, site) in names.iter().enumerate() {
            let address = site_address(index);
            let namespace =
                Namespace::create(&netns::namespace_name(&options.prefix, run, index, site))?;
            let mtu = options.mtu;
            let wanted = options.congestion_control.as_deref();
            let (tun, congestion_control) = namespace.run(|| {
                let tun = create_tun(address, mtu)?;
                Ok::<_, EmulatorError>((tun, congestion_control(wanted)?))
            })??;
            tracing::info!(%site, %address, namespace = %namespace.name(), %congestion_control, "site namespace ready");
            packet.sites.push(Site {
                info: PacketSite {
                    site: site.clone(),
                    address,
                    namespace: namespace.name().to_string(),
                    congestion_control,
                },
                tun: Arc::new(tun),
                namespace,
            });
        }
        for index in 0..packet.sites.len() {
            let reader = packet.start_reader(index)?;
            packet.readers.push(reader);
        }
        Ok(packet)
    }

    /// The emulator whose pipes carry the packets: live control and
    /// counters.
    pub fn emulator(&self) -> &Emulator {
        &self.emulator
    }

    /// Every site with its address and namespace, in address order.
    pub fn sites(&self) -> Vec<PacketSite> {
        self.sites.iter().map(|s| s.info.clone()).collect()
    }

    /// The address of `site` inside the emulated network.
    pub fn address(&self, site: &str) -> Result<Ipv4Addr, EmulatorError> {
        Ok(self.site(site)?.info.address)
    }

    /// The namespace of `site`.
    pub fn namespace(&self, site: &str) -> Result<&Namespace, EmulatorError> {
        Ok(&self.site(site)?.namespace)
    }

    /// Runs `work` on a thread inside `site`'s namespace (see
    /// [`Namespace::run`]): sockets it creates are the site's.
    pub fn run_in<T: Send>(
        &self,
        site: &str,
        work: impl FnOnce() -> T + Send,
    ) -> Result<T, EmulatorError> {
        self.namespace(site)?.run(work)
    }

    /// Starts `command` inside `site`'s namespace.
    pub fn spawn_in(&self, site: &str, command: &mut Command) -> Result<Child, EmulatorError> {
        self.namespace(site)?.spawn(command)
    }

    /// Packets dropped because no link leads where they were going (an
    /// unknown address, sites without a link, not IPv4).
    pub fn unroutable_packets(&self) -> u64 {
        self.unroutable.load(Ordering::Relaxed)
    }

    fn site(&self, site: &str) -> Result<&Site, EmulatorError> {
        self.sites
            .iter()
            .find(|s| s.info.site == site)
            .ok_or_else(|| EmulatorError::UnknownSite {
                site: site.to_string(),
            })
    }

    fn start_reader(&self, index: usize) -> Result<Reader, EmulatorError> {
        let from = &self.sites[index];
        let mut routes = Vec::new();
        for to in &self.sites {
            if to.info.site == from.info.site {
                continue;
            }
            if let Ok(pipe) = self.emulator.pipe(&from.info.site, &to.info.site) {
                let sink: Arc<dyn PacketSink> = Arc::clone(&to.tun) as Arc<dyn PacketSink>;
                routes.push(Route {
                    destination: to.info.address,
                    pipe,
                    sink: Arc::downgrade(&sink),
                });
            }
        }
        let io = |what: String| move |source| EmulatorError::Io { what, source };
        let site = from.info.site.clone();
        let poll = Poll::new().map_err(io(format!("cannot create the poller of site {site}")))?;
        let fd = from.tun.device.as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), TUN_TOKEN, Interest::READABLE)
            .map_err(io(format!("cannot watch the TUN device of site {site}")))?;
        let waker = Waker::new(poll.registry(), WAKE_TOKEN)
            .map_err(io(format!("cannot create the waker of site {site}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let loop_state = ReadLoop {
            tun: Arc::clone(&from.tun),
            routes,
            stop: Arc::clone(&stop),
            unroutable: Arc::clone(&self.unroutable),
        };
        let thread = std::thread::Builder::new()
            .name(format!("tun {site}"))
            .spawn(move || loop_state.run(poll))
            .map_err(io(format!("cannot start the TUN reader of site {site}")))?;
        Ok(Reader {
            stop,
            waker,
            thread: Some(thread),
        })
    }
}

impl Drop for PacketEmulator {
    fn drop(&mut self) {
        for reader in &self.readers {
            reader.stop.store(true, Ordering::Relaxed);
            if let Err(error) = reader.waker.wake() {
                tracing::warn!(%error, "cannot wake a TUN reader to stop it");
            }
        }
        for reader in &mut self.readers {
            if let Some(thread) = reader.thread.take() {
                let _ = thread.join();
            }
        }
        // Then `sites` drop: each TUN device closes, then its namespace
        // is removed.
    }
}

/// `198.18.0.{index + 1}`.
fn site_address(index: usize) -> Ipv4Addr {
    let host = u8::try_from(index + 1).unwrap_or(u8::MAX);
    let [a, b, c, _] = SITE_NETWORK.octets();
    Ipv4Addr::new(a, b, c, host)
}

fn validate(prefix: &str, mtu: u16) -> Result<(), EmulatorError> {
    if prefix.is_empty()
        || prefix.len() > 16
        || !prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(EmulatorError::InvalidArgument {
            field: "prefix",
            message: format!(
                "must be 1 to 16 letters, digits or `_` (it starts namespace names), found {prefix:?}"
            ),
        });
    }
    if !(576..=9000).contains(&mtu) {
        return Err(EmulatorError::InvalidArgument {
            field: "mtu",
            message: format!("must be within 576 and 9000 bytes, found {mtu}"),
        });
    }
    Ok(())
}

/// Creates the TUN device with `address`/24 and `mtu`, up, non-blocking,
/// IPv6 off. Runs inside the site's namespace.
fn create_tun(address: Ipv4Addr, mtu: u16) -> Result<Tun, EmulatorError> {
    let mut config = tun::Configuration::default();
    config
        .tun_name(TUN_NAME)
        .address(address)
        .netmask(Ipv4Addr::new(255, 255, 255, 0))
        .mtu(mtu);
    let mut device = tun::create(&config).map_err(|error| EmulatorError::Io {
        what: format!("cannot create TUN device {TUN_NAME} with address {address}"),
        source: std::io::Error::other(error.to_string()),
    })?;
    device.set_nonblock().map_err(|source| EmulatorError::Io {
        what: format!("cannot make TUN device {TUN_NAME} non-blocking"),
        source,
    })?;
    // Before the device is up, or the kernel sends router solicitations
    // and the like into it; they would only be counted as unroutable.
    let ipv6 = format!("/proc/sys/net/ipv6/conf/{TUN_NAME}/disable_ipv6");
    if let Err(error) = std::fs::write(&ipv6, "1") {
        tracing::debug!(%error, "cannot turn IPv6 off on the TUN device");
    }
    device.enabled(true).map_err(|error| EmulatorError::Io {
        what: format!("cannot bring TUN device {TUN_NAME} up"),
        source: std::io::Error::other(error.to_string()),
    })?;
    Ok(Tun { device })
}

/// Sets the namespace's default TCP congestion control, if `wanted`, and
/// returns the one in force. Runs inside the site's namespace.
fn congestion_control(wanted: Option<&str>) -> Result<String, EmulatorError> {
    const PATH: &str = "/proc/sys/net/ipv4/tcp_congestion_control";
    if let Some(wanted) = wanted {
        std::fs::write(PATH, wanted).map_err(|error| {
            // A namespace other than the host's may only default to a
            // congestion control the host allows (the kernel's EPERM).
            let message = if error.kind() == std::io::ErrorKind::PermissionDenied {
                let allowed =
                    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
                        .map(|a| a.trim().to_string())
                        .unwrap_or_default();
                format!(
                    "{wanted:?} cannot be a site namespace's default: the host allows only \
                     {allowed:?} there (net.ipv4.tcp_allowed_congestion_control; add it with \
                     `sysctl -w net.ipv4.tcp_allowed_congestion_control=\"{allowed} {wanted}\"`): {error}"
                )
            } else {
                format!(
                    "{wanted:?} is not a congestion control this kernel offers \
                     (see net.ipv4.tcp_available_congestion_control): {error}"
                )
            };
            EmulatorError::InvalidArgument {
                field: "congestion_control",
                message,
            }
        })?;
    }
    std::fs::read_to_string(PATH)
        .map(|name| name.trim().to_string())
        .map_err(|source| EmulatorError::Io {
            what: format!("cannot read {PATH}"),
            source,
        })
}

/// What one site's reader thread works with.
#[derive(Debug)]
struct ReadLoop {
    tun: Arc<Tun>,
    routes: Vec<Route>,
    stop: Arc<AtomicBool>,
    unroutable: Arc<AtomicU64>,
}

impl ReadLoop {
    fn run(self, mut poll: Poll) {
        let mut events = Events::with_capacity(4);
        let mut buffer = vec![0u8; MAX_PACKET];
        let mut batch: Vec<Payload> = Vec::with_capacity(socket::BATCH);
        let mut batch_route: Option<usize> = None;
        let mut warned = HashSet::new();
        loop {
            if let Err(error) = poll.poll(&mut events, None)
                && error.kind() != std::io::ErrorKind::Interrupted
            {
                tracing::error!(%error, "TUN reader cannot poll: it stops");
                return;
            }
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            // mio is edge-triggered: read until the device is empty.
            loop {
                let len = match self.tun.device.recv(&mut buffer) {
                    Ok(len) => len,
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the TUN device");
                        break;
                    }
                };
                let packet = &buffer[..len];
                let route = ip::destination(packet)
                    .and_then(|to| self.routes.iter().position(|r| r.destination == to));
                let Some(route) = route else {
                    self.unroutable.fetch_add(1, Ordering::Relaxed);
                    if let Some(to) = ip::destination(packet)
                        && warned.len() < 64
                        && warned.insert(to)
                    {
                        tracing::debug!(%to, "dropped a packet for an address without a link");
                    }
                    continue;
                };
                if batch_route != Some(route) || batch.len() >= socket::BATCH {
                    self.flush(batch_route, &mut batch);
                    batch_route = Some(route);
                }
                batch.push(Payload::Packet {
                    sink: Weak::clone(&self.routes[route].sink),
                    data: packet.to_vec(),
                });
            }
            self.flush(batch_route, &mut batch);
        }
    }

    fn flush(&self, route: Option<usize>, batch: &mut Vec<Payload>) {
        if let Some(route) = route
            && !batch.is_empty()
        {
            self.routes[route].pipe.send_batch(batch.drain(..));
        }
    }
}
