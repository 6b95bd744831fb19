//! A tiny block-style YAML writer for the manifests the agent renders.
//!
//! The manifests are built as a [`Value`] tree and written in one
//! deterministic layout: two-space indentation, keys in insertion order,
//! sequences of scalars in flow style (`[a, b]`), multi-line strings as
//! literal blocks. A string is written plain only when it cannot be read
//! back as anything but that string by a YAML 1.1 or 1.2 parser (so `on`,
//! `no`, `0755`, `1e3` or `null` are quoted); everything else is
//! double-quoted with escapes. That is all a Kubernetes manifest needs, and
//! it keeps a YAML library out of the agent.

use std::fmt::Write as _;

/// A YAML node.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    String(String),
    Integer(u64),
    Bool(bool),
    Sequence(Vec<Value>),
    /// Entries in the order they are written.
    Mapping(Vec<(String, Value)>),
}

impl Value {
    pub fn string(s: impl Into<String>) -> Self {
        Self::String(s.into())
    }

    /// A mapping from `(key, value)` pairs, kept in this order.
    pub fn mapping<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Self {
        Self::Mapping(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    fn is_scalar(&self) -> bool {
        matches!(self, Self::String(_) | Self::Integer(_) | Self::Bool(_))
    }

    fn is_empty_collection(&self) -> bool {
        match self {
            Self::Sequence(items) => items.is_empty(),
            Self::Mapping(entries) => entries.is_empty(),
            _ => false,
        }
    }
}

/// Writes one YAML document (without the `---` marker).
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Mapping(entries) if !entries.is_empty() => write_mapping(&mut out, entries, 0),
        Value::Sequence(items) if !items.is_empty() && !all_scalars(items) => {
            write_sequence(&mut out, items, 0)
        }
        other => {
            write_inline(&mut out, other, 0);
            out.push('\n');
        }
    }
    out
}

/// Sequences of one-line scalars are written in flow style.
fn all_scalars(items: &[Value]) -> bool {
    items
        .iter()
        .all(|item| item.is_scalar() && !matches!(item, Value::String(s) if s.contains('\n')))
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn write_mapping(out: &mut String, entries: &[(String, Value)], level: usize) {
    for (key, value) in entries {
        indent(out, level);
        write_key(out, key);
        out.push(':');
        write_after_key(out, value, level);
    }
}

/// Writes what follows `key:` or `- `: an inline value on the same line, or
/// a nested block on the next lines.
fn write_after_key(out: &mut String, value: &Value, level: usize) {
    match value {
        Value::Mapping(entries) if !entries.is_empty() => {
            out.push('\n');
            write_mapping(out, entries, level + 1);
        }
        Value::Sequence(items) if !items.is_empty() && !all_scalars(items) => {
            out.push('\n');
            write_sequence(out, items, level + 1);
        }
        other => {
            out.push(' ');
            write_inline(out, other, level + 1);
            out.push('\n');
        }
    }
}

fn write_sequence(out: &mut String, items: &[Value], level: usize) {
    for item in items {
        indent(out, level);
        out.push('-');
        match item {
            // A mapping item starts on the dash's line, its other keys
            // aligned under the first.
            Value::Mapping(entries) if !entries.is_empty() => {
                out.push(' ');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        indent(out, level + 1);
                    }
                    write_key(out, key);
                    out.push(':');
                    write_after_key(out, value, level + 1);
                }
            }
            other => write_after_key(out, other, level),
        }
    }
}

/// Scalars, empty collections and flow sequences of scalars. Only a value
/// that follows a block key (`level` is then its block's indentation) may
/// be a literal block; inside flow collections strings are quoted.
fn write_inline(out: &mut String, value: &Value, level: usize) {
    match value {
        Value::String(s) => write_scalar_string(out, s, level),
        Value::Integer(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Sequence(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_flow(out, item);
            }
            out.push(']');
        }
        Value::Mapping(_) if value.is_empty_collection() => out.push_str("{}"),
        // Non-empty mappings are always written as blocks by the callers.
        Value::Mapping(entries) => {
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_double_quoted(out, key);
                out.push_str(": ");
                write_flow(out, item);
            }
            out.push('}');
        }
    }
}

/// A value inside a flow collection: strings plain or double-quoted.
fn write_flow(out: &mut String, value: &Value) {
    match value {
        Value::String(s) => write_key(out, s),
        other => write_inline(out, other, 0),
    }
}

/// A mapping key or flow item: plain when safe, else double-quoted.
fn write_key(out: &mut String, s: &str) {
    if is_plain_safe(s) {
        out.push_str(s);
    } else {
        write_double_quoted(out, s);
    }
}

/// A string as a plain scalar, a literal block (multi-line text that fits
/// one) or a double-quoted scalar. `level` is the indentation of the block
/// content.
fn write_scalar_string(out: &mut String, s: &str, level: usize) {
    if is_plain_safe(s) {
        out.push_str(s);
    } else if fits_literal_block(s) {
        write_literal_block(out, s, level);
    } else {
        write_double_quoted(out, s);
    }
}

/// True when `s` reads back as exactly this string when written plain, in
/// block and flow context alike: it starts with a letter or `/`, uses only
/// letters, digits and `-._/`, and is not one of the YAML 1.1 words for
/// booleans and null. Numbers, which start with a digit, sign or dot, are
/// never plain.
fn is_plain_safe(s: &str) -> bool {
    const RESERVED: &[&str] = &[
        "y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf",
    ];
    let Some(first) = s.chars().next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == '/')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '/'))
        && !RESERVED.contains(&s.to_ascii_lowercase().as_str())
}

/// Multi-line text of printable characters whose first line does not start
/// with a space (which would need an indentation indicator) and whose lines
/// carry no trailing spaces or tabs (which editors and linters eat).
fn fits_literal_block(s: &str) -> bool {
    s.contains('\n')
        && !s.starts_with([' ', '\n'])
        && s.chars().all(|c| c == '\n' || !c.is_control())
        && s.lines().all(|line| !line.ends_with([' ', '\t']))
}

fn write_literal_block(out: &mut String, s: &str, level: usize) {
    let body = s.trim_end_matches('\n');
    let trailing = s.len() - body.len();
    out.push_str(match trailing {
        0 => "|-",
        1 => "|",
        _ => "|+",
    });
    for line in s
        .split('\n')
        .take(body.split('\n').count() + trailing.saturating_sub(1))
    {
        out.push('\n');
        if !line.is_empty() {
            indent(out, level);
            out.push_str(line);
        }
    }
}

fn write_double_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_nested_blocks_in_insertion_order() {
        let doc = Value::mapping([
            ("apiVersion", Value::string("v1")),
            (
                "metadata",
                Value::mapping([
                    ("name", Value::string("a")),
                    ("labels", Value::mapping([("k8s.io/x", Value::string("7"))])),
                ]),
            ),
            (
                "items",
                Value::Sequence(vec![
                    Value::mapping([
                        ("name", Value::string("c")),
                        ("ports", Value::Sequence(vec![Value::Integer(80)])),
                    ]),
                    Value::mapping([("empty", Value::Mapping(vec![]))]),
                ]),
            ),
            ("on", Value::Bool(true)),
        ]);
        assert_eq!(
            to_string(&doc),
            "apiVersion: v1\n\
             metadata:\n  name: a\n  labels:\n    k8s.io/x: \"7\"\n\
             items:\n  - name: c\n    ports: [80]\n  - empty: {}\n\
             \"on\": true\n"
        );
    }

    #[test]
    fn quotes_strings_a_parser_would_read_as_something_else() {
        for (s, written) in [
            ("trainer", "trainer"),
            ("nvidia.com/gpu", "nvidia.com/gpu"),
            ("", "\"\""),
            ("no", "\"no\""),
            ("Off", "\"Off\""),
            ("0755", "\"0755\""),
            ("1e3", "\"1e3\""),
            ("-1", "\"-1\""),
            (".inf", "\".inf\""),
            ("a: b", "\"a: b\""),
            ("#x", "\"#x\""),
            ("say \"hi\"\\", "\"say \\\"hi\\\"\\\\\""),
            ("tab\there", "\"tab\\there\""),
            ("bell\u{7}", "\"bell\\u0007\""),
        ] {
            let mut out = String::new();
            write_scalar_string(&mut out, s, 0);
            assert_eq!(out, written, "{s:?}");
        }
    }

    #[test]
    fn multi_line_text_becomes_a_literal_block_with_exact_chomping() {
        let doc = |s: &str| to_string(&Value::mapping([("k", Value::string(s))]));
        assert_eq!(doc("a\nb\n"), "k: |\n  a\n  b\n");
        assert_eq!(doc("a\n\nb"), "k: |-\n  a\n\n  b\n");
        assert_eq!(doc("a\nb\n\n"), "k: |+\n  a\n  b\n\n");
        // Leading space or trailing blanks fall back to double quotes.
        assert_eq!(doc(" a\nb"), "k: \" a\\nb\"\n");
        assert_eq!(doc("a \nb"), "k: \"a \\nb\"\n");
    }
}
