//! Turning a site's assignment into what its scheduler understands: a Slurm
//! batch script ([`slurm`]) or a Kubernetes JobSet ([`kubernetes`]), always
//! available as files ([`write_dry_run`]), submitted to Slurm where one is
//! configured ([`slurm::submit`]).
//!
//! # How ranks reach their GPUs
//!
//! The coordinator binds every rank to a GPU of a node, named by its place
//! in the site's compressed topology. [`resolve`] turns each binding into a
//! host with the inventory, refusing any binding it cannot resolve (never a
//! guessed host). The result is the **rank table**, one line per rank,
//! `rank node gpu`, ordered by node (natural order) and GPU, after a `#`
//! header line. Both renderings launch one process per rank and give it:
//!
//! - `RANK` (global rank), `LOCAL_RANK` (its GPU on the node), `WORLD_SIZE`;
//! - `MASTER_ADDR` / `MASTER_PORT` when rank 0 runs on this site;
//! - `LONGHAUL_JOB`, `LONGHAUL_SITE`, `LONGHAUL_REVISION`,
//!   `LONGHAUL_WORLD_SIZE`, `LONGHAUL_TP`, `LONGHAUL_PP`, `LONGHAUL_DP`,
//!   `LONGHAUL_MODE`, `LONGHAUL_INNER_STEPS`, `LONGHAUL_STAGES` and
//!   `LONGHAUL_REPLICAS` (index ranges such as `0-8`), `LONGHAUL_NODE`, and
//!   `LONGHAUL_RANK_TABLE` (the path of the table).
//!
//! The configured command then runs under `bash -c`. A per-node launcher
//! such as `torchrun` cannot be used: it numbers ranks node by node, while
//! a pipeline split across sites gives each site ranks that are not
//! contiguous.

pub mod kubernetes;
mod options;
pub mod slurm;
mod yaml;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::assignment::{AssignmentError, SiteAssignment};
use crate::hostlist;
use crate::inventory::{Inventory, Node};

pub use options::{
    DEFAULT_COMMAND, DEFAULT_RENDEZVOUS_PORT, KubernetesOptions, RenderOptions, SlurmOptions,
    SlurmTopology, Target,
};

/// Why an assignment could not be rendered or submitted.
#[derive(Debug, Error)]
pub enum RenderError {
    #[error(transparent)]
    Assignment(#[from] AssignmentError),
    #[error("option `{field}`: {reason}")]
    InvalidOption { field: &'static str, reason: String },
    #[error("the assignment is for site {assignment:?} but the inventory is of site {inventory:?}")]
    SiteMismatch {
        assignment: String,
        inventory: String,
    },
    #[error("the assignment places no rank on site {site:?}; there is nothing to run")]
    NoRanks { site: String },
    #[error(
        "rank {rank} is bound to (building {building:?}, domain group {domain_group:?}, \
         domain {domain}, node {node}), which is not in the site's inventory"
    )]
    UnknownNode {
        rank: u64,
        building: String,
        domain_group: String,
        domain: u64,
        node: u64,
    },
    #[error(
        "rank {rank} is bound to (building {building:?}, domain group {domain_group:?}, \
         domain {domain}, node {node}), which the inventory lists twice ({first:?} and \
         {second:?})"
    )]
    AmbiguousNode {
        rank: u64,
        building: String,
        domain_group: String,
        domain: u64,
        node: u64,
        first: String,
        second: String,
    },
    #[error("rank {rank} is bound to GPU {gpu} of node {node:?}, which has {gpus} GPUs")]
    GpuOutOfRange {
        rank: u64,
        node: String,
        gpu: u32,
        gpus: u32,
    },
    #[error(
        "rank {rank} is bound to node {node:?}, whose name cannot be used in a hostlist or \
         manifest ({reason})"
    )]
    InvalidNodeName {
        rank: u64,
        node: String,
        reason: &'static str,
    },
    #[error(
        "node name {node:?} names two places in the inventory, {first} and {second}, both \
         with ranks (rank {rank} on the second)"
    )]
    NodeNameReused {
        rank: u64,
        node: String,
        first: String,
        second: String,
    },
    #[error(
        "no Slurm partition contains all {nodes} assigned nodes ({hostlist}); \
         set `slurm.partition`"
    )]
    NoCommonPartition { nodes: usize, hostlist: String },
    #[error(
        "{what} {name:?} is {length} characters, more than Kubernetes allows ({limit}); {hint}"
    )]
    NameTooLong {
        what: &'static str,
        name: String,
        length: usize,
        limit: usize,
        hint: &'static str,
    },
    #[error(
        "the rank table is {bytes} bytes, more than a ConfigMap holds ({limit}); \
         render this site for Slurm, or split the job"
    )]
    RankTableTooLarge { bytes: usize, limit: usize },
    #[error("path {path:?} is not valid UTF-8, so it cannot be written into a script")]
    NonUtf8Path { path: PathBuf },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not run {program}: {source}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} did not finish within {seconds:.1} s and was killed; stderr: {stderr}")]
    Timeout {
        program: PathBuf,
        seconds: f64,
        stderr: String,
    },
    #[error("{program} failed ({status}): {stderr}")]
    SbatchFailed {
        program: PathBuf,
        status: String,
        stderr: String,
    },
    #[error(
        "cannot read sbatch --parsable output {output:?}: expected `<job id>` or \
         `<job id>;<cluster>`"
    )]
    SbatchOutput { output: String },
}

/// One node of the site with the ranks bound to it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedNode<'a> {
    pub node: &'a Node,
    /// `(rank, gpu)` pairs, by GPU.
    pub ranks: Vec<(u64, u32)>,
}

/// An assignment resolved against the inventory: every node with ranks, in
/// natural order of their names.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedAssignment<'a> {
    pub assignment: &'a SiteAssignment,
    pub inventory: &'a Inventory,
    pub nodes: Vec<PlacedNode<'a>>,
}

type Place<'a> = (&'a str, &'a str, u64, u64);

/// Validates `assignment` and binds each of its ranks to an inventory node.
/// Fails, naming the rank, when a binding points at a node the inventory
/// does not have (or has twice), at a GPU the node does not have, or at a
/// node whose name cannot be written into a hostlist or manifest.
pub fn resolve<'a>(
    assignment: &'a SiteAssignment,
    inventory: &'a Inventory,
) -> Result<ResolvedAssignment<'a>, RenderError> {
    assignment.validate()?;
    if assignment.site_id != inventory.site.id {
        return Err(RenderError::SiteMismatch {
            assignment: assignment.site_id.clone(),
            inventory: inventory.site.id.clone(),
        });
    }
    if assignment.ranks.is_empty() {
        return Err(RenderError::NoRanks {
            site: assignment.site_id.clone(),
        });
    }
    // One pass over the inventory instead of a search per rank: sites have
    // tens of thousands of GPUs.
    let mut by_place: HashMap<Place<'a>, (&'a Node, Option<&'a Node>)> = HashMap::new();
    for node in &inventory.nodes {
        let place = (
            node.building.as_str(),
            node.domain_group.as_str(),
            node.domain,
            node.node,
        );
        by_place
            .entry(place)
            .and_modify(|entry| {
                entry.1.get_or_insert(node);
            })
            .or_insert((node, None));
    }

    let mut placed: BTreeMap<Place<'a>, PlacedNode<'a>> = BTreeMap::new();
    for binding in &assignment.ranks {
        let place = (
            binding.building.as_str(),
            binding.domain_group.as_str(),
            binding.domain,
            binding.node,
        );
        let node = match by_place.get(&place) {
            None => {
                return Err(RenderError::UnknownNode {
                    rank: binding.rank,
                    building: binding.building.clone(),
                    domain_group: binding.domain_group.clone(),
                    domain: binding.domain,
                    node: binding.node,
                });
            }
            Some((first, Some(second))) => {
                return Err(RenderError::AmbiguousNode {
                    rank: binding.rank,
                    building: binding.building.clone(),
                    domain_group: binding.domain_group.clone(),
                    domain: binding.domain,
                    node: binding.node,
                    first: first.name.clone(),
                    second: second.name.clone(),
                });
            }
            Some((node, None)) => *node,
        };
        if binding.gpu >= node.gpus {
            return Err(RenderError::GpuOutOfRange {
                rank: binding.rank,
                node: node.name.clone(),
                gpu: binding.gpu,
                gpus: node.gpus,
            });
        }
        if let Err(reason) = check_node_name(&node.name) {
            return Err(RenderError::InvalidNodeName {
                rank: binding.rank,
                node: node.name.clone(),
                reason,
            });
        }
        placed
            .entry(place)
            .or_insert_with(|| PlacedNode {
                node,
                ranks: Vec::new(),
            })
            .ranks
            .push((binding.rank, binding.gpu));
    }

    let mut names: HashMap<&str, Place<'a>> = HashMap::new();
    for (place, placed_node) in &placed {
        if let Some(other) = names.insert(placed_node.node.name.as_str(), *place) {
            let rank = placed_node.ranks.first().map_or(0, |&(rank, _)| rank);
            return Err(RenderError::NodeNameReused {
                rank,
                node: placed_node.node.name.clone(),
                first: describe_place(other),
                second: describe_place(*place),
            });
        }
    }

    let mut nodes: Vec<PlacedNode<'a>> = placed.into_values().collect();
    for node in &mut nodes {
        node.ranks.sort_by_key(|&(_, gpu)| gpu);
    }
    nodes.sort_by(|a, b| hostlist::natural_cmp(&a.node.name, &b.node.name));
    Ok(ResolvedAssignment {
        assignment,
        inventory,
        nodes,
    })
}

fn describe_place((building, domain_group, domain, node): Place<'_>) -> String {
    format!("(building {building:?}, domain group {domain_group:?}, domain {domain}, node {node})")
}

/// Node names go into hostlists, rank tables, shell scripts and Kubernetes
/// label values: letters, digits, `-`, `.` and `_` only.
fn check_node_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > 253 {
        return Err("it is longer than 253 characters");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err("only letters, digits, '-', '.' and '_' are allowed");
    }
    Ok(())
}

impl ResolvedAssignment<'_> {
    /// The rank table: a `#` header line, then `rank node gpu` per rank,
    /// by node (natural order) and GPU.
    pub fn rank_table(&self) -> String {
        let a = self.assignment;
        let mut out = format!(
            "# longhaul rank table: job {} site {} revision {}: rank node gpu\n",
            a.job_id, a.site_id, a.revision
        );
        for placed in &self.nodes {
            for &(rank, gpu) in &placed.ranks {
                out.push_str(&format!("{rank} {} {gpu}\n", placed.node.name));
            }
        }
        out
    }

    /// Every rank's node, in rank-table order: line i is the host of row i.
    pub fn host_file(&self) -> String {
        let mut out = String::new();
        for placed in &self.nodes {
            for _ in &placed.ranks {
                out.push_str(&placed.node.name);
                out.push('\n');
            }
        }
        out
    }

    /// The compressed hostlist of the assigned nodes.
    pub fn hostlist(&self) -> String {
        hostlist::compress(self.nodes.iter().map(|n| n.node.name.as_str()))
    }

    /// Ranks on this site.
    pub fn rank_count(&self) -> usize {
        self.nodes.iter().map(|n| n.ranks.len()).sum()
    }

    /// Most ranks on one node.
    pub fn max_ranks_per_node(&self) -> usize {
        self.nodes.iter().map(|n| n.ranks.len()).max().unwrap_or(0)
    }

    /// The node that runs rank 0, when it runs here.
    pub fn rank_zero_node(&self) -> Option<&str> {
        self.nodes
            .iter()
            .find(|n| n.ranks.iter().any(|&(rank, _)| rank == 0))
            .map(|n| n.node.name.as_str())
    }

    /// Nodes per scale-up domain of a domain group, from the site model
    /// the inventory registered (counted from the node list when the model
    /// lacks the group).
    pub fn nodes_per_domain(&self, building: &str, domain_group: &str) -> u64 {
        self.inventory
            .site
            .buildings
            .iter()
            .filter(|b| b.id == building)
            .flat_map(|b| &b.domains)
            .find(|g| g.id == domain_group)
            .map(|g| u64::from(g.nodes_per_domain))
            .unwrap_or_else(|| {
                let domains: BTreeSet<u64> = self
                    .inventory
                    .nodes
                    .iter()
                    .filter(|n| n.building == building && n.domain_group == domain_group)
                    .map(|n| n.domain)
                    .collect();
                let nodes = self
                    .inventory
                    .nodes
                    .iter()
                    .filter(|n| n.building == building && n.domain_group == domain_group)
                    .count();
                u64::try_from(nodes / domains.len().max(1)).unwrap_or(1)
            })
    }

    /// The `LONGHAUL_*` variables common to every rank (not the per-rank
    /// ones, nor `LONGHAUL_RANK_TABLE`, whose path differs per scheduler).
    pub(crate) fn job_environment(&self) -> Vec<(&'static str, String)> {
        let a = self.assignment;
        vec![
            ("LONGHAUL_JOB", a.job_id.clone()),
            ("LONGHAUL_SITE", a.site_id.clone()),
            ("LONGHAUL_REVISION", a.revision.to_string()),
            ("LONGHAUL_WORLD_SIZE", a.world_size.to_string()),
            ("LONGHAUL_TP", a.tensor_parallel.to_string()),
            ("LONGHAUL_PP", a.pipeline_parallel.to_string()),
            ("LONGHAUL_DP", a.data_parallel.to_string()),
            ("LONGHAUL_EP", a.expert_parallel.to_string()),
            ("LONGHAUL_MODE", a.mode.clone()),
            ("LONGHAUL_INNER_STEPS", a.inner_steps.to_string()),
            ("LONGHAUL_STAGES", hostlist::index_ranges(&a.stages)),
            ("LONGHAUL_REPLICAS", hostlist::index_ranges(&a.replicas)),
            ("WORLD_SIZE", a.world_size.to_string()),
        ]
    }
}

/// File names of one assignment's dry run, in the order they are written.
pub fn dry_run_file_names(assignment: &SiteAssignment, targets: &[Target]) -> Vec<String> {
    let stem = format!("{}-r{}", assignment.job_id, assignment.revision);
    let mut names = vec![format!("{stem}.ranks")];
    if targets.contains(&Target::Slurm) {
        names.push(format!("{stem}.hosts"));
        names.push(format!("{stem}.sbatch"));
    }
    if targets.contains(&Target::Kubernetes) {
        names.push(format!("{stem}.jobset.yaml"));
    }
    names
}

/// Renders the assignment for every target in `options.targets` and writes
/// the files into `dir` (created if missing): `<job>-r<revision>.ranks`
/// (the rank table), and for Slurm `.hosts` (its host file) and `.sbatch`,
/// for Kubernetes `.jobset.yaml`. Returns their paths.
///
/// Everything is rendered before anything is written, so invalid input
/// leaves `dir` untouched. Each file is written to a temporary name, synced
/// and renamed into place, so a reader never sees a partial file; if any
/// write fails, the temporary files are removed. The batch script names the
/// rank table and host file by absolute path: `dir` must be on a file system
/// the compute nodes share.
pub fn write_dry_run(
    dir: &Path,
    assignment: &SiteAssignment,
    inventory: &Inventory,
    options: &RenderOptions,
) -> Result<Vec<PathBuf>, RenderError> {
    options.validate()?;
    let resolved = resolve(assignment, inventory)?;
    let dir = std::path::absolute(dir).map_err(|source| RenderError::Io {
        action: "resolving",
        path: dir.to_path_buf(),
        source,
    })?;
    let names = dry_run_file_names(assignment, &options.targets);
    let path_of = |suffix: &str| {
        names
            .iter()
            .find(|n| n.ends_with(suffix))
            .map(|n| dir.join(n))
    };

    let mut files: Vec<(PathBuf, String)> = Vec::new();
    let rank_table_path = dir.join(&names[0]);
    files.push((rank_table_path.clone(), resolved.rank_table()));
    if let (Some(hosts_path), Some(sbatch_path)) = (path_of(".hosts"), path_of(".sbatch")) {
        let paths = slurm::ScriptPaths {
            rank_table: utf8(&rank_table_path)?,
            host_file: utf8(&hosts_path)?,
        };
        let script = slurm::render_resolved(&resolved, options, &paths)?;
        files.push((hosts_path, resolved.host_file()));
        files.push((sbatch_path, script));
    }
    if let Some(jobset_path) = path_of(".jobset.yaml") {
        files.push((
            jobset_path,
            kubernetes::render_resolved(&resolved, options)?,
        ));
    }

    fs::create_dir_all(&dir).map_err(|source| RenderError::Io {
        action: "creating",
        path: dir.clone(),
        source,
    })?;
    write_all_atomically(&dir, &files)?;
    Ok(files.into_iter().map(|(path, _)| path).collect())
}

fn utf8(path: &Path) -> Result<&str, RenderError> {
    path.to_str().ok_or_else(|| RenderError::NonUtf8Path {
        path: path.to_path_buf(),
    })
}

/// Writes every file under a temporary name first, then renames them all
/// into place and syncs the directory.
fn write_all_atomically(dir: &Path, files: &[(PathBuf, String)]) -> Result<(), RenderError> {
    let mut temps: Vec<PathBuf> = Vec::new();
    let cleanup = |temps: &[PathBuf]| {
        for temp in temps {
            // Best effort: the error being reported matters more.
            let _ = fs::remove_file(temp);
        }
    };
    for (path, contents) in files {
        let temp = crate::atomic::temp_beside(path);
        temps.push(temp.clone());
        if let Err(source) = crate::atomic::write_synced(&temp, contents.as_bytes()) {
            cleanup(&temps);
            return Err(RenderError::Io {
                action: "writing",
                path: temp,
                source,
            });
        }
    }
    for (index, ((path, _), temp)) in files.iter().zip(&temps).enumerate() {
        if let Err(source) = fs::rename(temp, path) {
            cleanup(&temps[index..]);
            return Err(RenderError::Io {
                action: "renaming into",
                path: path.clone(),
                source,
            });
        }
    }
    crate::atomic::sync_dir(dir).map_err(|source| RenderError::Io {
        action: "syncing",
        path: dir.to_path_buf(),
        source,
    })
}
