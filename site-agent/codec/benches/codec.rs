//! The codec on one core, beside `memcpy` of the same buffer in the same run.
//!
//! One fragment of n f32 elements (default 2²⁴, the most one frame holds:
//! 64 MiB, larger than the caches, as a real pseudo-gradient is), seeded
//! Gaussian values (σ = 10⁻³). Each repetition runs every operation once,
//! in turn, so that background load hits them alike; the table gives the
//! median over the repetitions. Throughput is bytes of input per second:
//! f32 input for encodes, the accumulator for decode-adds (n × 4 bytes
//! either way), so those figures compare with `memcpy` of the n × 4-byte
//! input; the encode from bf16 input counts the n × 2 bytes it reads. Encodes carry error feedback unless the name says otherwise;
//! decode-add includes every check (both checksums, scales) and, with
//! zstd, the decompression.
//!
//! ```text
//! cargo bench -p longhaul-codec --bench codec
//! ```
//!
//! Environment: `CODEC_BENCH_ELEMENTS` (default 16777216),
//! `CODEC_BENCH_REPS` (default 9), `CODEC_BENCH_SEED` (default 1). Not run
//! in CI.

use std::hint::black_box;
use std::time::Instant;

use longhaul_codec::{Codec, Encoder, EncoderConfig, Frame, decode_add, fragment_hash};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

fn env(name: &str, default: u64) -> Result<u64, Box<dyn std::error::Error>> {
    match std::env::var(name) {
        Ok(value) => Ok(value.parse().map_err(|e| format!("{name}={value}: {e}"))?),
        Err(_) => Ok(default),
    }
}

fn gaussian(n: usize, sigma: f32, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut uniform = move || (f64::from(rng.next_u32()) + 1.0) / 4_294_967_296.0;
    (0..n)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32 * sigma
        })
        .collect()
}

/// One operation of the table: what it does, and the seconds of each run.
struct Row {
    name: String,
    seconds: Vec<f64>,
    bytes_per_param: Option<f64>,
    /// Bytes of input per element the GB/s figure counts: 4 (f32), 2 for
    /// the bf16-input encode, which reads half as much.
    input_bytes: usize,
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn time(f: impl FnOnce()) -> f64 {
    let started = Instant::now();
    f();
    started.elapsed().as_secs_f64()
}

struct Case {
    name: &'static str,
    codec: Codec,
    error_feedback: bool,
    zstd: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = env("CODEC_BENCH_ELEMENTS", 1 << 24)? as usize;
    let reps = env("CODEC_BENCH_REPS", 9)?.max(1) as usize;
    let seed = env("CODEC_BENCH_SEED", 1)?;
    let input = gaussian(n, 1.0e-3, seed);
    let mut copy = vec![0.0f32; n];
    let mut acc = vec![0.0f32; n];

    let cases = [
        Case {
            name: "int8 B=256",
            codec: Codec::new(8, 256)?,
            error_feedback: true,
            zstd: false,
        },
        Case {
            name: "int8 B=256 no EF",
            codec: Codec::new(8, 256)?,
            error_feedback: false,
            zstd: false,
        },
        Case {
            name: "int8 B=256 zstd",
            codec: Codec::new(8, 256)?,
            error_feedback: true,
            zstd: true,
        },
        Case {
            name: "int4 B=64",
            codec: Codec::new(4, 64)?,
            error_feedback: true,
            zstd: false,
        },
        Case {
            name: "int4 B=128",
            codec: Codec::new(4, 128)?,
            error_feedback: true,
            zstd: false,
        },
        Case {
            name: "int4 B=64 zstd",
            codec: Codec::new(4, 64)?,
            error_feedback: true,
            zstd: true,
        },
        Case {
            name: "bf16",
            codec: Codec::bf16(),
            error_feedback: false,
            zstd: false,
        },
    ];
    let mut encoders: Vec<Encoder> = cases
        .iter()
        .map(|c| {
            let config = EncoderConfig {
                codec: c.codec,
                error_feedback: c.error_feedback,
                zstd: c.zstd,
            };
            Encoder::new(config, n)
        })
        .collect();
    let mut frames: Vec<Frame> = cases.iter().map(|_| Frame::new()).collect();
    // One untimed pass: page in every buffer (the copy and the accumulator
    // too, so that the first timed run pays no page faults), size every
    // frame.
    copy.copy_from_slice(&input);
    for (encoder, frame) in encoders.iter_mut().zip(&mut frames) {
        encoder.encode_into(0, &input, frame)?;
        decode_add(frame.as_bytes(), &mut acc, 0.25)?;
    }
    black_box((&copy, &acc));

    let mut memcpy = Row {
        name: "memcpy (f32 input)".into(),
        seconds: vec![],
        bytes_per_param: Some(4.0),
        input_bytes: 4,
    };
    let mut encode: Vec<Row> = cases
        .iter()
        .zip(&frames)
        .map(|(c, f)| Row {
            name: format!("encode {}", c.name),
            seconds: vec![],
            bytes_per_param: Some(f.len() as f64 / n as f64),
            input_bytes: 4,
        })
        .collect();
    let mut decode: Vec<Row> = cases
        .iter()
        .map(|c| Row {
            name: format!("decode-add {}", c.name),
            seconds: vec![],
            bytes_per_param: None,
            input_bytes: 4,
        })
        .collect();
    let mut hash = Row {
        name: "fragment_hash".into(),
        seconds: vec![],
        bytes_per_param: None,
        input_bytes: 4,
    };
    // bf16 input into int8: GB/s of the n × 2 bytes it reads (its
    // /memcpy ratio is against memcpy's n × 4-byte figure).
    let input_bf16: Vec<u16> = input.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
    let int8 = EncoderConfig::new(8, 256, true, false)?;
    let mut from_bf16 = Encoder::new(int8, n);
    let mut bf16_frame = Frame::new();
    from_bf16.encode_bf16_into(0, &input_bf16, &mut bf16_frame)?;
    let mut encode_bf16 = Row {
        name: "encode int8 B=256 from bf16".into(),
        seconds: vec![],
        bytes_per_param: Some(bf16_frame.len() as f64 / n as f64),
        input_bytes: 2,
    };

    for _ in 0..reps {
        memcpy
            .seconds
            .push(time(|| copy.copy_from_slice(black_box(&input))));
        black_box(&copy);
        for ((encoder, frame), row) in encoders.iter_mut().zip(&mut frames).zip(&mut encode) {
            let mut result = Ok(());
            row.seconds.push(time(|| {
                result = encoder.encode_into(0, black_box(&input), frame)
            }));
            result?;
        }
        for (frame, row) in frames.iter().zip(&mut decode) {
            let mut result = Ok(());
            row.seconds.push(time(|| {
                result = decode_add(black_box(frame.as_bytes()), &mut acc, 0.25).map(|_| ())
            }));
            result?;
            black_box(&acc);
        }
        let mut result = Ok(());
        encode_bf16.seconds.push(time(|| {
            result = from_bf16.encode_bf16_into(0, black_box(&input_bf16), &mut bf16_frame)
        }));
        result?;
        hash.seconds.push(time(|| {
            black_box(fragment_hash(black_box(&input)));
        }));
    }

    let bytes = (n * 4) as f64;
    let memcpy_gbs = bytes / median(&memcpy.seconds) / 1e9;
    println!(
        "codec on one core: n = {n} f32 elements ({:.0} MiB), Gaussian σ = 1e-3, seed {seed}, median of {reps} runs",
        bytes / (1 << 20) as f64
    );
    println!(
        "{:<28} {:>9} {:>8} {:>9} {:>10}",
        "operation", "ms", "GB/s", "/memcpy", "B/param"
    );
    for row in std::iter::once(&memcpy)
        .chain(&encode)
        .chain(std::iter::once(&encode_bf16))
        .chain(&decode)
        .chain(std::iter::once(&hash))
    {
        let seconds = median(&row.seconds);
        let gbs = (n * row.input_bytes) as f64 / seconds / 1e9;
        let per_param = row
            .bytes_per_param
            .map_or(String::from("-"), |b| format!("{b:.4}"));
        println!(
            "{:<28} {:>9.2} {:>8.2} {:>9.2} {:>10}",
            row.name,
            seconds * 1e3,
            gbs,
            gbs / memcpy_gbs,
            per_param
        );
    }
    Ok(())
}
