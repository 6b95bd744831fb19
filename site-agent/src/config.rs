//! The agent's TOML config.
//!
//! ```toml
//! site = "north"
//! # Coordinator replicas; any may be a follower or down.
//! coordinators = ["https://10.0.0.1:7700", "https://10.0.0.2:7700", "https://10.0.0.3:7700"]
//! data_listen = "0.0.0.0:7800"      # QUIC, for probes and exchanges with other agents
//! data_advertise = "10.1.0.5:7800"  # what other agents dial (default: data_listen)
//! status_listen = "127.0.0.1:7900"  # `site-agent status`
//! metrics_listen = "127.0.0.1:9800" # Prometheus, optional
//! state_dir = "/var/lib/longhaul-agent"
//!
//! [tls]                             # or `plaintext = true`, for local use only
//! ca = "ca.pem"
//! cert = "north.pem"                # names north.site.longhaul
//! key = "north.key"
//!
//! [inventory]                       # see the inventory module
//! source = "slurm"
//! site = "north"
//! fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
//!
//! [render]                          # see the render module; files go to state_dir/rendered
//! command = "python -u train.py"
//!
//! [submit]                          # optional: submit rendered Slurm scripts
//! sbatch = "sbatch"
//!
//! [probe]                           # optional; every field has a default
//! socket_buffer = "32 MiB"          # UDP buffers of the agent's QUIC sockets
//!
//! [exchange]                        # optional; every field has a default
//! synthetic_elements = 4_000_000    # rehearsals: a seeded pseudo-gradient per fragment
//! link_rate = "1 Gbit/s"            # sizes the QUIC windows and UDP buffers
//! link_rtt = "50 ms"
//! congestion = "cubic"              # or "dedicated", for links the job owns; "new-reno" or "bbr" (quinn's, to evaluate)
//!
//! [trainer]                         # optional: trainers hand the agent their pseudo-gradients
//! socket = "/run/longhaul/north.sock"  # the local trainer API (or `listen`, TCP loopback)
//! shm_dir = "/dev/shm"              # where trainers' tensors are
//! session_ttl = "30 s"              # a silent trainer's rank is released after this
//! ```
//!
//! Relative paths are relative to the config file's directory.
//!
//! [`AgentConfig::to_toml`] writes a config back as this TOML (what was set,
//! without the defaults), so programs that start agents build the value and
//! write it rather than composing text; `from_toml` reads it back equal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use longhaul_core::ConfigError;
use longhaul_core::config::{FieldPath, Validate, Violation, check_id};
use longhaul_core::units::{ByteSize, DataRate, Duration};
use serde::{Deserialize, Serialize};

use crate::inventory::InventoryConfig;
use crate::render::RenderOptions;

/// Where the agent listens for probes unless configured.
pub const DEFAULT_DATA_LISTEN: &str = "127.0.0.1:7800";
/// Where the agent serves its status unless configured.
pub const DEFAULT_STATUS_LISTEN: &str = "127.0.0.1:7900";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The site this agent speaks for.
    pub site: String,
    /// Coordinator replica URLs (`http://` in plaintext, `https://` with TLS).
    pub coordinators: Vec<String>,
    /// Run without TLS. For local use only: nothing is authenticated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plaintext: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
    #[serde(default = "default_data_listen")]
    pub data_listen: SocketAddr,
    /// The address other agents dial; `data_listen` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_advertise: Option<SocketAddr>,
    #[serde(default = "default_status_listen")]
    pub status_listen: SocketAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// Where the agent keeps its progress and rendered files
    /// (default `.longhaul-agent/<site>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// Time between inventory rescans (default 30 s).
    #[serde(default = "default_rescan")]
    pub rescan_interval: Duration,
    /// Bound on one call to the coordinator (default 5 s).
    #[serde(default = "default_call_timeout")]
    pub call_timeout: Duration,
    pub inventory: InventoryConfig,
    #[serde(default, skip_serializing_if = "is_default")]
    pub render: RenderOptions,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit: Option<SubmitConfig>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub probe: ProbeConfig,
    #[serde(default, skip_serializing_if = "is_default")]
    pub exchange: ExchangeConfig,
    /// The local trainer API; when set, the agent takes part in its jobs'
    /// outer rounds with what its trainers submit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer: Option<TrainerConfig>,
}

/// The local trainer API (`trainer.proto`): the site's training processes
/// submit their pseudo-gradients and collect the averages through it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerConfig {
    /// The Unix socket the API is served on (created; an old socket file
    /// at the path is replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// A TCP loopback address to serve it on as well (or instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// The directory of the trainers' shared-memory tensors (default
    /// `/dev/shm`).
    #[serde(default = "default_shm_dir")]
    pub shm_dir: PathBuf,
    /// A trainer silent this long loses its rank (default 30 s).
    #[serde(default = "default_session_ttl")]
    pub session_ttl: Duration,
}

fn default_shm_dir() -> PathBuf {
    PathBuf::from("/dev/shm")
}

fn default_session_ttl() -> Duration {
    Duration::from_secs(30)
}

impl TrainerConfig {
    /// Served on `socket`, with the defaults.
    pub fn on_socket(socket: PathBuf) -> Self {
        Self {
            socket: Some(socket),
            listen: None,
            shm_dir: default_shm_dir(),
            session_ttl: default_session_ttl(),
        }
    }

    fn violations(&self, at: &FieldPath, exchange: &ExchangeConfig, out: &mut Vec<Violation>) {
        if self.socket.is_none() && self.listen.is_none() {
            out.push(Violation::new(
                at.key("socket"),
                "is missing: give `socket` (a Unix socket path) or `listen` (a TCP loopback address)",
            ));
        }
        if let Some(listen) = self.listen
            && !listen.ip().is_loopback()
        {
            out.push(Violation::new(
                at.key("listen"),
                format!("{listen} is not a loopback address: the trainer API is local to the site's machine"),
            ));
        }
        if !(1_000_000_000..=3_600_000_000_000).contains(&self.session_ttl.as_nanos()) {
            out.push(Violation::new(
                at.key("session_ttl"),
                "must be between 1 s and 1 h",
            ));
        }
        if exchange.synthetic_elements.is_some() {
            out.push(Violation::new(
                FieldPath::root().key("exchange").key("synthetic_elements"),
                "is set but so is [trainer]: the agent contributes either synthetic pseudo-gradients or its trainers', not both",
            ));
        }
    }
}

/// Whether a section is all defaults, and so need not be written.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Link probes to the other sites' agents (QUIC, on `data_listen`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeConfig {
    /// Probe the other sites at all (the probe server runs regardless, so
    /// that the others can probe this one). Default true.
    pub enabled: bool,
    /// Time between probe rounds (default 60 s).
    pub interval: Duration,
    /// Echoed datagrams for the RTT (default 20).
    pub pings: u32,
    /// Datagrams of the loss test; 0 skips it (default 500).
    pub loss_datagrams: u32,
    /// Length of the throughput test; 0 skips it (default 1 s). Long fat
    /// links need longer to leave slow start.
    pub throughput_duration: Duration,
    /// Parallel streams of the throughput test (default 8).
    pub throughput_streams: u32,
    /// Base of every probe's seed (default 0); each probe's seed is logged.
    pub seed: u64,
    /// Receive and send buffer of the agent's QUIC sockets (the data
    /// endpoint, at least this, and the probe clients), default 32 MiB, between 208 KiB and 1 GiB. Granted
    /// past `net.core.rmem_max` only with `CAP_NET_ADMIN`; the log says
    /// what the kernel granted.
    pub socket_buffer: ByteSize,
    /// Where to reach some sites' agents, for probes and the exchange,
    /// instead of the address they registered (site id → host:port), e.g.
    /// through a NAT or the rehearsal's emulated links.
    pub peer_addresses: std::collections::BTreeMap<String, SocketAddr>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        let defaults = crate::probe::ProbeOptions::default();
        Self {
            enabled: true,
            interval: Duration::from_secs(60),
            pings: defaults.pings,
            loss_datagrams: defaults.loss_datagrams,
            throughput_duration: Duration::from_nanos(
                defaults.throughput_duration.as_nanos() as u64
            ),
            throughput_streams: defaults.throughput_streams,
            seed: defaults.seed,
            socket_buffer: ByteSize::from_bytes(defaults.transport.socket_buffer_bytes as u64),
            peer_addresses: std::collections::BTreeMap::new(),
        }
    }
}

impl ProbeConfig {
    /// The scheduler's options.
    pub fn scheduler_options(&self) -> crate::probe::SchedulerOptions {
        let std = std::time::Duration::from;
        let probe = crate::probe::ProbeOptions {
            pings: self.pings,
            loss_datagrams: self.loss_datagrams,
            throughput_duration: std(self.throughput_duration),
            throughput_streams: self.throughput_streams,
            seed: self.seed,
            transport: crate::probe::QuicTuning {
                socket_buffer_bytes: usize::try_from(self.socket_buffer.bytes())
                    .unwrap_or(usize::MAX),
                ..crate::probe::QuicTuning::default()
            },
            ..crate::probe::ProbeOptions::default()
        };
        // The probe's own deadline: its schedule with room to spare.
        let timeout = probe.schedule() * 2 + std::time::Duration::from_secs(5);
        crate::probe::SchedulerOptions {
            interval: std(self.interval),
            probe: crate::probe::ProbeOptions { timeout, ..probe },
            ..crate::probe::SchedulerOptions::default()
        }
    }
}

/// The pseudo-gradient exchange with the other sites' agents (QUIC, on
/// `data_listen` beside the probes; peers at the address they registered
/// or `probe.peer_addresses`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExchangeConfig {
    /// Take part in the outer rounds of the jobs this site is a replica
    /// of, with a synthetic pseudo-gradient of this many f32 values per
    /// fragment (seeded from `seed`, the job, the round, the fragment and
    /// the site; between 1 and 2^28): rehearsals and benchmarks of the
    /// links. Unset (the default): the agent contributes what its trainers
    /// submit (`[trainer]`), or, without that, serves its peers' exchanges
    /// but contributes to no round.
    pub synthetic_elements: Option<u64>,
    /// Base of the synthetic pseudo-gradients' seeds (default 0).
    pub seed: u64,
    /// Connections to each peer, each with its own congestion controller
    /// (default 4, at most 64).
    pub connections_per_peer: u32,
    /// The rate and round trip of the links, for the QUIC windows and UDP
    /// buffers (default 1 Gbit/s and 50 ms).
    pub link_rate: DataRate,
    pub link_rtt: Duration,
    /// Pace what is sent to each peer at this rate (a dedicated link's
    /// planned share); unset: congestion control alone (default).
    pub pacing: Option<DataRate>,
    /// A peer with no working connection this long is given up on for
    /// the fragment (default 15 s): the round's deadline excludes it.
    pub peer_timeout: Duration,
    /// `cubic` (default; backs off on every loss, right on a shared path)
    /// or `dedicated` (for links the job owns: each connection holds its
    /// share of 1.25 × the link's bandwidth-delay product through random
    /// loss; it does not back off for other traffic), or for evaluation
    /// `new-reno` (quinn's NewReno) or `bbr` (quinn's experimental BBR).
    pub congestion: crate::exchange::Congestion,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        let defaults = crate::exchange::ExchangeOptions::default();
        Self {
            synthetic_elements: None,
            seed: 0,
            connections_per_peer: defaults.connections_per_peer,
            link_rate: DataRate::from_bits_per_second(defaults.link_rate_bits_per_second),
            link_rtt: Duration::from_nanos(defaults.link_rtt.as_nanos() as u64),
            pacing: None,
            peer_timeout: Duration::from_nanos(defaults.peer_timeout.as_nanos() as u64),
            congestion: defaults.congestion,
        }
    }
}

impl ExchangeConfig {
    /// The exchange node's options.
    pub fn options(&self) -> crate::exchange::ExchangeOptions {
        crate::exchange::ExchangeOptions {
            connections_per_peer: self.connections_per_peer,
            link_rate_bits_per_second: self.link_rate.bits_per_second(),
            link_rtt: self.link_rtt.into(),
            pacing_bytes_per_second: self.pacing.map(|r| r.bits_per_second() / 8),
            peer_timeout: self.peer_timeout.into(),
            congestion: self.congestion,
            ..crate::exchange::ExchangeOptions::default()
        }
    }

    fn violations(&self, at: &FieldPath, out: &mut Vec<Violation>) {
        if let Some(elements) = self.synthetic_elements
            && !(1..=crate::rounds::MAX_SYNTHETIC_ELEMENTS).contains(&elements)
        {
            out.push(Violation::new(
                at.key("synthetic_elements"),
                format!(
                    "is {elements}; it must be between 1 and {}",
                    crate::rounds::MAX_SYNTHETIC_ELEMENTS
                ),
            ));
        }
        if let Err(crate::exchange::ExchangeError::InvalidOptions { field, message }) =
            self.options().validate()
        {
            let field = match field {
                "link_rate_bits_per_second" => "link_rate",
                "pacing_bytes_per_second" => "pacing",
                other => other,
            };
            out.push(Violation::new(at.key(field), message));
        }
    }
}

/// PEM files for mutual TLS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The CA that signs the coordinators' and agents' certificates.
    pub ca: PathBuf,
    /// This agent's certificate; it names `<site>.site.longhaul`.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Submission of rendered Slurm scripts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitConfig {
    /// The sbatch program (default `sbatch` on `PATH`).
    #[serde(default = "default_sbatch")]
    pub sbatch: PathBuf,
    /// Extra arguments before the script (e.g. `["--hold"]`).
    #[serde(default)]
    pub args: Vec<String>,
    /// How long sbatch may take (default 60 s).
    #[serde(default = "default_submit_timeout")]
    pub timeout: Duration,
}

fn default_data_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7800))
}
fn default_status_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7900))
}
fn default_rescan() -> Duration {
    Duration::from_secs(30)
}
fn default_call_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_sbatch() -> PathBuf {
    PathBuf::from("sbatch")
}
fn default_submit_timeout() -> Duration {
    Duration::from_secs(60)
}

impl Validate for AgentConfig {
    fn violations(&self) -> Vec<Violation> {
        let root = FieldPath::root();
        let mut out = Vec::new();
        check_id(&root.key("site"), &self.site, &mut out);
        if self.inventory.site != self.site {
            out.push(Violation::new(
                root.key("inventory").key("site"),
                format!(
                    "is {:?} but the agent is for site {:?}",
                    self.inventory.site, self.site
                ),
            ));
        }
        if self.coordinators.is_empty() {
            out.push(Violation::new(
                root.key("coordinators"),
                "is empty: list at least one coordinator replica URL",
            ));
        }
        let scheme = if self.tls.is_some() {
            "https://"
        } else {
            "http://"
        };
        longhaul_core::limits::check_entries(
            &root.key("coordinators"),
            self.coordinators.len(),
            longhaul_core::limits::MAX_COORDINATOR_URLS,
            "URLs",
            &mut out,
        );
        for (i, url) in self.coordinators.iter().enumerate() {
            if let Some(problem) = longhaul_core::limits::url_problem(url) {
                out.push(Violation::new(root.key("coordinators").index(i), problem));
            } else if !url.starts_with(scheme) {
                out.push(Violation::new(
                    root.key("coordinators").index(i),
                    format!(
                        "{url:?} must start with {scheme} (TLS is {})",
                        if self.tls.is_some() { "on" } else { "off" }
                    ),
                ));
            }
        }
        match (&self.tls, self.plaintext) {
            (Some(_), true) => out.push(Violation::new(
                root.key("plaintext"),
                "is true but [tls] is set too: choose one",
            )),
            (None, false) => out.push(Violation::new(
                root.key("tls"),
                "is missing: give [tls] ca/cert/key for mutual TLS, or set `plaintext = true` for local use",
            )),
            _ => {}
        }
        for (name, value) in [
            ("rescan_interval", self.rescan_interval),
            ("call_timeout", self.call_timeout),
        ] {
            if value.as_nanos() < 1_000_000 {
                out.push(Violation::new(root.key(name), "must be at least 1 ms"));
            }
        }
        if self.status_listen == self.data_listen {
            out.push(Violation::new(
                root.key("status_listen"),
                "is the same address as `data_listen`",
            ));
        }
        out.extend(self.inventory.check(&root.key("inventory")));
        let socket_buffer = self.probe.socket_buffer.bytes();
        if !usize::try_from(socket_buffer)
            .is_ok_and(|bytes| crate::probe::SOCKET_BUFFER_RANGE.contains(&bytes))
        {
            out.push(Violation::new(
                root.key("probe").key("socket_buffer"),
                format!(
                    "is {socket_buffer} bytes; it must be between 208 KiB (the kernel's default) and 1 GiB"
                ),
            ));
        } else if let Err(error) = self.probe.scheduler_options().probe.validate() {
            out.push(Violation::new(root.key("probe"), error.to_string()));
        }
        if self.probe.interval.as_nanos() < 10_000_000 {
            out.push(Violation::new(
                root.key("probe").key("interval"),
                "must be at least 10 ms",
            ));
        }
        self.exchange.violations(&root.key("exchange"), &mut out);
        if let Some(trainer) = &self.trainer {
            trainer.violations(&root.key("trainer"), &self.exchange, &mut out);
        }
        if let Err(error) = self.render.validate() {
            out.push(Violation::new(root.key("render"), error.to_string()));
        }
        out
    }
}

/// `a/b/../c` as `a/c`, without touching the file system (so paths
/// shown to operators read as they would write them).
fn lexically_clean(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

impl AgentConfig {
    /// A config for `site` with the parser's defaults for everything not
    /// given. It has neither `[tls]` nor `plaintext = true` (the parser has
    /// no default for that choice either): set one before use.
    pub fn new(
        site: impl Into<String>,
        coordinators: Vec<String>,
        data_listen: SocketAddr,
        status_listen: SocketAddr,
        inventory: InventoryConfig,
    ) -> Self {
        Self {
            site: site.into(),
            coordinators,
            plaintext: false,
            tls: None,
            data_listen,
            data_advertise: None,
            status_listen,
            metrics_listen: None,
            state_dir: None,
            rescan_interval: default_rescan(),
            call_timeout: default_call_timeout(),
            inventory,
            render: RenderOptions::default(),
            submit: None,
            probe: ProbeConfig::default(),
            exchange: ExchangeConfig::default(),
            trainer: None,
        }
    }

    /// The config as the TOML that [`AgentConfig::from_toml`] reads back to
    /// an equal value; sections left at their defaults are omitted. Fails
    /// on a path that is not UTF-8.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// Parses and checks a config file's text; relative paths are resolved
    /// against `base` (the file's directory).
    pub fn from_toml(file: &str, text: &str, base: &Path) -> Result<Self, ConfigError> {
        let mut config: AgentConfig = longhaul_core::config::parse(file, text)?;
        config.inventory.resolve_paths(base);
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = lexically_clean(&base.join(&*p));
            }
        };
        if let Some(tls) = config.tls.as_mut() {
            resolve(&mut tls.ca);
            resolve(&mut tls.cert);
            resolve(&mut tls.key);
        }
        if let Some(dir) = config.state_dir.as_mut() {
            resolve(dir);
        }
        if let Some(trainer) = config.trainer.as_mut() {
            if let Some(socket) = trainer.socket.as_mut() {
                resolve(socket);
            }
            resolve(&mut trainer.shm_dir);
        }
        Ok(config)
    }

    /// The state directory, defaulted.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!(".longhaul-agent/{}", self.site)))
    }

    /// The address other agents dial.
    pub fn data_address(&self) -> SocketAddr {
        self.data_advertise.unwrap_or(self.data_listen)
    }
}

#[cfg(test)]
#[path = "config_inputs_tests.rs"]
mod input_tests;

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
