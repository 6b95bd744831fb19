//! Natural order of scheduler names: `n2` before `n10`, as an operator reads
//! them. Every ordering in an inventory (buildings, domains, nodes) uses it,
//! so the same cluster always yields the same indices.

use std::cmp::Ordering;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
