//! What can go wrong while discovering an inventory. Every message names the
//! object at fault (a node, block, switch, building or config field); bad
//! inventory is reported in full, every problem at once, never just the first.

use std::fmt;
use std::path::PathBuf;

use longhaul_core::ConfigError;
use longhaul_core::config::Violation;

use super::Unmapped;

/// The kind of a [`Problem`], for callers (and tests) that act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProblemKind {
    /// Two nodes share a name (or one node is listed twice).
    DuplicateNode,
    /// A node's GPU counts disagree: Slurm GRES vs the node's configured
    /// TRES, or the Kubernetes `nvidia.com/gpu.count` label vs the node's
    /// `nvidia.com/gpu` capacity.
    GpuCountMismatch,
    /// A GPU type that is neither in the catalogue nor an alias of one.
    UnknownGpuType,
    /// One node with GPUs of more than one type.
    MixedGpuTypes,
    /// A node in two blocks or two leaf switches.
    InTwoDomains,
    /// Nodes of one scale-up domain disagree on GPU type or count.
    DomainMismatch,
    /// Nodes of one scale-up domain are in different buildings.
    DomainSpansBuildings,
    /// A value the scheduler reported could not be read (a GRES string, a
    /// label, a switch hierarchy).
    Unreadable,
    /// A building without a valid id or without a fabric.
    Building,
    /// The compressed site breaks a rule of the topology model (checked by
    /// the core's own validation, such as a domain beyond its GPU's reach).
    ModelRule,
}

/// One thing wrong with the inventory, naming the object at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The node (or block, switch, building) at fault, as the scheduler names it.
    pub object: String,
    pub kind: ProblemKind,
    pub message: String,
}

impl Problem {
    pub fn new(object: impl Into<String>, kind: ProblemKind, message: impl Into<String>) -> Self {
        Self {
            object: object.into(),
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}

/// Why an inventory could not be discovered.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The `[inventory]` config is wrong; paths are relative to that table.
    #[error("invalid inventory config: {}", violation_list(.violations))]
    Config { violations: Vec<Violation> },
    /// The static source's topology file did not parse or validate.
    #[error(transparent)]
    TopologyFile(#[from] ConfigError),
    #[error("site {site:?} is not in {file} (it has {available})")]
    SiteNotFound {
        file: String,
        site: String,
        available: String,
    },
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An external command could not start, failed or ran out of time.
    #[error("`{command}` {reason}{}", stderr_suffix(.stderr))]
    Command {
        command: String,
        reason: String,
        /// What the command wrote to stderr (trimmed, bounded).
        stderr: String,
    },
    /// Output or a file that is not in the expected format at all.
    #[error("{what}: {message}")]
    Malformed { what: String, message: String },
    /// The scheduler's inventory has problems; all of them are listed.
    #[error("inventory from {source_name} has {} problem(s):\n{}", .problems.len(), problem_list(.problems))]
    Invalid {
        source_name: String,
        problems: Vec<Problem>,
    },
    /// Not one GPU node could be mapped.
    #[error("inventory from {source_name} has no usable GPU node ({} seen, all unmapped){}", .unmapped.len(), unmapped_list(.unmapped))]
    Empty {
        source_name: String,
        unmapped: Vec<Unmapped>,
    },
}

impl InventoryError {
    /// The problems of an [`InventoryError::Invalid`], empty otherwise.
    pub fn problems(&self) -> &[Problem] {
        match self {
            Self::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }
}

fn violation_list(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("field `{}`: {}", v.path, v.message))
        .collect::<Vec<_>>()
        .join("; ")
}

fn problem_list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn unmapped_list(unmapped: &[Unmapped]) -> String {
    const SHOWN: usize = 10;
    let mut text: String = unmapped
        .iter()
        .take(SHOWN)
        .map(|u| format!("\n  {}: {}", u.object, u.reason))
        .collect();
    if unmapped.len() > SHOWN {
        text.push_str(&format!("\n  ... and {} more", unmapped.len() - SHOWN));
    }
    text
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; stderr: {stderr}")
    }
}
