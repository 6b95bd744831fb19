//! The lease's decisions, sans-IO: when to register, when to renew, when to
//! move to another replica, when the lease is gone.
//!
//! **Nothing here makes a call, sleeps or reads a clock.** Time comes in as
//! `now`; results come in through the `handle_*` methods; the `poll_*`
//! methods say what to do next. The lease task in `agent.rs` makes the
//! calls, sleeps until [`Lease::poll_timeout`] and keeps the status board.
//!
//! The rules: register at once (any replica; followers forward to the
//! leader), then renew every fifth of the TTL: a renewal writes nothing at
//! the coordinator (one heartbeat round to a quorum), so renewing often is
//! cheap, and it leaves four more chances before the lease lapses. A failed
//! registration waits with a growing backoff, and moves to the next replica
//! when another one might answer. A renewal that fails because the replica
//! is unreachable, has no leader or could not confirm it leads moves to the
//! next replica and retries within 50 ms, so after a leader change the agent
//! finds the new leader in one or two short timeouts: the new leader gives
//! every site at least half a TTL for that (`longhaul_core::lease`). A
//! renewal refused because the lease is gone (the site was marked down)
//! registers again at once, as does a change of the inventory's shape.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tonic::Code;

use super::backoff::Backoff;
use crate::coordinator::is_transient_code;

/// The longest wait before retrying a failed renewal at the next replica:
/// soon, but a cluster without a leader should not be hammered.
const RENEWAL_RETRY: Duration = Duration::from_millis(50);

/// The shortest bound on a renewal call.
const MIN_RENEWAL_TIMEOUT: Duration = Duration::from_millis(100);

/// Renewals per TTL while all goes well.
const RENEWALS_PER_TTL: u32 = 5;

/// Time between renewals while all goes well.
fn renewal_period(ttl: Duration) -> Duration {
    ttl / RENEWALS_PER_TTL
}

/// Why a lease given up for a new inventory shape was lost.
pub const RESHAPED: &str = "the inventory changed shape";

/// A call to make now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseCall {
    /// Register the site's current inventory, the call bounded by `timeout`.
    Register { timeout: Duration },
    /// Renew `lease_id`, the call bounded by `timeout`.
    KeepAlive { lease_id: u64, timeout: Duration },
}

/// What happened, for the driver to publish, count and log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The replica in use failed in a way another might not: use the next.
    SwitchReplica,
    /// The lease is held from now on.
    Registered { lease_id: u64, ttl: Duration },
    /// The lease was renewed; `leader_url` is the leader the replica named.
    Renewed { leader_id: u64, leader_url: String },
    /// The lease is lost, for `reason`; registering again.
    Lost { reason: String },
}

/// What a failed renewal led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalFailure {
    /// The coordinator no longer has the lease: register again.
    LeaseGone,
    /// Try the next replica shortly.
    NextReplica,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// No lease; register at `at`.
    Unregistered { at: Instant },
    /// A registration is in flight.
    Registering,
    /// The lease is held; renew at `renew_at`.
    Held {
        lease_id: u64,
        ttl: Duration,
        renew_at: Instant,
    },
    /// A renewal is in flight.
    Renewing { lease_id: u64, ttl: Duration },
}

/// The lease of one site at the coordinator.
#[derive(Debug)]
pub struct Lease {
    call_timeout: Duration,
    state: State,
    backoff: Backoff,
    /// A new inventory shape is waiting to be registered. It takes effect
    /// once a lease is held, so that one asked for while a registration
    /// (perhaps of the old inventory) was in flight is not lost.
    reshaped: bool,
    events: VecDeque<LeaseEvent>,
}

impl Lease {
    /// A lease not yet registered; the first registration is due at `now`.
    /// `call_timeout` bounds a registration, and every renewal.
    pub fn new(now: Instant, call_timeout: Duration) -> Self {
        Self {
            call_timeout,
            state: State::Unregistered { at: now },
            backoff: Backoff::new(),
            reshaped: false,
            events: VecDeque::new(),
        }
    }

    /// The lease held, if any (`None` while registering).
    pub fn lease_id(&self) -> Option<u64> {
        match self.state {
            State::Held { lease_id, .. } | State::Renewing { lease_id, .. } => Some(lease_id),
            State::Unregistered { .. } | State::Registering => None,
        }
    }

    /// The call to make at `now`, if one is due. Its outcome must come back
    /// through the matching `handle_*` method before the next call.
    pub fn poll_call(&mut self, now: Instant) -> Option<LeaseCall> {
        match self.state {
            State::Unregistered { at } if at <= now => {
                self.state = State::Registering;
                Some(LeaseCall::Register {
                    timeout: self.call_timeout,
                })
            }
            State::Held {
                lease_id,
                ttl,
                renew_at,
            } if renew_at <= now => {
                self.state = State::Renewing { lease_id, ttl };
                Some(LeaseCall::KeepAlive {
                    lease_id,
                    timeout: renewal_timeout(ttl, self.call_timeout),
                })
            }
            _ => None,
        }
    }

    /// When the next call is due; `None` while one is in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Unregistered { at } => Some(at),
            State::Held { renew_at, .. } => Some(renew_at),
            State::Registering | State::Renewing { .. } => None,
        }
    }

    /// The next thing that happened, oldest first.
    pub fn poll_event(&mut self) -> Option<LeaseEvent> {
        self.events.pop_front()
    }

    /// A registration was answered at `now` with a lease of `ttl_ms`.
    pub fn handle_registered(&mut self, now: Instant, lease_id: u64, ttl_ms: u64) {
        self.backoff.reset();
        let ttl = Duration::from_millis(ttl_ms.max(1));
        self.events
            .push_back(LeaseEvent::Registered { lease_id, ttl });
        self.hold(now, lease_id, ttl, now + renewal_period(ttl));
    }

    /// A registration failed at `now` with `code`.
    pub fn handle_register_failed(&mut self, now: Instant, code: Code) {
        if is_transient_code(code) {
            self.events.push_back(LeaseEvent::SwitchReplica);
        }
        self.state = State::Unregistered {
            at: now + self.backoff.next_pause(),
        };
    }

    /// A renewal was answered at `now`.
    pub fn handle_renewed(&mut self, now: Instant, leader_id: u64, leader_url: String) {
        let State::Renewing { lease_id, ttl } = self.state else {
            return;
        };
        self.events.push_back(LeaseEvent::Renewed {
            leader_id,
            leader_url,
        });
        self.hold(now, lease_id, ttl, now + renewal_period(ttl));
    }

    /// A renewal failed at `now` with `code` and `message`.
    pub fn handle_renewal_failed(
        &mut self,
        now: Instant,
        code: Code,
        message: &str,
    ) -> RenewalFailure {
        if matches!(code, Code::NotFound | Code::FailedPrecondition) {
            self.lose(now, message.to_string());
            return RenewalFailure::LeaseGone;
        }
        if let State::Renewing { lease_id, ttl } = self.state {
            self.events.push_back(LeaseEvent::SwitchReplica);
            self.hold(
                now,
                lease_id,
                ttl,
                now + RENEWAL_RETRY.min(renewal_period(ttl)),
            );
        }
        RenewalFailure::NextReplica
    }

    /// The inventory changed in a way only a registration can express.
    pub fn handle_inventory_reshaped(&mut self, now: Instant) {
        self.reshaped = true;
        if let State::Held {
            lease_id,
            ttl,
            renew_at,
        } = self.state
        {
            self.hold(now, lease_id, ttl, renew_at);
        }
    }

    /// Holds the lease until `renew_at`, unless a new inventory shape is
    /// waiting to be registered.
    fn hold(&mut self, now: Instant, lease_id: u64, ttl: Duration, renew_at: Instant) {
        if self.reshaped {
            self.reshaped = false;
            self.lose(now, RESHAPED.to_string());
            return;
        }
        self.state = State::Held {
            lease_id,
            ttl,
            renew_at,
        };
    }

    fn lose(&mut self, now: Instant, reason: String) {
        self.events.push_back(LeaseEvent::Lost { reason });
        self.state = State::Unregistered { at: now };
    }
}

/// A renewal's bound: a sixth of the TTL, at least 100 ms and at most the
/// configured call timeout (which wins when it is shorter than 100 ms), so
/// that a dead replica costs little.
fn renewal_timeout(ttl: Duration, call_timeout: Duration) -> Duration {
    // Not `clamp`: it panics when the call timeout is below 100 ms, which
    // the config allows.
    (ttl / 6).max(MIN_RENEWAL_TIMEOUT).min(call_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL_TIMEOUT: Duration = Duration::from_secs(5);
    const TTL_MS: u64 = 9_000;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn events(lease: &mut Lease) -> Vec<LeaseEvent> {
        std::iter::from_fn(|| lease.poll_event()).collect()
    }

    /// A lease registered at `start` with a 9 s TTL, its events taken.
    fn registered(start: Instant) -> Lease {
        let mut lease = Lease::new(start, CALL_TIMEOUT);
        assert_eq!(
            lease.poll_call(start),
            Some(LeaseCall::Register {
                timeout: CALL_TIMEOUT
            })
        );
        lease.handle_registered(start, 7, TTL_MS);
        assert_eq!(
            events(&mut lease),
            [LeaseEvent::Registered {
                lease_id: 7,
                ttl: ms(TTL_MS)
            }]
        );
        lease
    }

    #[test]
    fn registers_at_once_and_only_once_while_the_call_is_in_flight() {
        let start = Instant::now();
        let mut lease = Lease::new(start, CALL_TIMEOUT);
        assert_eq!(lease.poll_timeout(), Some(start));
        assert!(matches!(
            lease.poll_call(start),
            Some(LeaseCall::Register { .. })
        ));
        assert_eq!(lease.poll_call(start + ms(1)), None);
        assert_eq!(lease.poll_timeout(), None);
        assert_eq!(lease.lease_id(), None);
    }

    #[test]
    fn renews_every_fifth_of_the_ttl() {
        let start = Instant::now();
        let mut lease = registered(start);
        assert_eq!(lease.lease_id(), Some(7));
        assert_eq!(lease.poll_timeout(), Some(start + ms(1_800)));
        assert_eq!(lease.poll_call(start + ms(1_799)), None);
        assert_eq!(
            lease.poll_call(start + ms(1_800)),
            Some(LeaseCall::KeepAlive {
                lease_id: 7,
                timeout: ms(1_500)
            })
        );
        // The next period counts from the answer, not from the schedule.
        let answered = start + ms(2_000);
        lease.handle_renewed(answered, 1, "http://leader".into());
        assert_eq!(
            events(&mut lease),
            [LeaseEvent::Renewed {
                leader_id: 1,
                leader_url: "http://leader".into()
            }]
        );
        assert_eq!(lease.poll_timeout(), Some(answered + ms(1_800)));
    }

    #[test]
    fn a_renewal_is_bounded_by_a_sixth_of_the_ttl_within_100_ms_and_the_call_timeout() {
        assert_eq!(renewal_timeout(ms(9_000), CALL_TIMEOUT), ms(1_500));
        assert_eq!(renewal_timeout(ms(300), CALL_TIMEOUT), ms(100));
        assert_eq!(renewal_timeout(ms(60_000), CALL_TIMEOUT), CALL_TIMEOUT);
    }

    #[test]
    fn a_call_timeout_below_100_ms_bounds_renewals_instead_of_panicking() {
        assert_eq!(renewal_timeout(ms(9_000), ms(50)), ms(50));
        let start = Instant::now();
        let mut lease = Lease::new(start, ms(50));
        lease.poll_call(start);
        lease.handle_registered(start, 7, TTL_MS);
        assert_eq!(
            lease.poll_call(start + ms(1_800)),
            Some(LeaseCall::KeepAlive {
                lease_id: 7,
                timeout: ms(50)
            })
        );
    }

    #[test]
    fn a_failed_renewal_moves_to_the_next_replica_and_retries_within_50_ms() {
        let start = Instant::now();
        let mut lease = registered(start);
        let due = start + ms(1_800);
        assert!(lease.poll_call(due).is_some());
        let failed = due + ms(10);
        assert_eq!(
            lease.handle_renewal_failed(failed, Code::Unavailable, "connection refused"),
            RenewalFailure::NextReplica
        );
        assert_eq!(events(&mut lease), [LeaseEvent::SwitchReplica]);
        // Still held: the next replica is asked for the same lease.
        assert_eq!(lease.lease_id(), Some(7));
        assert_eq!(lease.poll_timeout(), Some(failed + ms(50)));
        assert!(matches!(
            lease.poll_call(failed + ms(50)),
            Some(LeaseCall::KeepAlive { lease_id: 7, .. })
        ));
        // A refusal that is not about the lease moves on as well.
        assert_eq!(
            lease.handle_renewal_failed(failed + ms(60), Code::PermissionDenied, "no"),
            RenewalFailure::NextReplica
        );
        assert_eq!(events(&mut lease), [LeaseEvent::SwitchReplica]);
    }

    #[test]
    fn a_renewal_retry_never_waits_longer_than_the_period() {
        let start = Instant::now();
        let mut lease = Lease::new(start, CALL_TIMEOUT);
        lease.poll_call(start);
        lease.handle_registered(start, 7, 90); // renewals every 18 ms
        assert!(lease.poll_call(start + ms(30)).is_some());
        lease.handle_renewal_failed(start + ms(30), Code::DeadlineExceeded, "slow");
        assert_eq!(lease.poll_timeout(), Some(start + ms(48)));
    }

    #[test]
    fn a_lease_reported_gone_registers_again_at_once() {
        for code in [Code::NotFound, Code::FailedPrecondition] {
            let start = Instant::now();
            let mut lease = registered(start);
            let due = start + ms(1_800);
            assert!(lease.poll_call(due).is_some());
            assert_eq!(
                lease.handle_renewal_failed(due, code, "lease 7 expired"),
                RenewalFailure::LeaseGone
            );
            assert_eq!(
                events(&mut lease),
                [LeaseEvent::Lost {
                    reason: "lease 7 expired".into()
                }]
            );
            assert_eq!(lease.lease_id(), None);
            assert_eq!(
                lease.poll_call(due),
                Some(LeaseCall::Register {
                    timeout: CALL_TIMEOUT
                })
            );
        }
    }

    #[test]
    fn registration_backoff_grows_switches_on_transient_errors_and_resets() {
        let start = Instant::now();
        let mut lease = Lease::new(start, CALL_TIMEOUT);
        let mut now = start;
        let mut waits = Vec::new();
        for code in [Code::Unavailable, Code::Unavailable, Code::InvalidArgument] {
            assert!(matches!(
                lease.poll_call(now),
                Some(LeaseCall::Register { .. })
            ));
            lease.handle_register_failed(now, code);
            let at = lease.poll_timeout().unwrap();
            assert_eq!(lease.poll_call(at - ms(1)), None);
            waits.push(at - now);
            now = at;
        }
        assert_eq!(waits, [ms(100), ms(200), ms(400)]);
        // Only the transient failures move to another replica.
        assert_eq!(
            events(&mut lease),
            [LeaseEvent::SwitchReplica, LeaseEvent::SwitchReplica]
        );
        // A registration resets the backoff: after the lease is lost, the
        // first failed registration waits 100 ms again.
        lease.poll_call(now);
        lease.handle_registered(now, 8, TTL_MS);
        let due = lease.poll_timeout().unwrap();
        lease.poll_call(due);
        lease.handle_renewal_failed(due, Code::NotFound, "gone");
        lease.poll_call(due);
        lease.handle_register_failed(due, Code::Unavailable);
        assert_eq!(lease.poll_timeout(), Some(due + ms(100)));
    }

    #[test]
    fn a_new_inventory_shape_gives_up_a_held_lease() {
        let start = Instant::now();
        let mut lease = registered(start);
        let now = start + ms(1_000);
        lease.handle_inventory_reshaped(now);
        assert_eq!(
            events(&mut lease),
            [LeaseEvent::Lost {
                reason: RESHAPED.into()
            }]
        );
        assert!(matches!(
            lease.poll_call(now),
            Some(LeaseCall::Register { .. })
        ));
        // Once only: the registration just made carries the new shape.
        lease.handle_registered(now, 8, TTL_MS);
        assert_eq!(
            events(&mut lease),
            [LeaseEvent::Registered {
                lease_id: 8,
                ttl: ms(TTL_MS)
            }]
        );
        assert_eq!(lease.lease_id(), Some(8));
    }

    #[test]
    fn a_new_shape_during_a_registration_registers_again_once_it_is_held() {
        let start = Instant::now();
        let mut lease = Lease::new(start, CALL_TIMEOUT);
        lease.poll_call(start);
        // The registration in flight may carry the old inventory.
        lease.handle_inventory_reshaped(start + ms(5));
        assert_eq!(events(&mut lease), []);
        lease.handle_registered(start + ms(10), 7, TTL_MS);
        assert_eq!(
            events(&mut lease),
            [
                LeaseEvent::Registered {
                    lease_id: 7,
                    ttl: ms(TTL_MS)
                },
                LeaseEvent::Lost {
                    reason: RESHAPED.into()
                }
            ]
        );
        assert!(matches!(
            lease.poll_call(start + ms(10)),
            Some(LeaseCall::Register { .. })
        ));
    }

    #[test]
    fn a_zero_ttl_is_taken_as_one_millisecond() {
        let start = Instant::now();
        let mut lease = Lease::new(start, CALL_TIMEOUT);
        lease.poll_call(start);
        lease.handle_registered(start, 7, 0);
        assert_eq!(
            events(&mut lease),
            [LeaseEvent::Registered {
                lease_id: 7,
                ttl: ms(1)
            }]
        );
    }
}
