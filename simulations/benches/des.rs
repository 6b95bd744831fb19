//! The discrete-event tier's speed on one core, beside the link model's own.
//!
//! - `des/transfer_*`: events per second of one two-site transfer (an event
//!   is a packet handed to a link, a packet delivered or a timer firing, as
//!   the link model's bench counts sends and deliveries): 8 Reno
//!   connections at loss 1e-4, 8 Cubic connections at loss 1e-4 and one
//!   paced connection, 1 Gbit/s, 1000 km;
//! - `link_model/fifo`: the link model alone, driven as `link_model.rs`
//!   drives it (10 Gbit/s, 1000 km, 110 % offered load), in the same run;
//! - `des/round_16_sites`: wall time of one outer round's fragment exchange
//!   among 16 fully meshed sites, 8 Reno connections per ordered pair,
//!   10 Gbit/s and 1000 km per link, loss 1e-4, a 64 MB fragment.
//!
//! Medians of 5 runs; every run prints its seed. Run with
//! `cargo bench -p longhaul-simulations --bench des`.

use std::hint::black_box;
use std::time::Instant;

use longhaul_core::units::{DataRate, Distance};
use longhaul_simulations::des::{ExchangeConfig, SenderModel, TransferConfig, exchange, transfer};
use longhaul_simulations::link::{Link, LinkConfig, LossModel};

const RUNS: usize = 5;
const SEED: u64 = 2026;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn wan(gbit: u64, km: f64, loss: f64) -> Result<LinkConfig, Box<dyn std::error::Error>> {
    let mut config = LinkConfig::new(
        DataRate::from_gbit_per_second(gbit),
        Distance::from_km(km).ok_or("bad distance")?,
    );
    if loss > 0.0 {
        config.loss = LossModel::Bernoulli { p: loss };
    }
    Ok(config)
}

fn bench_transfer(
    name: &str,
    sender: SenderModel,
    connections: u32,
    loss: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let config = TransferConfig::new(
        wan(1, 1000.0, loss)?,
        2_000_000_000,
        connections,
        sender,
        SEED,
    );
    let mut rates = Vec::new();
    let mut last = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let report = black_box(transfer(&config)?);
        let elapsed = started.elapsed().as_secs_f64();
        rates.push(report.events as f64 / elapsed);
        last = Some(report);
    }
    let report = last.ok_or("no run")?;
    println!(
        "des/{name}: seed {SEED}: {} events, {:.2} s virtual, {:.0} Mbit/s goodput, {} retransmits: {:.2} million events per second on one core (median of {RUNS})",
        report.events,
        report.elapsed.as_secs_f64(),
        report.goodput_bytes_per_second * 8e-6,
        report.retransmits,
        median(rates) / 1e6
    );
    Ok(())
}

/// The link model alone, as `benches/link_model.rs` drives it (FIFO, no
/// jitter here: the tier's links have none either).
fn bench_link_model() -> Result<(), Box<dyn std::error::Error>> {
    let mut rates = Vec::new();
    for _ in 0..RUNS {
        let mut link = Link::new(wan(10, 1000.0, 1e-4)?, SEED)?;
        let gap_ns = 1_091;
        let mut events: u64 = 0;
        let started = Instant::now();
        let mut now = 0;
        for id in 0..2_000_000 {
            black_box(link.handle_send(now, id, 1500, false));
            events += 1;
            while let Some(delivery) = link.poll_delivery(now) {
                black_box(delivery);
                events += 1;
            }
            now += gap_ns;
        }
        while let Some(wakeup) = link.next_wakeup() {
            while let Some(delivery) = link.poll_delivery(wakeup) {
                black_box(delivery);
                events += 1;
            }
        }
        rates.push(events as f64 / started.elapsed().as_secs_f64());
    }
    println!(
        "link_model/fifo: seed {SEED}: {:.2} million packet events per second on one core (median of {RUNS})",
        median(rates) / 1e6
    );
    Ok(())
}

fn bench_round() -> Result<(), Box<dyn std::error::Error>> {
    let config = ExchangeConfig::new(
        16,
        wan(10, 1000.0, 1e-4)?,
        64_000_000,
        8,
        SenderModel::Reno,
        SEED,
    );
    let mut walls = Vec::new();
    let mut last = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let report = black_box(exchange(&config)?);
        walls.push(started.elapsed().as_secs_f64());
        last = Some(report);
    }
    let report = last.ok_or("no run")?;
    let wall = median(walls);
    println!(
        "des/round_16_sites: seed {SEED}: 240 pairs × 8 Reno connections, 64 MB fragment: round {:.3} s virtual ({:?}), {} events, {} retransmits: {wall:.3} s wall (median of {RUNS}), {:.2} million events per second",
        report.round.map_or(f64::NAN, |round| round.as_secs_f64()),
        report.outcome,
        report.events,
        report.retransmits,
        report.events as f64 / wall / 1e6
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    bench_transfer("transfer_reno_8", SenderModel::Reno, 8, 1e-4)?;
    bench_transfer("transfer_cubic_8", SenderModel::Cubic, 8, 1e-4)?;
    bench_transfer(
        "transfer_paced_1",
        SenderModel::Paced {
            bits_per_second: 900_000_000,
        },
        1,
        0.0,
    )?;
    bench_link_model()?;
    bench_round()?;
    Ok(())
}
