//! How an operator tailors the rendered requests to their site: the command
//! each rank runs, Slurm account and limits, Kubernetes namespace, queue,
//! image and topology labels. Read from the agent's config file; every field
//! has a default, unknown fields are refused.

use serde::{Deserialize, Serialize};

use super::RenderError;

/// The command every rank runs when none is configured. It is run by
/// `bash -c` once per rank with `RANK`, `LOCAL_RANK`, `WORLD_SIZE` and the
/// `LONGHAUL_*` variables set (see the [`super`] module docs).
pub const DEFAULT_COMMAND: &str = "python -u train.py";

/// Port of the rank-0 rendezvous (`MASTER_PORT`) when none is configured:
/// the PyTorch default.
pub const DEFAULT_RENDEZVOUS_PORT: u16 = 29500;

/// Options for rendering one site's part of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RenderOptions {
    /// Shell command each rank runs (default [`DEFAULT_COMMAND`]).
    pub command: String,
    /// What [`super::write_dry_run`] writes (default: Slurm only; add
    /// `kubernetes`, which needs `kubernetes.image`).
    pub targets: Vec<Target>,
    /// `MASTER_PORT`, exported with `MASTER_ADDR` when rank 0 runs on this
    /// site (default [`DEFAULT_RENDEZVOUS_PORT`]).
    pub rendezvous_port: u16,
    pub slurm: SlurmOptions,
    pub kubernetes: KubernetesOptions,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            command: DEFAULT_COMMAND.to_string(),
            targets: vec![Target::Slurm],
            rendezvous_port: DEFAULT_RENDEZVOUS_PORT,
            slurm: SlurmOptions::default(),
            kubernetes: KubernetesOptions::default(),
        }
    }
}

/// A scheduler to render for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// A Slurm batch script, its rank table and host file.
    Slurm,
    /// A JobSet with its rank-table ConfigMap.
    Kubernetes,
}

/// Slurm-specific options. All default to "let the cluster decide" except
/// `exclusive` and `topology`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmOptions {
    /// `--partition`; by default the partitions every assigned node is in.
    pub partition: Option<String>,
    /// `--account`; none by default.
    pub account: Option<String>,
    /// `--time`, in any format sbatch takes (`90`, `2:00:00`,
    /// `1-12:00:00`, `UNLIMITED`); none by default (the partition's).
    pub time_limit: Option<String>,
    /// Which topology option to add (default `auto`).
    pub topology: SlurmTopology,
    /// `--exclusive` (default true): the job owns its nodes, so the GPU
    /// indices the coordinator bound ranks to are the node's own.
    pub exclusive: bool,
}

impl Default for SlurmOptions {
    fn default() -> Self {
        Self {
            partition: None,
            account: None,
            time_limit: None,
            topology: SlurmTopology::Auto,
            exclusive: true,
        }
    }
}

/// The Slurm topology plugin the site runs, which decides the topology
/// option of the batch script. The nodes are always pinned with
/// `--nodelist`, so the option cannot move the job; it makes Slurm check the
/// pinned nodes against its own view of the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SlurmTopology {
    /// `block` when some scale-up domain spans several nodes (NVL72 racks
    /// are what topology/block exists for), `flat` otherwise.
    Auto,
    /// topology/block: `--segment=<nodes per domain>`, so every segment
    /// must sit in one block.
    Block,
    /// topology/tree: `--switches=<leaf switches of the pinned nodes>`,
    /// when the inventory names every node's leaf switch.
    Tree,
    /// No topology option.
    Flat,
}

/// Kubernetes-specific options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesOptions {
    /// Namespace of the JobSet and its ConfigMap (default `default`).
    pub namespace: String,
    /// Kueue LocalQueue, as the `kueue.x-k8s.io/queue-name` label; none by
    /// default (the JobSet is then not admitted by Kueue and the topology
    /// annotations have no effect).
    pub queue_name: Option<String>,
    /// Container image of the trainer; required to render a JobSet.
    pub image: Option<String>,
    /// Node label naming a node's scale-up domain (default
    /// `nvidia.com/gpu.clique`, set by NVIDIA's GPU operator on multi-node
    /// NVLink systems); a Kueue topology level.
    pub domain_label: String,
    /// Node label of the level above (rack, block, leaf switch), preferred
    /// for groups of single-node domains; none by default.
    pub block_label: Option<String>,
    /// Extended resource of one GPU (default `nvidia.com/gpu`).
    pub gpu_resource: String,
}

impl Default for KubernetesOptions {
    fn default() -> Self {
        Self {
            namespace: "default".to_string(),
            queue_name: None,
            image: None,
            domain_label: "nvidia.com/gpu.clique".to_string(),
            block_label: None,
            gpu_resource: "nvidia.com/gpu".to_string(),
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> RenderError {
    RenderError::InvalidOption {
        field,
        reason: reason.into(),
    }
}

impl RenderOptions {
    /// Checks every option that is rendered into a script or manifest, so a
    /// value can neither break the file's syntax nor smuggle in a line.
    pub fn validate(&self) -> Result<(), RenderError> {
        if self.command.trim().is_empty() {
            return Err(invalid("command", "is empty"));
        }
        if self.command.contains('\0') {
            return Err(invalid("command", "contains a NUL character"));
        }
        if self.targets.is_empty() {
            return Err(invalid(
                "targets",
                "is empty; list `slurm`, `kubernetes` or both",
            ));
        }
        if self.targets.contains(&Target::Kubernetes) && self.kubernetes.image.is_none() {
            return Err(invalid(
                "kubernetes.image",
                "is required to render a JobSet (the `kubernetes` target)",
            ));
        }
        if self.rendezvous_port == 0 {
            return Err(invalid("rendezvous_port", "is 0"));
        }
        self.slurm.validate()?;
        self.kubernetes.validate()
    }
}

impl SlurmOptions {
    fn validate(&self) -> Result<(), RenderError> {
        if let Some(partition) = &self.partition {
            // sbatch takes a comma-separated list of partitions.
            for name in partition.split(',') {
                check_slurm_word("slurm.partition", name)?;
            }
        }
        if let Some(account) = &self.account {
            check_slurm_word("slurm.account", account)?;
        }
        if let Some(time) = &self.time_limit {
            check_time_limit(time)?;
        }
        Ok(())
    }
}

/// A Slurm partition or account name: printable, no blanks, no `#`, `,` or
/// quotes (which would end or change the `#SBATCH` line's meaning).
fn check_slurm_word(field: &'static str, value: &str) -> Result<(), RenderError> {
    if value.is_empty() {
        return Err(invalid(field, "is empty"));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '#' | ',' | '"' | '\'' | '\\'))
    {
        return Err(invalid(field, format!("{value:?} contains {c:?}")));
    }
    Ok(())
}

/// sbatch's time formats: `minutes`, `minutes:seconds`,
/// `hours:minutes:seconds`, `days-hours`, `days-hours:minutes`,
/// `days-hours:minutes:seconds`, or `UNLIMITED` / `INFINITE`.
fn check_time_limit(value: &str) -> Result<(), RenderError> {
    const FIELD: &str = "slurm.time_limit";
    if matches!(value, "UNLIMITED" | "INFINITE") {
        return Ok(());
    }
    let numbers = |s: &str| {
        s.split(':')
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let (days, rest) = match value.split_once('-') {
        Some((days, rest)) => (Some(days), rest),
        None => (None, value),
    };
    let parts = rest.split(':').count();
    let valid = match days {
        Some(days) => numbers(days) && !days.contains(':') && numbers(rest) && parts <= 3,
        None => numbers(rest) && parts <= 3,
    };
    if valid {
        Ok(())
    } else {
        Err(invalid(
            FIELD,
            format!(
                "{value:?} is not a Slurm time (minutes, minutes:seconds, hours:minutes:seconds, \
                 days-hours, days-hours:minutes, days-hours:minutes:seconds, UNLIMITED)"
            ),
        ))
    }
}

impl KubernetesOptions {
    fn validate(&self) -> Result<(), RenderError> {
        check_dns_label("kubernetes.namespace", &self.namespace)?;
        if let Some(queue) = &self.queue_name {
            check_label_value("kubernetes.queue_name", queue)?;
        }
        if let Some(image) = &self.image
            && (image.is_empty() || image.chars().any(|c| !c.is_ascii_graphic()))
        {
            return Err(invalid(
                "kubernetes.image",
                format!("{image:?} is not an image reference (empty, or has blanks)"),
            ));
        }
        check_qualified_name("kubernetes.domain_label", &self.domain_label)?;
        if let Some(label) = &self.block_label {
            check_qualified_name("kubernetes.block_label", label)?;
        }
        check_qualified_name("kubernetes.gpu_resource", &self.gpu_resource)
    }
}

/// A DNS-1123 label: 1 to 63 of `a-z0-9-`, alphanumeric at both ends.
pub(crate) fn check_dns_label(field: &'static str, value: &str) -> Result<(), RenderError> {
    if is_dns_label(value) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!(
                "{value:?} is not a DNS label (1 to 63 characters of a-z, 0-9 and '-', \
                 starting and ending with a letter or digit)"
            ),
        ))
    }
}

pub(crate) fn is_dns_label(value: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !value.is_empty()
        && value.len() <= 63
        && value.starts_with(alnum)
        && value.ends_with(alnum)
        && value.chars().all(|c| alnum(c) || c == '-')
}

/// A label value: up to 63 of `A-Za-z0-9-_.`, alphanumeric at both ends.
fn check_label_value(field: &'static str, value: &str) -> Result<(), RenderError> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let valid = !value.is_empty()
        && value.len() <= 63
        && value.starts_with(alnum)
        && value.ends_with(alnum)
        && value
            .chars()
            .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!(
                "{value:?} is not a label value (1 to 63 characters of A-Z, a-z, 0-9, '-', '_' \
                 and '.', starting and ending with a letter or digit)"
            ),
        ))
    }
}

/// A label key or resource name: an optional DNS-subdomain prefix and `/`,
/// then a name of up to 63 of `A-Za-z0-9-_.`, alphanumeric at both ends.
fn check_qualified_name(field: &'static str, value: &str) -> Result<(), RenderError> {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(is_dns_label));
    if name_ok && prefix_ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{value:?} is not a Kubernetes qualified name ([dns.prefix/]name)"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(options: &RenderOptions) -> Option<&'static str> {
        match options.validate() {
            Err(RenderError::InvalidOption { field, .. }) => Some(field),
            Err(other) => panic!("unexpected error {other}"),
            Ok(()) => None,
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(field_of(&RenderOptions::default()), None);
    }

    #[test]
    fn each_bad_option_is_named() {
        type Change = fn(&mut RenderOptions);
        let cases: Vec<(Change, &str)> = vec![
            (|o| o.command = "  ".into(), "command"),
            (|o| o.targets.clear(), "targets"),
            (|o| o.rendezvous_port = 0, "rendezvous_port"),
            (
                |o| o.slurm.partition = Some("gpu\n#SBATCH --x".into()),
                "slurm.partition",
            ),
            (
                |o| o.slurm.partition = Some("a,,b".into()),
                "slurm.partition",
            ),
            (
                |o| o.slurm.account = Some("my acct".into()),
                "slurm.account",
            ),
            (
                |o| o.slurm.time_limit = Some("2h".into()),
                "slurm.time_limit",
            ),
            (
                |o| o.slurm.time_limit = Some("1-2-3".into()),
                "slurm.time_limit",
            ),
            (
                |o| o.slurm.time_limit = Some("1:2:3:4".into()),
                "slurm.time_limit",
            ),
            (
                |o| o.kubernetes.namespace = "Team_A".into(),
                "kubernetes.namespace",
            ),
            (
                |o| o.kubernetes.queue_name = Some("q-".into()),
                "kubernetes.queue_name",
            ),
            (
                |o| o.kubernetes.image = Some("a b".into()),
                "kubernetes.image",
            ),
            (
                |o| o.kubernetes.domain_label = "a/b/c".into(),
                "kubernetes.domain_label",
            ),
            (
                |o| o.kubernetes.block_label = Some("x/".into()),
                "kubernetes.block_label",
            ),
            (
                |o| o.kubernetes.gpu_resource = "".into(),
                "kubernetes.gpu_resource",
            ),
        ];
        for (change, field) in cases {
            let mut options = RenderOptions::default();
            change(&mut options);
            assert_eq!(field_of(&options), Some(field), "{options:?}");
        }
    }

    #[test]
    fn slurm_time_formats_are_accepted() {
        for time in [
            "90",
            "90:30",
            "2:00:00",
            "1-12",
            "1-12:30",
            "1-12:30:00",
            "UNLIMITED",
        ] {
            assert!(check_time_limit(time).is_ok(), "{time}");
        }
    }

    #[test]
    fn options_parse_from_toml_and_refuse_unknown_keys() {
        let options: RenderOptions = toml::from_str(
            "command = \"python pretrain.py\"\ntargets = [\"slurm\", \"kubernetes\"]\n\
             [slurm]\naccount = \"ml\"\n[kubernetes]\nimage = \"registry.example/trainer:1\"\n",
        )
        .unwrap();
        assert_eq!(options.command, "python pretrain.py");
        assert_eq!(options.slurm.account.as_deref(), Some("ml"));
        assert!(options.slurm.exclusive);
        assert_eq!(options.kubernetes.namespace, "default");
        let err = toml::from_str::<RenderOptions>("[slurm]\nqos = \"high\"\n").unwrap_err();
        assert!(err.to_string().contains("qos"), "{err}");
    }
}
