//! Site leases, kept alive in the leader's memory: the pure table
//! (`longhaul_core::lease`, which says how leases work and why a new leader's
//! grace is safe) behind a mutex, fed the time since the replica started; the
//! confirmation a renewal waits for before it is acknowledged; and the task
//! that proposes an expiry for every lease that runs out, woken at the next
//! deadline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use longhaul_core::lease::LeaseError;
use longhaul_core::lease::{Expiry, LeaseTable, vote_lease};
use longhaul_core::state::{Command, Request};

use super::raft_loop::{RaftHandle, Role};
use super::service::now_unix_ms;
use super::state_machine::ApplyResponse;
use crate::consensus::NodeConfig;

/// The TTL granted when the replica is not configured otherwise, in ticks:
/// 1.6 s at the default 100 ms tick. A renewal needs a round trip to a quorum
/// (about a tick between sites), and the agent renews every fifth of the TTL
/// and gives up on a replica after a sixth of it.
pub const DEFAULT_LEASE_TTL_TICKS: u32 = 16;

/// The shortest TTL a replica grants, in ticks: a sixth of it must leave room
/// for a renewal's round trip to a quorum.
pub const MIN_LEASE_TTL_TICKS: u32 = 8;

/// The TTL granted by default with ticks of `tick_interval`.
pub fn default_lease_ttl(tick_interval: Duration) -> Duration {
    tick_interval.saturating_mul(DEFAULT_LEASE_TTL_TICKS)
}

/// The expiry task looks at the table at least this often: a new term (the
/// takeover) and a new registration are noticed within it. Expiries
/// themselves are exact: the task also wakes at the next deadline.
const EXPIRY_POLL: Duration = Duration::from_millis(50);

/// The lease table of one replica (meaningful while it leads).
#[derive(Debug, Clone)]
pub struct Leases {
    raft: RaftHandle,
    ttl: Duration,
    /// The origin of the table's time.
    started: Instant,
    table: Arc<Mutex<LeaseTable>>,
}

impl Leases {
    /// Leases of `ttl`, with the takeover grace the timers of `node` prove
    /// (every replica of a cluster runs the same timers; see
    /// `longhaul_core::lease::vote_lease`).
    pub fn new(raft: RaftHandle, ttl: Duration, node: &NodeConfig) -> Self {
        let bound = vote_lease(node.tick_interval, node.election_ticks);
        Self {
            raft,
            ttl,
            started: Instant::now(),
            table: Arc::new(Mutex::new(LeaseTable::new(ttl).with_renewal_bound(bound))),
        }
    }

    /// The TTL this replica grants.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn table(&self) -> std::sync::MutexGuard<'_, LeaseTable> {
        // A panic while holding the lock cannot leave the table
        // inconsistent in a way that matters: deadlines are refreshed.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The table's time: since this replica started.
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// A lease id no other leader can have granted (see
    /// [`LeaseTable::grant`]).
    pub fn grant(&self) -> Result<u64, LeaseError> {
        let status = self.raft.status();
        if status.role != Role::Leader {
            return Err(LeaseError::NotLeader);
        }
        Ok(self.table().grant(status.term))
    }

    /// Renews `site`'s lease; returns the TTL now running. The renewal is
    /// recorded as it arrives (an agent that reached the leader is alive,
    /// whatever happens next), but acknowledged only once a quorum confirmed
    /// that this replica still leads, within `wait`: what a later leader
    /// relies on when it counts renewals it did not see.
    pub async fn keep_alive(
        &self,
        site: &str,
        lease_id: u64,
        wait: Duration,
    ) -> Result<Duration, LeaseError> {
        let status = self.raft.status();
        if status.role != Role::Leader {
            return Err(LeaseError::NotLeader);
        }
        let ttl = {
            let state = self.raft.state().read();
            let ttl = longhaul_core::lease::check_renewal(&state, site, lease_id, self.ttl)?;
            let now = self.now();
            let mut table = self.table();
            table.sync(status.term, &state, now);
            table.renew(site, now);
            metrics::gauge!("longhaul_leases_held").set(table.len() as f64);
            ttl
        };
        match self.confirm(wait).await {
            Ok(()) => {
                metrics::counter!("longhaul_lease_renewals_total").increment(1);
                Ok(ttl)
            }
            Err(error) => {
                metrics::counter!("longhaul_lease_renewals_unconfirmed_total").increment(1);
                Err(error)
            }
        }
    }

    /// Confirms, within `wait`, that a quorum still follows this replica and
    /// that it is not handing leadership over (`RaftHandle::confirm_leadership`).
    /// A renewal is acknowledged only after it; so is a registration, after
    /// its commit, so that a lease handed out just before a hand-over is not
    /// counted from the takeover with less than its TTL.
    pub async fn confirm(&self, wait: Duration) -> Result<(), LeaseError> {
        match tokio::time::timeout(wait, self.raft.confirm_leadership()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(LeaseError::Unconfirmed(error.to_string())),
            Err(_) => Err(LeaseError::Unconfirmed(format!(
                "no quorum confirmed the leader within {} ms",
                wait.as_millis()
            ))),
        }
    }

    /// The sites whose lease ran out, each returned once until
    /// [`Leases::expiry_failed`] hands it back; and when to look again.
    fn expired(&self, term: u64) -> (Vec<Expiry>, Option<Duration>) {
        let now = self.now();
        let state = self.raft.state().read();
        let mut table = self.table();
        table.sync(term, &state, now);
        metrics::gauge!("longhaul_leases_held").set(table.len() as f64);
        let expired = table.expired(now);
        let next = table.next_deadline().map(|at| at.saturating_sub(now));
        (expired, next)
    }

    fn expiry_failed(&self, site: &str) {
        self.table().expiry_failed(site);
    }

    /// Watches the leases while this replica leads; proposes `MarkSiteDown`
    /// for every lease that runs out, as soon as it does.
    pub fn spawn_expiry(&self) {
        let leases = self.clone();
        tokio::spawn(async move {
            loop {
                let status = leases.raft.status();
                let mut pause = EXPIRY_POLL;
                if status.role == Role::Leader {
                    let (expired, next) = leases.expired(status.term);
                    if let Some(next) = next {
                        pause = pause.min(next);
                    }
                    for expiry in expired {
                        leases.propose_expiry(expiry);
                    }
                }
                // At least a millisecond: a deadline is reached when the
                // table's time is at or past it.
                tokio::time::sleep(pause.max(Duration::from_millis(1))).await;
            }
        });
    }

    /// Proposes `MarkSiteDown` for one expiry, in its own task: a slow commit
    /// must not delay the others' detection.
    fn propose_expiry(&self, expiry: Expiry) {
        let Expiry {
            site,
            lease_id,
            ttl,
        } = expiry;
        let command = Command::MarkSiteDown {
            site_id: site.clone(),
            reason: format!(
                "lease {lease_id} expired: no keep-alive for {} ms",
                ttl.as_millis()
            ),
            at_unix_ms: now_unix_ms(),
            lease_id: Some(lease_id),
        };
        let leases = self.clone();
        tokio::spawn(async move {
            let outcome = tokio::time::timeout(
                Duration::from_secs(5),
                leases.raft.propose(Request::new(command)),
            )
            .await;
            match outcome {
                Ok(Ok(ApplyResponse::Applied { revision })) => {
                    metrics::counter!("longhaul_lease_expiries_total").increment(1);
                    tracing::warn!(%site, lease_id, revision, "site lease expired; site marked down");
                }
                // Re-registered (or already down) meanwhile: the next pass
                // reads the new record.
                Ok(Ok(ApplyResponse::Refused { error })) => {
                    tracing::debug!(%site, %error, "lease expiry refused");
                    leases.expiry_failed(&site);
                }
                Ok(Err(error)) => {
                    tracing::warn!(%site, %error, "lease expiry not committed; retrying");
                    leases.expiry_failed(&site);
                }
                Err(_) => {
                    tracing::warn!(%site, "lease expiry not committed within 5 s; retrying");
                    leases.expiry_failed(&site);
                }
            }
        });
    }
}
