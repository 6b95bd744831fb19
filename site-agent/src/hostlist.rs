//! Scheduler node names: Slurm hostlist expressions and natural order.
//!
//! - [`expand`] reads Slurm's syntax: entries separated by commas outside
//!   brackets; a bracket holds comma-separated numbers and `lo-hi` ranges; a
//!   range whose lower bound has leading zeros keeps that width (`[08-10]`
//!   gives `08 09 10`); several brackets in one entry expand as a product
//!   (`r[1-2]n[1-2]` gives `r1n1 r1n2 r2n1 r2n2`). `(null)` and the empty
//!   string are empty lists.
//! - [`compress`] writes one: a name splits into a prefix and its trailing
//!   run of digits; names with the same prefix fold into one bracket of
//!   ranges, and a number joins a range only if writing it at the range's
//!   width gives back its exact spelling (`n9 n10` make `n[9-10]`, `n09 n10`
//!   make `n[09-10]`, `n9 n010` stay apart), so `expand(compress(x))` is `x`.
//! - [`natural_cmp`] is the order an operator reads names in (`n2` before
//!   `n10`). Every ordering in an inventory (buildings, domains, nodes) uses
//!   it, so the same cluster always yields the same indices.

use std::cmp::Ordering;
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

/// Compares two names by runs: digit runs by numeric value (then by length, so
/// `n02` and `n2` are still ordered), other runs byte-wise.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let (run_a, rest_a) = split_run(a, true);
                let (run_b, rest_b) = split_run(b, true);
                let order = compare_digits(run_a, run_b);
                if order != Ordering::Equal {
                    return order;
                }
                (a, b) = (rest_a, rest_b);
            }
            (Some(_), Some(_)) => {
                let (run_a, rest_a) = split_run(a, false);
                let (run_b, rest_b) = split_run(b, false);
                // Compare the text runs; when one is a prefix of the other the
                // next character decides (a digit run sorts before text).
                let common = run_a.len().min(run_b.len());
                let order = run_a[..common].cmp(&run_b[..common]);
                if order != Ordering::Equal {
                    return order;
                }
                if run_a.len() != run_b.len() {
                    return a[common..].cmp(&b[common..]);
                }
                (a, b) = (rest_a, rest_b);
            }
        }
    }
}

fn split_run(text: &[u8], digits: bool) -> (&[u8], &[u8]) {
    let end = text
        .iter()
        .position(|c| c.is_ascii_digit() != digits)
        .unwrap_or(text.len());
    text.split_at(end)
}

fn compare_digits(a: &[u8], b: &[u8]) -> Ordering {
    let trim = |run: &[u8]| -> usize { run.iter().take_while(|&&c| c == b'0').count() };
    let (sig_a, sig_b) = (&a[trim(a)..], &b[trim(b)..]);
    sig_a
        .len()
        .cmp(&sig_b.len())
        .then_with(|| sig_a.cmp(sig_b))
        .then_with(|| a.len().cmp(&b.len()))
}

/// Sorts names in natural order.
pub fn sort_natural(names: &mut [String]) {
    names.sort_by(|a, b| natural_cmp(a, b));
}

/// A host name split into its prefix and trailing number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Split<'a> {
    prefix: &'a str,
    /// The trailing digits as written, empty when there are none.
    digits: &'a str,
    /// Their value; `None` when there are no digits or too many for a u64,
    /// in which case the name is written out as it is.
    value: Option<u64>,
}

fn split(name: &str) -> Split<'_> {
    let prefix_len = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (prefix, digits) = name.split_at(prefix_len);
    Split {
        prefix,
        digits,
        value: digits.parse().ok(),
    }
}

/// The order compression folds in: by prefix, then by the trailing
/// number's value, then by its spelling (`n7` before `n007`), names without
/// a number first. (Inventories order names with [`natural_cmp`].)
fn compress_order(a: &str, b: &str) -> Ordering {
    let (sa, sb) = (split(a), split(b));
    sa.prefix
        .cmp(sb.prefix)
        .then_with(|| match (sa.value, sb.value) {
            (Some(x), Some(y)) => x.cmp(&y),
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| sa.digits.len().cmp(&sb.digits.len()))
        .then_with(|| a.cmp(b))
}

/// A run of consecutive numbers all written at the width of `first`.
struct Range<'a> {
    first: &'a str,
    first_value: u64,
    last_value: u64,
}

impl Range<'_> {
    fn width(&self) -> usize {
        self.first.len()
    }

    fn extends_to(&self, digits: &str, value: u64) -> bool {
        self.last_value.checked_add(1) == Some(value)
            && format!("{value:0width$}", width = self.width()) == digits
    }

    fn write(&self, out: &mut String) {
        out.push_str(self.first);
        if self.last_value != self.first_value {
            out.push('-');
            out.push_str(&format!(
                "{:0width$}",
                self.last_value,
                width = self.width()
            ));
        }
    }
}

/// Compresses host names into a Slurm hostlist expression, in natural
/// order, duplicates dropped. Names must not contain `[`, `]` or `,`
/// (Slurm forbids them in node names; the renderer refuses them earlier).
pub fn compress<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let mut sorted: Vec<&str> = names.into_iter().collect();
    sorted.sort_by(|a, b| compress_order(a, b));
    sorted.dedup();

    let mut out = String::new();
    let mut index = 0;
    while let Some(&name) = sorted.get(index) {
        if !out.is_empty() {
            out.push(',');
        }
        let head = split(name);
        let Some(head_value) = head.value else {
            out.push_str(name);
            index += 1;
            continue;
        };
        // Every following name with this prefix and a number goes into one
        // bracket; natural order keeps them together and ascending.
        let mut ranges = vec![Range {
            first: head.digits,
            first_value: head_value,
            last_value: head_value,
        }];
        index += 1;
        while let Some(&next) = sorted.get(index) {
            let s = split(next);
            let Some(value) = s.value.filter(|_| s.prefix == head.prefix) else {
                break;
            };
            match ranges.last_mut() {
                Some(range) if range.extends_to(s.digits, value) => range.last_value = value,
                _ => ranges.push(Range {
                    first: s.digits,
                    first_value: value,
                    last_value: value,
                }),
            }
            index += 1;
        }
        out.push_str(head.prefix);
        let single = ranges.len() == 1 && ranges[0].first_value == ranges[0].last_value;
        if single {
            ranges[0].write(&mut out);
        } else {
            out.push('[');
            for (i, range) in ranges.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                range.write(&mut out);
            }
            out.push(']');
        }
    }
    out
}

/// Compresses sorted distinct indices into ranges: `0-3,5,7-8`.
pub fn index_ranges(indices: &[u32]) -> String {
    let mut out = String::new();
    let mut iter = indices.iter().copied().peekable();
    while let Some(first) = iter.next() {
        let mut last = first;
        while let Some(&next) = iter.peek() {
            if last.checked_add(1) != Some(next) {
                break;
            }
            last = next;
            iter.next();
        }
        if !out.is_empty() {
            out.push(',');
        }
        if first == last {
            out.push_str(&first.to_string());
        } else {
            out.push_str(&format!("{first}-{last}"));
        }
    }
    out
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
    #[test]
    fn numbers_compare_by_value() {
        let mut names: Vec<String> = ["n10", "n2", "n1", "m3", "n02", "block10", "block9"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        sort_natural(&mut names);
        assert_eq!(names, ["block9", "block10", "m3", "n1", "n2", "n02", "n10"]);
    }

    #[test]
    fn text_and_mixed_runs() {
        assert_eq!(natural_cmp("gpu-a1", "gpu-b1"), Ordering::Less);
        assert_eq!(natural_cmp("a", "a1"), Ordering::Less);
        assert_eq!(natural_cmp("a1b", "a1"), Ordering::Greater);
        assert_eq!(natural_cmp("rack2-n10", "rack10-n1"), Ordering::Less);
        assert_eq!(natural_cmp("x", "x"), Ordering::Equal);
        assert_eq!(natural_cmp("", "a"), Ordering::Less);
        // Numbers longer than any integer type still compare.
        assert_eq!(
            natural_cmp("n123456789012345678901234567890", "n99"),
            Ordering::Greater
        );
    }
    #[test]
    fn compresses_like_slurm() {
        let cases: &[(&[&str], &str)] = &[
            (&[], ""),
            (&["login"], "login"),
            (&["n1"], "n1"),
            (&["n3", "n1", "n2"], "n[1-3]"),
            (&["n001", "n002", "n003", "n020"], "n[001-003,020]"),
            (&["n10", "n9", "n2"], "n[2,9-10]"),
            (&["n09", "n10"], "n[09-10]"),
            (&["n9", "n010"], "n[9,010]"),
            (&["n1", "n1", "n2"], "n[1-2]"),
            (&["b", "a2", "a1", "c"], "a[1-2],b,c"),
            (
                &["rack1-node3", "rack1-node4", "rack2-node1"],
                "rack1-node[3-4],rack2-node1",
            ),
            (&["x", "x1", "x2"], "x,x[1-2]"),
            (&["n0", "n00", "n000"], "n[0,00,000]"),
        ];
        for (names, expected) in cases {
            assert_eq!(compress(names.iter().copied()), *expected, "{names:?}");
        }
    }

    #[test]
    fn a_number_beyond_u64_is_written_out_as_it_is() {
        let huge = "n99999999999999999999999";
        assert_eq!(compress([huge, "n1"]), format!("{huge},n1"));
    }

    #[test]
    fn natural_order_compares_numbers_by_value() {
        let mut names = vec!["n10", "n9", "m100", "n", "n09"];
        names.sort_by(|a, b| compress_order(a, b));
        assert_eq!(names, ["m100", "n", "n9", "n09", "n10"]);
    }

    #[test]
    fn index_ranges_fold_runs() {
        assert_eq!(index_ranges(&[]), "");
        assert_eq!(index_ranges(&[4]), "4");
        assert_eq!(index_ranges(&[0, 1, 2, 3, 5, 7, 8]), "0-3,5,7-8");
        assert_eq!(
            index_ranges(&[u32::MAX - 1, u32::MAX]),
            "4294967294-4294967295"
        );
    }
}
