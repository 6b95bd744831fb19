//! Site leases as a pure table: what the leader decides about liveness,
//! with time passed in.
//!
//! Only transitions go through Raft: a registration (which carries the lease
//! id and TTL into the replicated site record) and an expiry (`MarkSiteDown`
//! guarded by the lease id). Renewals touch nothing but this table, so a
//! keep-alive costs no disk write, as etcd's leases do.
//!
//! Any leader can check a renewal, because the lease id is in the replicated
//! record ([`check_renewal`]). A new leader has no deadlines yet: it gives
//! every live lease a full TTL from the moment it takes over (its **grace**),
//! so an agent that needs a moment to find the new leader is not marked down
//! for it. Sites registered without a lease (id 0, e.g. by an operator)
//! never expire.
//!
//! Time is a [`Duration`] since an origin the caller chooses (the server
//! uses its start); nothing here reads a clock.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::state::{ClusterState, Liveness};

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

/// A lease that ran out: propose `MarkSiteDown` guarded by `lease_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    pub site: String,
    pub lease_id: u64,
    pub ttl: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    lease_id: u64,
    deadline: Duration,
    ttl: Duration,
    /// An expiry was handed out and has not been answered yet.
    expiring: bool,
}

/// The lease deadlines of one replica, meaningful while it leads in `term`.
#[derive(Debug, Clone)]
pub struct LeaseTable {
    default_ttl: Duration,
    /// The leader term the deadlines were counted in; a new term starts over.
    term: u64,
    next: u32,
    entries: BTreeMap<String, Entry>,
}

/// The TTL of a record's lease: its own, or `default` when it has none.
pub fn ttl_of(ttl_ms: u64, default: Duration) -> Duration {
    if ttl_ms == 0 {
        default
    } else {
        Duration::from_millis(ttl_ms)
    }
}

/// Whether `site` may renew `lease_id` according to the replicated records;
/// the TTL that renewal runs for.
pub fn check_renewal(
    state: &ClusterState,
    site: &str,
    lease_id: u64,
    default_ttl: Duration,
) -> Result<Duration, LeaseError> {
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
    Ok(ttl_of(record.lease_ttl_ms, default_ttl))
}

impl LeaseTable {
    /// An empty table granting `default_ttl` to records without a TTL.
    pub fn new(default_ttl: Duration) -> Self {
        Self {
            default_ttl,
            term: 0,
            next: 0,
            entries: BTreeMap::new(),
        }
    }

    /// A lease id no other leader can have granted: `term` in the high half
    /// (one leader per term), a counter in the low half. A new term starts
    /// the table over.
    pub fn grant(&mut self, term: u64) -> u64 {
        self.start_term(term);
        self.next = self.next.wrapping_add(1).max(1);
        (term << 32) | u64::from(self.next)
    }

    /// Brings the table in line with the replicated records at `now`: a new
    /// term starts every lease afresh (the new leader's grace); a site that
    /// registered (a new lease) gets a full TTL from `now`; sites that are
    /// down or lease-less are dropped.
    pub fn sync(&mut self, term: u64, state: &ClusterState, now: Duration) {
        self.start_term(term);
        self.entries.retain(|site, entry| {
            state
                .site(site)
                .is_some_and(|r| r.liveness == Liveness::Up && r.lease_id == entry.lease_id)
        });
        for record in state.sites() {
            if record.liveness != Liveness::Up || record.lease_id == 0 {
                continue;
            }
            let ttl = ttl_of(record.lease_ttl_ms, self.default_ttl);
            self.entries
                .entry(record.site.id.clone())
                .or_insert_with(|| Entry {
                    lease_id: record.lease_id,
                    deadline: now.saturating_add(ttl),
                    ttl,
                    expiring: false,
                });
        }
    }

    /// Renews `site`'s lease at `now` (after [`LeaseTable::sync`]): its
    /// deadline moves to `now + TTL`. False if the table holds no lease for
    /// it.
    pub fn renew(&mut self, site: &str, now: Duration) -> bool {
        match self.entries.get_mut(site) {
            Some(entry) => {
                entry.deadline = now.saturating_add(entry.ttl);
                true
            }
            None => false,
        }
    }

    /// The leases whose deadline is at or before `now`, in site order; each
    /// is handed out once until [`LeaseTable::expiry_failed`] hands it back.
    pub fn expired(&mut self, now: Duration) -> Vec<Expiry> {
        self.entries
            .iter_mut()
            .filter(|(_, e)| !e.expiring && e.deadline <= now)
            .map(|(site, e)| {
                e.expiring = true;
                Expiry {
                    site: site.clone(),
                    lease_id: e.lease_id,
                    ttl: e.ttl,
                }
            })
            .collect()
    }

    /// The expiry of `site` was not committed: hand it out again.
    pub fn expiry_failed(&mut self, site: &str) {
        if let Some(entry) = self.entries.get_mut(site) {
            entry.expiring = false;
        }
    }

    /// The leases held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// When `site`'s lease runs out, if the table holds one.
    pub fn deadline(&self, site: &str) -> Option<Duration> {
        self.entries.get(site).map(|e| e.deadline)
    }

    fn start_term(&mut self, term: u64) {
        if self.term != term {
            self.term = term;
            self.next = 0;
            self.entries.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;
    use crate::state::{Command, Request};
    use crate::topology::Topology;

    const TTL: Duration = Duration::from_secs(3);
    const TOPOLOGY: &str = include_str!("../../../deploy/examples/two-campuses-80km.toml");

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// A state in which `north` holds lease `lease_id` (TTL `ttl_ms`, 0: the
    /// default) and `south` is registered without a lease.
    fn state(lease_id: u64, ttl_ms: u64) -> ClusterState {
        let topology = Topology::from_toml("t.toml", TOPOLOGY).unwrap();
        let mut state = ClusterState::default();
        for site in &topology.sites {
            let (lease_id, lease_ttl_ms) = if site.id == "north" {
                (lease_id, ttl_ms)
            } else {
                (0, 0)
            };
            state
                .apply(&Request::new(Command::RegisterSite {
                    site: site.clone(),
                    data_address: String::new(),
                    at_unix_ms: 0,
                    lease_id,
                    lease_ttl_ms,
                }))
                .unwrap();
        }
        state
    }

    fn mark_down(state: &mut ClusterState, site: &str, lease_id: u64) {
        state
            .apply(&Request::new(Command::MarkSiteDown {
                site_id: site.into(),
                reason: "lease expired".into(),
                at_unix_ms: 1,
                lease_id: Some(lease_id),
            }))
            .unwrap();
    }

    #[test]
    fn lease_ids_are_unique_within_and_across_terms() {
        let mut table = LeaseTable::new(TTL);
        let a = table.grant(1);
        let b = table.grant(1);
        let c = table.grant(2);
        assert_eq!((a, b), ((1 << 32) | 1, (1 << 32) | 2));
        assert_eq!(c, (2 << 32) | 1);
    }

    #[test]
    fn a_lease_expires_one_ttl_after_its_last_renewal_and_only_then() {
        let state = state(7, 0);
        let mut table = LeaseTable::new(TTL);
        table.sync(1, &state, ms(0));
        assert_eq!(table.len(), 1, "the lease-less site holds no lease");
        assert!(table.expired(ms(2_999)).is_empty());
        assert!(table.renew("north", ms(2_000)));
        assert!(table.expired(ms(4_999)).is_empty());
        let expired = table.expired(ms(5_000));
        assert_eq!(
            expired,
            vec![Expiry {
                site: "north".into(),
                lease_id: 7,
                ttl: TTL
            }]
        );
        // Handed out once, until the expiry fails.
        assert!(table.expired(ms(9_000)).is_empty());
        table.expiry_failed("north");
        assert_eq!(table.expired(ms(9_000)).len(), 1);
    }

    #[test]
    fn a_record_ttl_overrides_the_default() {
        let mut table = LeaseTable::new(TTL);
        table.sync(1, &state(7, 500), ms(0));
        assert_eq!(table.deadline("north"), Some(ms(500)));
        assert_eq!(table.expired(ms(500))[0].ttl, ms(500));
    }

    #[test]
    fn a_new_leader_grants_every_live_lease_a_full_ttl() {
        let state = state(7, 0);
        let mut table = LeaseTable::new(TTL);
        table.sync(1, &state, ms(0));
        // Term 2 starts at 2.5 s: the lease, nearly out in term 1, runs
        // until 5.5 s.
        table.sync(2, &state, ms(2_500));
        assert_eq!(table.deadline("north"), Some(ms(5_500)));
        assert!(table.expired(ms(5_499)).is_empty());
        assert_eq!(table.expired(ms(5_500)).len(), 1);
        // Syncing again in the same term keeps the deadline.
        table.sync(2, &state, ms(5_600));
        assert_eq!(table.deadline("north"), Some(ms(5_500)));
    }

    #[test]
    fn a_site_down_or_registered_again_leaves_its_old_lease() {
        let mut state = state(7, 0);
        let mut table = LeaseTable::new(TTL);
        table.sync(1, &state, ms(0));
        mark_down(&mut state, "north", 7);
        table.sync(1, &state, ms(100));
        assert!(table.is_empty());
        assert!(!table.renew("north", ms(100)));
        // Registered again with a new lease: a full TTL from then.
        let again = self::state(9, 0);
        table.sync(1, &again, ms(1_000));
        assert_eq!(table.deadline("north"), Some(ms(4_000)));
        assert_eq!(table.expired(ms(4_000))[0].lease_id, 9);
    }

    #[test]
    fn renewals_are_checked_against_the_replicated_record() {
        let mut state = state(7, 0);
        assert_eq!(check_renewal(&state, "north", 7, TTL), Ok(TTL));
        assert_eq!(
            check_renewal(&state, "north", 8, TTL),
            Err(LeaseError::Superseded {
                site: "north".into(),
                current: 7,
                given: 8
            })
        );
        // A lease-less site cannot renew lease 0.
        assert!(matches!(
            check_renewal(&state, "south", 0, TTL),
            Err(LeaseError::Superseded { current: 0, .. })
        ));
        assert_eq!(
            check_renewal(&state, "east", 7, TTL),
            Err(LeaseError::UnknownSite("east".into()))
        );
        mark_down(&mut state, "north", 7);
        let error = check_renewal(&state, "north", 7, TTL).unwrap_err();
        assert!(
            error.to_string().contains("is down (lease expired)"),
            "{error}"
        );
    }
}
