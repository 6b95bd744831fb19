//! Parsing config files with errors that point at the problem.
//!
//! A config file is parsed in two passes. The first deserializes the TOML into
//! the model with `serde` (unknown keys, wrong types and malformed units fail
//! here). The second runs semantic checks on the model (duplicate ids, links to
//! unknown sites, capacities of zero, ...), which report a [`FieldPath`]. Both
//! kinds of failure are then located in the source: the span of the offending
//! key or value is looked up by its path in the parsed document, and reported
//! as `file:line:column` together with the path (`sites[1].buildings[0].id`).

use std::fmt;

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// One segment of a path into a config document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// A path into a config document, such as `sites[1].buildings[0].id`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldPath(Vec<Segment>);

impl FieldPath {
    pub fn root() -> Self {
        Self(Vec::new())
    }
    /// The path extended by a key.
    pub fn key(&self, key: &str) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Key(key.to_string()));
        Self(segments)
    }
    /// The path extended by an array index.
    pub fn index(&self, index: usize) -> Self {
        let mut segments = self.0.clone();
        segments.push(Segment::Index(index));
        Self(segments)
    }
    pub fn segments(&self) -> &[Segment] {
        &self.0
    }
    fn from_serde(path: &serde_path_to_error::Path) -> Self {
        use serde_path_to_error::Segment as S;
        Self(
            path.iter()
                .filter_map(|segment| match segment {
                    S::Seq { index } => Some(Segment::Index(*index)),
                    S::Map { key } | S::Enum { variant: key } => Some(Segment::Key(key.clone())),
                    S::Unknown => None,
                })
                .collect(),
        )
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(document)");
        }
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(key) if i == 0 => write!(f, "{key}")?,
                Segment::Key(key) => write!(f, ".{key}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// A problem found by semantic validation, before it is located in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: FieldPath,
    pub message: String,
}

impl Violation {
    pub fn new(path: FieldPath, message: impl Into<String>) -> Self {
        Self {
            path,
            message: message.into(),
        }
    }
}

/// One located problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// The field path, such as `sites[1].buildings[0].id`.
    pub path: String,
    /// 1-based line; 0 when the problem has no place in the file.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    pub message: String,
}

/// Every problem found in one config file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file name as the user gave it.
    pub file: String,
    /// At least one issue, in document order.
    pub issues: Vec<Issue>,
}

impl ConfigError {
    /// The first issue (there is always at least one).
    pub fn first(&self) -> &Issue {
        &self.issues[0]
    }

    /// An error that is not about a place in the file (for example, the file
    /// could not be read).
    pub fn whole_file(file: &str, message: impl Into<String>) -> Self {
        Self {
            file: file.to_string(),
            issues: vec![Issue {
                path: FieldPath::root().to_string(),
                line: 0,
                column: 0,
                message: message.into(),
            }],
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.issues.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            if issue.line == 0 {
                write!(
                    f,
                    "{}: field `{}`: {}",
                    self.file, issue.path, issue.message
                )?;
            } else {
                write!(
                    f,
                    "{}:{}:{}: field `{}`: {}",
                    self.file, issue.line, issue.column, issue.path, issue.message
                )?;
            }
        }
        Ok(())
    }
}

/// A model that can be checked after it has been deserialized.
pub trait Validate {
    /// Every semantic problem, in document order. Empty when the value is valid.
    fn violations(&self) -> Vec<Violation>;

    /// The bounds of [`crate::limits`] that admission puts on the value once it is part of
    /// a replicated write, checked when a file is read so that a file that passes is never
    /// refused later for its size. Not part of [`Validate::violations`], which apply runs
    /// on logged commands and must stay the same in every release.
    fn bounds(&self) -> Vec<Violation> {
        Vec::new()
    }
}

/// Parses `text` (the contents of `file`) into `T` and validates it.
pub fn parse<T: DeserializeOwned + Validate>(file: &str, text: &str) -> Result<T, ConfigError> {
    let document = DeTable::parse(text).map_err(|error| {
        let (line, column) = error
            .span()
            .map(|span| line_column(text, span.start))
            .unwrap_or((0, 0));
        ConfigError {
            file: file.to_string(),
            issues: vec![Issue {
                path: FieldPath::root().to_string(),
                line,
                column,
                message: format!("invalid TOML: {}", error.message().trim()),
            }],
        }
    })?;

    let deserializer = toml::Deserializer::from(document.clone());
    let value: T = serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let path = FieldPath::from_serde(error.path());
        let inner = error.inner();
        let span = inner
            .span()
            .filter(|span| !span.is_empty())
            .or_else(|| locate(&document, &path));
        let (line, column) = span.map(|s| line_column(text, s.start)).unwrap_or((0, 0));
        ConfigError {
            file: file.to_string(),
            issues: vec![Issue {
                path: path.to_string(),
                line,
                column,
                message: inner.message().trim().to_string(),
            }],
        }
    })?;

    let mut violations = value.violations();
    violations.extend(value.bounds());
    if violations.is_empty() {
        return Ok(value);
    }
    Err(locate_violations(file, text, &document, violations))
}

/// Turns semantic violations into located issues.
pub fn locate_violations(
    file: &str,
    text: &str,
    document: &Spanned<DeTable<'_>>,
    violations: Vec<Violation>,
) -> ConfigError {
    let mut issues: Vec<Issue> = violations
        .into_iter()
        .map(|violation| {
            let (line, column) = locate(document, &violation.path)
                .map(|s| line_column(text, s.start))
                .unwrap_or((0, 0));
            Issue {
                path: violation.path.to_string(),
                line,
                column,
                message: violation.message,
            }
        })
        .collect();
    issues.sort_by_key(|issue| (issue.line == 0, issue.line, issue.column));
    ConfigError {
        file: file.to_string(),
        issues,
    }
}

/// Re-locates violations of a value parsed from `text` (used when a check
/// needs a second file, such as a job checked against a topology).
pub fn violations_in(file: &str, text: &str, violations: Vec<Violation>) -> ConfigError {
    match DeTable::parse(text) {
        Ok(document) => locate_violations(file, text, &document, violations),
        Err(_) => ConfigError {
            file: file.to_string(),
            issues: violations
                .into_iter()
                .map(|v| Issue {
                    path: v.path.to_string(),
                    line: 0,
                    column: 0,
                    message: v.message,
                })
                .collect(),
        },
    }
}

/// The span of the value at `path`, or of the deepest ancestor that exists.
/// For a key that exists, the span of its value is returned, so that line and
/// column point at what has to change.
fn locate(document: &Spanned<DeTable<'_>>, path: &FieldPath) -> Option<std::ops::Range<usize>> {
    let mut best = document.span();
    let mut table: Option<&DeTable<'_>> = Some(document.get_ref());
    let mut current: Option<&Spanned<DeValue<'_>>> = None;
    for segment in path.segments() {
        let next = match (segment, table, current) {
            (Segment::Key(key), Some(table), _) => table
                .iter()
                .find(|(k, _)| k.get_ref().as_ref() == key.as_str())
                .map(|(_, v)| v),
            (Segment::Index(index), _, Some(value)) => value
                .get_ref()
                .as_array()
                .and_then(|array| array.get(*index)),
            _ => None,
        };
        let Some(next) = next else { break };
        best = next.span();
        current = Some(next);
        table = next.get_ref().as_table();
    }
    Some(best)
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..floor_char_boundary(text, offset)];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

fn floor_char_boundary(text: &str, mut offset: usize) -> usize {
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

/// Checks that ids are short, lowercase and safe in file names, URLs and
/// scheduler constraints.
pub fn check_id(path: &FieldPath, id: &str, out: &mut Vec<Violation>) {
    let valid = !id.is_empty()
        // Not `limits::MAX_ID_LEN`, which admission owns: apply runs this check on logged
        // commands, and must stay the same in every release.
        && id.len() <= 63
        && id.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        out.push(Violation::new(
            path.clone(),
            format!(
                "invalid id {}: expected 1 to 63 characters of a-z, 0-9, '-' or '_', starting with a letter or digit",
                crate::limits::quote(id),
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based_and_count_characters() {
        let text = "a = 1\nµb = 2\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 6), (2, 1));
        // 'b' follows a two-byte character: column 2, not 3.
        assert_eq!(line_column(text, 8), (2, 2));
    }

    #[test]
    fn paths_print_like_accessors() {
        let path = FieldPath::root()
            .key("sites")
            .index(1)
            .key("buildings")
            .index(0)
            .key("id");
        assert_eq!(path.to_string(), "sites[1].buildings[0].id");
        assert_eq!(FieldPath::root().to_string(), "(document)");
    }
}
