//! GPU names as schedulers spell them (Slurm GRES types, NVIDIA GPU feature
//! discovery products) mapped to the catalogue's names (`h100`, `gb200`).
//!
//! Names are compared case-insensitively with `_` and `-` treated alike, so
//! `nvidia_h100_80gb_hbm3` (Slurm's NVML auto-detection) and
//! `NVIDIA-H100-80GB-HBM3` (the Kubernetes product label) are one name. A
//! name that is neither a catalogue name, a built-in alias nor a configured
//! alias is unknown: the agent does not guess a type from a near match.

use std::collections::BTreeMap;

use longhaul_core::gpu::builtin_gpu_types;

/// Built-in aliases, normalized. Only variants whose figures match the
/// catalogue entry are listed (an A100 40GB is not an `a100`).
const BUILTIN_ALIASES: &[(&str, &str)] = &[
    ("nvidia-a100-sxm4-80gb", "a100"),
    ("a100-sxm4-80gb", "a100"),
    ("nvidia-h100-80gb-hbm3", "h100"),
    ("h100-80gb-hbm3", "h100"),
    ("nvidia-h100-sxm5-80gb", "h100"),
    ("nvidia-h200", "h200"),
    ("nvidia-h200-141gb-hbm3e", "h200"),
    ("h200-141gb-hbm3e", "h200"),
    ("nvidia-b200", "b200"),
    ("nvidia-gb200", "gb200"),
    ("nvidia-gb300", "gb300"),
    ("amd-instinct-mi300x", "mi300x"),
    ("instinct-mi300x", "mi300x"),
];

/// Resolves scheduler GPU names to catalogue names.
#[derive(Debug, Clone)]
pub struct GpuNames {
    /// Normalized alias → catalogue name; configured aliases override
    /// built-in ones.
    aliases: BTreeMap<String, String>,
    catalogue: Vec<String>,
}

impl GpuNames {
    /// The built-in table plus `configured` (scheduler name → catalogue name).
    pub fn new(configured: &BTreeMap<String, String>) -> Self {
        let catalogue: Vec<String> = builtin_gpu_types().into_iter().map(|t| t.name).collect();
        let mut aliases: BTreeMap<String, String> = catalogue
            .iter()
            .map(|name| (name.clone(), name.clone()))
            .chain(
                BUILTIN_ALIASES
                    .iter()
                    .map(|(alias, name)| (alias.to_string(), name.to_string())),
            )
            .collect();
        for (alias, name) in configured {
            aliases.insert(normalize(alias), name.clone());
        }
        Self { aliases, catalogue }
    }

    /// The catalogue name for a scheduler's GPU name, if known.
    pub fn resolve(&self, name: &str) -> Option<&str> {
        self.aliases.get(&normalize(name)).map(String::as_str)
    }

    /// The catalogue's names, for error messages.
    pub fn catalogue(&self) -> &[String] {
        &self.catalogue
    }

    /// The error message for an unknown name, with what would be accepted.
    pub fn unknown(&self, name: &str, origin: &str) -> String {
        format!(
            "unknown GPU type {name:?} ({origin}): expected one of {} or an alias of one; \
             add it to `inventory.gpu_aliases` if it is one of those",
            self.catalogue.join(", ")
        )
    }
}

/// Lowercase with `_` as `-`.
pub fn normalize(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('_', "-")
}

/// The most GPUs one node's board connects (an 8-GPU HGX board). A type
/// whose scale-up domain reaches further (GB200, 72) forms domains across
/// nodes, which only the scheduler's topology can name.
pub const SINGLE_NODE_DOMAIN_GPUS: u32 = 8;

/// True when GPUs of the catalogue type `name` form NVLink domains across
/// nodes.
pub fn spans_nodes(name: &str) -> bool {
    builtin_gpu_types()
        .iter()
        .any(|t| t.name == name && t.max_domain_gpus > SINGLE_NODE_DOMAIN_GPUS)
}

/// True when `name` is in the built-in catalogue.
pub fn is_catalogue_name(name: &str) -> bool {
    builtin_gpu_types().iter().any(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_spellings_resolve_to_the_catalogue() {
        let names = GpuNames::new(&BTreeMap::new());
        assert_eq!(names.resolve("h100"), Some("h100"));
        assert_eq!(names.resolve("H100"), Some("h100"));
        assert_eq!(names.resolve("nvidia_h100_80gb_hbm3"), Some("h100"));
        assert_eq!(names.resolve("NVIDIA-H100-80GB-HBM3"), Some("h100"));
        assert_eq!(names.resolve("NVIDIA-GB200"), Some("gb200"));
        assert_eq!(names.resolve("tesla_t4"), None);
        assert_eq!(names.resolve("NVIDIA-A100-SXM4-40GB"), None);
    }

    #[test]
    fn configured_aliases_extend_and_override() {
        let configured = BTreeMap::from([
            ("hopper".to_string(), "h100".to_string()),
            ("NVIDIA-H200".to_string(), "h100".to_string()),
        ]);
        let names = GpuNames::new(&configured);
        assert_eq!(names.resolve("Hopper"), Some("h100"));
        assert_eq!(names.resolve("nvidia_h200"), Some("h100"));
    }
}
