//! The reduction every site computes the same way, and the hash it reports.

use crate::decoder::{CheckedFrame, check_payload, check_target};
use crate::error::ReduceError;
use crate::frame::FrameHeader;

/// One site's encoded share and the weight it counts with (1/M for an
/// average over M sites, re-weighted when a site is excluded).
#[derive(Debug, Clone, Copy)]
pub struct Contribution<'a> {
    pub site: &'a str,
    pub frame: &'a [u8],
    pub weight: f32,
}

/// out ← Σ weight_k × decode(frame_k), summed element by element in the
/// order of the sites' ids (byte order), starting from +0.0, whatever order
/// `contributions` arrived in. Every header is checked against the
/// output's length and its weight before any payload is decompressed, and
/// every frame is checked whole before `out` is written: on any error
/// `out` is unchanged. Floating-point addition is not associative, so a fixed
/// order is what makes the result bit-identical at every site that reduces
/// the same frames; the arithmetic itself (IEEE f32 multiply and add, no
/// fused multiply-add) gives the same bits on every CPU.
pub fn reduce(contributions: &[Contribution<'_>], out: &mut [f32]) -> Result<(), ReduceError> {
    if contributions.is_empty() {
        return Err(ReduceError::Empty);
    }
    let mut ordered: Vec<&Contribution<'_>> = contributions.iter().collect();
    ordered.sort_by(|a, b| a.site.cmp(b.site));
    if let Some(pair) = ordered.windows(2).find(|pair| pair[0].site == pair[1].site) {
        return Err(ReduceError::DuplicateSite {
            site: pair[0].site.to_string(),
        });
    }
    let refused = |c: &Contribution<'_>, source| ReduceError::Frame {
        site: c.site.to_string(),
        source,
    };
    // Every header first, against the output's length and the weight,
    // before any frame is decompressed: a small frame claiming many
    // elements costs nothing. Then each payload is checked (one zstd
    // context for all of them); every decompressed payload is held until
    // the sum, at most 2 bytes per element of `out` each.
    let mut parsed = Vec::with_capacity(ordered.len());
    for c in &ordered {
        let header = FrameHeader::parse(c.frame).map_err(|e| refused(c, e))?;
        check_target(&header.0, out.len(), c.weight).map_err(|e| refused(c, e))?;
        parsed.push(header);
    }
    let mut decompressor = None;
    let mut checked: Vec<CheckedFrame<'_>> = Vec::with_capacity(ordered.len());
    for (c, header) in ordered.iter().zip(parsed) {
        if header.0.zstd && decompressor.is_none() {
            let context = zstd::bulk::Decompressor::new().map_err(|e| {
                refused(
                    c,
                    crate::DecodeError::Zstd {
                        reason: e.to_string(),
                    },
                )
            })?;
            decompressor = Some(context);
        }
        let frame = check_payload(header, decompressor.as_mut()).map_err(|e| refused(c, e))?;
        checked.push(frame);
    }
    out.fill(0.0);
    for (c, frame) in ordered.iter().zip(&checked) {
        frame.add_to(out, c.weight).map_err(|e| refused(c, e))?;
    }
    Ok(())
}

/// The hash a site reports for a reduced fragment: `blake3:` and 64 hex
/// digits of the BLAKE3 hash of the values as little-endian f32 bytes
/// (71 printable ASCII characters, within the round record's 128).
///
/// A reduction of checked frames is always finite; should a NaN reach the
/// hash anyway, every NaN is hashed as the one quiet NaN 0x7FC00000, so
/// that sites whose NaNs differ only in sign or payload bits (which IEEE
/// arithmetic leaves unspecified) still report the same hash. Every other
/// value is hashed as its bits (+0.0 and −0.0 differ).
pub fn fragment_hash(values: &[f32]) -> String {
    let mut hasher = blake3::Hasher::new();
    // 64 KiB at a time: enough chunks for BLAKE3 to hash several in parallel.
    let mut buffer = vec![0u8; 1 << 16];
    for chunk in values.chunks(buffer.len() / 4) {
        let bytes = &mut buffer[..chunk.len() * 4];
        for (out, value) in bytes.chunks_exact_mut(4).zip(chunk) {
            let bits = if value.is_nan() {
                0x7FC0_0000
            } else {
                value.to_bits()
            };
            out.copy_from_slice(&bits.to_le_bytes());
        }
        hasher.update(bytes);
    }
    format!("blake3:{}", hasher.finalize().to_hex())
}
