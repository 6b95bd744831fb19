//! The Slurm rendering: a batch script that allocates exactly the nodes the
//! coordinator assigned and starts one task per rank on its bound node, and
//! [`submit`], which hands a script to `sbatch`.
//!
//! # The allocation
//!
//! `--nodes` and `--nodelist` (compressed, see [`super::hostlist`]) pin the
//! nodes; `--gpus-per-node` and `--ntasks-per-node` are the most ranks on
//! one node (every node's count when the assignment fills nodes evenly, as
//! placement does); `--exclusive` (by default) makes the bound GPU indices
//! the node's own. The partition is the configured one, else every
//! partition all nodes share (sbatch picks one of a list).
//!
//! # Topology: `--segment` rather than `--switches`
//!
//! Because the nodes are pinned, a topology option cannot move the job; it
//! only makes Slurm check the pin against its own topology. With
//! topology/block (multi-node NVLink domains such as NVL72 racks),
//! `--segment=<s>` asks that the job be made of segments of `s` nodes each
//! inside one block, `s` being the nodes the job uses in each scale-up
//! domain (their greatest common divisor when domains are used unevenly);
//! a pin that straddles blocks is then refused instead of running tensor
//! parallelism over the scale-out fabric. With topology/tree,
//! `--switches=<n>` only delays a job whose pinned nodes span more than `n`
//! leaf switches (up to the site's `max_switch_wait`) and then runs it
//! anyway, so it is emitted only when asked for (`topology = "tree"`) and
//! the inventory names every node's leaf switch. The default (`auto`) picks
//! `--segment` when some used domain spans several nodes, nothing otherwise.
//! sbatch releases older than the option (22.05, for one) refuse it: such a
//! site sets `topology = "flat"`.
//!
//! # The launch
//!
//! `srun --distribution=arbitrary` with `SLURM_HOSTFILE` set to the host
//! file starts task `i` on line `i` of that file, which is the node of row
//! `i` of the rank table. Each task reads its row, checks that it runs on
//! that node, exports `RANK`, `LOCAL_RANK` and `LONGHAUL_NODE` and runs the
//! command. Both files are named by absolute path and must be on a file
//! system the nodes share.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{RenderError, RenderOptions, ResolvedAssignment, SlurmTopology, resolve};
use crate::assignment::SiteAssignment;
use crate::inventory::Inventory;

/// Where the batch script finds the rank table and host file at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptPaths<'a> {
    /// Absolute path of the rank table ([`ResolvedAssignment::rank_table`]).
    pub rank_table: &'a str,
    /// Absolute path of the host file ([`ResolvedAssignment::host_file`]).
    pub host_file: &'a str,
}

/// Renders the batch script for `assignment` on `inventory`.
pub fn render(
    assignment: &SiteAssignment,
    inventory: &Inventory,
    options: &RenderOptions,
    paths: &ScriptPaths<'_>,
) -> Result<String, RenderError> {
    options.validate()?;
    let resolved = resolve(assignment, inventory)?;
    render_resolved(&resolved, options, paths)
}

/// Quotes `s` for a POSIX shell: inside single quotes, with each `'`
/// written as `'\''`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The per-task launcher srun runs: it takes row `SLURM_PROCID` of the rank
/// table (after the header line), checks that the task runs on that row's
/// node and runs the command with `RANK` and `LOCAL_RANK` set. It is
/// single-quoted as a whole in the script, so it contains no single quote.
pub const TASK_LAUNCHER: &str = r#"set -euo pipefail
row="$(sed -n "$((SLURM_PROCID + 2))p" "$LONGHAUL_RANK_TABLE")"
if [ -z "$row" ]; then
  echo "longhaul: no rank-table row for task $SLURM_PROCID" >&2
  exit 1
fi
read -r RANK LONGHAUL_NODE LOCAL_RANK <<< "$row"
if [ "$LONGHAUL_NODE" != "$SLURMD_NODENAME" ]; then
  echo "longhaul: task $SLURM_PROCID runs on $SLURMD_NODENAME but rank $RANK is bound to $LONGHAUL_NODE" >&2
  exit 1
fi
export RANK LOCAL_RANK LONGHAUL_NODE
exec bash -c "$LONGHAUL_COMMAND""#;

pub(crate) fn render_resolved(
    resolved: &ResolvedAssignment<'_>,
    options: &RenderOptions,
    paths: &ScriptPaths<'_>,
) -> Result<String, RenderError> {
    let a = resolved.assignment;
    let slurm = &options.slurm;
    let nodes = resolved.nodes.len();
    let ranks = resolved.rank_count();
    let per_node = resolved.max_ranks_per_node();
    let partition = match &slurm.partition {
        Some(partition) => Some(partition.clone()),
        None => common_partitions(resolved)?,
    };
    let topology = topology_option(resolved, slurm.topology);

    let mut out = String::new();
    let mut line = |s: &str| {
        out.push_str(s);
        out.push('\n');
    };
    line("#!/bin/bash");
    line(&format!(
        "# Rendered by the longhaul site agent: job {}, site {}, revision {}.",
        a.job_id, a.site_id, a.revision
    ));
    line(&format!(
        "# {ranks} ranks on {nodes} nodes; {} mode; stages {}; replicas {}.",
        a.mode,
        crate::hostlist::index_ranges(&a.stages),
        crate::hostlist::index_ranges(&a.replicas)
    ));
    line("# The agent renders it again when the assignment changes; do not edit.");
    line(&format!(
        "#SBATCH --job-name=longhaul-{}-{}",
        a.job_id, a.site_id
    ));
    line(&format!("#SBATCH --nodes={nodes}"));
    line(&format!("#SBATCH --nodelist={}", resolved.hostlist()));
    line(&format!("#SBATCH --ntasks-per-node={per_node}"));
    line(&format!("#SBATCH --gpus-per-node={per_node}"));
    if slurm.exclusive {
        line("#SBATCH --exclusive");
    }
    if let Some(partition) = &partition {
        line(&format!("#SBATCH --partition={partition}"));
    }
    if let Some(account) = &slurm.account {
        line(&format!("#SBATCH --account={account}"));
    }
    if let Some(time) = &slurm.time_limit {
        line(&format!("#SBATCH --time={time}"));
    }
    match &topology {
        Topology::Segment(size) => line(&format!("#SBATCH --segment={size}")),
        Topology::Switches(count) => line(&format!("#SBATCH --switches={count}")),
        Topology::None => {}
    }
    // sbatch reads #SBATCH lines only up to the first command, so every
    // note about them comes after.
    line("");
    match &topology {
        Topology::Segment(size) => {
            line(&format!(
                "# --segment: each scale-up domain holds a multiple of {size} of the job's nodes;"
            ));
            line("# Slurm refuses the pinned nodes if its blocks disagree.");
        }
        Topology::Switches(count) => line(&format!(
            "# --switches: the pinned nodes hang off {count} leaf switches."
        )),
        Topology::None => {}
    }
    if resolved.nodes.iter().any(|n| n.ranks.len() != per_node) {
        line(&format!(
            "# Nodes carry different numbers of ranks; each is allocated {per_node} GPUs"
        ));
        line("# and runs only its own ranks.");
    }
    line("set -euo pipefail");
    line("");
    for (name, value) in resolved.job_environment() {
        line(&format!("export {name}={}", shell_quote(&value)));
    }
    line(&format!(
        "export LONGHAUL_RANK_TABLE={}",
        shell_quote(paths.rank_table)
    ));
    match resolved.rank_zero_node() {
        Some(node) => {
            line(&format!("export MASTER_ADDR={}", shell_quote(node)));
            line(&format!("export MASTER_PORT={}", options.rendezvous_port));
        }
        None => line(
            "# Rank 0 runs on another site: MASTER_ADDR and MASTER_PORT come from the \
             environment sbatch is run in.",
        ),
    }
    line(&format!(
        "export LONGHAUL_COMMAND={}",
        shell_quote(&options.command)
    ));
    line("");
    line("# One task per rank: task i runs on line i of the host file and takes row i of");
    line("# the rank table.");
    line(&format!(
        "export SLURM_HOSTFILE={}",
        shell_quote(paths.host_file)
    ));
    line(&format!(
        "srun --ntasks={ranks} --distribution=arbitrary --kill-on-bad-exit=1 bash -c {}",
        shell_quote(TASK_LAUNCHER)
    ));
    Ok(out)
}

/// The partitions every assigned node is in, comma-separated; `None` when
/// some node's partitions are unknown (the inventory source did not say).
fn common_partitions(resolved: &ResolvedAssignment<'_>) -> Result<Option<String>, RenderError> {
    let mut common: Option<BTreeSet<&str>> = None;
    for placed in &resolved.nodes {
        let node = placed.node;
        if node.partitions.is_empty() {
            return Ok(None);
        }
        let partitions: BTreeSet<&str> = node.partitions.iter().map(String::as_str).collect();
        common = Some(match common {
            None => partitions,
            Some(common) => common.intersection(&partitions).copied().collect(),
        });
    }
    let common = common.unwrap_or_default();
    if common.is_empty() {
        return Err(RenderError::NoCommonPartition {
            nodes: resolved.nodes.len(),
            hostlist: resolved.hostlist(),
        });
    }
    for partition in &common {
        if partition.is_empty()
            || !partition
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(RenderError::InvalidOption {
                field: "slurm.partition",
                reason: format!(
                    "the inventory's partition {partition:?} cannot be written into the \
                     script; set `slurm.partition`"
                ),
            });
        }
    }
    Ok(Some(common.into_iter().collect::<Vec<_>>().join(",")))
}

enum Topology {
    Segment(u64),
    Switches(usize),
    None,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn topology_option(resolved: &ResolvedAssignment<'_>, wanted: SlurmTopology) -> Topology {
    // Nodes used in each multi-node scale-up domain.
    let mut per_domain: BTreeMap<(&str, &str, u64), u64> = BTreeMap::new();
    let mut single_node_domains = false;
    for placed in &resolved.nodes {
        let node = placed.node;
        if resolved.nodes_per_domain(&node.building, &node.domain_group) > 1 {
            *per_domain
                .entry((&node.building, &node.domain_group, node.domain))
                .or_default() += 1;
        } else {
            single_node_domains = true;
        }
    }
    let block = match wanted {
        SlurmTopology::Auto => !per_domain.is_empty(),
        SlurmTopology::Block => true,
        SlurmTopology::Tree => {
            let switches: Option<BTreeSet<&str>> = resolved
                .nodes
                .iter()
                .map(|n| n.node.scheduler_domain.as_deref())
                .collect();
            return match switches {
                Some(switches) if !switches.is_empty() => Topology::Switches(switches.len()),
                _ => Topology::None,
            };
        }
        SlurmTopology::Flat => false,
    };
    let segment = if single_node_domains {
        1
    } else {
        per_domain.values().copied().fold(0, gcd)
    };
    if block && segment > 1 {
        Topology::Segment(segment)
    } else {
        Topology::None
    }
}

/// How to run `sbatch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmSubmitOptions {
    /// The sbatch program (default `sbatch`, found on `PATH`).
    pub sbatch: PathBuf,
    /// Extra arguments before the script, such as `--hold` or `--test-only`.
    pub args: Vec<String>,
    /// How long sbatch may take before it is killed (default 60 s; sbatch
    /// retries an unreachable controller for a while by itself).
    pub timeout: Duration,
}

impl Default for SlurmSubmitOptions {
    fn default() -> Self {
        Self {
            sbatch: PathBuf::from("sbatch"),
            args: Vec::new(),
            timeout: Duration::from_secs(60),
        }
    }
}

/// A job Slurm accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmittedJob {
    pub job_id: u64,
    /// The cluster, when sbatch names one (federations, `--clusters`).
    pub cluster: Option<String>,
}

/// Reads `sbatch --parsable` output: `<job id>` or `<job id>;<cluster>`,
/// on the last non-empty line (sbatch may print warnings before it).
pub fn parse_parsable(output: &str) -> Result<SubmittedJob, RenderError> {
    let bad = || RenderError::SbatchOutput {
        output: output.to_string(),
    };
    let last = output
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .ok_or_else(bad)?;
    let (id, cluster) = match last.split_once(';') {
        Some((id, cluster)) => (id, Some(cluster)),
        None => (last, None),
    };
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let job_id = id.parse().map_err(|_| bad())?;
    let cluster = match cluster {
        Some(c) if c.is_empty() || c.contains(char::is_whitespace) => return Err(bad()),
        Some(c) => Some(c.to_string()),
        None => None,
    };
    Ok(SubmittedJob { job_id, cluster })
}

/// Most bytes of sbatch's stdout or stderr kept.
const OUTPUT_LIMIT: u64 = 64 * 1024;

/// Submits `script_path` with `sbatch --parsable [args] <script>` and
/// returns the job Slurm created. sbatch is killed if it outlives
/// `options.timeout`; a failure carries its exit status and stderr. Blocks
/// the calling thread (use `spawn_blocking` from async code).
pub fn submit(
    script_path: &Path,
    options: &SlurmSubmitOptions,
) -> Result<SubmittedJob, RenderError> {
    let program = options.sbatch.clone();
    let mut child = Command::new(&program)
        .arg("--parsable")
        .args(&options.args)
        .arg(script_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| RenderError::Spawn {
            program: program.clone(),
            source,
        })?;
    // Drain both pipes on their own threads so a chatty sbatch cannot block
    // on a full pipe while we wait for it to exit.
    let (stdout_tx, stdout_rx) = mpsc::channel();
    let (stderr_tx, stderr_rx) = mpsc::channel();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            let _ = stdout_tx.send(read_limited(stdout));
        });
    }
    if let Some(stderr) = child.stderr.take() {
        std::thread::spawn(move || {
            let _ = stderr_tx.send(read_limited(stderr));
        });
    }

    let deadline = Instant::now() + options.timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RenderError::Timeout {
                    program,
                    seconds: options.timeout.as_secs_f64(),
                    stderr: collect(&stderr_rx, Instant::now() + Duration::from_millis(200)),
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(source) => {
                let _ = child.kill();
                return Err(RenderError::Spawn { program, source });
            }
        }
    };
    // A grandchild could hold the pipes open after sbatch exits: wait for
    // the output no longer than the time left, and at least a moment.
    let output_deadline = deadline.max(Instant::now() + Duration::from_millis(200));
    let stdout = collect(&stdout_rx, output_deadline);
    let stderr = collect(&stderr_rx, output_deadline);
    if !status.success() {
        return Err(RenderError::SbatchFailed {
            program,
            status: status.to_string(),
            stderr,
        });
    }
    parse_parsable(&stdout)
}

fn read_limited(stream: impl Read) -> String {
    let mut bytes = Vec::new();
    let _ = stream.take(OUTPUT_LIMIT).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

fn collect(rx: &mpsc::Receiver<String>, deadline: Instant) -> String {
    let wait = deadline.saturating_duration_since(Instant::now());
    rx.recv_timeout(wait)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_bare_job_id_and_one_with_a_cluster() {
        assert_eq!(
            parse_parsable("1234\n").unwrap(),
            SubmittedJob {
                job_id: 1234,
                cluster: None
            }
        );
        assert_eq!(
            parse_parsable("1234;cluster\n").unwrap(),
            SubmittedJob {
                job_id: 1234,
                cluster: Some("cluster".into())
            }
        );
        assert_eq!(
            parse_parsable("sbatch: warning: something\n77;north-a\n")
                .unwrap()
                .job_id,
            77
        );
    }

    #[test]
    fn refuses_output_that_is_not_a_job_id() {
        for output in [
            "",
            "\n",
            "abc",
            "12a",
            "-5",
            "1234;",
            ";north",
            "99999999999999999999999",
        ] {
            let err = parse_parsable(output).expect_err(output);
            assert!(
                err.to_string()
                    .contains("cannot read sbatch --parsable output"),
                "{err}"
            );
        }
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert!(!TASK_LAUNCHER.contains('\''));
    }

    #[test]
    fn gcd_of_domain_usage() {
        assert_eq!([18, 18, 9].into_iter().fold(0, gcd), 9);
        assert_eq!([18].into_iter().fold(0, gcd), 18);
        assert_eq!([4, 6].into_iter().fold(0, gcd), 2);
    }
}
