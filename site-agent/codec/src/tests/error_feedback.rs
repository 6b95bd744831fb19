//! The codec's tests: error feedback.

use super::*;

/// Σ over rounds of what was sent against Σ of the inputs: the error of the
/// model's accumulated update.
fn accumulated_error(bits: u32, block: u32, error_feedback: bool, rounds: usize) -> (f64, f64) {
    let n = 1 << 14;
    let mut stream = Gaussian::new(42);
    let mut encoder = Encoder::new(config(bits, block, error_feedback, false), n);
    let mut sent = vec![0.0f64; n];
    let mut truth = vec![0.0f64; n];
    let mut first = 0.0;
    for round in 0..rounds {
        let x = stream.sample(n, 1.0e-3);
        let y = decode(&encoder.encode(&x).unwrap(), n);
        for i in 0..n {
            sent[i] += f64::from(y[i]);
            truth[i] += f64::from(x[i]);
        }
        if round == 0 {
            first = rms(sent.iter().zip(&truth).map(|(s, t)| s - t));
        }
    }
    (first, rms(sent.iter().zip(&truth).map(|(s, t)| s - t)))
}

#[test]
fn error_feedback_keeps_the_accumulated_error_bounded() {
    for (bits, block) in [(8, 256), (4, 64)] {
        let (first, with) = accumulated_error(bits, block, true, 100);
        let (first_without, without) = accumulated_error(bits, block, false, 100);
        assert_eq!(first, first_without, "round 1 is the same either way");
        // With feedback the accumulated error is the last residual: about
        // one round's. Without, 100 independent errors add up: about √100×.
        assert!(
            with < 1.5 * first,
            "{bits} bits: {with} after 100 rounds, {first} after 1"
        );
        assert!(
            without > 7.0 * first,
            "{bits} bits: {without} after 100 rounds, {first} after 1"
        );
    }
}
