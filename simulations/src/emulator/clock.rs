//! Wall-clock time as the link model's virtual time.

use std::time::{Duration, Instant};

/// Maps `Instant`s to the link model's `now` (nanoseconds since the
/// emulator started). Every link of one emulator shares one clock, so times
/// compare across links.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }

    /// Nanoseconds since the origin; saturates after 584 years.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The instant of a virtual time, or `None` past what `Instant` holds.
    pub fn instant(&self, ns: u64) -> Option<Instant> {
        self.origin.checked_add(Duration::from_nanos(ns))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
