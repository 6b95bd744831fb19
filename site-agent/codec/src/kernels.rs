//! The inner loops: absmax, quantise with and without error feedback,
//! dequantise into an accumulator, and the bf16 conversions they use.
//!
//! Every loop here is plain safe Rust over slices, written so that LLVM
//! vectorises it (no early exits, no calls, integer maxima instead of float
//! maxima, whose NaN rules keep LLVM from reordering them). Rounding to the
//! nearest integer uses the "magic number" addition: for |t| < 2²² the f32
//! sum t + 1.5·2²³ is an integer (its ulp is 1), rounded to nearest with
//! ties to even, and its low mantissa bits are that integer in two's
//! complement. That is one add where `f32::round_ties_even` would be a
//! library call per element on baseline x86-64, and it gives the same result.
//! Callers validate their input first: nothing here sees a NaN, an infinity
//! or a value at or above [`crate::MAX_MAGNITUDE`].

/// 1.5 · 2²³: adding it rounds |t| < 2²² to an integer, ties to even.
const ROUNDING_MAGIC: f32 = 12_582_912.0;

/// The f32 a bf16 stands for (exact).
#[inline]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// The bf16 nearest to `value`, ties to even. `value` is finite and below
/// [`crate::MAX_MAGNITUDE`] in magnitude, so the carry never reaches the
/// exponent's all-ones pattern.
#[inline]
pub(crate) fn bf16_nearest(value: f32) -> u16 {
    let bits = value.to_bits();
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    ((bits + rounding) >> 16) as u16
}

/// The smallest bf16 at or above `value` (finite, positive): a scale rounded
/// up never pushes a block's largest element past the top code.
#[inline]
pub(crate) fn bf16_round_up(value: f32) -> u16 {
    let bits = value.to_bits();
    let high = (bits >> 16) as u16;
    if bits & 0xFFFF == 0 { high } else { high + 1 }
}

/// Bits of |value| as an integer: for finite floats their order is the
/// order of the magnitudes.
#[inline]
fn magnitude_bits(value: f32) -> u32 {
    value.to_bits() & 0x7FFF_FFFF
}

/// The largest |x| of `values`.
#[inline]
pub(crate) fn absmax(values: &[f32]) -> f32 {
    f32::from_bits(values.iter().fold(0, |m, &x| m.max(magnitude_bits(x))))
}

/// The index of the first element whose magnitude bits reach `limit_bits`
/// (NaN and ±∞ included), if any. Scans in chunks so that the common case,
/// no such element, is one vectorised maximum per chunk.
pub(crate) fn first_at_or_above(values: &[f32], limit_bits: u32) -> Option<usize> {
    const CHUNK: usize = 4096;
    for (c, chunk) in values.chunks(CHUNK).enumerate() {
        let max = chunk.iter().fold(0, |m, &x| m.max(magnitude_bits(x)));
        if max >= limit_bits {
            let within = chunk
                .iter()
                .position(|&x| magnitude_bits(x) >= limit_bits)?;
            return Some(c * CHUNK + within);
        }
    }
    None
}

/// As [`first_at_or_above`], for bf16 bit patterns.
pub(crate) fn first_bf16_at_or_above(values: &[u16], limit_bits: u16) -> Option<usize> {
    const CHUNK: usize = 4096;
    for (c, chunk) in values.chunks(CHUNK).enumerate() {
        let max = chunk.iter().fold(0, |m, &x| m.max(x & 0x7FFF));
        if max >= limit_bits {
            let within = chunk.iter().position(|&x| x & 0x7FFF >= limit_bits)?;
            return Some(c * CHUNK + within);
        }
    }
    None
}

/// A block's scale: `absmax / levels` rounded up to a bf16, with its
/// reciprocal. A block whose scale would be below the smallest normal f32
/// (absmax < levels · 2⁻¹²⁶) gets scale 0: it is sent as zeros and, with
/// error feedback, stays in the residual.
#[inline]
pub(crate) fn block_scale(absmax: f32, levels: f32) -> (u16, f32, f32) {
    let exact = absmax / levels;
    if exact < f32::MIN_POSITIVE {
        return (0, 0.0, 0.0);
    }
    let bits = bf16_round_up(exact);
    let scale = bf16_to_f32(bits);
    (bits, scale, 1.0 / scale)
}

/// Quantises one block of `values` to 8-bit codes q = rne(x · (1/s)),
/// |q| ≤ 127; returns the scale's bf16 bits.
pub(crate) fn quantise8(values: &[f32], codes: &mut [u8]) -> u16 {
    let (bits, _, inverse) = block_scale(absmax(values), 127.0);
    for (code, &x) in codes.iter_mut().zip(values) {
        *code = (x * inverse + ROUNDING_MAGIC).to_bits() as u8;
    }
    bits
}

/// As [`quantise8`], with error feedback: `residual` holds last round's
/// residual on entry; the block quantised is v = x + residual, and
/// `residual` holds v − q·s on return.
pub(crate) fn quantise8_feedback(values: &[f32], residual: &mut [f32], codes: &mut [u8]) -> u16 {
    let mut max = 0;
    for (r, &x) in residual.iter_mut().zip(values) {
        *r += x;
        max = max.max(magnitude_bits(*r));
    }
    let (bits, scale, inverse) = block_scale(f32::from_bits(max), 127.0);
    for (code, r) in codes.iter_mut().zip(residual.iter_mut()) {
        let rounded = *r * inverse + ROUNDING_MAGIC;
        *code = rounded.to_bits() as u8;
        *r -= (rounded - ROUNDING_MAGIC) * scale;
    }
    bits
}

/// Quantises one block to 4-bit codes (|q| ≤ 7), two per byte, the even
/// element in the low nibble; an odd last element leaves the high nibble 0.
pub(crate) fn quantise4(values: &[f32], codes: &mut [u8]) -> u16 {
    let (bits, _, inverse) = block_scale(absmax(values), 7.0);
    let nibble = |x: f32| (x * inverse + ROUNDING_MAGIC).to_bits() as u8 & 0x0F;
    let pairs = values.chunks_exact(2);
    let tail = pairs.remainder();
    for (code, pair) in codes.iter_mut().zip(pairs) {
        *code = nibble(pair[0]) | (nibble(pair[1]) << 4);
    }
    if let (Some(&x), Some(code)) = (tail.first(), codes.get_mut(values.len() / 2)) {
        *code = nibble(x);
    }
    bits
}

/// [`quantise4`] with error feedback, as [`quantise8_feedback`].
pub(crate) fn quantise4_feedback(values: &[f32], residual: &mut [f32], codes: &mut [u8]) -> u16 {
    let mut max = 0;
    for (r, &x) in residual.iter_mut().zip(values) {
        *r += x;
        max = max.max(magnitude_bits(*r));
    }
    let (bits, scale, inverse) = block_scale(f32::from_bits(max), 7.0);
    let nibble = |r: &mut f32| {
        let rounded = *r * inverse + ROUNDING_MAGIC;
        *r -= (rounded - ROUNDING_MAGIC) * scale;
        rounded.to_bits() as u8 & 0x0F
    };
    let len = residual.len();
    let (paired, tail) = residual.split_at_mut(len - len % 2);
    for (code, pair) in codes.iter_mut().zip(paired.chunks_exact_mut(2)) {
        let (low, high) = pair.split_at_mut(1);
        *code = nibble(&mut low[0]) | (nibble(&mut high[0]) << 4);
    }
    if let (Some(r), Some(code)) = (tail.first_mut(), codes.get_mut(len / 2)) {
        *code = nibble(r);
    }
    bits
}

/// bf16 passthrough: each value to its nearest bf16 (little-endian pairs
/// of bytes).
pub(crate) fn to_bf16(values: &[f32], out: &mut [u8]) {
    for (pair, &x) in out.chunks_exact_mut(2).zip(values) {
        pair.copy_from_slice(&bf16_nearest(x).to_le_bytes());
    }
}

/// [`to_bf16`] with error feedback: v = x + residual is rounded to bf16,
/// and v − bf16(v) stays in the residual.
pub(crate) fn to_bf16_feedback(values: &[f32], residual: &mut [f32], out: &mut [u8]) {
    for ((pair, r), &x) in out.chunks_exact_mut(2).zip(residual.iter_mut()).zip(values) {
        let v = *r + x;
        let bits = bf16_nearest(v);
        *r = v - bf16_to_f32(bits);
        pair.copy_from_slice(&bits.to_le_bytes());
    }
}

/// `acc[i] += q_i × (s × w)` for one block of 8-bit codes.
pub(crate) fn add8(codes: &[u8], scale_weight: f32, acc: &mut [f32]) {
    for (a, &code) in acc.iter_mut().zip(codes) {
        *a += f32::from(code as i8) * scale_weight;
    }
}

/// `acc[i] += q_i × (s × w)` for one block of 4-bit codes (low nibble first).
pub(crate) fn add4(codes: &[u8], scale_weight: f32, acc: &mut [f32]) {
    let len = acc.len();
    let (paired, tail) = acc.split_at_mut(len - len % 2);
    for (pair, &code) in paired.chunks_exact_mut(2).zip(codes) {
        let low = ((code << 4) as i8) >> 4;
        let high = (code as i8) >> 4;
        pair[0] += f32::from(low) * scale_weight;
        pair[1] += f32::from(high) * scale_weight;
    }
    if let (Some(a), Some(&code)) = (tail.first_mut(), codes.get(len / 2)) {
        *a += f32::from(((code << 4) as i8) >> 4) * scale_weight;
    }
}

/// `acc[i] += bf16_i × w` for bf16 passthrough.
pub(crate) fn add16(values: &[u8], weight: f32, acc: &mut [f32]) {
    for (a, pair) in acc.iter_mut().zip(values.chunks_exact(2)) {
        *a += bf16_to_f32(u16::from_le_bytes([pair[0], pair[1]])) * weight;
    }
}
