//! A congestion controller for **dedicated links**: a link the job owns
//! (a leased wave, a reserved share), whose losses are random (a dirty
//! connector, a marginal amplifier), not a full queue's. Loss-based
//! controllers (Cubic, NewReno) read every loss as congestion and halve
//! their window: at 0.1 % random loss on a 50 ms path one connection of
//! either holds a few percent of a 1 Gbit/s link (Mathis: MSS/RTT ×
//! 1.22/√p). This one does not.
//!
//! [`DedicatedConfig`] gives every connection a fixed target window (the
//! exchange sets it to its share of 1.25 × the bandwidth-delay product of
//! the link as configured, `link_rate` × `link_rtt`, so that the pool
//! fills the link and keeps a standing queue of a quarter of a BDP at
//! most); the window grows from the RFC 9002 initial window by the bytes
//! acknowledged (slow start) up to the target and stays there through
//! losses, which QUIC retransmits. Only persistent congestion (every
//! packet over several RTTs lost: an outage, a cut) starts it again from
//! the initial window. Quinn paces each connection at 1.25 × its window
//! per RTT, so the window is spread over the round trip, not burst.
//!
//! **Use it only on a link that is the job's, with its real rate and RTT
//! configured**: it never measures the path. On a shared path it does not
//! back off for other traffic, by design; with a configured rate above
//! the link's it overfills the queue for good (steady overload is not
//! persistent congestion), and a buffer smaller than a quarter BDP drops
//! at every round trip. The window is per peer: peers behind one shared
//! uplink each get the whole link's share. The default is Cubic.

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use quinn::congestion::{Controller, ControllerFactory};
use quinn_proto::RttEstimator;

/// The smallest target window (a connection's first round trips need
/// room above the initial window).
pub const MIN_WINDOW: u64 = 64 << 10;

/// Builds [`Dedicated`] controllers with a target window of `window`
/// bytes per connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedicatedConfig {
    pub window: u64,
}

impl ControllerFactory for DedicatedConfig {
    fn build(self: Arc<Self>, _now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let initial = initial_window(current_mtu);
        Box::new(Dedicated {
            target: self.window.max(MIN_WINDOW),
            initial,
            window: initial,
        })
    }
}

/// The initial window of RFC 9002 (and quinn's): min(10 × MTU,
/// max(2 × MTU, 14 720)) bytes.
fn initial_window(mtu: u16) -> u64 {
    let mtu = u64::from(mtu);
    (10 * mtu).min((2 * mtu).max(14_720))
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Dedicated {
    target: u64,
    initial: u64,
    window: u64,
}

impl Dedicated {
    /// Slow start up to the target; an application-limited sender proves
    /// nothing about the path.
    fn acked(&mut self, bytes: u64, app_limited: bool) {
        if !app_limited && self.window < self.target {
            self.window = (self.window + bytes).min(self.target);
        }
    }
}

impl Controller for Dedicated {
    fn on_ack(
        &mut self,
        _now: Instant,
        _sent: Instant,
        bytes: u64,
        app_limited: bool,
        _rtt: &RttEstimator,
    ) {
        self.acked(bytes, app_limited);
    }

    fn on_congestion_event(
        &mut self,
        _now: Instant,
        _sent: Instant,
        is_persistent_congestion: bool,
        _lost_bytes: u64,
    ) {
        // Random loss on a dedicated link is not congestion; a path that
        // lost everything for several RTTs is gone or changed: probe it
        // again from the start.
        if is_persistent_congestion {
            self.window = self.initial;
        }
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.initial = initial_window(new_mtu);
        self.window = self.window.max(self.initial);
    }

    fn window(&self) -> u64 {
        self.window
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.initial
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller(window: u64) -> Dedicated {
        let initial = initial_window(1200);
        Dedicated {
            target: window.max(MIN_WINDOW),
            initial,
            window: initial,
        }
    }

    #[test]
    fn the_window_grows_to_its_target_and_holds_through_random_loss() {
        let mut c = controller(1 << 20);
        let now = Instant::now();
        assert_eq!(c.window(), 12_000);
        for _ in 0..200 {
            c.acked(10_000, false);
        }
        assert_eq!(c.window(), 1 << 20);
        c.on_congestion_event(now, now, false, 1200);
        assert_eq!(c.window(), 1 << 20, "a random loss changes nothing");
        // Application-limited acks do not grow it.
        let mut limited = controller(1 << 20);
        limited.acked(100_000, true);
        assert_eq!(limited.window(), 12_000);
        // An outage starts it again.
        c.on_congestion_event(now, now, true, 1 << 20);
        assert_eq!(c.window(), 12_000);
        assert_eq!(initial_window(1500), 14_720);
    }

    #[test]
    fn the_factory_raises_a_target_below_the_floor() {
        let c = Arc::new(DedicatedConfig { window: 1000 }).build(Instant::now(), 1200);
        let c = c.into_any().downcast::<Dedicated>().unwrap();
        assert_eq!(c.target, MIN_WINDOW);
    }
}
