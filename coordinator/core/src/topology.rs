//! The topology model: sites, buildings, scale-up domains, nodes, GPUs,
//! intra-building fabrics and WAN links, with the figures derived from them.
//!
//! Domains are described in groups of identical racks (`count` domains of
//! `nodes_per_domain` nodes with `gpus_per_node` GPUs), so a 100k-GPU site is
//! a few lines of TOML and every derived figure is computed per group, not
//! per GPU.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::config::{self, ConfigError, FieldPath, Validate, Violation, check_id};
use crate::gpu::{GpuType, builtin_gpu_types};
use crate::limits::quote;
use crate::units::{ByteSize, DataRate, Distance, Duration};

/// One-way propagation delay of light in fibre, seconds per kilometre.
pub const FIBRE_SECONDS_PER_KM: f64 = 5e-6;

/// Mean radius of the Earth, for great-circle distances.
const EARTH_RADIUS_KM: f64 = 6371.0;

/// A whole topology: the GPU types it uses, its sites and the WAN between them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub name: String,
    /// GPU types beyond the built-in catalogue (`a100`, `h100`, `h200`,
    /// `b200`, `gb200`, `gb300`, `mi300x`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_types: Vec<GpuType>,
    pub sites: Vec<Site>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<WanLink>,
}

/// A campus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Site {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    /// Aggregate capacity between the buildings of the campus, one direction.
    /// Required when the site has more than one building.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub campus_interconnect: Option<DataRate>,
    pub buildings: Vec<Building>,
}

/// Latitude and longitude in degrees.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    pub latitude: f64,
    pub longitude: f64,
}

/// A building (data hall) with one scale-out fabric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Building {
    pub id: String,
    pub fabric: Fabric,
    pub domains: Vec<DomainGroup>,
}

/// How the GPUs of a building are connected beyond their scale-up domain.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fabric {
    pub kind: FabricKind,
    /// Per-GPU injection rate into the fabric (one NIC per GPU).
    pub link_rate: DataRate,
    /// Oversubscription above the leaf: 1.0 is non-blocking, 2.0 halves the
    /// capacity that leaves a leaf.
    #[serde(default = "one")]
    pub oversubscription: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricKind {
    LeafSpine,
    RailAligned,
}

impl FabricKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LeafSpine => "leaf-spine",
            Self::RailAligned => "rail-aligned",
        }
    }
}

/// `count` identical scale-up domains (NVLink domains, NVL72 racks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainGroup {
    pub id: String,
    #[serde(default = "one_u32")]
    pub count: u32,
    pub nodes_per_domain: u32,
    pub gpus_per_node: u32,
    /// A built-in GPU type or one declared in `gpu_types`.
    pub gpu: String,
}

fn one_u32() -> u32 {
    1
}

impl DomainGroup {
    pub fn gpus_per_domain(&self) -> u64 {
        u64::from(self.nodes_per_domain) * u64::from(self.gpus_per_node)
    }
    pub fn nodes(&self) -> u64 {
        u64::from(self.count) * u64::from(self.nodes_per_domain)
    }
    pub fn gpus(&self) -> u64 {
        u64::from(self.count) * self.gpus_per_domain()
    }
}

/// A bundle of parallel WAN links between two sites.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WanLink {
    /// The two site ids, in any order.
    #[serde(deserialize_with = "site_pair")]
    pub between: [String; 2],
    /// Fibre route length (not the great-circle distance).
    pub distance: Distance,
    /// Fixed one-way delay added to propagation (transponders, switching).
    #[serde(default)]
    pub overhead: Duration,
    #[serde(default = "one_u32")]
    pub parallel_links: u32,
    /// Rate of one link.
    pub link_rate: DataRate,
    /// Packet loss probability in [0, 1).
    #[serde(default)]
    pub loss: f64,
    /// Egress buffer per link; defaults to one bandwidth-delay product.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<ByteSize>,
}

/// Deserializes exactly two site ids. serde's fixed-size arrays would accept
/// and silently drop a third element from TOML.
pub fn site_pair<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<[String; 2], D::Error> {
    let ids = Vec::<String>::deserialize(deserializer)?;
    <[String; 2]>::try_from(ids).map_err(|ids| {
        serde::de::Error::custom(format!(
            "expected an array of exactly two site ids, found {}",
            ids.len()
        ))
    })
}

pub(crate) fn site_pair_opt<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<[String; 2]>, D::Error> {
    site_pair(deserializer).map(Some)
}

/// Figures derived from a WAN link's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LinkFigures {
    /// distance × 5 µs/km + overhead.
    pub one_way_seconds: f64,
    /// 2 × one way.
    pub rtt_seconds: f64,
    /// Bytes in flight on one link at its rate: rate × RTT / 8.
    pub bdp_bytes_per_link: f64,
    /// Bytes in flight on the whole bundle.
    pub bdp_bytes_total: f64,
    /// Rate of the whole bundle, bits per second.
    pub aggregate_bits_per_second: f64,
    /// Configured buffer, or one BDP per link when none is configured.
    pub buffer_bytes: f64,
    /// How long the buffer takes to drain at the link rate.
    pub buffer_seconds: f64,
    /// Loss-limited rate of one TCP/QUIC stream with 1460-byte segments
    /// (Mathis: MSS/RTT · 1.22/√p); `None` on a loss-free link.
    pub single_stream_bits_per_second: Option<f64>,
}

impl WanLink {
    /// Propagation plus overhead, one way, in seconds.
    pub fn one_way_seconds(&self) -> f64 {
        self.distance.km() * FIBRE_SECONDS_PER_KM + self.overhead.as_secs_f64()
    }

    pub fn rtt_seconds(&self) -> f64 {
        2.0 * self.one_way_seconds()
    }

    pub fn figures(&self) -> LinkFigures {
        let rtt = self.rtt_seconds();
        let rate = self.link_rate.bits_per_second() as f64;
        let bdp = rate * rtt / 8.0;
        let buffer = self.buffer.map_or(bdp, |b| b.bytes() as f64);
        const MSS_BYTES: f64 = 1460.0;
        let single_stream = (self.loss > 0.0 && rtt > 0.0)
            .then(|| (MSS_BYTES * 8.0 / rtt) * 1.22 / self.loss.sqrt());
        LinkFigures {
            one_way_seconds: self.one_way_seconds(),
            rtt_seconds: rtt,
            bdp_bytes_per_link: bdp,
            bdp_bytes_total: bdp * f64::from(self.parallel_links),
            aggregate_bits_per_second: rate * f64::from(self.parallel_links),
            buffer_bytes: buffer,
            buffer_seconds: if rate > 0.0 { buffer * 8.0 / rate } else { 0.0 },
            single_stream_bits_per_second: single_stream,
        }
    }

    /// True when the link joins `a` and `b`, in either order.
    pub fn joins(&self, a: &str, b: &str) -> bool {
        (self.between[0] == a && self.between[1] == b)
            || (self.between[0] == b && self.between[1] == a)
    }
}

/// Great-circle distance between two locations (haversine).
pub fn great_circle_km(a: Location, b: Location) -> f64 {
    let (lat1, lat2) = (a.latitude.to_radians(), b.latitude.to_radians());
    let dlat = lat2 - lat1;
    let dlon = (b.longitude - a.longitude).to_radians();
    let h = (dlat / 2.0).sin().powi(2) + lat1.cos() * lat2.cos() * (dlon / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_KM * h.sqrt().min(1.0).asin()
}

/// Capacity figures of one level of the hierarchy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bisection {
    /// `scale-up domain`, `building`, `campus` or `wan`.
    pub level: &'static str,
    /// What the figure is for (a domain group, building, site or link).
    pub scope: String,
    /// Rate that can cross a cut splitting the scope's GPUs into two equal
    /// halves, one direction, bits per second. For a WAN link bundle it is the
    /// bundle's aggregate rate.
    pub bits_per_second: f64,
}

/// GPU, node and domain counts of one building.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BuildingSummary {
    pub id: String,
    pub gpus: u64,
    pub nodes: u64,
    pub domains: u64,
    /// GPU types and their counts.
    pub gpus_by_type: BTreeMap<String, u64>,
}

/// Counts of one site.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SiteSummary {
    pub id: String,
    pub gpus: u64,
    pub nodes: u64,
    pub domains: u64,
    pub dense_bf16_pflops: f64,
    pub hbm_bytes: f64,
    pub buildings: Vec<BuildingSummary>,
}

/// A link with its derived figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkSummary {
    pub between: [String; 2],
    pub distance_km: f64,
    pub parallel_links: u32,
    pub link_rate_bits_per_second: u64,
    pub loss: f64,
    pub figures: LinkFigures,
}

/// Everything `topology show` prints, in a form fit for JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopologySummary {
    pub name: String,
    pub gpus: u64,
    pub nodes: u64,
    pub domains: u64,
    pub sites: Vec<SiteSummary>,
    pub links: Vec<LinkSummary>,
    pub bisection: Vec<Bisection>,
}

impl Topology {
    /// Parses and validates a topology file's contents.
    pub fn from_toml(file: &str, text: &str) -> Result<Self, ConfigError> {
        config::parse(file, text)
    }

    /// Serializes to TOML that [`Topology::from_toml`] parses back equal.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// A GPU type by name: declared types first, then the built-in catalogue.
    pub fn gpu_type(&self, name: &str) -> Option<GpuType> {
        self.gpu_types
            .iter()
            .find(|t| t.name == name)
            .cloned()
            .or_else(|| builtin_gpu_types().into_iter().find(|t| t.name == name))
    }

    pub fn site(&self, id: &str) -> Option<&Site> {
        self.sites.iter().find(|s| s.id == id)
    }

    /// The link bundle between two sites, if any.
    pub fn link(&self, a: &str, b: &str) -> Option<&WanLink> {
        self.links.iter().find(|l| l.joins(a, b))
    }

    pub fn gpus(&self) -> u64 {
        self.sites.iter().map(Site::gpus).sum()
    }

    /// Counts, derived link figures and bisection per level.
    pub fn summary(&self) -> TopologySummary {
        let types: BTreeMap<String, GpuType> = self
            .sites
            .iter()
            .flat_map(|s| &s.buildings)
            .flat_map(|b| &b.domains)
            .filter_map(|d| self.gpu_type(&d.gpu).map(|t| (d.gpu.clone(), t)))
            .collect();
        let mut bisection = Vec::new();
        let sites: Vec<SiteSummary> = self
            .sites
            .iter()
            .map(|site| {
                let buildings: Vec<BuildingSummary> = site
                    .buildings
                    .iter()
                    .map(|building| {
                        let mut gpus_by_type = BTreeMap::new();
                        for group in &building.domains {
                            *gpus_by_type.entry(group.gpu.clone()).or_insert(0) += group.gpus();
                            if let Some(gpu) = types.get(&group.gpu) {
                                bisection.push(Bisection {
                                    level: "scale-up domain",
                                    scope: format!("{}/{}/{}", site.id, building.id, group.id),
                                    bits_per_second: (group.gpus_per_domain() / 2) as f64
                                        * gpu.scale_up.bits_per_second() as f64,
                                });
                            }
                        }
                        let gpus = building.gpus();
                        bisection.push(Bisection {
                            level: "building",
                            scope: format!("{}/{}", site.id, building.id),
                            bits_per_second: (gpus / 2) as f64
                                * building.fabric.link_rate.bits_per_second() as f64
                                / building.fabric.oversubscription,
                        });
                        BuildingSummary {
                            id: building.id.clone(),
                            gpus,
                            nodes: building.domains.iter().map(DomainGroup::nodes).sum(),
                            domains: building.domains.iter().map(|d| u64::from(d.count)).sum(),
                            gpus_by_type,
                        }
                    })
                    .collect();
                if let Some(interconnect) = site.campus_interconnect {
                    bisection.push(Bisection {
                        level: "campus",
                        scope: site.id.clone(),
                        bits_per_second: interconnect.bits_per_second() as f64,
                    });
                }
                let groups = || site.buildings.iter().flat_map(|b| &b.domains);
                SiteSummary {
                    id: site.id.clone(),
                    gpus: site.gpus(),
                    nodes: buildings.iter().map(|b| b.nodes).sum(),
                    domains: buildings.iter().map(|b| b.domains).sum(),
                    dense_bf16_pflops: groups()
                        .map(|g| {
                            g.gpus() as f64
                                * types.get(&g.gpu).map_or(0.0, |t| t.dense_bf16.tflops())
                                / 1000.0
                        })
                        .sum(),
                    hbm_bytes: groups()
                        .map(|g| {
                            g.gpus() as f64
                                * types.get(&g.gpu).map_or(0.0, |t| t.hbm.bytes() as f64)
                        })
                        .sum(),
                    buildings,
                }
            })
            .collect();
        let links: Vec<LinkSummary> = self
            .links
            .iter()
            .map(|link| {
                let figures = link.figures();
                bisection.push(Bisection {
                    level: "wan",
                    scope: format!("{}-{}", link.between[0], link.between[1]),
                    bits_per_second: figures.aggregate_bits_per_second,
                });
                LinkSummary {
                    between: link.between.clone(),
                    distance_km: link.distance.km(),
                    parallel_links: link.parallel_links,
                    link_rate_bits_per_second: link.link_rate.bits_per_second(),
                    loss: link.loss,
                    figures,
                }
            })
            .collect();
        TopologySummary {
            name: self.name.clone(),
            gpus: sites.iter().map(|s| s.gpus).sum(),
            nodes: sites.iter().map(|s| s.nodes).sum(),
            domains: sites.iter().map(|s| s.domains).sum(),
            sites,
            links,
            bisection,
        }
    }
}

impl Site {
    pub fn gpus(&self) -> u64 {
        self.buildings.iter().map(Building::gpus).sum()
    }

    /// The largest scale-up domain of the site, in GPUs.
    pub fn largest_domain_gpus(&self) -> u64 {
        self.buildings
            .iter()
            .flat_map(|b| &b.domains)
            .map(DomainGroup::gpus_per_domain)
            .max()
            .unwrap_or(0)
    }
}

impl Building {
    pub fn gpus(&self) -> u64 {
        self.domains.iter().map(DomainGroup::gpus).sum()
    }
}

fn check_rate(path: FieldPath, rate: DataRate, out: &mut Vec<Violation>) {
    if rate.bits_per_second() == 0 {
        out.push(Violation::new(
            path,
            "must be a positive data rate, found 0",
        ));
    }
}

fn check_count(path: FieldPath, value: u32, what: &str, out: &mut Vec<Violation>) {
    if value == 0 {
        out.push(Violation::new(
            path,
            format!("must be at least 1 {what}, found 0"),
        ));
    }
}

impl Validate for Topology {
    fn bounds(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        let sites = FieldPath::root().key("sites");
        let max = crate::limits::MAX_SITES;
        crate::limits::check_entries(&sites, self.sites.len(), max, "sites", &mut out);
        for (s, site) in self.sites.iter().enumerate() {
            crate::state::site_bounds(&sites.index(s), site, &mut out);
        }
        let links = FieldPath::root().key("links");
        let max = crate::limits::MAX_LINKS;
        crate::limits::check_entries(&links, self.links.len(), max, "links", &mut out);
        for (l, link) in self.links.iter().enumerate() {
            crate::state::link_bounds(&links.index(l), link, &mut out);
        }
        let gpu_types = FieldPath::root().key("gpu_types");
        for (i, gpu) in self.gpu_types.iter().enumerate() {
            let path = gpu_types.index(i).key("scale_up");
            crate::limits::check_rate_at_most(&path, gpu.scale_up, &mut out);
        }
        // The sum only when no site's own bounds failed: they say more.
        if out.is_empty() {
            crate::limits::check_at_most(
                &sites,
                crate::state::total_gpus(&self.sites),
                crate::limits::MAX_GPUS,
                "GPUs in all",
                &mut out,
            );
        }
        out
    }

    fn violations(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        let root = FieldPath::root();
        if self.name.trim().is_empty() {
            out.push(Violation::new(root.key("name"), "must not be empty"));
        }

        let builtin: BTreeSet<String> = builtin_gpu_types().into_iter().map(|t| t.name).collect();
        let mut declared = BTreeSet::new();
        for (i, gpu) in self.gpu_types.iter().enumerate() {
            let path = root.key("gpu_types").index(i);
            check_id(&path.key("name"), &gpu.name, &mut out);
            if builtin.contains(&gpu.name) {
                out.push(Violation::new(
                    path.key("name"),
                    format!(
                        "GPU type {:?} is built in; pick another name for a custom type",
                        gpu.name
                    ),
                ));
            } else if !declared.insert(gpu.name.clone()) {
                out.push(Violation::new(
                    path.key("name"),
                    format!("duplicate GPU type {:?}", gpu.name),
                ));
            }
            if gpu.hbm.bytes() == 0 {
                out.push(Violation::new(
                    path.key("hbm"),
                    "must be a positive size, found 0",
                ));
            }
            if gpu.dense_bf16.tflops() <= 0.0 {
                out.push(Violation::new(
                    path.key("dense_bf16"),
                    "must be a positive throughput",
                ));
            }
            check_rate(path.key("scale_up"), gpu.scale_up, &mut out);
            check_count(
                path.key("max_domain_gpus"),
                gpu.max_domain_gpus,
                "GPU",
                &mut out,
            );
        }

        if self.sites.is_empty() {
            out.push(Violation::new(
                root.key("sites"),
                "a topology needs at least one site",
            ));
        }
        let mut site_ids = BTreeSet::new();
        for (s, site) in self.sites.iter().enumerate() {
            let path = root.key("sites").index(s);
            check_id(&path.key("id"), &site.id, &mut out);
            if !site_ids.insert(site.id.as_str()) {
                out.push(Violation::new(
                    path.key("id"),
                    format!("duplicate site id {:?}", site.id),
                ));
            }
            if let Some(location) = site.location {
                let loc = path.key("location");
                if !(-90.0..=90.0).contains(&location.latitude) {
                    out.push(Violation::new(
                        loc.key("latitude"),
                        format!(
                            "must be within [-90, 90] degrees, found {}",
                            location.latitude
                        ),
                    ));
                }
                if !(-180.0..=180.0).contains(&location.longitude) {
                    out.push(Violation::new(
                        loc.key("longitude"),
                        format!(
                            "must be within [-180, 180] degrees, found {}",
                            location.longitude
                        ),
                    ));
                }
            }
            if let Some(rate) = site.campus_interconnect {
                check_rate(path.key("campus_interconnect"), rate, &mut out);
            } else if site.buildings.len() > 1 {
                out.push(Violation::new(
                    path.key("buildings"),
                    format!(
                        "site {:?} has {} buildings but no `campus_interconnect` rate between them",
                        site.id,
                        site.buildings.len()
                    ),
                ));
            }
            if site.buildings.is_empty() {
                out.push(Violation::new(
                    path.key("buildings"),
                    format!(
                        "site {:?} has no GPUs: add at least one building with domains",
                        site.id
                    ),
                ));
            }
            let mut building_ids = BTreeSet::new();
            for (b, building) in site.buildings.iter().enumerate() {
                let path = path.key("buildings").index(b);
                check_id(&path.key("id"), &building.id, &mut out);
                if !building_ids.insert(building.id.as_str()) {
                    out.push(Violation::new(
                        path.key("id"),
                        format!(
                            "duplicate building id {:?} in site {:?}",
                            building.id, site.id
                        ),
                    ));
                }
                check_rate(
                    path.key("fabric").key("link_rate"),
                    building.fabric.link_rate,
                    &mut out,
                );
                let over = building.fabric.oversubscription;
                if !(over.is_finite() && over >= 1.0) {
                    out.push(Violation::new(
                        path.key("fabric").key("oversubscription"),
                        format!(
                            "must be a ratio of at least 1.0 (1.0 is non-blocking), found {over}"
                        ),
                    ));
                }
                if building.domains.is_empty() {
                    out.push(Violation::new(
                        path.key("domains"),
                        format!("building {:?} has no scale-up domains", building.id),
                    ));
                }
                let mut domain_ids = BTreeSet::new();
                for (d, group) in building.domains.iter().enumerate() {
                    let path = path.key("domains").index(d);
                    check_id(&path.key("id"), &group.id, &mut out);
                    if !domain_ids.insert(group.id.as_str()) {
                        out.push(Violation::new(
                            path.key("id"),
                            format!(
                                "duplicate domain group id {:?} in building {:?}",
                                group.id, building.id
                            ),
                        ));
                    }
                    check_count(path.key("count"), group.count, "domain", &mut out);
                    check_count(
                        path.key("nodes_per_domain"),
                        group.nodes_per_domain,
                        "node",
                        &mut out,
                    );
                    check_count(
                        path.key("gpus_per_node"),
                        group.gpus_per_node,
                        "GPU",
                        &mut out,
                    );
                    match self.gpu_type(&group.gpu) {
                        None => out.push(Violation::new(
                            path.key("gpu"),
                            format!(
                                "unknown GPU type {}: expected one of {} or a type declared in `gpu_types`",
                                quote(&group.gpu),
                                builtin.iter().cloned().collect::<Vec<_>>().join(", ")
                            ),
                        )),
                        Some(gpu) if group.gpus_per_domain() > u64::from(gpu.max_domain_gpus) => {
                            out.push(Violation::new(
                                path.key("nodes_per_domain"),
                                format!(
                                    "a domain of {} nodes × {} GPUs = {} GPUs exceeds the scale-up reach of {:?} ({} GPUs)",
                                    group.nodes_per_domain,
                                    group.gpus_per_node,
                                    group.gpus_per_domain(),
                                    gpu.name,
                                    gpu.max_domain_gpus
                                ),
                            ))
                        }
                        Some(_) => {}
                    }
                }
            }
        }

        let mut pairs = BTreeSet::new();
        for (l, link) in self.links.iter().enumerate() {
            let path = root.key("links").index(l);
            let [a, b] = &link.between;
            for (i, id) in [a, b].into_iter().enumerate() {
                if !site_ids.contains(id.as_str()) {
                    out.push(Violation::new(
                        path.key("between").index(i),
                        format!("link to unknown site {}", quote(id)),
                    ));
                }
            }
            if a == b {
                out.push(Violation::new(
                    path.key("between"),
                    format!("a link must join two different sites, found {a:?} twice"),
                ));
            }
            let pair = if a <= b {
                (a.clone(), b.clone())
            } else {
                (b.clone(), a.clone())
            };
            if a != b && !pairs.insert(pair) {
                out.push(Violation::new(
                    path.key("between"),
                    format!("duplicate link between {a:?} and {b:?}: describe parallel links with `parallel_links`"),
                ));
            }
            check_count(
                path.key("parallel_links"),
                link.parallel_links,
                "link",
                &mut out,
            );

            check_rate(path.key("link_rate"), link.link_rate, &mut out);
            if !(link.loss.is_finite() && (0.0..1.0).contains(&link.loss)) {
                out.push(Violation::new(
                    path.key("loss"),
                    format!(
                        "must be a probability in [0, 1) (write 1% as 0.01), found {}",
                        link.loss
                    ),
                ));
            }
            if link.buffer.is_some_and(|b| b.bytes() == 0) {
                out.push(Violation::new(
                    path.key("buffer"),
                    "must be a positive size, found 0",
                ));
            }
            let locations = (
                self.site(a).and_then(|s| s.location),
                self.site(b).and_then(|s| s.location),
            );
            if let (Some(la), Some(lb)) = locations {
                let geodesic = great_circle_km(la, lb);
                // Fibre follows roads and rail; it can be longer than the
                // great circle, never shorter (1% slack for rounded coordinates).
                if link.distance.km() < geodesic * 0.99 {
                    out.push(Violation::new(
                        path.key("distance"),
                        format!(
                            "fibre route of {} km is shorter than the {:.0} km great-circle distance between {a:?} and {b:?}",
                            link.distance.km(),
                            geodesic
                        ),
                    ));
                }
            }
        }
        out
    }
}
