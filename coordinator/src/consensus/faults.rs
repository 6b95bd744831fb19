//! Faults on raft messages, for tests: seeded rules that drop, delay or cut
//! messages between replicas, the one vocabulary of faults of both kinds of
//! test cluster. It is a [`MessageFilter`] (whose documentation says what a
//! verdict means): over real gRPC, one handle is shared by every replica of
//! a cluster (`ReplicaConfig::message_filter`, see [`Faults::filter`]) and
//! each replica's `Outbox` asks it about every message it is about to queue
//! for a peer; in virtual time the harness's network asks it about every
//! message sent (`harness::Cluster::faults`). A rule between two replicas
//! holds in both directions only if both use the handle. Rules compose: a message is dropped if any partition or
//! isolation cuts its route or any drop rule draws it, and otherwise waits
//! for the sum of the delays whose routes it takes.
//!
//! Every random draw comes from one [`SeedRng`] seeded with
//! [`Faults::seed`], in the order messages are judged. In virtual time that
//! order is fixed, so a seed replays the run exactly; over gRPC which
//! message gets which draw depends on how the replicas' tasks interleave, so
//! a seed replays the fault pattern, not the exact run.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use longhaul_core::rng::SeedRng;

use super::filter::{MessageFilter, Verdict};

/// The messages a rule applies to, by sender and receiver replica id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Every message.
    All,
    /// Messages this replica sends.
    From(u64),
    /// Messages sent to this replica.
    To(u64),
    /// Messages between these two replicas, in both directions.
    Between(u64, u64),
    /// Messages from one replica to another, in that direction only.
    OneWay { from: u64, to: u64 },
}

impl Route {
    pub fn matches(self, from: u64, to: u64) -> bool {
        match self {
            Route::All => true,
            Route::From(id) => from == id,
            Route::To(id) => to == id,
            Route::Between(a, b) => (from, to) == (a, b) || (from, to) == (b, a),
            Route::OneWay { from: f, to: t } => (from, to) == (f, t),
        }
    }
}

/// Names an installed rule, to remove it with [`Faults::remove`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(u64);

#[derive(Debug, Clone)]
enum Rule {
    Drop {
        route: Route,
        probability: f64,
    },
    Delay {
        route: Route,
        /// Of a message on the route being held back at all.
        probability: f64,
        base: Duration,
        jitter: Duration,
    },
    /// Replicas in different groups cannot reach each other; replicas in no
    /// group are not affected.
    Partition {
        groups: Vec<BTreeSet<u64>>,
    },
    /// The replica can reach no one and no one can reach it.
    Isolate {
        replica: u64,
    },
}

impl Rule {
    fn cuts(&self, from: u64, to: u64) -> bool {
        match self {
            Rule::Partition { groups } => {
                let group_of = |id: u64| groups.iter().position(|group| group.contains(&id));
                matches!((group_of(from), group_of(to)), (Some(a), Some(b)) if a != b)
            }
            Rule::Isolate { replica } => from == *replica || to == *replica,
            Rule::Drop { .. } | Rule::Delay { .. } => false,
        }
    }
}

#[derive(Debug)]
struct Rules {
    rng: SeedRng,
    next_id: u64,
    installed: Vec<(RuleId, Rule)>,
}

#[derive(Debug)]
struct Shared {
    seed: u64,
    /// Whether any rule is installed: all a message pays when none is.
    active: AtomicBool,
    rules: Mutex<Rules>,
    dropped: AtomicU64,
    delayed: AtomicU64,
}

/// A shared, cheaply cloned set of fault rules on the raft transport; see
/// the module's documentation. A new handle has no rules and delivers
/// everything.
#[derive(Debug, Clone)]
pub struct Faults(Arc<Shared>);

impl Faults {
    pub fn new(seed: u64) -> Self {
        Self(Arc::new(Shared {
            seed,
            active: AtomicBool::new(false),
            rules: Mutex::new(Rules {
                rng: SeedRng::new(seed),
                next_id: 0,
                installed: Vec::new(),
            }),
            dropped: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
        }))
    }

    /// This handle as a replica's `message_filter`.
    pub fn filter(&self) -> Option<Arc<dyn MessageFilter>> {
        Some(Arc::new(self.clone()))
    }

    /// The seed of every random draw.
    pub fn seed(&self) -> u64 {
        self.0.seed
    }

    /// Drops each message on `route` with probability `probability`.
    ///
    /// # Panics
    ///
    /// If `probability` is not within `0.0..=1.0`.
    pub fn drop_randomly(&self, route: Route, probability: f64) -> RuleId {
        assert!(
            (0.0..=1.0).contains(&probability),
            "probability: {probability} is not within 0..=1"
        );
        self.install(Rule::Drop { route, probability })
    }

    /// Holds back each message on `route` for `base` plus a uniformly drawn
    /// part of `jitter`.
    pub fn delay(&self, route: Route, base: Duration, jitter: Duration) -> RuleId {
        self.install(Rule::Delay {
            route,
            probability: 1.0,
            base,
            jitter,
        })
    }

    /// Holds back each message on `route` with probability `probability`,
    /// for `base` plus a uniformly drawn part of `jitter`; the others pass
    /// at once. Held messages overtake nothing but are overtaken: the
    /// network reorders.
    ///
    /// # Panics
    ///
    /// If `probability` is not within `0.0..=1.0`.
    pub fn delay_randomly(
        &self,
        route: Route,
        probability: f64,
        base: Duration,
        jitter: Duration,
    ) -> RuleId {
        assert!(
            (0.0..=1.0).contains(&probability),
            "probability: {probability} is not within 0..=1"
        );
        self.install(Rule::Delay {
            route,
            probability,
            base,
            jitter,
        })
    }

    /// How many rules are installed.
    pub fn rule_count(&self) -> usize {
        self.lock().installed.len()
    }

    /// Cuts every route between replicas of different `groups`, both ways.
    pub fn partition(&self, groups: &[&[u64]]) -> RuleId {
        let groups = groups
            .iter()
            .map(|group| group.iter().copied().collect())
            .collect();
        self.install(Rule::Partition { groups })
    }

    /// Cuts `replica` off from every other replica, both ways.
    pub fn isolate(&self, replica: u64) -> RuleId {
        self.install(Rule::Isolate { replica })
    }

    /// Removes one rule; the others stay.
    pub fn remove(&self, rule: RuleId) {
        let mut rules = self.lock();
        rules.installed.retain(|(id, _)| *id != rule);
        self.0
            .active
            .store(!rules.installed.is_empty(), Ordering::Release);
    }

    /// Removes every rule: the network is whole again.
    pub fn heal(&self) {
        let mut rules = self.lock();
        rules.installed.clear();
        self.0.active.store(false, Ordering::Release);
    }

    /// Messages dropped so far (cut or drawn).
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }

    /// Messages delayed so far.
    pub fn delayed(&self) -> u64 {
        self.0.delayed.load(Ordering::Relaxed)
    }

    /// The fate of a message from `from` to `to` queued now.
    pub fn judge(&self, from: u64, to: u64) -> Verdict {
        if !self.0.active.load(Ordering::Acquire) {
            return Verdict::Deliver;
        }
        let mut rules = self.lock();
        let Rules { rng, installed, .. } = &mut *rules;
        let mut delay = Duration::ZERO;
        for (_, rule) in installed.iter() {
            let dropped = match rule {
                Rule::Partition { .. } | Rule::Isolate { .. } => rule.cuts(from, to),
                Rule::Drop { route, probability } => {
                    route.matches(from, to) && rng.chance(*probability)
                }
                Rule::Delay {
                    route,
                    probability,
                    base,
                    jitter,
                } => {
                    // A certain delay draws nothing for its probability.
                    if route.matches(from, to) && (*probability >= 1.0 || rng.chance(*probability))
                    {
                        let jitter = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
                        let drawn = if jitter == 0 { 0 } else { rng.up_to(jitter) };
                        delay = delay
                            .saturating_add(*base)
                            .saturating_add(Duration::from_nanos(drawn));
                    }
                    false
                }
            };
            if dropped {
                self.0.dropped.fetch_add(1, Ordering::Relaxed);
                return Verdict::Drop;
            }
        }
        if delay.is_zero() {
            Verdict::Deliver
        } else {
            self.0.delayed.fetch_add(1, Ordering::Relaxed);
            Verdict::DeliverAfter(delay)
        }
    }

    fn install(&self, rule: Rule) -> RuleId {
        let mut rules = self.lock();
        rules.next_id += 1;
        let id = RuleId(rules.next_id);
        rules.installed.push((id, rule));
        self.0.active.store(true, Ordering::Release);
        id
    }

    /// The rules; a panic while they were held cannot leave them half changed.
    fn lock(&self) -> MutexGuard<'_, Rules> {
        self.0.rules.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl MessageFilter for Faults {
    fn judge(&self, from: u64, to: u64) -> Verdict {
        Faults::judge(self, from, to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_rules_everything_is_delivered() {
        let faults = Faults::new(1);
        assert_eq!(faults.judge(1, 2), Verdict::Deliver);
        let rule = faults.drop_randomly(Route::All, 1.0);
        assert_eq!(faults.judge(1, 2), Verdict::Drop);
        faults.remove(rule);
        assert_eq!(faults.judge(1, 2), Verdict::Deliver);
        assert_eq!(faults.dropped(), 1);
    }

    #[test]
    fn routes_match_their_messages() {
        let cases = [
            (Route::All, [true, true, true]),
            (Route::From(1), [true, false, true]),
            (Route::To(1), [false, true, false]),
            (Route::Between(1, 2), [true, true, false]),
            (Route::OneWay { from: 1, to: 2 }, [true, false, false]),
        ];
        for (route, expected) in cases {
            let found = [(1, 2), (2, 1), (1, 3)].map(|(from, to)| route.matches(from, to));
            assert_eq!(found, expected, "{route:?}");
        }
    }

    #[test]
    fn partitions_and_isolation_cut_both_ways_and_compose() {
        let faults = Faults::new(1);
        let partition = faults.partition(&[&[1], &[2, 3]]);
        let verdicts = |faults: &Faults| {
            [(1, 2), (2, 1), (3, 1), (2, 3), (3, 2), (1, 4), (4, 2)]
                .map(|(from, to)| faults.judge(from, to) == Verdict::Drop)
        };
        // Replica 4 is in no group: the partition does not touch it.
        assert_eq!(
            verdicts(&faults),
            [true, true, true, false, false, false, false]
        );
        let isolate = faults.isolate(3);
        assert_eq!(
            verdicts(&faults),
            [true, true, true, true, true, false, false]
        );
        faults.remove(partition);
        assert_eq!(
            verdicts(&faults),
            [false, false, true, true, true, false, false]
        );
        faults.remove(isolate);
        assert_eq!(verdicts(&faults), [false; 7]);
    }

    #[test]
    fn delays_add_up_within_their_jitter() {
        let faults = Faults::new(7);
        faults.delay(Route::All, Duration::from_millis(5), Duration::ZERO);
        faults.delay(
            Route::To(2),
            Duration::from_millis(10),
            Duration::from_millis(20),
        );
        assert_eq!(
            faults.judge(2, 1),
            Verdict::DeliverAfter(Duration::from_millis(5))
        );
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            let Verdict::DeliverAfter(delay) = faults.judge(1, 2) else {
                panic!("not delayed");
            };
            assert!(
                (Duration::from_millis(15)..=Duration::from_millis(35)).contains(&delay),
                "{delay:?}"
            );
            seen.insert(delay);
        }
        assert!(
            seen.len() > 100,
            "the jitter is drawn: {} values",
            seen.len()
        );
        assert_eq!(faults.delayed(), 201);
    }

    #[test]
    fn one_seed_gives_one_pattern() {
        let pattern = |seed: u64| {
            let faults = Faults::new(seed);
            faults.drop_randomly(Route::All, 0.3);
            faults.delay(Route::All, Duration::ZERO, Duration::from_millis(20));
            (0..500)
                .map(|i| faults.judge(1, 2 + i % 2))
                .collect::<Vec<_>>()
        };
        assert_eq!(pattern(42), pattern(42));
        assert_ne!(pattern(42), pattern(43));
        let drops = pattern(42).iter().filter(|v| **v == Verdict::Drop).count();
        assert!((100..200).contains(&drops), "about 30% of 500: {drops}");
    }
}
