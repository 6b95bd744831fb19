//! The Kubernetes rendering: a ConfigMap with the rank table and a JobSet
//! (`jobset.x-k8s.io/v1alpha2`) whose pods run on exactly the assigned
//! nodes, with Kueue topology-aware-scheduling annotations.
//!
//! # Shape: one replicated job per scale-up domain
//!
//! Kueue admits each replicated job as one pod set, and its
//! `podset-required-topology` annotation keeps a pod set inside one domain
//! of a topology level. Tensor parallelism must stay inside a scale-up
//! domain, so the pod set is the domain: when a domain spans several nodes
//! (an NVL72 rack), each domain the job uses becomes a replicated job `d<k>`
//! with one pod per node, required in one `domain_label` domain
//! (`nvidia.com/gpu.clique` by default). A stage-per-job shape could not say
//! this: a stage's replicas span many domains. When every domain is a
//! single node (HGX servers), the node already keeps tensor parallelism
//! together, so the nodes of a domain group become one replicated job
//! `n<k>`, with `podset-preferred-topology` on `block_label` when one is
//! configured, to keep data-parallel traffic under few switches. Nodes
//! with different rank counts go into different replicated jobs, since a
//! pod template asks one GPU count.
//!
//! # Pinning and ranks
//!
//! Each pod requires one of its replicated job's nodes (node affinity on
//! `kubernetes.io/hostname`, which must equal the inventory's node name)
//! and pod anti-affinity keeps one pod of the JobSet per node. Which pod
//! lands on which of those nodes is the scheduler's choice, so a pod learns
//! its node from the downward API (`LONGHAUL_NODE`), starts one process per
//! rank-table row of that node and fails if the count is not what was
//! assigned. `MASTER_ADDR` is not set: a pod has no stable address before
//! it is scheduled, and the rendezvous endpoint of a job that spans sites
//! must come from outside the assignment.

use std::collections::BTreeMap;

use super::yaml::{self, Value};
use super::{PlacedNode, RenderError, RenderOptions, ResolvedAssignment, resolve};
use crate::assignment::SiteAssignment;
use crate::inventory::Inventory;

/// Where the rank table is mounted in every pod.
pub const RANK_TABLE_DIR: &str = "/etc/longhaul";
/// The rank table's key in its ConfigMap and file name under
/// [`RANK_TABLE_DIR`].
pub const RANK_TABLE_KEY: &str = "ranks";
/// Most bytes a ConfigMap holds.
pub const CONFIG_MAP_LIMIT: usize = 1024 * 1024;
/// The hostname of a JobSet pod, `<jobset>-<replicated job>-<job
/// index>-<pod index>`, is a DNS label.
const POD_HOSTNAME_LIMIT: usize = 63;

/// The node label pods are pinned with.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The pod's launcher, run by `bash -c`: one process per rank-table row of
/// this pod's node, with `RANK` and `LOCAL_RANK` set; it fails if the node
/// has not the assigned number of rows, and stops the other ranks as soon
/// as one fails (they would wait for it in their next collective).
pub const POD_LAUNCHER: &str = r#"set -euo pipefail
pids=()
while read -r rank node gpu; do
  if [ "$node" = "$LONGHAUL_NODE" ]; then
    (RANK="$rank" LOCAL_RANK="$gpu" exec bash -c "$LONGHAUL_COMMAND") &
    pids+=("$!")
  fi
done < <(grep -v '^#' "$LONGHAUL_RANK_TABLE")
if [ "${#pids[@]}" -ne "$LONGHAUL_RANKS_PER_POD" ]; then
  echo "longhaul: node $LONGHAUL_NODE has ${#pids[@]} ranks in the rank table, expected $LONGHAUL_RANKS_PER_POD" >&2
  kill "${pids[@]}" 2>/dev/null || true
  exit 1
fi
# Poll rather than `wait -n`, which misses ranks that ended before it runs.
running=("${pids[@]}")
while [ "${#running[@]}" -gt 0 ]; do
  still=()
  for pid in "${running[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      still+=("$pid")
    elif ! wait "$pid"; then
      echo "longhaul: a rank on $LONGHAUL_NODE failed; stopping the others" >&2
      kill "${running[@]}" 2>/dev/null || true
      exit 1
    fi
  done
  running=("${still[@]}")
  if [ "${#running[@]}" -gt 0 ]; then
    sleep 1
  fi
done
"#;

/// Renders the ConfigMap and JobSet for `assignment` on `inventory`, as
/// one YAML stream of two documents.
pub fn render(
    assignment: &SiteAssignment,
    inventory: &Inventory,
    options: &RenderOptions,
) -> Result<String, RenderError> {
    options.validate()?;
    let resolved = resolve(assignment, inventory)?;
    render_resolved(&resolved, options)
}

/// The JobSet's name: `longhaul-<job>-<site>-r<revision>`, with `_`
/// (allowed in ids, not in Kubernetes names) written as `-`.
pub fn jobset_name(assignment: &SiteAssignment) -> String {
    format!(
        "longhaul-{}-{}-r{}",
        assignment.job_id, assignment.site_id, assignment.revision
    )
    .replace('_', "-")
}

/// The key that decides which replicated job a node's pod belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct GroupKey<'a> {
    building: &'a str,
    domain_group: &'a str,
    /// The scale-up domain, for domains that span several nodes.
    domain: Option<u64>,
    ranks_per_node: usize,
}

pub(crate) fn render_resolved(
    resolved: &ResolvedAssignment<'_>,
    options: &RenderOptions,
) -> Result<String, RenderError> {
    let k8s = &options.kubernetes;
    let image = k8s.image.as_deref().ok_or(RenderError::InvalidOption {
        field: "kubernetes.image",
        reason: "is required to render a JobSet".to_string(),
    })?;
    let a = resolved.assignment;
    let name = jobset_name(a);
    if name.len() > POD_HOSTNAME_LIMIT {
        return Err(RenderError::NameTooLong {
            what: "JobSet name",
            name: name.clone(),
            length: name.len(),
            limit: POD_HOSTNAME_LIMIT,
            hint: "shorten the job or site id",
        });
    }

    let mut groups: BTreeMap<GroupKey<'_>, Vec<&PlacedNode<'_>>> = BTreeMap::new();
    for placed in &resolved.nodes {
        let node = placed.node;
        let multi_node = resolved.nodes_per_domain(&node.building, &node.domain_group) > 1;
        let key = GroupKey {
            building: &node.building,
            domain_group: &node.domain_group,
            domain: multi_node.then_some(node.domain),
            ranks_per_node: placed.ranks.len(),
        };
        groups.entry(key).or_default().push(placed);
    }

    let (mut domains, mut node_groups) = (0, 0);
    let mut replicated_jobs = Vec::new();
    for (key, nodes) in &groups {
        let job_name = if key.domain.is_some() {
            domains += 1;
            format!("d{}", domains - 1)
        } else {
            node_groups += 1;
            format!("n{}", node_groups - 1)
        };
        let hostname = format!("{name}-{job_name}-0-{}", nodes.len().saturating_sub(1));
        if hostname.len() > POD_HOSTNAME_LIMIT {
            return Err(RenderError::NameTooLong {
                what: "pod hostname",
                name: hostname.clone(),
                length: hostname.len(),
                limit: POD_HOSTNAME_LIMIT,
                hint: "shorten the job or site id",
            });
        }
        replicated_jobs.push(replicated_job(
            resolved, options, image, &name, &job_name, key, nodes,
        ));
    }

    let rank_table = resolved.rank_table();
    if rank_table.len() > CONFIG_MAP_LIMIT {
        return Err(RenderError::RankTableTooLarge {
            bytes: rank_table.len(),
            limit: CONFIG_MAP_LIMIT,
        });
    }
    let config_map = Value::mapping([
        ("apiVersion", Value::string("v1")),
        ("kind", Value::string("ConfigMap")),
        (
            "metadata",
            Value::mapping([
                ("name", Value::string(format!("{name}-ranks"))),
                ("namespace", Value::string(&k8s.namespace)),
                ("annotations", longhaul_annotations(a)),
            ]),
        ),
        (
            "data",
            Value::mapping([(RANK_TABLE_KEY, Value::String(rank_table))]),
        ),
    ]);

    let mut labels = Vec::new();
    if let Some(queue) = &k8s.queue_name {
        labels.push(("kueue.x-k8s.io/queue-name", Value::string(queue)));
    }
    let mut metadata = vec![
        ("name", Value::string(&name)),
        ("namespace", Value::string(&k8s.namespace)),
    ];
    if !labels.is_empty() {
        metadata.push(("labels", Value::mapping(labels)));
    }
    metadata.push(("annotations", longhaul_annotations(a)));
    let jobset = Value::mapping([
        ("apiVersion", Value::string("jobset.x-k8s.io/v1alpha2")),
        ("kind", Value::string("JobSet")),
        ("metadata", Value::mapping(metadata)),
        (
            "spec",
            Value::mapping([("replicatedJobs", Value::Sequence(replicated_jobs))]),
        ),
    ]);

    Ok(format!(
        "# Rendered by the longhaul site agent: job {}, site {}, revision {}.\n\
         # {} ranks on {} nodes. The agent renders it again when the assignment changes.\n\
         {}---\n{}",
        a.job_id,
        a.site_id,
        a.revision,
        resolved.rank_count(),
        resolved.nodes.len(),
        yaml::to_string(&config_map),
        yaml::to_string(&jobset)
    ))
}

fn longhaul_annotations(a: &SiteAssignment) -> Value {
    Value::mapping([
        ("longhaul/job", Value::string(&a.job_id)),
        ("longhaul/site", Value::string(&a.site_id)),
        ("longhaul/revision", Value::string(a.revision.to_string())),
    ])
}

fn env(name: &str, value: impl Into<String>) -> Value {
    Value::mapping([
        ("name", Value::string(name)),
        ("value", Value::string(value)),
    ])
}

fn replicated_job(
    resolved: &ResolvedAssignment<'_>,
    options: &RenderOptions,
    image: &str,
    jobset: &str,
    job_name: &str,
    key: &GroupKey<'_>,
    nodes: &[&PlacedNode<'_>],
) -> Value {
    let k8s = &options.kubernetes;
    let pods = u64::try_from(nodes.len()).unwrap_or(u64::MAX);
    let gpus = u64::try_from(key.ranks_per_node).unwrap_or(u64::MAX);

    let mut job_annotations = vec![
        ("longhaul/building", Value::string(key.building)),
        ("longhaul/domain-group", Value::string(key.domain_group)),
    ];
    let mut pod_annotations = Vec::new();
    match key.domain {
        Some(domain) => {
            job_annotations.push(("longhaul/domain", Value::string(domain.to_string())));
            if let Some(scheduler_domain) = shared_scheduler_domain(nodes) {
                job_annotations
                    .push(("longhaul/scheduler-domain", Value::string(scheduler_domain)));
            }
            pod_annotations.push((
                "kueue.x-k8s.io/podset-required-topology",
                Value::string(&k8s.domain_label),
            ));
        }
        None => {
            if let Some(block_label) = &k8s.block_label {
                pod_annotations.push((
                    "kueue.x-k8s.io/podset-preferred-topology",
                    Value::string(block_label),
                ));
            }
        }
    }

    let mut environment: Vec<Value> = resolved
        .job_environment()
        .into_iter()
        .map(|(name, value)| env(name, value))
        .collect();
    environment.push(env(
        "LONGHAUL_RANK_TABLE",
        format!("{RANK_TABLE_DIR}/{RANK_TABLE_KEY}"),
    ));
    environment.push(env("LONGHAUL_RANKS_PER_POD", gpus.to_string()));
    environment.push(env("LONGHAUL_COMMAND", &options.command));
    environment.push(Value::mapping([
        ("name", Value::string("LONGHAUL_NODE")),
        (
            "valueFrom",
            Value::mapping([(
                "fieldRef",
                Value::mapping([("fieldPath", Value::string("spec.nodeName"))]),
            )]),
        ),
    ]));

    let hostnames: Vec<Value> = nodes.iter().map(|n| Value::string(&n.node.name)).collect();
    let affinity = Value::mapping([
        (
            "nodeAffinity",
            Value::mapping([(
                "requiredDuringSchedulingIgnoredDuringExecution",
                Value::mapping([(
                    "nodeSelectorTerms",
                    Value::Sequence(vec![Value::mapping([(
                        "matchExpressions",
                        Value::Sequence(vec![Value::mapping([
                            ("key", Value::string(HOSTNAME_LABEL)),
                            ("operator", Value::string("In")),
                            ("values", Value::Sequence(hostnames)),
                        ])]),
                    )])]),
                )]),
            )]),
        ),
        (
            "podAntiAffinity",
            Value::mapping([(
                "requiredDuringSchedulingIgnoredDuringExecution",
                Value::Sequence(vec![Value::mapping([
                    (
                        "labelSelector",
                        Value::mapping([(
                            "matchLabels",
                            Value::mapping([(
                                "jobset.sigs.k8s.io/jobset-name",
                                Value::string(jobset),
                            )]),
                        )]),
                    ),
                    ("topologyKey", Value::string(HOSTNAME_LABEL)),
                ])]),
            )]),
        ),
    ]);

    let container = Value::mapping([
        ("name", Value::string("trainer")),
        ("image", Value::string(image)),
        (
            "command",
            Value::Sequence(vec![Value::string("bash"), Value::string("-c")]),
        ),
        ("args", Value::Sequence(vec![Value::string(POD_LAUNCHER)])),
        ("env", Value::Sequence(environment)),
        (
            "resources",
            Value::mapping([(
                "limits",
                Value::mapping([(k8s.gpu_resource.as_str(), Value::Integer(gpus))]),
            )]),
        ),
        (
            "volumeMounts",
            Value::Sequence(vec![Value::mapping([
                ("name", Value::string("rank-table")),
                ("mountPath", Value::string(RANK_TABLE_DIR)),
                ("readOnly", Value::Bool(true)),
            ])]),
        ),
    ]);

    let mut pod_metadata = Vec::new();
    if !pod_annotations.is_empty() {
        pod_metadata.push(("annotations", Value::mapping(pod_annotations)));
    }
    let mut pod_template = Vec::new();
    if !pod_metadata.is_empty() {
        pod_template.push(("metadata", Value::mapping(pod_metadata)));
    }
    pod_template.push((
        "spec",
        Value::mapping([
            ("restartPolicy", Value::string("Never")),
            ("affinity", affinity),
            ("containers", Value::Sequence(vec![container])),
            (
                "volumes",
                Value::Sequence(vec![Value::mapping([
                    ("name", Value::string("rank-table")),
                    (
                        "configMap",
                        Value::mapping([("name", Value::string(format!("{jobset}-ranks")))]),
                    ),
                ])]),
            ),
        ]),
    ));

    Value::mapping([
        ("name", Value::string(job_name)),
        ("replicas", Value::Integer(1)),
        (
            "template",
            Value::mapping([
                (
                    "metadata",
                    Value::mapping([("annotations", Value::mapping(job_annotations))]),
                ),
                (
                    "spec",
                    Value::mapping([
                        ("parallelism", Value::Integer(pods)),
                        ("completions", Value::Integer(pods)),
                        ("completionMode", Value::string("Indexed")),
                        ("backoffLimit", Value::Integer(0)),
                        ("template", Value::mapping(pod_template)),
                    ]),
                ),
            ]),
        ),
    ])
}

/// The scheduler's name for the domain, when every node reports the same.
fn shared_scheduler_domain<'a>(nodes: &[&PlacedNode<'a>]) -> Option<&'a str> {
    let first = nodes.first()?.node.scheduler_domain.as_deref()?;
    nodes
        .iter()
        .all(|n| n.node.scheduler_domain.as_deref() == Some(first))
        .then_some(first)
}
