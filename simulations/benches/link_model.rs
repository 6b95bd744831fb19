//! Packet events per second through one busy link, on one core.
//!
//! A 10 Gbit/s, 1000 km link with Gilbert-Elliott loss, jitter and a one-BDP
//! buffer is offered 1500-byte packets at 110% of its rate, so the queue
//! stays full and drop-tail is exercised; deliveries are polled as virtual
//! time advances. An event is one `handle_send` or one delivery returned by
//! `poll_delivery`. Two runs: FIFO jitter (deliveries in order) and
//! reordering jitter (deliveries through the heap). Run with
//! `cargo bench -p longhaul-simulations --bench link_model`.

use std::hint::black_box;
use std::time::Instant;

use longhaul_core::units::{DataRate, Distance, Duration};
use longhaul_simulations::link::{Jitter, JitterMode, Link, LinkConfig, LossModel};

const PACKETS: u64 = 5_000_000;

fn busy_link(mode: JitterMode) -> Result<Link, Box<dyn std::error::Error>> {
    let mut config = LinkConfig::new(
        DataRate::from_gbit_per_second(10),
        Distance::from_km(1000.0).ok_or("bad distance")?,
    );
    config.loss = LossModel::GilbertElliott {
        p: 0.001,
        r: 0.3,
        loss_in_bad: 0.5,
        loss_in_good: 0.0001,
    };
    config.jitter = Some(Jitter {
        max: Duration::from_micros(50),
        mode,
    });
    Ok(Link::new(config, 42)?)
}

fn run(name: &str, mut link: Link) {
    // 1500 bytes at 11 Gbit/s: one packet every 1091 ns.
    let gap_ns = 1_091;
    let mut events: u64 = 0;
    let started = Instant::now();
    let mut now = 0;
    for id in 0..PACKETS {
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
    let elapsed = started.elapsed().as_secs_f64();
    let stats = link.stats();
    println!(
        "link_model/{name}: {events} events ({} sends, {} deliveries, {} queue drops, {} losses) in {elapsed:.3} s: {:.2} million packet events per second on one core",
        stats.packets_in,
        stats.packets_delivered,
        stats.drops.queue,
        stats.drops.loss,
        events as f64 / elapsed / 1e6
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    run("fifo_jitter", busy_link(JitterMode::Fifo)?);
    run("reorder_jitter", busy_link(JitterMode::Reorder)?);
    Ok(())
}
