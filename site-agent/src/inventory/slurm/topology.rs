//! Slurm's network topology, from `topology.conf` or from the output of
//! `scontrol show topology` (the same `Key=Value` records):
//!
//! - topology/tree: `SwitchName=leaf1 Nodes=n[01-16]` and
//!   `SwitchName=spine1 Switches=leaf[1-4]`; `scontrol` adds `Level=` and
//!   `LinkSpeed=`, and lists every node below an upper switch too.
//! - topology/block (Slurm 23.11+): `BlockName=block1 Nodes=n[01-18]` and
//!   `BlockSizes=18,72`; `scontrol` adds `BlockIndex=` and `BlockSize=`.
//!
//! Keys are case-insensitive as in Slurm's parser; `#` starts a comment and a
//! trailing `\` continues a line. Lines without `=` (messages such as "No
//! topology information available") are skipped.

use super::super::InventoryError;
use crate::hostlist;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    pub name: String,
    /// Nodes directly attached (for a leaf) or below (in `scontrol`'s output
    /// of an upper switch).
    pub nodes: Vec<String>,
    /// Child switches; empty for a leaf.
    pub switches: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub name: String,
    pub nodes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlurmTopology {
    pub switches: Vec<Switch>,
    pub blocks: Vec<Block>,
}

/// Parses `text`; `what` names it in errors (a path or a command).
pub fn parse(what: &str, text: &str) -> Result<SlurmTopology, InventoryError> {
    let malformed = |line: usize, message: String| InventoryError::Malformed {
        what: what.to_string(),
        message: format!("line {line}: {message}"),
    };
    let mut topology = SlurmTopology::default();
    let mut pending = String::new();
    let mut start_line = 0;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim_end();
        if pending.is_empty() {
            start_line = index + 1;
        }
        if let Some(continued) = line.strip_suffix('\\') {
            pending.push_str(continued);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let record = std::mem::take(&mut pending);
        let fields: Vec<(String, &str)> = record
            .split_whitespace()
            .filter_map(|token| token.split_once('='))
            .map(|(key, value)| (key.to_ascii_lowercase(), value))
            .collect();
        let Some((kind, name)) = fields.first() else {
            continue;
        };
        let field = |key: &str| fields.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
        let expand = |key: &str| -> Result<Vec<String>, InventoryError> {
            hostlist::expand(field(key).unwrap_or(""))
                .map_err(|e| malformed(start_line, format!("{} of {name}: {e}", key_name(key))))
        };
        if name.is_empty() {
            return Err(malformed(
                start_line,
                format!("{} has no name", key_name(kind)),
            ));
        }
        match kind.as_str() {
            "switchname" => {
                if topology.switches.iter().any(|s| s.name == *name) {
                    return Err(malformed(
                        start_line,
                        format!("switch {name} is declared twice"),
                    ));
                }
                topology.switches.push(Switch {
                    name: name.to_string(),
                    nodes: expand("nodes")?,
                    switches: expand("switches")?,
                });
            }
            "blockname" => {
                if topology.blocks.iter().any(|b| b.name == *name) {
                    return Err(malformed(
                        start_line,
                        format!("block {name} is declared twice"),
                    ));
                }
                topology.blocks.push(Block {
                    name: name.to_string(),
                    nodes: expand("nodes")?,
                });
            }
            // Aggregation sizes of blocks: not needed to find a node's block.
            "blocksizes" => {}
            _ => {
                return Err(malformed(
                    start_line,
                    format!(
                        "unknown record {:?}: expected SwitchName=, BlockName= or BlockSizes=",
                        record.trim()
                    ),
                ));
            }
        }
    }
    if !topology.switches.is_empty() && !topology.blocks.is_empty() {
        return Err(InventoryError::Malformed {
            what: what.to_string(),
            message: "has both switches (topology/tree) and blocks (topology/block)".to_string(),
        });
    }
    Ok(topology)
}

fn key_name(key: &str) -> &'static str {
    match key {
        "switchname" => "SwitchName",
        "blockname" => "BlockName",
        "nodes" => "Nodes",
        "switches" => "Switches",
        _ => "field",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_from_topology_conf() {
        let text = "# two leaves\nSwitchName=leaf1 Nodes=n[1-2]\nSwitchName=leaf2 \\\n  Nodes=n3\n\
                    switchname=top Switches=leaf[1-2] LinkSpeed=100\n";
        let topology = parse("topology.conf", text).unwrap();
        assert_eq!(topology.switches.len(), 3);
        assert_eq!(topology.switches[0].nodes, ["n1", "n2"]);
        assert_eq!(topology.switches[1].nodes, ["n3"]);
        assert_eq!(topology.switches[2].switches, ["leaf1", "leaf2"]);
        assert!(topology.blocks.is_empty());
    }

    #[test]
    fn blocks_from_scontrol_output() {
        let text = "BlockName=b1 BlockIndex=0 Nodes=gb[01-18] BlockSize=18\n\
                    BlockName=b2 BlockIndex=1 Nodes=gb[19-36] BlockSize=18\n";
        let topology = parse("scontrol show topology", text).unwrap();
        assert_eq!(topology.blocks.len(), 2);
        assert_eq!(topology.blocks[1].nodes.len(), 18);
        assert_eq!(topology.blocks[1].nodes[0], "gb19");
    }

    #[test]
    fn messages_without_records_are_an_empty_topology() {
        let topology = parse("scontrol", "No topology information available\n").unwrap();
        assert_eq!(topology, SlurmTopology::default());
    }

    #[test]
    fn bad_records_name_the_line() {
        for (text, expected) in [
            ("SwitchName=s1 Nodes=n[1-\n", "line 1: Nodes of s1"),
            (
                "\nSwitchName=s1\nSwitchName=s1\n",
                "line 3: switch s1 is declared twice",
            ),
            ("NodeName=n1\n", "line 1: unknown record"),
            (
                "SwitchName=s1 Nodes=a\nBlockName=b1 Nodes=b\n",
                "both switches",
            ),
            ("BlockName= Nodes=a\n", "BlockName has no name"),
        ] {
            let error = parse("topology.conf", text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }
}
