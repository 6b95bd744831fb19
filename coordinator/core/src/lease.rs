//! Site leases as a pure table: what the leader decides about liveness,
//! with time passed in.
//!
//! Only transitions go through Raft: a registration (which carries the lease
//! id and TTL into the replicated site record) and an expiry (`MarkSiteDown`
//! guarded by the lease id). Renewals write nothing, so a keep-alive costs no
//! disk write, as etcd's leases do; the leader acknowledges one only after a
//! quorum confirmed it still leads (a ReadIndex round: heartbeats, no disk).
//! Any leader can check a renewal, because the lease id is in the replicated
//! record ([`check_renewal`]). Sites registered without a lease (id 0, e.g. by
//! an operator) never expire.
//!
//! # When a lease runs out
//!
//! On the leader that received the renewal: one TTL after it arrived
//! ([`LeaseTable::renew`]). A new leader saw none of its predecessors'
//! renewals. When it takes over (its first [`LeaseTable::sync`] in the term)
//! it gives every live lease a **grace** counted from then:
//!
//! ```text
//! grace = max(TTL − bound, TTL / 2)
//! ```
//!
//! where `bound` ([`LeaseTable::with_renewal_bound`]) is how long, at least,
//! before the takeover every renewal an earlier leader acknowledged arrived.
//! Without a bound (0, the default) the grace is a full TTL.
//!
//! **Why no lease ends before a renewal the new leader cannot see could
//! justify.** Say an earlier leader acknowledged a renewal that reached it at
//! `ρ`; the new leader won its election at `E` and takes over at `T ≥ E`.
//!
//! 1. The renewal was acknowledged only after a quorum `Q` of voters
//!    acknowledged a heartbeat sent after `ρ` (the ReadIndex round). A replica
//!    that no longer leads cannot gather that quorum, so it acknowledges
//!    nothing. (A registration, which starts a lease, is acknowledged after
//!    its commit and the same round.)
//! 2. Any two quorums share a voter (membership changes go through joint
//!    consensus, so one configuration's quorums meet the next's). A voter of
//!    `Q` acknowledged the heartbeat in the old term and voted for the new
//!    leader afterwards (once a voter has moved to a later term it no longer
//!    acknowledges the old one's heartbeats), so `ρ < E ≤ T`: a full TTL from
//!    `T` is never too short. That is all the default (bound 0) relies on.
//! 3. With pre-vote and check-quorum, raft-rs's replicas keep a *leader
//!    lease*: after a heartbeat of the current leader a follower grants no
//!    pre-vote (nor vote) for a later term until `election_ticks` of its own
//!    ticks have passed, and the leader itself ignores them until
//!    check-quorum makes it step down, no sooner than `election_ticks` ticks
//!    after a quorum last acknowledged it. No replica enters a later term
//!    before a quorum granted it pre-votes (its own once its election timer,
//!    at least `election_ticks` ticks, ran out), and that quorum shares a
//!    voter with `Q`. A runtime ticks
//!    at most once per tick interval, less tokio's 5 ms of tolerance, and the
//!    first tick may follow the heartbeat at once, so that voter granted its
//!    pre-vote at least `(election_ticks − 1) × (tick − 5 ms)` after `ρ`.
//!    Hence `ρ ≤ T − bound` with `bound = (election_ticks − 2) × (tick − 5 ms)`
//!    ([`vote_lease`], one tick to spare for clocks that run at slightly
//!    different rates), and `T + TTL − bound ≥ ρ + TTL`.
//! 4. Raft lets a replica skip that lease in two cases, which the
//!    coordinator's node closes: a replica that restarted has forgotten whom
//!    it heard (it grants no pre-vote or vote during its first election
//!    timeout instead), and the transferee of a leadership hand-over
//!    campaigns with a forced vote (the leader stops confirming renewals and
//!    registrations when it decides to hand over, and sends the transferee
//!    its go-ahead only an election timeout later, so `ρ` is at least that
//!    long before any vote of the new term).
//!
//! The bound assumes every voter runs the same tick interval and election
//! ticks (replicas of one cluster are configured alike), and that their
//! clocks' rates differ by much less than one tick per election timeout.
//!
//! The floor of half a TTL is liveness, not safety: an agent that is alive
//! needs a moment to find the new leader after an election (the site agent
//! retries at the next replica within 50 ms; see its `agent/lease.rs`), and
//! half a TTL is several of its renewal periods.
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
    /// The leader recorded the renewal but could not confirm, with a quorum,
    /// that it still leads (or it is handing leadership over), so it does not
    /// acknowledge it (see the module's safety argument).
    #[error("renewal not confirmed: {0}; renew again, at another replica if this persists")]
    Unconfirmed(String),
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
    /// How long before this replica takes over, at least, every renewal an
    /// earlier leader acknowledged arrived (see the module docs).
    renewal_bound: Duration,
    /// The leader term the deadlines were counted in; a new term starts over.
    term: u64,
    /// The term's first sync (the takeover) has not happened yet.
    taking_over: bool,
    next: u32,
    entries: BTreeMap<String, Entry>,
}

/// How long before a new leader takes over, at least, every renewal an
/// earlier leader acknowledged arrived, when every voter ticks every
/// `tick_interval` and keeps raft's leader lease for `election_ticks` ticks:
/// `(election_ticks − 2) × (tick_interval − 5 ms)` (step 3 of the module
/// docs: one tick of the `election_ticks − 1` proven is left as a margin for
/// clock rates, and 5 ms per tick is tokio's tolerance for a late tick).
pub fn vote_lease(tick_interval: Duration, election_ticks: usize) -> Duration {
    let tick = tick_interval.saturating_sub(Duration::from_millis(5));
    let ticks = u32::try_from(election_ticks.saturating_sub(2)).unwrap_or(u32::MAX);
    tick.saturating_mul(ticks)
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
    /// An empty table granting `default_ttl` to records without a TTL. A
    /// new leader gives every live lease a full TTL until
    /// [`LeaseTable::with_renewal_bound`] says more.
    pub fn new(default_ttl: Duration) -> Self {
        Self {
            default_ttl,
            renewal_bound: Duration::ZERO,
            term: 0,
            taking_over: true,
            next: 0,
            entries: BTreeMap::new(),
        }
    }

    /// The table of a replica that, when it takes over, may count every
    /// renewal it did not see as at least `bound` old: [`vote_lease`] of the
    /// cluster's timers, which the module docs prove.
    pub fn with_renewal_bound(mut self, bound: Duration) -> Self {
        self.renewal_bound = bound;
        self
    }

    /// What a new leader gives a lease of `ttl` from its takeover:
    /// `TTL − bound`, and never less than half the TTL, the time an agent
    /// that is alive needs to find the new leader.
    pub fn takeover_grace(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(self.renewal_bound).max(ttl / 2)
    }

    /// A lease id no other leader can have granted: `term` in the high half
    /// (one leader per term), a counter in the low half. A new term starts
    /// the table over.
    pub fn grant(&mut self, term: u64) -> u64 {
        self.start_term(term);
        self.next = self.next.wrapping_add(1).max(1);
        (term << 32) | u64::from(self.next)
    }

    /// Brings the table in line with the replicated records at `now`: the
    /// first sync of a term is the takeover, which gives every live lease
    /// the [takeover grace](LeaseTable::takeover_grace) from `now`; a site
    /// seen later in the term (a new lease) gets a full TTL from `now`;
    /// sites that are down or lease-less are dropped.
    pub fn sync(&mut self, term: u64, state: &ClusterState, now: Duration) {
        self.start_term(term);
        let taking_over = std::mem::replace(&mut self.taking_over, false);
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
            let grace = if taking_over {
                self.takeover_grace(ttl)
            } else {
                ttl
            };
            self.entries
                .entry(record.site.id.clone())
                .or_insert_with(|| Entry {
                    lease_id: record.lease_id,
                    deadline: now.saturating_add(grace),
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

    /// The earliest deadline of a lease not handed out as expired: when
    /// [`LeaseTable::expired`] has something to say next, unless renewals
    /// come first.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.entries
            .values()
            .filter(|e| !e.expiring)
            .map(|e| e.deadline)
            .min()
    }

    fn start_term(&mut self, term: u64) {
        if self.term != term {
            self.term = term;
            self.taking_over = true;
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
    fn without_a_bound_a_new_leader_grants_every_live_lease_a_full_ttl() {
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
    fn the_vote_lease_spares_a_tick_and_tokios_tolerance() {
        assert_eq!(vote_lease(ms(100), 10), ms(760));
        assert_eq!(vote_lease(ms(100), 15), ms(1_235));
        // Two ticks or fewer prove nothing; nor do ticks within the tolerance.
        assert_eq!(vote_lease(ms(100), 2), Duration::ZERO);
        assert_eq!(vote_lease(ms(100), 0), Duration::ZERO);
        assert_eq!(vote_lease(ms(4), 10), Duration::ZERO);
    }

    /// The earliest a new leader can take over after an earlier one
    /// acknowledged a renewal that arrived at `renewed` (step 3 of the
    /// module docs): a voter of the confirming quorum granted its pre-vote
    /// `election_ticks − 1` ticks later, each tick at least 5 ms short.
    fn earliest_takeover(renewed: Duration, tick: Duration, election_ticks: u32) -> Duration {
        renewed + (tick - ms(5)) * (election_ticks - 1)
    }

    #[test]
    fn a_new_leader_counts_unseen_renewals_as_old_as_the_bound() {
        let state = state(7, 0);
        let bound = vote_lease(ms(100), 10);
        // The old leader renewed north at 10 s; the new one takes over as
        // soon as it can, and must keep north up until 10 s + TTL: not a
        // moment less (that would cut short a lease the agent was given),
        // and not more either (that is the detection this buys).
        let renewed = ms(10_000);
        let takeover = earliest_takeover(renewed, ms(100), 10);
        let mut table = LeaseTable::new(TTL).with_renewal_bound(bound);
        table.sync(2, &state, takeover);
        let deadline = table.deadline("north").unwrap();
        assert!(deadline >= renewed + TTL, "{deadline:?}");
        assert!(deadline < takeover + TTL, "no better than a full TTL");
        assert_eq!(deadline, takeover + TTL - ms(760));
        assert!(table.expired(deadline - ms(1)).is_empty());
        assert_eq!(table.expired(deadline).len(), 1);
    }

    #[test]
    fn the_takeover_grace_never_falls_below_half_a_ttl() {
        let table = LeaseTable::new(TTL).with_renewal_bound(ms(2_000));
        assert_eq!(table.takeover_grace(TTL), ms(1_500));
        assert_eq!(table.takeover_grace(ms(10_000)), ms(8_000));
        let table = LeaseTable::new(TTL).with_renewal_bound(ms(60_000));
        assert_eq!(table.takeover_grace(TTL), ms(1_500));
        assert_eq!(LeaseTable::new(TTL).takeover_grace(TTL), TTL);
    }

    /// Over a grid of timers, TTLs, renewal times and takeovers no earlier
    /// than the vote lease allows: the new leader never ends a lease before
    /// the unseen renewal's TTL is over, always leaves at least half a TTL
    /// to find it, and never waits longer than a full TTL.
    #[test]
    fn no_unseen_renewal_outlives_the_takeover_grace() {
        let mut checked = 0;
        for tick in [ms(10), ms(20), ms(100), ms(250)] {
            for election_ticks in [2_u32, 3, 5, 10, 15, 30] {
                let bound = vote_lease(tick, election_ticks as usize);
                for ttl in [ms(300), ms(1_600), ms(3_000), ms(10_000)] {
                    for renewed in [ms(0), ms(1), ms(4_321)] {
                        for late in [ms(0), ms(1), ms(37), ms(900), ms(5_000)] {
                            let takeover = earliest_takeover(renewed, tick, election_ticks) + late;
                            let mut table = LeaseTable::new(ttl).with_renewal_bound(bound);
                            table.sync(3, &state_with_ttl(ttl), takeover);
                            let deadline = table.deadline("north").unwrap();
                            assert!(
                                deadline >= renewed + ttl,
                                "tick {tick:?} × {election_ticks}, TTL {ttl:?}: renewed at {renewed:?}, \
                                 taken over at {takeover:?}, expires at {deadline:?}"
                            );
                            assert!(deadline >= takeover + ttl / 2);
                            assert!(deadline <= takeover + ttl);
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 4 * 6 * 4 * 3 * 5);
    }

    /// The state of [`state`] with north's lease running for `ttl`.
    fn state_with_ttl(ttl: Duration) -> ClusterState {
        state(7, ttl.as_millis() as u64)
    }

    #[test]
    fn only_the_first_sync_of_a_term_is_a_takeover() {
        let mut state = state(7, 0);
        let mut table = LeaseTable::new(TTL).with_renewal_bound(ms(1_000));
        // A registration at the new leader before its first sync: the
        // takeover is still to come.
        let id = table.grant(2);
        table.sync(2, &state, ms(100));
        assert_eq!(table.deadline("north"), Some(ms(2_100)), "TTL − bound");
        // A lease first seen later in the term gets a full TTL.
        mark_down(&mut state, "north", 7);
        table.sync(2, &state, ms(200));
        let again = self::state(id, 0);
        table.sync(2, &again, ms(300));
        assert_eq!(table.deadline("north"), Some(ms(3_300)));
        // So does a renewal.
        assert!(table.renew("north", ms(400)));
        assert_eq!(table.deadline("north"), Some(ms(3_400)));
        // The next term takes over again.
        table.sync(3, &again, ms(500));
        assert_eq!(table.deadline("north"), Some(ms(2_500)));
    }

    #[test]
    fn the_next_deadline_skips_leases_handed_out_as_expired() {
        let mut table = LeaseTable::new(TTL);
        assert_eq!(table.next_deadline(), None);
        table.sync(1, &state(7, 0), ms(0));
        assert_eq!(table.next_deadline(), Some(TTL));
        assert!(table.renew("north", ms(500)));
        assert_eq!(table.next_deadline(), Some(ms(3_500)));
        assert_eq!(table.expired(ms(3_500)).len(), 1);
        assert_eq!(table.next_deadline(), None);
        table.expiry_failed("north");
        assert_eq!(table.next_deadline(), Some(ms(3_500)));
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
