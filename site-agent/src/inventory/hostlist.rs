//! Slurm host lists: `n[001-018,020],gpu-a[1-2]` and their expansion.
//!
//! The syntax is Slurm's: entries separated by commas outside brackets; a
//! bracket holds comma-separated numbers and `lo-hi` ranges; a range whose
//! lower bound has leading zeros keeps that width (`[08-10]` gives `08 09
//! 10`); several brackets in one entry expand as a product
//! (`r[1-2]n[1-2]` gives `r1n1 r1n2 r2n1 r2n2`). `(null)` and the empty
//! string are empty lists.

use std::fmt;

/// Expansion is refused beyond this many names: a typo such as
/// `n[1-100000000]` must be an error, not an exhausted machine.
pub const MAX_HOSTS: usize = 1_000_000;

/// Why a host list could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid host list {list:?}: {reason}")]
pub struct HostlistError {
    pub list: String,
    pub reason: String,
}

/// Expands a host list into names, in the order written.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let error = |reason: String| HostlistError {
        list: list.to_string(),
        reason,
    };
    let trimmed = list.trim();
    if trimmed.is_empty() || trimmed == "(null)" {
        return Ok(Vec::new());
    }
    let mut names = Vec::new();
    for entry in split_entries(trimmed).map_err(&error)? {
        if entry.is_empty() {
            return Err(error("empty entry (two commas in a row?)".to_string()));
        }
        expand_entry(entry, &mut names).map_err(&error)?;
    }
    Ok(names)
}

/// Splits at commas that are not inside brackets.
fn split_entries(list: &str) -> Result<Vec<&str>, String> {
    let mut entries = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth > 0 => return Err(format!("nested '[' at byte {i}")),
            '[' => depth += 1,
            ']' if depth == 0 => return Err(format!("unmatched ']' at byte {i}")),
            ']' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err("unclosed '['".to_string());
    }
    entries.push(list[start..].trim());
    Ok(entries)
}

/// One piece of an entry: literal text or the numbers of a bracket.
enum Piece<'a> {
    Text(&'a str),
    Numbers(Vec<String>),
}

fn expand_entry(entry: &str, out: &mut Vec<String>) -> Result<(), String> {
    let mut pieces = Vec::new();
    let mut rest = entry;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|i| open + i)
            .ok_or_else(|| format!("unclosed '[' in {entry:?}"))?;
        if open > 0 {
            pieces.push(Piece::Text(&rest[..open]));
        }
        pieces.push(Piece::Numbers(expand_bracket(&rest[open + 1..close])?));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    let mut names = vec![String::new()];
    for piece in &pieces {
        match piece {
            Piece::Text(text) => names.iter_mut().for_each(|name| name.push_str(text)),
            Piece::Numbers(numbers) => {
                let total = names.len().saturating_mul(numbers.len());
                if out.len().saturating_add(total) > MAX_HOSTS {
                    return Err(format!("expands to more than {MAX_HOSTS} names"));
                }
                names = names
                    .iter()
                    .flat_map(|name| numbers.iter().map(move |n| format!("{name}{n}")))
                    .collect();
            }
        }
    }
    out.extend(names);
    Ok(())
}

/// `001-018,020` into `001`, `002`, ..., `018`, `020`.
fn expand_bracket(inner: &str) -> Result<Vec<String>, String> {
    let mut numbers = Vec::new();
    for part in inner.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.trim(), hi.trim()),
            None => (part, part),
        };
        let parse = |text: &str| -> Result<u64, String> {
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "{part:?} in [{inner}] is not a number or a lo-hi range"
                ));
            }
            text.parse::<u64>()
                .map_err(|_| format!("{text:?} in [{inner}] is too large"))
        };
        let (low, high) = (parse(lo)?, parse(hi)?);
        if high < low {
            return Err(format!("range {part:?} in [{inner}] runs backwards"));
        }
        if high - low >= MAX_HOSTS as u64 {
            return Err(format!(
                "range {part:?} expands to more than {MAX_HOSTS} names"
            ));
        }
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        numbers.extend((low..=high).map(|n| format!("{n:0width$}")));
    }
    Ok(numbers)
}

/// A list of names that prints compactly in error messages.
#[derive(Debug)]
pub struct Names<'a>(pub &'a [String]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 5;
        let shown: Vec<&str> = self.0.iter().take(SHOWN).map(String::as_str).collect();
        write!(f, "{}", shown.join(", "))?;
        if self.0.len() > SHOWN {
            write!(f, " and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        expand(list).unwrap()
    }

    #[test]
    fn ranges_lists_and_padding() {
        assert_eq!(
            names("n[001-003,020],gpu-a[1-2]"),
            ["n001", "n002", "n003", "n020", "gpu-a1", "gpu-a2"]
        );
        assert_eq!(names("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(names("n[08-10]"), ["n08", "n09", "n10"]);
        assert_eq!(names("n[0-1]"), ["n0", "n1"]);
        assert_eq!(names("n[7]"), ["n7"]);
    }

    #[test]
    fn plain_names_and_empty_lists() {
        assert_eq!(names("login1"), ["login1"]);
        assert_eq!(names("a,b , c"), ["a", "b", "c"]);
        assert!(names("").is_empty());
        assert!(names("(null)").is_empty());
    }

    #[test]
    fn several_brackets_expand_as_a_product() {
        assert_eq!(
            names("r[1-2]n[1-2]-ib"),
            ["r1n1-ib", "r1n2-ib", "r2n1-ib", "r2n2-ib"]
        );
    }

    #[test]
    fn malformed_lists_are_errors_that_say_why() {
        for (list, reason) in [
            ("n[1-3", "unclosed '['"),
            ("n1-3]", "unmatched ']'"),
            ("n[3-1]", "runs backwards"),
            ("n[a-b]", "is not a number"),
            ("n[1-]", "is not a number"),
            ("n[[1]]", "nested '['"),
            ("a,,b", "empty entry"),
            ("n[1-100000000]", "more than 1000000 names"),
            ("n[1-1000]m[1-1001]", "more than 1000000 names"),
        ] {
            let error = expand(list).unwrap_err();
            assert_eq!(error.list, list);
            assert!(
                error.reason.contains(reason),
                "{list}: {:?} lacks {reason:?}",
                error.reason
            );
        }
    }
}
