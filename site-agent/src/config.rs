//! The agent's TOML config.
//!
//! ```toml
//! site = "north"
//! # Coordinator replicas; any may be a follower or down.
//! coordinators = ["https://10.0.0.1:7700", "https://10.0.0.2:7700", "https://10.0.0.3:7700"]
//! data_listen = "0.0.0.0:7800"      # QUIC, for probes from other agents
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
//! ```
//!
//! Relative paths are relative to the config file's directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use longhaul_core::ConfigError;
use longhaul_core::config::{FieldPath, Validate, Violation, check_id};
use longhaul_core::units::Duration;
use serde::Deserialize;

use crate::inventory::InventoryConfig;
use crate::render::RenderOptions;

/// Where the agent listens for probes unless configured.
pub const DEFAULT_DATA_LISTEN: &str = "127.0.0.1:7800";
/// Where the agent serves its status unless configured.
pub const DEFAULT_STATUS_LISTEN: &str = "127.0.0.1:7900";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The site this agent speaks for.
    pub site: String,
    /// Coordinator replica URLs (`http://` in plaintext, `https://` with TLS).
    pub coordinators: Vec<String>,
    /// Run without TLS. For local use only: nothing is authenticated.
    #[serde(default)]
    pub plaintext: bool,
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    #[serde(default = "default_data_listen")]
    pub data_listen: SocketAddr,
    /// The address other agents dial; `data_listen` when unset.
    #[serde(default)]
    pub data_advertise: Option<SocketAddr>,
    #[serde(default = "default_status_listen")]
    pub status_listen: SocketAddr,
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// Where the agent keeps its progress and rendered files
    /// (default `.longhaul-agent/<site>`).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// Time between inventory rescans (default 30 s).
    #[serde(default = "default_rescan")]
    pub rescan_interval: Duration,
    /// Bound on one call to the coordinator (default 5 s).
    #[serde(default = "default_call_timeout")]
    pub call_timeout: Duration,
    pub inventory: InventoryConfig,
    #[serde(default)]
    pub render: RenderOptions,
    #[serde(default)]
    pub submit: Option<SubmitConfig>,
    #[serde(default)]
    pub probe: ProbeConfig,
}

/// Link probes to the other sites' agents (QUIC, on `data_listen`).
#[derive(Debug, Clone, Deserialize)]
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
    /// Where to reach some sites' agents instead of the address they
    /// registered (site id → host:port), e.g. through a NAT or the
    /// rehearsal's emulated links.
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

/// PEM files for mutual TLS.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The CA that signs the coordinators' and agents' certificates.
    pub ca: PathBuf,
    /// This agent's certificate; it names `<site>.site.longhaul`.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Submission of rendered Slurm scripts.
#[derive(Debug, Clone, Deserialize)]
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
        for (i, url) in self.coordinators.iter().enumerate() {
            if !url.starts_with(scheme) {
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
        if let Err(error) = self.probe.scheduler_options().probe.validate() {
            out.push(Violation::new(root.key("probe"), error.to_string()));
        }
        if self.probe.interval.as_nanos() < 10_000_000 {
            out.push(Violation::new(
                root.key("probe").key("interval"),
                "must be at least 10 ms",
            ));
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
mod tests {
    use super::*;

    const GOOD: &str = r#"
site = "north"
coordinators = ["http://127.0.0.1:7700", "http://127.0.0.1:7701"]
plaintext = true

[inventory]
source = "static"
site = "north"
static = { file = "topology.toml" }
"#;

    #[test]
    fn a_good_config_parses_with_defaults_and_resolved_paths() {
        let config =
            AgentConfig::from_toml("agent.toml", GOOD, Path::new("/etc/longhaul")).unwrap();
        assert_eq!(config.data_listen.to_string(), DEFAULT_DATA_LISTEN);
        assert_eq!(config.status_listen.to_string(), DEFAULT_STATUS_LISTEN);
        assert_eq!(config.state_dir(), PathBuf::from(".longhaul-agent/north"));
        assert_eq!(
            config.inventory.static_file.as_ref().unwrap().file,
            PathBuf::from("/etc/longhaul/topology.toml")
        );
    }

    #[test]
    fn relative_paths_are_cleaned_lexically() {
        assert_eq!(
            lexically_clean(Path::new("deploy/agents/../../.data/./x")),
            PathBuf::from(".data/x")
        );
        assert_eq!(
            lexically_clean(Path::new("../a/../b")),
            PathBuf::from("../b")
        );
        assert_eq!(
            lexically_clean(Path::new("/a/b/../c")),
            PathBuf::from("/a/c")
        );
    }

    #[test]
    fn every_bad_setting_is_named_with_its_line() {
        let bad = r#"
site = "North!"
coordinators = ["https://127.0.0.1:7700"]
call_timeout = "0 s"

[inventory]
source = "static"
site = "south"
static = { file = "topology.toml" }
"#;
        let error = AgentConfig::from_toml("agent.toml", bad, Path::new(".")).unwrap_err();
        let text = error.to_string();
        for expected in [
            "agent.toml:2:8: field `site`",
            "field `inventory.site`: is \"south\" but the agent is for site \"North!\"",
            "field `coordinators[0]`: \"https://127.0.0.1:7700\" must start with http://",
            "field `tls`: is missing",
            "field `call_timeout`: must be at least 1 ms",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
        let unknown = AgentConfig::from_toml(
            "agent.toml",
            &GOOD.replace("plaintext = true", "plaintext = true\nlease = 3"),
            Path::new("."),
        )
        .unwrap_err();
        assert!(unknown.to_string().contains("lease"), "{unknown}");
    }
}
