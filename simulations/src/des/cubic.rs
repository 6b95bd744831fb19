//! Cubic's window growth (RFC 9438, which obsoletes RFC 8312), in segments.
//!
//! After a reduction the window follows W_cubic(t) = C·(t − K)³ + W_max,
//! t the time since the congestion-avoidance epoch began, W_max the window
//! before the reduction and K = ∛((W_max − cwnd_epoch)/C) the time it takes
//! to get back there. A reduction multiplies the window by β = 0.7, and a
//! second reduction below the previous W_max lowers W_max further (fast
//! convergence, §4.7). In the Reno-friendly region (§4.3) the window is at
//! least W_est, an AIMD estimate that grows by α = 3(1 − β)/(1 + β) segments
//! per window (1 once W_est has passed W_max), so Cubic's rate is never below
//! Reno's for the same loss and RTT. Slow start is the connection's own (no
//! HyStart).
//!
//! [`Flavour::Quinn`] is quinn 0.11's Cubic (`quinn-proto`'s
//! `congestion/cubic.rs`), which the agents run, where it departs from the
//! RFC: its epoch starts at the reduction, not at the first ACK after it;
//! K is ∛(W_max·(1 − β)/C) and W_est starts at β·W_max, both as if the
//! window had been reduced from W_max, so after a fast-convergence W_max
//! (below the window the loss ended) the curve and the estimate start
//! below the window, and the window waits for them; α stays 0.53 past
//! W_max; the region is chosen by the curve one RTT ahead, and that target
//! is not capped at 1.5 windows.

/// Cubic's scaling constant C, segments per second³ (RFC 9438 §5).
pub(crate) const C: f64 = 0.4;
/// The multiplicative decrease factor β (RFC 9438 §4.6).
pub(crate) const BETA: f64 = 0.7;
/// The Reno-friendly additive increase per window (RFC 9438 §4.3).
const ALPHA: f64 = 3.0 * (1.0 - BETA) / (1.0 + BETA);

/// The least window after a reduction, segments (as Reno's floor).
const MIN_WINDOW: f64 = 2.0;

/// Whose Cubic (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavour {
    Rfc9438,
    Quinn,
}

/// Cubic's state between reductions.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cubic {
    flavour: Flavour,
    /// The window before the last reduction (W_max), segments.
    w_max: f64,
    /// The window when the last reduction happened (cwnd_prior), segments.
    w_prior: f64,
    /// When the current congestion-avoidance epoch began, if it has.
    epoch_start_ns: Option<u64>,
    /// Time the current epoch ran before `epoch_start_ns`: in earlier
    /// transfers of a connection kept open, and idle between them.
    epoch_carried_ns: u64,
    /// Seconds from the epoch's start until W_cubic reaches W_max.
    k_seconds: f64,
    /// The Reno-friendly estimate W_est, segments.
    w_est: f64,
    /// A retransmission timeout was the last reduction: the next epoch
    /// starts with K = 0 and W_max the window it starts at (§4.8).
    after_timeout: bool,
}

impl Cubic {
    pub fn new(flavour: Flavour) -> Self {
        Self {
            flavour,
            w_max: 0.0,
            w_prior: 0.0,
            epoch_start_ns: None,
            epoch_carried_ns: 0,
            k_seconds: 0.0,
            w_est: 0.0,
            after_timeout: false,
        }
    }

    /// A congestion event at `now_ns` with the window at `cwnd`: returns
    /// the new ssthresh (β·cwnd) and ends the epoch; the next growth starts
    /// another (quinn's starts now).
    pub fn on_congestion(&mut self, cwnd: f64, now_ns: u64) -> f64 {
        // Fast convergence: a window that stopped short of the last W_max
        // releases bandwidth to newer flows.
        self.w_max = if cwnd < self.w_max {
            cwnd * (1.0 + BETA) / 2.0
        } else {
            cwnd
        };
        self.w_prior = cwnd;
        self.epoch_start_ns = None;
        self.epoch_carried_ns = 0;
        self.after_timeout = false;
        if self.flavour == Flavour::Quinn {
            self.k_seconds = (self.w_max * (1.0 - BETA) / C).cbrt();
            self.w_est = BETA * self.w_max;
            self.epoch_start_ns = Some(now_ns);
        }
        (cwnd * BETA).max(MIN_WINDOW)
    }

    /// A retransmission timeout with `flight` segments in flight: the new
    /// ssthresh (β·flight, as for any congestion event), and the first
    /// congestion-avoidance epoch after it grows from its own start, K = 0
    /// and W_max = the window then (RFC 9438 §4.8), not back towards the
    /// window the timeout ended.
    pub fn on_timeout(&mut self, flight: f64) -> f64 {
        let ssthresh = self.on_congestion(flight, 0);
        self.epoch_start_ns = None;
        self.after_timeout = true;
        ssthresh
    }

    /// The window after one more segment is ACKed in congestion avoidance,
    /// at `now_ns`, with the smoothed RTT `srtt_ns`.
    pub fn grow(&mut self, cwnd: f64, now_ns: u64, srtt_ns: f64) -> f64 {
        let start = match self.epoch_start_ns {
            Some(start) => start,
            None => {
                // A new epoch (§4.2): from a window above the last W_max
                // (slow start overshot it, or there was no reduction yet)
                // the curve starts at its plateau.
                // (quinn's only gets here with no reduction yet, or after
                // a timeout.)
                if self.after_timeout || cwnd >= self.w_max {
                    self.after_timeout = false;
                    self.w_max = cwnd;
                    self.k_seconds = 0.0;
                } else {
                    self.k_seconds = ((self.w_max - cwnd) / C).cbrt();
                }
                self.w_est = match self.flavour {
                    Flavour::Rfc9438 => cwnd,
                    Flavour::Quinn => BETA * self.w_max,
                };
                self.epoch_start_ns = Some(now_ns);
                self.epoch_carried_ns = 0;
                now_ns
            }
        };
        let t = now_ns
            .saturating_sub(start)
            .saturating_add(self.epoch_carried_ns) as f64
            * 1e-9;
        let rtt = srtt_ns.max(0.0) * 1e-9;
        if self.flavour == Flavour::Quinn {
            // quinn's estimate is a function of time since the reduction.
            if rtt > 0.0 {
                self.w_est = BETA * self.w_max + ALPHA * t / rtt;
            }
            let target = self.w_cubic(t + rtt);
            let goal = if target < self.w_est {
                self.w_est
            } else {
                cwnd + (target - cwnd) / cwnd
            };
            // In either region at most one datagram per ACKed one (quinn
            // adds a datagram once the increments reach one, and drops the
            // rest), and never less.
            return goal.clamp(cwnd, cwnd + 1.0);
        }
        let alpha = if self.w_est >= self.w_prior {
            1.0
        } else {
            ALPHA
        };
        self.w_est += alpha / cwnd;
        let cubic_now = self.w_cubic(t);
        if cubic_now < self.w_est {
            // The Reno-friendly region: at least what AIMD would have.
            return self.w_est.max(cwnd);
        }
        // Aim at where the curve will be one RTT from now, at most 1.5×.
        let target = self.w_cubic(t + rtt).clamp(cwnd, 1.5 * cwnd);
        cwnd + (target - cwnd) / cwnd
    }

    /// The connection's transfer ends at `now_ns`: the epoch's time so far
    /// is carried (see [`Cubic::resume`]).
    pub fn suspend(&mut self, now_ns: u64) {
        if let Some(start) = self.epoch_start_ns {
            self.epoch_carried_ns = self
                .epoch_carried_ns
                .saturating_add(now_ns.saturating_sub(start));
        }
    }

    /// `idle_ns` pass without a transfer. quinn's epoch clock runs on: its
    /// curve and estimate are functions of the time since the reduction,
    /// whether or not anything was sent. The RFC flavour's leaves idle time
    /// out, as Linux's does.
    pub fn idle(&mut self, idle_ns: u64) {
        if self.flavour == Flavour::Quinn && self.epoch_start_ns.is_some() {
            self.epoch_carried_ns = self.epoch_carried_ns.saturating_add(idle_ns);
        }
    }

    /// The connection's next transfer starts at `now_ns` (of its run).
    pub fn resume(&mut self, now_ns: u64) {
        if self.epoch_start_ns.is_some() {
            self.epoch_start_ns = Some(now_ns);
        }
    }

    /// Whether this is quinn's Cubic (paced as quinn paces, and not grown
    /// while the sender has nothing to send).
    pub fn is_quinns(&self) -> bool {
        self.flavour == Flavour::Quinn
    }

    fn w_cubic(&self, t: f64) -> f64 {
        C * (t - self.k_seconds).powi(3) + self.w_max
    }
}

/// RFC 9438 §5.1's average window under periodic loss p, segments, for a
/// round-trip time of `rtt_seconds`: the larger of Cubic's
/// (C(3 + β)/(4(1 − β)))^¼ · (RTT/p)^¾ and the Reno-friendly region's
/// AIMD(α, β) window √(α(1 + β)/(2(1 − β)p)), which with Cubic's α is
/// Reno's √(3/(2p)) ≈ 1.22/√p. `None` without loss.
pub fn cubic_average_window(rtt_seconds: f64, loss: f64) -> Option<f64> {
    if !(loss > 0.0 && rtt_seconds > 0.0) {
        return None;
    }
    let cubic =
        (C * (3.0 + BETA) / (4.0 * (1.0 - BETA))).powf(0.25) * (rtt_seconds / loss).powf(0.75);
    let reno_friendly = (ALPHA * (1.0 + BETA) / (2.0 * (1.0 - BETA)) / loss).sqrt();
    Some(cubic.max(reno_friendly))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTT_NS: f64 = 100e6;

    /// β = 0.7 and the curve's shape: back at W_max after K seconds, where
    /// K = ∛(W_max·(1 − β)/C), concave before, convex after.
    #[test]
    fn after_a_reduction_the_window_returns_to_w_max_after_k() {
        let mut cubic = Cubic::new(Flavour::Rfc9438);
        let ssthresh = cubic.on_congestion(1000.0, 0);
        assert_eq!(ssthresh, 700.0);
        let k = (1000.0_f64 * 0.3 / 0.4).cbrt();
        let mut cwnd = ssthresh;
        let mut now = 0u64;
        let mut at_k = None;
        // One ACK per 1/cwnd of an RTT: cwnd ACKs per RTT.
        while now < 2 * (k * 1e9) as u64 {
            cwnd = cubic.grow(cwnd, now, RTT_NS);
            now += (RTT_NS / cwnd) as u64;
            if at_k.is_none() && now as f64 * 1e-9 >= k {
                at_k = Some(cwnd);
            }
        }
        let at_k = at_k.unwrap();
        // The target is one RTT ahead, so at K the window is just past W_max.
        assert!((990.0..=1010.0).contains(&at_k), "{at_k} at K = {k} s");
        // At 2K: C·K³ + W_max = W_max + 300, within the RTT's lead.
        assert!((1270.0..=1400.0).contains(&cwnd), "{cwnd} at 2K");
    }

    /// After a timeout the first epoch starts at its plateau (K = 0, W_max =
    /// the window then), so it grows slowly at first; after a loss it climbs
    /// back towards the window the loss ended.
    #[test]
    fn after_a_timeout_the_first_epoch_starts_at_its_own_window() {
        let grow_for = |cubic: &mut Cubic, mut cwnd: f64, seconds: f64| {
            let mut now = 0u64;
            while (now as f64) < seconds * 1e9 {
                cwnd = cubic.grow(cwnd, now, RTT_NS);
                now += (RTT_NS / cwnd) as u64;
            }
            cwnd
        };
        let mut timed_out = Cubic::new(Flavour::Rfc9438);
        let ssthresh = timed_out.on_timeout(1000.0);
        assert_eq!(ssthresh, 700.0);
        // From ssthresh (slow start is the connection's): one second of
        // congestion avoidance.
        let after_timeout = grow_for(&mut timed_out, ssthresh, 1.0);
        assert_eq!(timed_out.k_seconds, 0.0);
        assert_eq!(timed_out.w_max, 700.0);
        let mut lost = Cubic::new(Flavour::Rfc9438);
        let from = lost.on_congestion(1000.0, 0);
        let after_loss = grow_for(&mut lost, from, 1.0);
        // From 700: C·t³ is under 1 segment in a second, and the
        // Reno-friendly region's α per RTT (≈ 0.53 × 10 RTTs) about 5; the
        // concave climb back towards 1000 gains far more.
        assert!(after_timeout < 710.0, "{after_timeout}");
        assert!(
            after_loss > after_timeout + 50.0,
            "{after_loss} vs {after_timeout}"
        );
    }

    /// Fast convergence: a second loss below the last W_max lowers it to
    /// the midpoint of the window and β times it.
    #[test]
    fn a_loss_below_w_max_lowers_w_max() {
        let mut cubic = Cubic::new(Flavour::Rfc9438);
        cubic.on_congestion(1000.0, 0);
        cubic.on_congestion(800.0, 0);
        assert_eq!(cubic.w_max, 800.0 * 1.7 / 2.0);
    }

    /// At a short RTT the curve is flat for long: the window grows at least
    /// as AIMD(α, β) would, α = 3·0.3/1.7 ≈ 0.53 segments per RTT.
    #[test]
    fn the_reno_friendly_region_grows_by_alpha_per_window() {
        let mut cubic = Cubic::new(Flavour::Rfc9438);
        let mut cwnd = cubic.on_congestion(100.0, 0);
        let mut now = 0u64;
        let rtt = 1e6;
        for _ in 0..10 {
            for _ in 0..cwnd as u32 {
                cwnd = cubic.grow(cwnd, now, rtt);
            }
            now += rtt as u64;
        }
        // Ten windows: about 5.3 segments above 70.
        assert!((74.0..=76.5).contains(&cwnd), "{cwnd}");
    }

    /// quinn's flavour after fast convergence: W_max = 0.85·90, and both
    /// the curve and the estimate start from β·W_max ≈ 53.6, below the
    /// reduced window of 63, which stays flat for RTTs where the RFC's
    /// grows at once; time idle between transfers runs the clock on.
    #[test]
    fn quinns_window_waits_for_its_curve_after_fast_convergence() {
        let rtt = 5e6;
        let ten_rtts = |cubic: &mut Cubic, mut cwnd: f64, from: u64| {
            let mut now = from;
            for _ in 0..10 {
                for _ in 0..cwnd as u32 {
                    cwnd = cubic.grow(cwnd, now, rtt);
                }
                now += rtt as u64;
            }
            cwnd
        };
        let mut quinn = Cubic::new(Flavour::Quinn);
        quinn.on_congestion(100.0, 0);
        let reduced = quinn.on_congestion(90.0, 0);
        assert!((reduced - 63.0).abs() < 1e-9, "{reduced}");
        assert_eq!(quinn.w_max, 90.0 * 1.7 / 2.0);
        let mut rfc = Cubic::new(Flavour::Rfc9438);
        rfc.on_congestion(100.0, 0);
        rfc.on_congestion(90.0, 0);
        assert_eq!(ten_rtts(&mut quinn.clone(), reduced, 0), reduced);
        assert!(ten_rtts(&mut rfc, reduced, 0) > reduced + 4.0);
        // A second idle: the estimate, 0.53 segments per RTT of it, is
        // past the window (one more segment per ACKed one at most).
        let mut idle = quinn.clone();
        idle.suspend(0);
        idle.idle(1_000_000_000);
        idle.resume(0);
        let after = idle.grow(reduced, 0, rtt);
        assert_eq!(after, reduced + 1.0);
    }

    #[test]
    fn the_average_window_is_cubics_or_renos_whichever_is_larger() {
        // Long RTT: Cubic's term, 1.054 · (0.2/1e-3)^¾ ≈ 56.
        let long = cubic_average_window(0.2, 1e-3).unwrap();
        assert!((55.5..=56.5).contains(&long), "{long}");
        // Short RTT: Reno's 1.22/√p.
        let short = cubic_average_window(0.02, 1e-3).unwrap();
        assert!((short - 1.2247 / 1e-3_f64.sqrt()).abs() < 0.01, "{short}");
        assert_eq!(cubic_average_window(0.02, 0.0), None);
    }
}
