//! The pause between attempts to reach the coordinator again.

use std::time::Duration;

/// The first pause, and the one after a success.
const FIRST: Duration = Duration::from_millis(100);
/// The longest pause.
const LONGEST: Duration = Duration::from_secs(2);

/// Exponential backoff between 100 ms and 2 s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    pub fn new() -> Self {
        Self { next: FIRST }
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.next = FIRST;
    }

    /// The pause to take now; the one after it is twice as long, up to 2 s.
    pub fn next_pause(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(LONGEST);
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn doubles_up_to_two_seconds_and_starts_over_after_a_reset() {
        let mut backoff = Backoff::new();
        let pauses: Vec<Duration> = (0..7).map(|_| backoff.next_pause()).collect();
        assert_eq!(
            pauses,
            [
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(2000),
                ms(2000)
            ]
        );
        backoff.reset();
        assert_eq!(backoff.next_pause(), ms(100));
        assert_eq!(backoff.next_pause(), ms(200));
    }
}
