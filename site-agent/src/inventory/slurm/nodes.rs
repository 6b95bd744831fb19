//! Slurm's nodes, from either of the two shapes Slurm prints them in:
//!
//! - JSON: `scontrol show nodes --json` (Slurm 23.02+) or `sinfo --json`
//!   (22.05, openapi v0.0.38), a `{"nodes": [...]}` document. `state` is a
//!   list (`["IDLE", "DRAIN"]`) since data_parser v0.0.40 and a lowercase
//!   string plus `state_flags` before it; both are read.
//! - text: `scontrol -o show nodes`, one `NodeName=... Key=Value ...` line
//!   per node, which every Slurm prints (22.05's `scontrol` has no `--json`).
//!
//! Only what the inventory needs is kept: name, GRES, partitions, state,
//! reason and configured TRES.

use serde::Deserialize;

use super::super::InventoryError;

/// One node as Slurm reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmNode {
    pub name: String,
    /// Configured generic resources (`gpu:h100:8(S:0-1)`), empty for none.
    pub gres: String,
    pub partitions: Vec<String>,
    /// Base state then flags, uppercase: `["IDLE", "DRAIN"]`.
    pub state: Vec<String>,
    pub reason: String,
    /// Configured trackable resources (`cpu=64,mem=1T,gres/gpu=8`), if given.
    pub tres: Option<String>,
}

/// Base states in which a node can take no work.
const UNUSABLE_STATES: &[&str] = &["DOWN", "ERROR", "FUTURE", "UNKNOWN"];

/// State flags that take a node out of service. Power saving, reservations,
/// maintenance windows and completing jobs do not: the node is still part of
/// the machine a plan may use.
const UNUSABLE_FLAGS: &[&str] = &[
    "DRAIN",
    "DRAINED",
    "DRAINING",
    "FAIL",
    "FAILING",
    "NOT_RESPONDING",
    "NO_RESPOND",
    "INVALID",
    "INVALID_REG",
    "REBOOT_ISSUED",
    "POWER_DOWN",
    "POWERING_DOWN",
];

impl SlurmNode {
    /// Why the node cannot be used, or `None` when it can.
    pub fn unusable_reason(&self) -> Option<String> {
        let base = self.state.first().map(String::as_str).unwrap_or("UNKNOWN");
        let out = UNUSABLE_STATES.contains(&base)
            || self
                .state
                .iter()
                .skip(1)
                .any(|f| UNUSABLE_FLAGS.contains(&f.as_str()));
        out.then(|| {
            let state = if self.state.is_empty() {
                "UNKNOWN".to_string()
            } else {
                self.state.join("+")
            };
            if self.reason.trim().is_empty() {
                format!("state {state}")
            } else {
                format!("state {state}: {}", self.reason.trim())
            }
        })
    }
}

#[derive(Deserialize)]
struct JsonDocument {
    nodes: Vec<JsonNode>,
    #[serde(default)]
    errors: Vec<JsonMessage>,
}

#[derive(Deserialize)]
struct JsonMessage {
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct JsonNode {
    name: String,
    #[serde(default)]
    gres: Option<String>,
    #[serde(default)]
    partitions: Option<Vec<String>>,
    #[serde(default)]
    state: Option<JsonState>,
    #[serde(default)]
    state_flags: Option<Vec<String>>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    tres: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum JsonState {
    One(String),
    Many(Vec<String>),
}

/// Reads a `{"nodes": [...]}` document.
pub fn parse_json(what: &str, text: &str) -> Result<Vec<SlurmNode>, InventoryError> {
    let malformed = |message: String| InventoryError::Malformed {
        what: what.to_string(),
        message,
    };
    let document: JsonDocument = serde_json::from_str(text).map_err(|e| {
        malformed(format!(
            "not a Slurm node list (`{{\"nodes\": [...]}}`): {e}"
        ))
    })?;
    if !document.errors.is_empty() {
        let messages: Vec<String> = document
            .errors
            .iter()
            .map(|e| {
                [e.error.as_deref(), e.description.as_deref()]
                    .into_iter()
                    .flatten()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(": ")
            })
            .collect();
        return Err(malformed(format!(
            "Slurm reported errors: {}",
            messages.join("; ")
        )));
    }
    Ok(document
        .nodes
        .into_iter()
        .map(|node| {
            let mut state: Vec<String> = match node.state {
                Some(JsonState::One(base)) => vec![base],
                Some(JsonState::Many(all)) => all,
                None => Vec::new(),
            };
            state.extend(node.state_flags.unwrap_or_default());
            SlurmNode {
                name: node.name,
                gres: clean(node.gres.as_deref().unwrap_or("")),
                partitions: node.partitions.unwrap_or_default(),
                state: state.iter().map(|s| s.to_ascii_uppercase()).collect(),
                reason: node.reason.unwrap_or_default(),
                tres: node.tres.filter(|t| !t.is_empty()),
            }
        })
        .collect())
}

/// Reads `scontrol -o show nodes` output.
pub fn parse_text(what: &str, text: &str) -> Result<Vec<SlurmNode>, InventoryError> {
    let mut nodes = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line == "No nodes in the system" {
            continue;
        }
        if !line.starts_with("NodeName=") {
            return Err(InventoryError::Malformed {
                what: what.to_string(),
                message: format!(
                    "line {} is not a one-line node record (record `scontrol -o show nodes`, with -o): {:?}",
                    index + 1,
                    truncate(line, 80)
                ),
            });
        }
        let fields = fields(line);
        let field = |key: &str| {
            fields
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.as_str())
                .unwrap_or("")
        };
        nodes.push(SlurmNode {
            name: field("NodeName").to_string(),
            gres: clean(field("Gres")),
            partitions: field("Partitions")
                .split(',')
                .filter(|p| !p.is_empty() && *p != "(null)")
                .map(str::to_string)
                .collect(),
            state: text_state(field("State")),
            reason: field("Reason").to_string(),
            tres: Some(clean(field("CfgTRES"))).filter(|t| !t.is_empty()),
        });
    }
    Ok(nodes)
}

/// Splits a record into `Key=Value` fields. A token without `=` (or whose
/// key is not a word) continues the previous value: `OS=Linux 6.1 #1 SMP`
/// and `Reason=Not responding [slurm@...]` hold spaces.
fn fields(line: &str) -> Vec<(&str, String)> {
    let mut fields: Vec<(&str, String)> = Vec::new();
    for token in line.split_whitespace() {
        let key = token
            .split_once('=')
            .map(|(k, _)| k)
            .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        match (key, fields.last_mut()) {
            (Some(key), _) => fields.push((key, token[key.len() + 1..].to_string())),
            (None, Some((_, value))) => {
                value.push(' ');
                value.push_str(token);
            }
            (None, None) => {}
        }
    }
    fields
}

/// `IDLE+DRAIN`, `DOWN*`, `MIXED+DRAIN*`: base state, flags, and the
/// trailing `*` that means "not responding".
fn text_state(state: &str) -> Vec<String> {
    let (state, not_responding) = match state.strip_suffix('*') {
        Some(rest) => (rest, true),
        None => (state, false),
    };
    let mut parts: Vec<String> = state
        .split('+')
        .filter(|p| !p.is_empty())
        .map(|p| p.to_ascii_uppercase())
        .collect();
    if not_responding {
        parts.push("NOT_RESPONDING".to_string());
    }
    parts
}

/// `(null)` and `N/A` are Slurm's ways of printing nothing.
fn clean(value: &str) -> String {
    match value.trim() {
        "(null)" | "N/A" => String::new(),
        other => other.to_string(),
    }
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_records_with_spaces_in_values() {
        let text = "NodeName=n1 Arch=x86_64 Gres=gpu:h100:8(S:0-1) OS=Linux 6.1.0 #1 SMP @0 \
                    State=IDLE+DRAIN Partitions=gpu,all CfgTRES=cpu=64,gres/gpu=8 \
                    Reason=Xid 79 [root@2025-01-01T00:00:00]\n\
                    NodeName=n2 Gres=(null) State=DOWN* Partitions=cpu Reason=Not responding\n";
        let nodes = parse_text("scontrol", text).unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].gres, "gpu:h100:8(S:0-1)");
        assert_eq!(nodes[0].state, ["IDLE", "DRAIN"]);
        assert_eq!(nodes[0].partitions, ["gpu", "all"]);
        assert_eq!(nodes[0].tres.as_deref(), Some("cpu=64,gres/gpu=8"));
        assert_eq!(nodes[0].reason, "Xid 79 [root@2025-01-01T00:00:00]");
        assert_eq!(
            nodes[0].unusable_reason().as_deref(),
            Some("state IDLE+DRAIN: Xid 79 [root@2025-01-01T00:00:00]")
        );
        assert_eq!(nodes[1].gres, "");
        assert_eq!(nodes[1].state, ["DOWN", "NOT_RESPONDING"]);
    }

    #[test]
    fn multi_line_records_are_refused() {
        let error = parse_text("scontrol", "NodeName=n1 Arch=x86_64\n   CPUAlloc=0\n").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("line 2 is not a one-line node record"),
            "{error}"
        );
    }

    #[test]
    fn both_json_state_shapes() {
        let v0038 = r#"{"nodes": [{"name": "a", "state": "idle", "state_flags": ["DRAIN"],
                        "gres": "gpu:h100:8", "partitions": ["gpu"], "tres": "cpu=1"}]}"#;
        let v0041 = r#"{"nodes": [{"name": "b", "state": ["MIXED"], "gres": "",
                        "partitions": [], "reason": ""}], "errors": [], "warnings": []}"#;
        let a = &parse_json("a", v0038).unwrap()[0];
        assert_eq!(a.state, ["IDLE", "DRAIN"]);
        assert!(a.unusable_reason().is_some());
        let b = &parse_json("b", v0041).unwrap()[0];
        assert_eq!(b.state, ["MIXED"]);
        assert_eq!(b.unusable_reason(), None);
    }

    #[test]
    fn usable_states() {
        let node = |state: &[&str]| SlurmNode {
            name: "n".to_string(),
            gres: String::new(),
            partitions: Vec::new(),
            state: state.iter().map(|s| s.to_string()).collect(),
            reason: String::new(),
            tres: None,
        };
        for usable in [
            &["IDLE"][..],
            &["ALLOCATED"],
            &["MIXED", "COMPLETING"],
            &["IDLE", "POWERED_DOWN"],
            &["IDLE", "MAINTENANCE", "RESERVED"],
        ] {
            assert_eq!(node(usable).unusable_reason(), None, "{usable:?}");
        }
        for unusable in [
            &["DOWN"][..],
            &["IDLE", "DRAIN"],
            &["MIXED", "DRAINING"],
            &["IDLE", "NOT_RESPONDING"],
            &["FUTURE"],
            &[],
        ] {
            assert!(node(unusable).unusable_reason().is_some(), "{unusable:?}");
        }
    }

    #[test]
    fn slurm_errors_in_json_are_reported() {
        let text = r#"{"nodes": [], "errors": [{"error": "Unable to contact slurm controller",
                       "description": "connect failure"}]}"#;
        let error = parse_json("scontrol show nodes --json", text).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("Unable to contact slurm controller"),
            "{error}"
        );
    }
}
