//! The simulator against the closed forms, with the bounds stated per test.
//!
//! Each test prints one line per case, `fidelity | case | closed form |
//! simulated | ratio | bound | seed` (shown with `--nocapture`), and fails
//! with the seed and the whole report. The bounds are not statistical
//! intervals: Mathis's constant itself is only approximate (1.22 for
//! periodic loss and an ACK per segment; random loss gives a somewhat
//! higher rate, timeouts a lower one), so the bounds are the factor the
//! issue accepts for a Reno-like model, and the runs are long enough (tens
//! to hundreds of loss events) that the seed moves the ratio by a few
//! per cent only.

use longhaul_core::cost::mathis_bytes_per_second;
use longhaul_simulations::des::{ExchangeConfig, Outcome, SenderModel, TransferReport, exchange};

use crate::{link, run, test_seed, with_buffer};

const MSS: f64 = 1460.0;
const PACKET: f64 = 1500.0;

fn line(case: &str, closed: f64, simulated: f64, bound: &str, seed: u64) -> f64 {
    let ratio = simulated / closed;
    println!(
        "fidelity | {case} | {closed:.4e} | {simulated:.4e} | {ratio:.3} | {bound} | seed {seed}"
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
    // Every lost data packet had to be sent again for the flow to complete.
    assert!(
        report.retransmits >= report.data_drops.total(),
        "seed {}: {report:?}",
        report.seed
    );
}

/// On a free link the times are exact: a transfer that fits in Reno's
/// initial window of 10 segments completes after 10 serialisations and one
/// propagation delay; a paced sender's k segments after (k − 1) pacing
/// intervals, one serialisation and the propagation delay.
#[test]
fn on_a_free_link_the_completion_time_is_exact() {
    // 100 Mbit/s: 1500 bytes take 120 µs; RTT 20 ms: 10 ms one way.
    let serialisation = 120_000;
    let one_way = 10_000_000;
    let seed = test_seed(1);
    let report = run(link(100, 20.0, 0.0), 14_600, 1, SenderModel::Reno, seed);
    completed(&report);
    assert_eq!(
        report.completion.map(|t| t.as_nanos()),
        Some(10 * serialisation + one_way),
        "seed {seed}: {report:?}"
    );
    // 50 Mbit/s pacing: one 1500-byte packet every 240 µs.
    let report = run(
        link(100, 20.0, 0.0),
        14_600,
        1,
        SenderModel::Paced {
            bits_per_second: 50_000_000,
        },
        seed,
    );
    completed(&report);
    assert_eq!(
        report.completion.map(|t| t.as_nanos()),
        Some(9 * 240_000 + serialisation + one_way),
        "seed {seed}: {report:?}"
    );
}

/// One Reno stream at random loss p, RTT 20 ms, on a 1 Gbit/s link it never
/// fills: goodput within 0.5×–1.5× of Mathis, MSS/RTT · 1.22/√p, for
/// p = 1e-3 (~200 loss events) and p = 1e-2 (~400). The goodput includes
/// slow start and the final RTT.
#[test]
fn one_reno_stream_is_within_half_and_one_and_a_half_of_mathis() {
    for (p, bytes, seed) in [(1e-3, 300_000_000, 11), (1e-2, 60_000_000, 12)] {
        let seed = test_seed(seed);
        let report = run(link(1000, 20.0, p), bytes, 1, SenderModel::Reno, seed);
        completed(&report);
        let mathis = mathis_bytes_per_second(0.020, p).unwrap_or(f64::NAN);
        let ratio = line(
            &format!("1 Reno stream, p = {p}, RTT 20 ms, B/s"),
            mathis,
            report.goodput_bytes_per_second,
            "0.5–1.5",
            seed,
        );
        assert!(
            (0.5..=1.5).contains(&ratio),
            "seed {seed}: ratio {ratio}, {report:?}"
        );
        assert!(
            report.data_drops.loss > 0 && report.data_drops.queue == 0,
            "{report:?}"
        );
    }
}

/// N Reno streams at p = 1e-3, RTT 20 ms, sharing a 200 Mbit/s link with a
/// one-BDP buffer: goodput within 30 % of min(N × Mathis, the link's
/// payload rate), N = 1, 2, 4, 8, 16 (16 × Mathis is 1.8 × the link).
/// Near saturation (N = 8) the queue adds drops to the random loss, so the
/// figure falls below both terms of the min; the bound still holds there.
#[test]
fn n_reno_streams_gain_linearly_until_the_link_saturates() {
    let mathis = mathis_bytes_per_second(0.020, 1e-3).unwrap_or(f64::NAN);
    let payload_rate = 200e6 / 8.0 * MSS / PACKET;
    for (index, streams) in [1u32, 2, 4, 8, 16].into_iter().enumerate() {
        let seed = test_seed(20 + index as u64);
        let expected = (f64::from(streams) * mathis).min(payload_rate);
        // At least ~100 loss events per stream for few streams: 120 s of
        // virtual time for one, down to 15 s from 8 on.
        let seconds = 15.0 * f64::from((8 / streams).max(1));
        let bytes = (expected * seconds) as u64;
        let report = run(
            link(200, 20.0, 1e-3),
            bytes,
            streams,
            SenderModel::Reno,
            seed,
        );
        completed(&report);
        let ratio = line(
            &format!("{streams} Reno streams, p = 0.001, 200 Mbit/s, B/s"),
            expected,
            report.goodput_bytes_per_second,
            "0.7–1.3",
            seed,
        );
        assert!(
            (0.7..=1.3).contains(&ratio),
            "seed {seed}: ratio {ratio}, {report:?}"
        );
    }
}

/// Drop-tail, loss 0, one Reno stream on 100 Mbit/s at RTT 20 ms (BDP
/// 250 kB): with a buffer of a tenth of the BDP the sawtooth drains the
/// pipe after every halving and utilisation (goodput over the payload rate)
/// stays below 0.9; with one BDP of buffer it is at least 0.9. Every drop
/// is a queue drop.
#[test]
fn drop_tail_below_the_bdp_underutilises_and_one_bdp_fills() {
    let payload_rate = 100e6 / 8.0 * MSS / PACKET;
    let bdp = 250_000;
    for (buffer, seed) in [(bdp / 10, 31u64), (bdp, 32)] {
        let seed = test_seed(seed);
        let report = run(
            with_buffer(link(100, 20.0, 0.0), buffer),
            100_000_000,
            1,
            SenderModel::Reno,
            seed,
        );
        completed(&report);
        let utilisation = line(
            &format!("1 Reno stream, buffer {buffer} B, utilisation (vs 1.0)"),
            1.0,
            report.goodput_bytes_per_second / payload_rate,
            if buffer < bdp { "< 0.9" } else { "≥ 0.9" },
            seed,
        );
        assert!(
            report.data_drops.queue > 0 && report.data_drops.loss == 0,
            "{report:?}"
        );
        if buffer < bdp {
            assert!(utilisation < 0.9, "seed {seed}: {utilisation}, {report:?}");
        } else {
            assert!(
                (0.9..=1.0).contains(&utilisation),
                "seed {seed}: {utilisation}, {report:?}"
            );
        }
    }
}

/// The paced sender at or below the link's rate, loss 0: goodput is the
/// paced rate's payload share (rate × MSS / packet bytes) within 2 %, with
/// no drop, over 1 and 4 connections.
#[test]
fn the_paced_sender_delivers_its_rate_without_drops() {
    for (mbit, connections, seed) in [(90u64, 1u32, 41u64), (100, 1, 42), (90, 4, 43)] {
        let seed = test_seed(seed);
        let rate = mbit * 1_000_000;
        let report = run(
            link(100, 20.0, 0.0),
            50_000_000,
            connections,
            SenderModel::Paced {
                bits_per_second: rate,
            },
            seed,
        );
        completed(&report);
        let expected = rate as f64 / 8.0 * MSS / PACKET;
        let ratio = line(
            &format!("paced {mbit} Mbit/s on 100 Mbit/s, {connections} conn., B/s"),
            expected,
            report.goodput_bytes_per_second,
            "0.98–1.02",
            seed,
        );
        assert!(
            (0.98..=1.02).contains(&ratio),
            "seed {seed}: ratio {ratio}, {report:?}"
        );
        assert_eq!(
            report.data_drops.total() + report.ack_drops.total(),
            0,
            "{report:?}"
        );
        assert_eq!(report.retransmits, 0, "{report:?}");
    }
}

/// A 4-site fragment exchange on a loss-free mesh of 100 Mbit/s links at
/// RTT 20 ms, one paced connection per pair at 90 Mbit/s: each phase is one
/// pair's share at the paced rate plus the one-way delay, so the round is
/// 2 · (F/M · packet/MSS · 8/rate + RTT/2), within 2 %.
#[test]
fn a_paced_exchange_round_is_two_transfers_of_a_share() {
    let seed = test_seed(51);
    let fragment = 40_000_000u64;
    let sites = 4u32;
    let rate = 90e6;
    let config = ExchangeConfig::new(
        sites,
        link(100, 20.0, 0.0),
        fragment,
        1,
        SenderModel::Paced {
            bits_per_second: rate as u64,
        },
        seed,
    );
    let report = match exchange(&config) {
        Ok(report) => report,
        Err(error) => panic!("seed {seed}: {error}"),
    };
    assert_eq!(
        report.outcome,
        Outcome::Completed,
        "seed {seed}: {report:?}"
    );
    let share = (fragment / u64::from(sites)) as f64;
    let phase = share * PACKET / MSS * 8.0 / rate + 0.010;
    let simulated = report.round.map_or(f64::NAN, |round| round.as_secs_f64());
    let ratio = line(
        "4-site paced exchange round, s",
        2.0 * phase,
        simulated,
        "0.98–1.02",
        seed,
    );
    assert!(
        (0.98..=1.02).contains(&ratio),
        "seed {seed}: ratio {ratio}, {report:?}"
    );
    assert_eq!(report.drops.total(), 0, "{report:?}");
}

/// The same round with 2 Reno connections per pair at p = 1e-3 completes,
/// retransmitting what was lost, and takes longer than the paced one.
#[test]
fn a_reno_exchange_round_completes_under_loss() {
    let seed = test_seed(52);
    let config = ExchangeConfig::new(
        4,
        link(100, 20.0, 1e-3),
        8_000_000,
        2,
        SenderModel::Reno,
        seed,
    );
    let report = match exchange(&config) {
        Ok(report) => report,
        Err(error) => panic!("seed {seed}: {error}"),
    };
    assert_eq!(
        report.outcome,
        Outcome::Completed,
        "seed {seed}: {report:?}"
    );
    assert!(
        report.drops.loss > 0 && report.retransmits > 0,
        "seed {seed}: {report:?}"
    );
    let floor = 2.0 * (2e6 * PACKET / MSS * 8.0 / 100e6 + 0.010);
    let round = report.round.map_or(f64::NAN, |round| round.as_secs_f64());
    assert!(
        round > floor,
        "seed {seed}: {round} s vs {floor} s, {report:?}"
    );
}
