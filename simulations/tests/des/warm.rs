//! Connections kept open from one transfer to the next, and quinn's Cubic.

use longhaul_core::units::Duration;
use longhaul_simulations::des::{
    DesError, Outcome, SenderModel, TransferConfig, TransferReport, transfer,
};

use crate::{link, run, test_seed, with_buffer};

fn completed(report: &TransferReport) -> f64 {
    assert_eq!(
        report.outcome,
        Outcome::Completed,
        "seed {}: {report:?}",
        report.seed
    );
    report
        .completion
        .map_or(f64::NAN, |d| d.as_nanos() as f64 / 1e9)
}

/// 100 Mbit/s, RTT 20 ms (BDP 250 kB), buffer 2 BDP, no loss: 1 MB over
/// two new connections spends about four RTTs in slow start; over the two
/// connections a 20 MB transfer left open, it goes at the window that
/// transfer ended with, so it takes less, but never less than the bytes
/// at the line rate plus one way. An idle time keeps the window and runs
/// quinn's Cubic clock on.
#[test]
fn a_kept_connection_goes_on_from_its_window_without_slow_start() {
    let seed = test_seed(91);
    let clean = with_buffer(link(100, 20.0, 0.0), 500_000);
    let cold = run(clean.clone(), 1_000_000, 2, SenderModel::QuinnCubic, seed);
    let cold_seconds = completed(&cold);
    let earlier = run(clean.clone(), 20_000_000, 2, SenderModel::QuinnCubic, seed);
    completed(&earlier);
    assert_eq!(earlier.warm.len(), 2, "{earlier:?}");
    for state in &earlier.warm {
        let cwnd = state.cwnd().unwrap_or(0.0);
        // Past the BDP over two connections (86 segments each).
        assert!(cwnd > 80.0, "seed {seed}: {cwnd}");
        let idle = state.clone().after_idle(Duration::from_secs(1));
        assert_eq!(idle.cwnd(), state.cwnd());
        assert_ne!(&idle, state, "the clock did not move");
    }
    let mut config = TransferConfig::new(clean, 1_000_000, 2, SenderModel::QuinnCubic, seed);
    config.warm = earlier
        .warm
        .iter()
        .map(|w| w.clone().after_idle(Duration::from_millis(100)))
        .collect();
    let warm = transfer(&config).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let warm_seconds = completed(&warm);
    // Every byte and its segments' headers at the line rate, then one way.
    let floor = (1_000_000.0 + (1_000_000f64 / 1460.0).ceil() * 40.0) * 8.0 / 100e6 + 0.010;
    println!(
        "warm | 1 MB cold {cold_seconds:.4} s, kept {warm_seconds:.4} s, floor {floor:.4} s | seed {seed}"
    );
    assert!(
        warm_seconds < cold_seconds - 0.020,
        "seed {seed}: kept {warm_seconds} vs cold {cold_seconds}"
    );
    assert!(
        warm_seconds >= floor,
        "seed {seed}: {warm_seconds} < {floor}"
    );
}

/// quinn's Cubic restarts its curve and its Reno-friendly estimate from
/// β·W_max, and after a loss short of the last W_max (fast convergence)
/// both start below the reduced window, which waits for them. Under random
/// loss at a short RTT, where the Reno-friendly region governs, it then
/// averages less than RFC 9438's Cubic: 100 Mbit/s, RTT 5 ms, p = 1e-3
/// (about 30 losses in 30 MB), same seed so the same packets are lost by
/// index: between 0.8× and 0.97× the RFC's goodput (0.90× at the fixed
/// seed).
#[test]
fn quinns_cubic_averages_less_than_the_rfcs_under_random_loss() {
    let seed = test_seed(92);
    let lossy = link(100, 5.0, 1e-3);
    let rfc = run(lossy.clone(), 30_000_000, 1, SenderModel::Cubic, seed);
    let quinn = run(lossy, 30_000_000, 1, SenderModel::QuinnCubic, seed);
    completed(&rfc);
    completed(&quinn);
    let ratio = quinn.goodput_bytes_per_second / rfc.goodput_bytes_per_second;
    println!(
        "fidelity | quinn's Cubic over RFC 9438's, p = 1e-3, RTT 5 ms | {ratio:.3} | 0.8–0.97 | seed {seed}"
    );
    assert!(
        (0.8..=0.97).contains(&ratio),
        "seed {seed}: {ratio}, {quinn:?} {rfc:?}"
    );
    assert!(quinn.data_drops.loss > 10, "{quinn:?}");
}

/// Kept state for another number of connections, or from another sender,
/// is refused, naming `warm`.
#[test]
fn kept_state_for_another_pool_or_sender_is_refused() {
    let seed = test_seed(93);
    let earlier = run(link(100, 5.0, 0.0), 100_000, 2, SenderModel::Cubic, seed);
    let mut config = TransferConfig::new(link(100, 5.0, 0.0), 100_000, 1, SenderModel::Cubic, seed);
    config.warm = earlier.warm.clone();
    let error = transfer(&config).unwrap_err();
    assert!(matches!(error, DesError::Warm { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        "`warm`: 2 connection state(s) for 1 connection(s)"
    );
    let mut config = TransferConfig::new(link(100, 5.0, 0.0), 100_000, 2, SenderModel::Reno, seed);
    config.warm = earlier.warm;
    let error = transfer(&config).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("`warm`: a Cubic connection's state for a Reno sender"),
        "{error}"
    );
}

/// A kept Reno connection numbers its transmissions from 0 again and
/// grows from its first ACK: after a lossy 5 MB transfer (whose last
/// reduction was thousands of transmissions in), 1 MB on a loss-free link
/// with a deep buffer ends with a larger window than it started with.
#[test]
fn a_kept_reno_connection_grows_from_its_first_ack() {
    let seed = test_seed(94);
    let lossy = run(link(100, 20.0, 1e-3), 5_000_000, 1, SenderModel::Reno, seed);
    completed(&lossy);
    assert!(lossy.data_drops.loss > 0, "{lossy:?}");
    let before = lossy.warm[0].cwnd().unwrap_or(f64::NAN);
    let deep = with_buffer(link(100, 20.0, 0.0), 10_000_000);
    let mut config = TransferConfig::new(deep, 1_000_000, 1, SenderModel::Reno, seed);
    config.warm = lossy.warm;
    let after = transfer(&config).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    completed(&after);
    let grown = after.warm[0].cwnd().unwrap_or(f64::NAN);
    assert!(grown > before + 1.0, "seed {seed}: {before} -> {grown}");
}

/// quinn's Cubic grows no window on ACKs once every segment is sent (the
/// connection is application-limited), so a connection kept after a
/// transfer carries less than it would have: 146 kB (100 segments) in
/// slow start on a loss-free, deep-buffered link. When the last segment
/// arrives (where the transfer's state is taken), the RFC sender has had
/// the ACKs of the segments sent an RTT before it, 70 here (cwnd 80);
/// quinn's stopped growing when its last segment went, after the ACKs of
/// the first 45 (10 + 2 × 45 sent: cwnd 55; pacing moves it a little).
#[test]
fn quinns_window_does_not_grow_on_the_tail_of_a_transfer() {
    let seed = test_seed(95);
    let deep = with_buffer(link(100, 20.0, 0.0), 10_000_000);
    let rfc = run(deep.clone(), 146_000, 1, SenderModel::Cubic, seed);
    let quinn = run(deep, 146_000, 1, SenderModel::QuinnCubic, seed);
    completed(&rfc);
    completed(&quinn);
    let rfc_cwnd = rfc.warm[0].cwnd().unwrap_or(f64::NAN);
    let quinn_cwnd = quinn.warm[0].cwnd().unwrap_or(f64::NAN);
    assert_eq!(rfc_cwnd, 80.0, "seed {seed}");
    assert!(
        (50.0..=65.0).contains(&quinn_cwnd),
        "seed {seed}: {quinn_cwnd}"
    );
}
