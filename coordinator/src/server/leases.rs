//! Site leases, kept alive in the leader's memory: the pure table
//! (`longhaul_core::lease`, which says how leases work) behind a mutex, fed
//! the time since the replica started, and the task that proposes an expiry
//! for every lease that runs out.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use longhaul_core::lease::LeaseError;
use longhaul_core::lease::{Expiry, LeaseTable};
use longhaul_core::state::{Command, Request};

use super::raft_loop::{RaftHandle, Role};
use super::service::now_unix_ms;
use super::state_machine::ApplyResponse;

/// The TTL granted when the replica is not configured otherwise.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

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
    pub fn new(raft: RaftHandle, ttl: Duration) -> Self {
        Self {
            raft,
            ttl,
            started: Instant::now(),
            table: Arc::new(Mutex::new(LeaseTable::new(ttl))),
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

    /// Renews `site`'s lease; returns the TTL now running.
    pub fn keep_alive(&self, site: &str, lease_id: u64) -> Result<Duration, LeaseError> {
        let status = self.raft.status();
        if status.role != Role::Leader {
            return Err(LeaseError::NotLeader);
        }
        let state = self.raft.state().read();
        let ttl = longhaul_core::lease::check_renewal(&state, site, lease_id, self.ttl)?;
        let now = self.now();
        let mut table = self.table();
        table.sync(status.term, &state, now);
        table.renew(site, now);
        metrics::gauge!("longhaul_leases_held").set(table.len() as f64);
        drop(table);
        drop(state);
        metrics::counter!("longhaul_lease_renewals_total").increment(1);
        Ok(ttl)
    }

    /// The sites whose lease ran out; each is returned once until
    /// [`Leases::expiry_failed`] hands it back.
    fn expired(&self, term: u64) -> Vec<Expiry> {
        let now = self.now();
        let state = self.raft.state().read();
        let mut table = self.table();
        table.sync(term, &state, now);
        metrics::gauge!("longhaul_leases_held").set(table.len() as f64);
        table.expired(now)
    }

    fn expiry_failed(&self, site: &str) {
        self.table().expiry_failed(site);
    }

    /// Watches the leases while this replica leads; proposes `MarkSiteDown`
    /// for every lease that runs out.
    pub fn spawn_expiry(&self) {
        let leases = self.clone();
        let period = (self.ttl / 20).clamp(Duration::from_millis(20), Duration::from_millis(500));
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let status = leases.raft.status();
                if status.role != Role::Leader {
                    continue;
                }
                for Expiry {
                    site,
                    lease_id,
                    ttl,
                } in leases.expired(status.term)
                {
                    let command = Command::MarkSiteDown {
                        site_id: site.clone(),
                        reason: format!(
                            "lease {lease_id} expired: no keep-alive for {} ms",
                            ttl.as_millis()
                        ),
                        at_unix_ms: now_unix_ms(),
                        lease_id: Some(lease_id),
                    };
                    let leases = leases.clone();
                    // One task per expiry: a slow commit must not delay the
                    // others' detection.
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
                            // Re-registered (or already down) meanwhile: the
                            // next pass reads the new record.
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
        });
    }
}
