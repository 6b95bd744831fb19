//! Site leases, kept alive in the leader's memory.
//!
//! Only transitions go through Raft: a registration (which carries the lease
//! id and TTL into the replicated site record) and an expiry (`MarkSiteDown`
//! guarded by the lease id). Renewals touch nothing but this table, so a
//! keep-alive costs no disk write, as etcd's leases do.
//!
//! Any leader can check a renewal, because the lease id is in the replicated
//! record. A new leader has no deadlines yet: it gives every live lease a
//! full TTL from the moment it takes over, so an agent that needs a moment
//! to find the new leader is not marked down for it.
//!
//! Sites registered without a lease (id 0, e.g. by an operator) never expire.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_core::state::{ClusterState, Command, Liveness, Request};

use super::raft_loop::{RaftHandle, Role};
use super::service::now_unix_ms;
use super::state_machine::ApplyResponse;

/// The TTL granted when the replica is not configured otherwise.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// Why a renewal was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("field `site_id`: unknown site {0:?}; register first")]
    UnknownSite(String),
    #[error("field `lease_id`: site {site:?} is down ({reason}); register again")]
    SiteDown { site: String, reason: String },
    #[error("field `lease_id`: site {site:?} holds lease {current}, not {given}; register again")]
    Superseded {
        site: String,
        current: u64,
        given: u64,
    },
    #[error("this replica is not the leader; renew at the leader")]
    NotLeader,
}

#[derive(Debug)]
struct Entry {
    lease_id: u64,
    deadline: Instant,
    ttl: Duration,
    /// An expiry was proposed and has not been answered yet.
    expiring: bool,
}

#[derive(Debug, Default)]
struct Table {
    /// The leader term the deadlines were counted in; a new term starts over.
    term: u64,
    next: u32,
    entries: HashMap<String, Entry>,
}

/// The lease table of one replica (meaningful while it leads).
#[derive(Debug, Clone)]
pub struct Leases {
    raft: RaftHandle,
    ttl: Duration,
    table: Arc<Mutex<Table>>,
}

impl Leases {
    pub fn new(raft: RaftHandle, ttl: Duration) -> Self {
        Self {
            raft,
            ttl,
            table: Arc::new(Mutex::new(Table::default())),
        }
    }

    /// The TTL this replica grants.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the table
        // inconsistent in a way that matters: deadlines are refreshed.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A lease id no other leader can have granted: the term in the high
    /// half (one leader per term), a counter in the low half.
    pub fn grant(&self) -> Result<u64, LeaseError> {
        let status = self.raft.status();
        if status.role != Role::Leader {
            return Err(LeaseError::NotLeader);
        }
        let mut table = self.table();
        if table.term != status.term {
            table.term = status.term;
            table.next = 0;
            table.entries.clear();
        }
        table.next = table.next.wrapping_add(1).max(1);
        Ok((status.term << 32) | u64::from(table.next))
    }

    /// Renews `site`'s lease; returns the TTL now running.
    pub fn keep_alive(&self, site: &str, lease_id: u64) -> Result<Duration, LeaseError> {
        let status = self.raft.status();
        if status.role != Role::Leader {
            return Err(LeaseError::NotLeader);
        }
        let state = self.raft.state().read();
        let record = state
            .site(site)
            .ok_or_else(|| LeaseError::UnknownSite(site.to_string()))?;
        if record.liveness == Liveness::Down {
            return Err(LeaseError::SiteDown {
                site: site.to_string(),
                reason: record.liveness_reason.clone(),
            });
        }
        if record.lease_id != lease_id || lease_id == 0 {
            return Err(LeaseError::Superseded {
                site: site.to_string(),
                current: record.lease_id,
                given: lease_id,
            });
        }
        let ttl = ttl_of(record.lease_ttl_ms, self.ttl);
        drop(state);
        let mut table = self.table();
        sync(&mut table, status.term, &self.raft.state().read(), self.ttl);
        if let Some(entry) = table.entries.get_mut(site) {
            entry.deadline = Instant::now() + entry.ttl;
        }
        metrics::counter!("longhaul_lease_renewals_total").increment(1);
        Ok(ttl)
    }

    /// The sites whose lease ran out, as (site, lease id, TTL); each is
    /// returned once until [`Leases::expiry_failed`] hands it back.
    fn expired(&self, term: u64) -> Vec<(String, u64, Duration)> {
        let now = Instant::now();
        let mut table = self.table();
        sync(&mut table, term, &self.raft.state().read(), self.ttl);
        table
            .entries
            .iter_mut()
            .filter(|(_, e)| !e.expiring && e.deadline <= now)
            .map(|(site, e)| {
                e.expiring = true;
                (site.clone(), e.lease_id, e.ttl)
            })
            .collect()
    }

    fn expiry_failed(&self, site: &str) {
        if let Some(entry) = self.table().entries.get_mut(site) {
            entry.expiring = false;
        }
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
                for (site, lease_id, ttl) in leases.expired(status.term) {
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

fn ttl_of(ttl_ms: u64, default: Duration) -> Duration {
    if ttl_ms == 0 {
        default
    } else {
        Duration::from_millis(ttl_ms)
    }
}

/// Brings the table in line with the replicated records: a new term starts
/// every lease afresh; a site that registered (a new lease) gets a full TTL;
/// sites that are down or lease-less are dropped.
fn sync(table: &mut Table, term: u64, state: &ClusterState, default_ttl: Duration) {
    if table.term != term {
        table.term = term;
        table.next = 0;
        table.entries.clear();
    }
    let now = Instant::now();
    table.entries.retain(|site, entry| {
        state
            .site(site)
            .is_some_and(|r| r.liveness == Liveness::Up && r.lease_id == entry.lease_id)
    });
    for record in state.sites() {
        if record.liveness != Liveness::Up || record.lease_id == 0 {
            continue;
        }
        let ttl = ttl_of(record.lease_ttl_ms, default_ttl);
        table
            .entries
            .entry(record.site.id.clone())
            .or_insert_with(|| Entry {
                lease_id: record.lease_id,
                deadline: now + ttl,
                ttl,
                expiring: false,
            });
    }
    metrics::gauge!("longhaul_leases_held").set(table.entries.len() as f64);
}
