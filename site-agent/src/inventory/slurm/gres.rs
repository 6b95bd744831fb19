//! GPU counts from Slurm's GRES and TRES strings.
//!
//! GRES: comma-separated `name[:type][:count][(detail)]` entries, such as
//! `gpu:h100:8(S:0-1),nic:mlx5:8`; counts may carry a K/M/G suffix. TRES:
//! `cpu=64,mem=1T,gres/gpu=8,gres/gpu:h100=8`.

/// The GPUs a GRES string declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuGres {
    pub count: u64,
    /// Distinct types in the order written; `None` for an untyped entry
    /// (`gpu:8`).
    pub types: Vec<Option<String>>,
}

/// The GPUs in `gres`, `Ok(None)` when it declares none.
pub fn parse_gpu_gres(gres: &str) -> Result<Option<GpuGres>, String> {
    let mut total = GpuGres {
        count: 0,
        types: Vec::new(),
    };
    for entry in split_outside_parentheses(gres) {
        let entry = entry.split('(').next().unwrap_or("").trim();
        if entry.is_empty() {
            continue;
        }
        let parts: Vec<&str> = entry.split(':').collect();
        if parts[0] != "gpu" {
            continue;
        }
        let (gpu_type, count) = match parts.as_slice() {
            [_] => (None, 1),
            [_, one] => match parse_count(one) {
                Some(count) => (None, count),
                None => (Some(*one), 1),
            },
            [_, gpu_type, count] => (
                Some(*gpu_type),
                parse_count(count)
                    .ok_or_else(|| format!("GRES {entry:?}: count {count:?} is not a number"))?,
            ),
            _ => return Err(format!("GRES {entry:?} is not gpu[:type][:count]")),
        };
        let gpu_type = gpu_type.map(str::to_string);
        if !total.types.contains(&gpu_type) {
            total.types.push(gpu_type);
        }
        total.count = total
            .count
            .checked_add(count)
            .ok_or_else(|| format!("GRES {gres:?}: GPU count overflows"))?;
    }
    Ok((total.count > 0).then_some(total))
}

/// The `gres/gpu=N` count of a TRES string, if it has one.
pub fn tres_gpu_count(tres: &str) -> Result<Option<u64>, String> {
    for entry in tres.split(',') {
        if let Some(("gres/gpu", count)) = entry.trim().split_once('=') {
            return parse_count(count)
                .map(Some)
                .ok_or_else(|| format!("TRES {entry:?}: count {count:?} is not a number"));
        }
    }
    Ok(None)
}

fn parse_count(text: &str) -> Option<u64> {
    let (digits, scale) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 1 << 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1u64),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

fn split_outside_parentheses(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(gres: &str) -> Option<(u64, Vec<Option<String>>)> {
        parse_gpu_gres(gres).unwrap().map(|g| (g.count, g.types))
    }

    #[test]
    fn typed_untyped_and_decorated_entries() {
        let h100 = Some("h100".to_string());
        assert_eq!(gpus("gpu:h100:8"), Some((8, vec![h100.clone()])));
        assert_eq!(
            gpus("gpu:gb200:4(S:0-1)"),
            Some((4, vec![Some("gb200".to_string())]))
        );
        assert_eq!(gpus("gpu:8"), Some((8, vec![None])));
        assert_eq!(
            gpus("gpu:h100:4(S:0,1),nic:mlx5:8,gpu:h100:4(S:2,3)"),
            Some((8, vec![h100]))
        );
        assert_eq!(gpus("gpu:a100:2,gpu:h100:2").map(|g| g.1.len()), Some(2));
        assert_eq!(gpus("gpu:1K"), Some((1024, vec![None])));
    }

    #[test]
    fn no_gpus() {
        assert_eq!(gpus(""), None);
        assert_eq!(gpus("nic:mlx5:8"), None);
        assert_eq!(gpus("gpu:h100:0"), None);
    }

    #[test]
    fn unreadable_gres() {
        assert!(parse_gpu_gres("gpu:h100:eight").is_err());
        assert!(parse_gpu_gres("gpu:h100:8:x").is_err());
    }

    #[test]
    fn tres_counts() {
        assert_eq!(
            tres_gpu_count("cpu=64,mem=1T,gres/gpu=8,gres/gpu:h100=8"),
            Ok(Some(8))
        );
        assert_eq!(tres_gpu_count("cpu=1,mem=256M,billing=1"), Ok(None));
        assert!(tres_gpu_count("gres/gpu=x").is_err());
    }
}
