//! Slurm hostlist expressions (`n[001-018,020],login1`) and the natural
//! order of host names (`n2` before `n10`).
//!
//! A name splits into a prefix and its trailing run of digits. Names with
//! the same prefix fold into one bracket of ranges. A range keeps the digit
//! width of its first number, as Slurm's expander does (`n[08-10]` is `n08
//! n09 n10`), so a number joins a range only if writing it at that width
//! gives back its exact spelling: `n9` and `n10` make `n[9-10]`, but `n09`
//! and `n10` make `n[09-10]`, and `n9` and `n010` stay apart.

use std::cmp::Ordering;

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

/// Natural order: by prefix, then by the trailing number's value, then by
/// its spelling (so `n7` sorts before `n007`), names without a number first.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
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
    sorted.sort_by(|a, b| natural_cmp(a, b));
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
        names.sort_by(|a, b| natural_cmp(a, b));
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
