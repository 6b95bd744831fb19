//! The Cubic sender against Reno and against RFC 9438's closed form.
//!
//! Each test prints `fidelity | case | expected | simulated | ratio | bound
//! | seed` lines (shown with `--nocapture`). Reno and Cubic run on the same
//! link with the same seed, so the links drop the same packets by index;
//! the ratio is then the senders' difference, not the seeds'.

use longhaul_core::cost::mathis_bytes_per_second;
use longhaul_simulations::des::{
    ExchangeConfig, Outcome, SenderModel, TransferReport, cubic_average_window, exchange,
};

use crate::{link, run, test_seed, with_buffer};

const MSS: f64 = 1460.0;
const PACKET: f64 = 1500.0;

fn line(case: &str, expected: f64, simulated: f64, bound: &str, seed: u64) -> f64 {
    let ratio = simulated / expected;
    println!(
        "fidelity | {case} | {expected:.4e} | {simulated:.4e} | {ratio:.3} | {bound} | seed {seed}"
    );
    ratio
}

fn completed(report: &TransferReport) {
    assert_eq!(
        report.outcome,
        Outcome::Completed,
        "seed {}: {report:?}",
        report.seed
    );
    assert!(
        report.retransmits >= report.data_drops.total(),
        "seed {}: {report:?}",
        report.seed
    );
}

/// Drop-tail, loss 0, one stream on 100 Mbit/s at RTT 20 ms (BDP 250 kB)
/// with half a BDP of buffer, 100 MB: Cubic's window after a loss, 0.7 ×
/// (BDP + buffer) = 1.05 BDP, still fills the pipe, so utilisation (slow
/// start included) is at least 0.98; Reno's, 0.5 × 1.5 BDP, drains it
/// after every halving (0.95 here), below 0.96 and below Cubic's. A Cubic
/// that reduced by half, or grew no faster than Reno, fails the first
/// bound. Without loss the run does not depend on the seed.
#[test]
fn cubic_fills_a_loss_free_link_with_half_a_bdp_of_buffer() {
    let payload_rate = 100e6 / 8.0 * MSS / PACKET;
    let seed = test_seed(71);
    let buffered = with_buffer(link(100, 20.0, 0.0), 125_000);
    let cubic = run(buffered.clone(), 100_000_000, 1, SenderModel::Cubic, seed);
    let reno = run(buffered, 100_000_000, 1, SenderModel::Reno, seed);
    completed(&cubic);
    completed(&reno);
    let cubic_utilisation = line(
        "1 Cubic stream, buffer BDP/2, utilisation (vs 1.0)",
        1.0,
        cubic.goodput_bytes_per_second / payload_rate,
        "≥ 0.98",
        seed,
    );
    let reno_utilisation = line(
        "1 Reno stream, buffer BDP/2, utilisation (vs 1.0)",
        1.0,
        reno.goodput_bytes_per_second / payload_rate,
        "< 0.96",
        seed,
    );
    assert!(
        (0.98..=1.0).contains(&cubic_utilisation),
        "seed {seed}: {cubic_utilisation}, {cubic:?}"
    );
    assert!(
        reno_utilisation < 0.96 && reno_utilisation < cubic_utilisation,
        "seed {seed}: {reno_utilisation}, {reno:?}"
    );
    // Both saw the buffer overflow, and nothing else.
    for report in [&cubic, &reno] {
        assert!(
            report.data_drops.queue > 0 && report.data_drops.loss == 0,
            "{report:?}"
        );
    }
}

/// Random loss p = 1e-3 on a 1 Gbit/s link neither fills. At RTT 200 ms
/// Cubic's cubic region governs: RFC 9438 §5.1 gives an average window of
/// 1.054·(RTT/p)^¾ ≈ 56 segments against Reno's 1.22/√p ≈ 39 (Mathis), so
/// Cubic should move about 1.45× Reno's goodput: the bound is 1.15×–2.5×,
/// and Cubic within 0.6×–1.6× of the closed form (random loss, slow start
/// and the last RTT move it). At RTT 20 ms the Reno-friendly region
/// governs and the closed forms agree (39 segments): Cubic is within
/// 0.8×–1.5× of Reno and 0.5×–1.5× of Mathis. About 150–300 loss events
/// per run.
#[test]
fn under_random_loss_cubic_beats_reno_at_long_rtt_and_matches_it_at_short() {
    let p = 1e-3;
    for (rtt_ms, bytes, seed, ratio_bound, closed_bound) in [
        (200.0, 200_000_000u64, 72u64, (1.15, 2.5), (0.6, 1.6)),
        (20.0, 300_000_000, 73, (0.8, 1.5), (0.5, 1.5)),
    ] {
        let seed = test_seed(seed);
        let cubic = run(link(1000, rtt_ms, p), bytes, 1, SenderModel::Cubic, seed);
        let reno = run(link(1000, rtt_ms, p), bytes, 1, SenderModel::Reno, seed);
        completed(&cubic);
        completed(&reno);
        let rtt = rtt_ms / 1000.0;
        let closed = cubic_average_window(rtt, p).unwrap_or(f64::NAN) * MSS / rtt;
        let mathis = mathis_bytes_per_second(rtt, p).unwrap_or(f64::NAN);
        let against_closed = line(
            &format!("1 Cubic stream, p = {p}, RTT {rtt_ms} ms, B/s (vs RFC 9438)"),
            closed,
            cubic.goodput_bytes_per_second,
            &format!("{}–{}", closed_bound.0, closed_bound.1),
            seed,
        );
        line(
            &format!("1 Reno stream, p = {p}, RTT {rtt_ms} ms, B/s (vs Mathis)"),
            mathis,
            reno.goodput_bytes_per_second,
            "(reported)",
            seed,
        );
        let against_reno = line(
            &format!("Cubic over Reno, p = {p}, RTT {rtt_ms} ms"),
            1.0,
            cubic.goodput_bytes_per_second / reno.goodput_bytes_per_second,
            &format!("{}–{}", ratio_bound.0, ratio_bound.1),
            seed,
        );
        assert!(
            (closed_bound.0..=closed_bound.1).contains(&against_closed),
            "seed {seed}: {against_closed}, {cubic:?}"
        );
        assert!(
            (ratio_bound.0..=ratio_bound.1).contains(&against_reno),
            "seed {seed}: {against_reno}, {cubic:?} {reno:?}"
        );
        assert!(
            cubic.data_drops.loss > 0 && cubic.data_drops.queue == 0,
            "{cubic:?}"
        );
    }
}

/// The same seed replays a lossy Cubic transfer bit for bit and another
/// seed differs; a Cubic exchange round completes and replays too.
#[test]
fn cubic_runs_replay_from_their_seed() {
    let seed = test_seed(74);
    println!("seed {seed}");
    let lossy = link(200, 50.0, 1e-2);
    let first = run(lossy.clone(), 5_000_000, 4, SenderModel::Cubic, seed);
    let again = run(lossy.clone(), 5_000_000, 4, SenderModel::Cubic, seed);
    completed(&first);
    assert_eq!(first, again, "seed {seed}");
    let other = run(lossy, 5_000_000, 4, SenderModel::Cubic, seed + 1);
    assert_ne!(
        (first.completion, first.data_drops),
        (other.completion, other.data_drops),
        "seeds {seed} and {}",
        seed + 1
    );

    let config = ExchangeConfig::new(
        3,
        link(100, 10.0, 1e-3),
        3_000_000,
        2,
        SenderModel::Cubic,
        seed,
    );
    let round = exchange(&config);
    assert_eq!(round, exchange(&config), "seed {seed}");
    let round = match round {
        Ok(report) => report,
        Err(error) => panic!("seed {seed}: {error}"),
    };
    assert_eq!(round.outcome, Outcome::Completed, "seed {seed}: {round:?}");
}
