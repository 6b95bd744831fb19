//! The codec's error on a seeded Gaussian stream, with and without error
//! feedback: after one round, and accumulated over 100 rounds.
//!
//! Each round a fresh pseudo-gradient x_r (n elements, N(0, σ²)) is
//! encoded and decoded. "1 round" is RMS(decode(x₁) − x₁) / RMS(x₁);
//! "100 rounds" is the error of the sum of what was sent against the sum of
//! the inputs, RMS(Σ decode − Σ x) / RMS(Σ x): what the outer optimiser's
//! accumulated update is off by. With error feedback that is the last
//! residual; without it, 100 independent rounding errors add up.
//!
//! ```text
//! cargo run --release -p longhaul-codec --example error_report
//! ```
//!
//! Environment: `CODEC_ERROR_SEED` (default 42), `CODEC_ERROR_ELEMENTS`
//! (default 1048576), `CODEC_ERROR_ROUNDS` (default 100).

use longhaul_codec::{Codec, Encoder, EncoderConfig, decode_add};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

fn env(name: &str, default: u64) -> Result<u64, Box<dyn std::error::Error>> {
    match std::env::var(name) {
        Ok(value) => Ok(value.parse().map_err(|e| format!("{name}={value}: {e}"))?),
        Err(_) => Ok(default),
    }
}

fn rms(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v * v, n + 1));
    (sum / n.max(1) as f64).sqrt()
}

/// RMS errors: (after round 1, accumulated after all rounds), each as
/// (absolute, relative to the RMS of what it is the error of).
type Errors = ((f64, f64), (f64, f64));

/// The errors of one codec with or without feedback.
fn run(
    codec: Codec,
    error_feedback: bool,
    n: usize,
    rounds: usize,
    seed: u64,
) -> Result<Errors, Box<dyn std::error::Error>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut uniform = move || (f64::from(rng.next_u32()) + 1.0) / 4_294_967_296.0;
    let config = EncoderConfig {
        codec,
        error_feedback,
        zstd: false,
    };
    let mut encoder = Encoder::new(config, n);
    let mut x = vec![0.0f32; n];
    let mut decoded = vec![0.0f32; n];
    let mut sent = vec![0.0f64; n];
    let mut truth = vec![0.0f64; n];
    let mut first = (0.0, 0.0);
    for round in 0..rounds {
        for v in &mut x {
            let (u, w) = (uniform(), uniform());
            *v = ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos()) as f32 * 1.0e-3;
        }
        let frame = encoder.encode(&x)?;
        decoded.fill(0.0);
        decode_add(frame.as_bytes(), &mut decoded, 1.0)?;
        for i in 0..n {
            sent[i] += f64::from(decoded[i]);
            truth[i] += f64::from(x[i]);
        }
        if round == 0 {
            let error = rms(decoded.iter().zip(&x).map(|(&d, &v)| f64::from(d - v)));
            first = (error, error / rms(x.iter().map(|&v| f64::from(v))));
        }
    }
    let error = rms(sent.iter().zip(&truth).map(|(s, t)| s - t));
    Ok((first, (error, error / rms(truth.iter().copied()))))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seed = env("CODEC_ERROR_SEED", 42)?;
    let n = env("CODEC_ERROR_ELEMENTS", 1 << 20)? as usize;
    let rounds = env("CODEC_ERROR_ROUNDS", 100)?.max(1) as usize;
    println!(
        "RMS error, Gaussian stream σ = 1e-3, n = {n}, seed {seed}; accumulated = error of the sum of {rounds} rounds (relative: to the RMS of the sum)"
    );
    println!(
        "{:<11} {:>19} {:>26} {:>26} {:>8}",
        "codec", "1 round abs (rel)", "accumulated, EF abs (rel)", "accumulated, no EF", "no EF/EF"
    );
    for (name, codec) in [
        ("int8 B=256", Codec::new(8, 256)?),
        ("int4 B=64", Codec::new(4, 64)?),
        ("int4 B=128", Codec::new(4, 128)?),
        ("bf16", Codec::bf16()),
    ] {
        let (first, with) = run(codec, true, n, rounds, seed)?;
        let (_, without) = run(codec, false, n, rounds, seed)?;
        let cell = |(abs, rel): (f64, f64)| format!("{abs:.3e} ({rel:.2e})");
        println!(
            "{name:<11} {:>19} {:>26} {:>26} {:>8.1}",
            cell(first),
            cell(with),
            cell(without),
            without.0 / with.0
        );
    }
    Ok(())
}
