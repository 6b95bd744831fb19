//! The `[inventory]` section of the agent's config: which source, and what
//! the scheduler cannot tell (fabric figures, campus interconnect, which
//! switches or zones form a building).
//!
//! ```toml
//! [inventory]
//! source = "slurm"                 # "static" | "slurm" | "kubernetes"
//! site = "north"
//! campus_interconnect = "25.6 Tbit/s"   # needed with more than one building
//! fabric = { kind = "rail-aligned", link_rate = "400 Gbit/s" }
//! buildings.dh2.fabric = { kind = "leaf-spine", link_rate = "400 Gbit/s", oversubscription = 2.0 }
//! gpu_aliases = { "tesla_h100" = "h100" }
//!
//! [inventory.slurm]
//! buildings = { dh1 = "block[1-8]", dh2 = "block[9-16]" }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use longhaul_core::ConfigError;
use longhaul_core::config::{self, FieldPath, Validate, Violation, check_id};
use longhaul_core::topology::{Fabric, Location};
use longhaul_core::units::Duration;
use serde::{Deserialize, Serialize};

use super::gpu::{GpuNames, is_catalogue_name};
use crate::hostlist;

/// The default deadline of one scheduler command.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The label that names a Kubernetes node's building unless configured.
pub const DEFAULT_BUILDING_LABEL: &str = "topology.kubernetes.io/zone";

/// Where the inventory comes from and what the scheduler cannot know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryConfig {
    pub source: SourceKind,
    /// The site this agent speaks for.
    pub site: String,
    /// Human name of the site (Slurm and Kubernetes sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    /// Capacity between the site's buildings; required when the scheduler
    /// shows more than one building.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub campus_interconnect: Option<longhaul_core::units::DataRate>,
    /// The fabric of every building without its own in `buildings`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<Fabric>,
    /// Per-building settings, by building id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub buildings: BTreeMap<String, BuildingConfig>,
    /// Scheduler GPU names (GRES types, product labels) → catalogue names,
    /// beyond the built-in aliases.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_aliases: BTreeMap<String, String>,
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_file: Option<StaticConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    Static,
    Slurm,
    Kubernetes,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Slurm => "slurm",
            Self::Kubernetes => "kubernetes",
        }
    }
}

/// Settings of one building.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildingConfig {
    pub fabric: Fabric,
}

/// `[inventory.static]`: a topology file and the site to take from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    /// A topology TOML file (the format of `deploy/examples/*.toml`).
    pub file: PathBuf,
}

/// `[inventory.slurm]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmConfig {
    /// The `scontrol` to run.
    #[serde(default = "default_scontrol")]
    pub scontrol: String,
    /// Deadline of each command.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// A recorded `scontrol show nodes --json` (or 22.05's `sinfo --json`)
    /// to read instead of running `scontrol`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_json: Option<PathBuf>,
    /// A recorded `scontrol -o show nodes` to read instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_text: Option<PathBuf>,
    /// `topology.conf`, or a recorded `scontrol show topology`, to read
    /// instead of running `scontrol show topology`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_file: Option<PathBuf>,
    /// Only nodes in one of these partitions; empty for every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<String>,
    /// Building id → host list of switch or block names in it
    /// (`dh1 = "block[1-8]"`). A tree node's building is the first of its
    /// switches (leaf upwards) listed here; a block's is the one listing it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub buildings: BTreeMap<String, String>,
    /// The building of nodes that `buildings` does not place. Without it a
    /// tree node's building is its top-level switch, and an unlisted block
    /// is an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_building: Option<String>,
    /// The GPU type of a GRES without a type (`gpu:8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untyped_gpu: Option<String>,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        Self {
            scontrol: default_scontrol(),
            timeout: DEFAULT_TIMEOUT,
            nodes_json: None,
            nodes_text: None,
            topology_file: None,
            partitions: Vec::new(),
            buildings: BTreeMap::new(),
            default_building: None,
            untyped_gpu: None,
        }
    }
}

/// `[inventory.kubernetes]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The `kubectl` to run (`kubectl get nodes -o json`).
    #[serde(default = "default_kubectl")]
    pub kubectl: String,
    /// Extra arguments before `get`, such as `["--context", "prod"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubectl_args: Vec<String>,
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// A node list (`kubectl get nodes -o json`) to read instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_json: Option<PathBuf>,
    /// The label whose value is the node's building.
    #[serde(default = "default_building_label")]
    pub building_label: String,
    /// Building id → the label values in it, when values are not ids
    /// themselves or several values form one building.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub buildings: BTreeMap<String, Vec<String>>,
    /// The building of nodes without the building label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_building: Option<String>,
    /// A label naming the NVLink domain (a rack) when a node has no
    /// `nvidia.com/gpu.clique`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_label: Option<String>,
    /// A label naming the node's pool, reported as its partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_label: Option<String>,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubectl: default_kubectl(),
            kubectl_args: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            nodes_json: None,
            building_label: default_building_label(),
            buildings: BTreeMap::new(),
            default_building: None,
            domain_label: None,
            pool_label: None,
        }
    }
}

fn default_scontrol() -> String {
    "scontrol".to_string()
}

fn default_kubectl() -> String {
    "kubectl".to_string()
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

fn default_building_label() -> String {
    DEFAULT_BUILDING_LABEL.to_string()
}

/// A file holding only an `[inventory]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InventoryFile {
    inventory: InventoryConfig,
}

impl Validate for InventoryFile {
    fn violations(&self) -> Vec<Violation> {
        self.inventory.check(&FieldPath::root().key("inventory"))
    }
}

impl InventoryConfig {
    /// Parses and validates a TOML document whose `[inventory]` table is
    /// this config; errors carry file, line, column and field.
    pub fn from_toml(file: &str, text: &str) -> Result<Self, ConfigError> {
        config::parse::<InventoryFile>(file, text).map(|f| f.inventory)
    }

    /// A Slurm config with everything else unset.
    pub fn slurm(site: &str, fabric: Fabric, slurm: SlurmConfig) -> Self {
        Self::new(
            SourceKind::Slurm,
            site,
            Some(fabric),
            None,
            Some(slurm),
            None,
        )
    }

    /// A Kubernetes config with everything else unset.
    pub fn kubernetes(site: &str, fabric: Fabric, kubernetes: KubernetesConfig) -> Self {
        Self::new(
            SourceKind::Kubernetes,
            site,
            Some(fabric),
            None,
            None,
            Some(kubernetes),
        )
    }

    /// A static config for `site` of the topology `file`.
    pub fn static_file(site: &str, file: impl Into<PathBuf>) -> Self {
        let file = StaticConfig { file: file.into() };
        Self::new(SourceKind::Static, site, None, Some(file), None, None)
    }

    fn new(
        source: SourceKind,
        site: &str,
        fabric: Option<Fabric>,
        static_file: Option<StaticConfig>,
        slurm: Option<SlurmConfig>,
        kubernetes: Option<KubernetesConfig>,
    ) -> Self {
        Self {
            source,
            site: site.to_string(),
            site_name: None,
            location: None,
            campus_interconnect: None,
            fabric,
            buildings: BTreeMap::new(),
            gpu_aliases: BTreeMap::new(),
            static_file,
            slurm,
            kubernetes,
        }
    }

    /// Makes relative file paths relative to `base` (the directory of the
    /// config file) instead of the working directory.
    pub fn resolve_paths(&mut self, base: &Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        if let Some(file) = &mut self.static_file {
            resolve(&mut file.file);
        }
        if let Some(slurm) = &mut self.slurm {
            for path in [
                &mut slurm.nodes_json,
                &mut slurm.nodes_text,
                &mut slurm.topology_file,
            ]
            .into_iter()
            .flatten()
            {
                resolve(path);
            }
        }
        if let Some(path) = self.kubernetes.as_mut().and_then(|k| k.nodes_json.as_mut()) {
            resolve(path);
        }
    }

    /// Every problem with this config, at paths below `at` (the path of the
    /// `[inventory]` table in the file that embeds it).
    pub fn check(&self, at: &FieldPath) -> Vec<Violation> {
        let mut out = Vec::new();
        check_id(&at.key("site"), &self.site, &mut out);
        let chosen = self.source.as_str();
        for (name, present) in [
            ("static", self.static_file.is_some()),
            ("slurm", self.slurm.is_some()),
            ("kubernetes", self.kubernetes.is_some()),
        ] {
            if present && name != chosen {
                out.push(Violation::new(
                    at.key(name),
                    format!("`{name}` settings given, but `source` is {chosen:?}"),
                ));
            }
        }
        for building in self.buildings.keys() {
            check_id(&at.key("buildings").key(building), building, &mut out);
        }
        for (alias, name) in &self.gpu_aliases {
            if !is_catalogue_name(name) {
                out.push(Violation::new(
                    at.key("gpu_aliases").key(alias),
                    format!(
                        "alias {alias:?} points at {name:?}, which is not in the GPU catalogue ({})",
                        GpuNames::new(&BTreeMap::new()).catalogue().join(", ")
                    ),
                ));
            }
        }
        match self.source {
            SourceKind::Static => self.check_static(at, &mut out),
            SourceKind::Slurm => {
                if let Some(slurm) = &self.slurm {
                    self.check_slurm(slurm, &at.key("slurm"), &mut out);
                }
            }
            SourceKind::Kubernetes => {
                if let Some(kubernetes) = &self.kubernetes {
                    check_kubernetes(kubernetes, &at.key("kubernetes"), &mut out);
                }
            }
        }
        out
    }

    fn check_static(&self, at: &FieldPath, out: &mut Vec<Violation>) {
        if self.static_file.is_none() {
            out.push(Violation::new(
                at.key("static"),
                "source \"static\" needs `[inventory.static]` with `file`",
            ));
        }
        let from_file = "comes from the static topology file, not from `[inventory]`";
        for (field, set) in [
            ("site_name", self.site_name.is_some()),
            ("location", self.location.is_some()),
            ("campus_interconnect", self.campus_interconnect.is_some()),
            ("fabric", self.fabric.is_some()),
            ("buildings", !self.buildings.is_empty()),
            ("gpu_aliases", !self.gpu_aliases.is_empty()),
        ] {
            if set {
                out.push(Violation::new(at.key(field), from_file));
            }
        }
    }

    fn check_slurm(&self, slurm: &SlurmConfig, at: &FieldPath, out: &mut Vec<Violation>) {
        check_command(&at.key("scontrol"), &slurm.scontrol, out);
        check_timeout(&at.key("timeout"), slurm.timeout, out);
        if slurm.nodes_json.is_some() && slurm.nodes_text.is_some() {
            out.push(Violation::new(
                at.key("nodes_text"),
                "give `nodes_json` or `nodes_text`, not both",
            ));
        }
        let mut owner: BTreeMap<String, &str> = BTreeMap::new();
        for (building, list) in &slurm.buildings {
            let path = at.key("buildings").key(building);
            check_id(&path, building, out);
            match hostlist::expand(list) {
                Ok(names) => {
                    for name in names {
                        if let Some(first) = owner.insert(name.clone(), building) {
                            out.push(Violation::new(
                                path.clone(),
                                format!(
                                    "{name:?} is listed in buildings {first:?} and {building:?}"
                                ),
                            ));
                        }
                    }
                }
                Err(e) => out.push(Violation::new(path, e.to_string())),
            }
        }
        if let Some(building) = &slurm.default_building {
            check_id(&at.key("default_building"), building, out);
        }
        if let Some(gpu) = &slurm.untyped_gpu {
            let names = GpuNames::new(&self.gpu_aliases);
            if names.resolve(gpu).is_none() {
                out.push(Violation::new(
                    at.key("untyped_gpu"),
                    names.unknown(gpu, "untyped_gpu"),
                ));
            }
        }
    }
}

fn check_kubernetes(kubernetes: &KubernetesConfig, at: &FieldPath, out: &mut Vec<Violation>) {
    check_command(&at.key("kubectl"), &kubernetes.kubectl, out);
    check_timeout(&at.key("timeout"), kubernetes.timeout, out);
    if kubernetes.building_label.trim().is_empty() {
        out.push(Violation::new(
            at.key("building_label"),
            "must name a node label",
        ));
    }
    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for (building, values) in &kubernetes.buildings {
        let path = at.key("buildings").key(building);
        check_id(&path, building, out);
        let mut seen = BTreeSet::new();
        for (i, value) in values.iter().enumerate() {
            let first = owner.insert(value, building);
            if !seen.insert(value) || first.is_some_and(|b| b != building) {
                out.push(Violation::new(
                    path.index(i),
                    format!(
                        "label value {value:?} is listed twice (buildings {:?} and {building:?})",
                        first.unwrap_or(building)
                    ),
                ));
            }
        }
    }
    if let Some(building) = &kubernetes.default_building {
        check_id(&at.key("default_building"), building, out);
    }
}

fn check_command(path: &FieldPath, command: &str, out: &mut Vec<Violation>) {
    if command.trim().is_empty() {
        out.push(Violation::new(path.clone(), "must name a program"));
    }
}

fn check_timeout(path: &FieldPath, timeout: Duration, out: &mut Vec<Violation>) {
    if timeout.as_nanos() == 0 {
        out.push(Violation::new(
            path.clone(),
            "must be a positive duration such as \"30 s\"",
        ));
    }
}

impl Validate for InventoryConfig {
    fn violations(&self) -> Vec<Violation> {
        self.check(&FieldPath::root())
    }
}
