//! An in-process Raft cluster in virtual time, for tests: generic over the state machine (the
//! key-value one for the consensus tests, the registers of the linearizability tests).
//!
//! Each replica is a real [`Node`] on its own store in a temporary directory (in memory where
//! the OS offers one). The transport is a `Vec` of messages judged by the cluster's
//! [`Faults`] (composable seeded rules: drop, delay, partition, isolate — the same vocabulary
//! and the same `MessageFilter` seam as the real gRPC transport's, as in tikv's
//! `test_raftstore`), and time only moves when the test calls [`Cluster::tick`]. Every random
//! choice (message loss, delays, election timeouts) flows from one seed, printed when a test
//! fails; set `LONGHAUL_SEED` to replay it.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use longhaul_core::rng::SeedRng;
use raft::SnapshotStatus;
use raft::eraftpb::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, Message, MessageType,
};
use tempfile::TempDir;

use super::faults::Faults;
use super::filter::{MessageFilter, Verdict};
use super::kv::{KvCommand, KvStateMachine};
use super::{DiskStorage, Event, Node, NodeConfig, StateMachine};

/// Crashes the owner of a store (a [`Node`] or a bare [`DiskStorage`]) the way SIGKILL does.
/// The OS keeps what the process wrote: every byte appended to the log, and the pages of the
/// state file; but redb's record of the commits made since the state file's last durable
/// (fsynced) one lived only in the process, so the reopened state file is at its last durable
/// commit: deferred commits are lost. Dropping the owner instead would be a clean shutdown,
/// which makes everything durable; so the files are copied while the owner runs, the owner is
/// dropped, and the copies are put back (the log directory exactly as it was).
pub(super) fn crash<T>(owner: T, store: &std::path::Path) {
    let [wal_dir, state_file] = DiskStorage::files(store);
    let mut images: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(&wal_dir)
        .expect("list the log to crash it")
        .map(|item| {
            let path = item.expect("list the log to crash it").path();
            let image = std::fs::read(&path).expect("read the log to crash it");
            (path, image)
        })
        .collect();
    let state = std::fs::read(&state_file).expect("read the state file to crash it");
    images.push((state_file, state));
    drop(owner);
    std::fs::remove_dir_all(&wal_dir).expect("remove the log to put back its crash image");
    std::fs::create_dir(&wal_dir).expect("put back the crashed log");
    for (file, image) in images {
        std::fs::write(file, image).expect("put back the crashed store");
    }
}

/// A directory for a replica's store, in memory where the OS offers one. A simulated crash
/// ([`crash`]) keeps what the process wrote to the file, as SIGKILL does, so the fsyncs only
/// cost time: on a disk they make a linearizability seed take ~20 s instead of ~2.
fn scratch_dir() -> std::io::Result<TempDir> {
    let memory = std::path::Path::new("/dev/shm");
    if memory.is_dir() {
        tempfile::Builder::new()
            .prefix("longhaul-harness")
            .tempdir_in(memory)
    } else {
        tempfile::tempdir()
    }
}

/// The redb file of a replica whose store lives in `dir`.
pub(super) fn store_path(dir: &TempDir) -> std::path::PathBuf {
    dir.path().join("raft.redb")
}

/// Delivers one round of messages through the network to the replicas in
/// `nodes`, reporting undelivered snapshots and unreachable peers to raft as a
/// real transport would. Returns false when nothing is in flight (idle).
/// Shared by every virtual-time cluster of the test suites.
pub(super) fn deliver<S: StateMachine>(
    nodes: &mut BTreeMap<u64, Node<S>>,
    network: &Network,
    msgs: Vec<Message>,
) -> bool {
    let snapshots: Vec<(u64, u64)> = msgs
        .iter()
        .filter(|m| m.get_msg_type() == MessageType::MsgSnapshot)
        .map(|m| (m.from, m.to))
        .collect();
    let msgs = network.judge(msgs);
    if msgs.is_empty() && snapshots.is_empty() {
        return false;
    }
    for (from, to) in snapshots {
        let delivered = msgs
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgSnapshot && m.from == from && m.to == to);
        if let (false, Some(leader)) = (delivered, nodes.get_mut(&from)) {
            leader.report_snapshot(to, SnapshotStatus::Failure);
        }
    }
    for msg in msgs {
        let (from, to) = (msg.from, msg.to);
        let is_snapshot = msg.get_msg_type() == MessageType::MsgSnapshot;
        match nodes.get_mut(&to) {
            // A message from a peer that is not (or no longer) a member is refused by
            // raft; that is the peer's problem, not the receiver's.
            Some(node) => {
                let _ = node.step(msg);
                if let (true, Some(leader)) = (is_snapshot, nodes.get_mut(&from)) {
                    leader.report_snapshot(to, SnapshotStatus::Finish);
                }
            }
            // A stopped replica: unreachable, and a snapshot to it failed
            // (raft waits for its outcome), as the real transport reports.
            None => {
                if let Some(sender) = nodes.get_mut(&from) {
                    sender.report_unreachable(to);
                    if is_snapshot {
                        sender.report_snapshot(to, SnapshotStatus::Failure);
                    }
                }
            }
        }
    }
    true
}

/// The virtual network: every message is judged once, when sent, by a
/// [`MessageFilter`] (the cluster's [`Faults`], as the gRPC transport's
/// outbox judges it in real time); a delayed one is held until the
/// cluster's clock has moved on by its delay, rounded up to whole ticks (a
/// held snapshot is reported failed, as a late transfer would time out).
pub struct Network {
    filter: Arc<dyn MessageFilter>,
    /// The cluster's clock, in ticks.
    clock: Rc<Cell<u64>>,
    tick: Duration,
    held: RefCell<Vec<(u64, Message)>>,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("filter", &self.filter)
            .field("held", &self.held.borrow().len())
            .finish_non_exhaustive()
    }
}

impl Network {
    /// The messages to deliver now: those of `msgs` the filter lets through
    /// at once, and the held ones that are due.
    fn judge(&self, msgs: Vec<Message>) -> Vec<Message> {
        let now = self.clock.get();
        let mut held = self.held.borrow_mut();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut *held)
            .into_iter()
            .partition(|(at, _)| *at <= now);
        *held = later;
        let mut out = Vec::with_capacity(msgs.len() + due.len());
        for msg in msgs {
            match self.filter.judge(msg.from, msg.to) {
                Verdict::Deliver => out.push(msg),
                Verdict::Drop => {}
                Verdict::DeliverAfter(delay) => {
                    let tick = self.tick.as_nanos().max(1);
                    let ticks = u64::try_from(delay.as_nanos().div_ceil(tick)).unwrap_or(u64::MAX);
                    if ticks == 0 {
                        out.push(msg);
                    } else {
                        held.push((now.saturating_add(ticks), msg));
                    }
                }
            }
        }
        out.extend(due.into_iter().map(|(_, msg)| msg));
        out
    }
}

/// Bound on delivery rounds in one [`Cluster::drive`]: far above what a healthy cluster needs.
const MAX_ROUNDS_PER_DRIVE: usize = 10_000;

/// N replicas, a network judged by [`Faults`] and a virtual clock.
pub struct Cluster<S: StateMachine = KvStateMachine> {
    pub seed: u64,
    rng: SeedRng,
    dirs: BTreeMap<u64, TempDir>,
    /// The running replicas.
    pub nodes: BTreeMap<u64, Node<S>>,
    election_ticks: BTreeMap<u64, usize>,
    /// The rules every message is judged by.
    faults: Faults,
    network: Network,
    next_request: u64,
    /// Every event each replica reported, in order.
    pub events: BTreeMap<u64, Vec<Event>>,
    /// Virtual time, in ticks.
    pub now: u64,
    /// The same, for the network, which holds messages until a time.
    clock: Rc<Cell<u64>>,
    tune: fn(&mut NodeConfig),
}

impl<S: StateMachine + Default> std::fmt::Debug for Cluster<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl<S: StateMachine> Drop for Cluster<S> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "cluster seed = {} (replay with LONGHAUL_SEED={})",
                self.seed, self.seed
            );
        }
    }
}

/// The length of a tick of replicas whose config `tune` adjusts.
fn tick_interval(tune: fn(&mut NodeConfig)) -> Duration {
    let mut config = NodeConfig::new(1);
    tune(&mut config);
    config.tick_interval
}

/// The seed for a test: `LONGHAUL_SEED` if set, else the test's own default.
pub fn seed_or(default: u64) -> u64 {
    std::env::var("LONGHAUL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

impl<S: StateMachine + Default> Cluster<S> {
    /// Starts replicas `1..=n`, all founding voters.
    pub fn new(n: u64, seed: u64) -> Self {
        Self::with_config(n, seed, |_| {})
    }

    /// Like [`Cluster::new`], with `tune` applied to every replica's config.
    pub fn with_config(n: u64, seed: u64, tune: fn(&mut NodeConfig)) -> Self {
        // The faults' own seed, derived rather than drawn, so adding a rule
        // changes no election timeout.
        let faults = Faults::new(longhaul_core::rng::derive(seed, "faults", 0));
        let clock = Rc::new(Cell::new(0));
        let network = Network {
            filter: Arc::new(faults.clone()),
            clock: Rc::clone(&clock),
            tick: tick_interval(tune),
            held: RefCell::new(Vec::new()),
        };
        let mut cluster = Self {
            seed,
            rng: SeedRng::new(seed),
            dirs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            election_ticks: BTreeMap::new(),
            faults,
            network,
            next_request: 0,
            events: BTreeMap::new(),
            now: 0,
            clock,
            tune,
        };
        let voters: Vec<u64> = (1..=n).collect();
        for id in 1..=n {
            cluster.start(id, &voters);
        }
        cluster
    }

    /// A child seed for a filter, drawn from the cluster's seed.
    pub fn fork_seed(&mut self) -> u64 {
        self.rng.next_u64()
    }

    fn config(&mut self, id: u64) -> NodeConfig {
        // raft-rs randomizes election timeouts with an unseedable thread RNG; pin each
        // replica's timeout to a value drawn from the cluster seed instead.
        // Timeouts are distinct: two replicas with the same fixed timeout could split the vote
        // forever, which raft's randomization exists to prevent.
        let timeout = match self.election_ticks.get(&id) {
            Some(timeout) => *timeout,
            None => loop {
                let candidate = self.rng.between(10, 29) as usize;
                if !self.election_ticks.values().any(|t| *t == candidate) {
                    self.election_ticks.insert(id, candidate);
                    break candidate;
                }
            },
        };
        let mut config = NodeConfig {
            min_election_ticks: timeout,
            max_election_ticks: timeout + 1,
            ..NodeConfig::new(id)
        };
        (self.tune)(&mut config);
        config
    }

    /// Starts (or restarts from its directory) replica `id`.
    pub fn start(&mut self, id: u64, initial_voters: &[u64]) {
        let dir = self
            .dirs
            .entry(id)
            .or_insert_with(|| scratch_dir().expect("temp dir"));
        let storage = DiskStorage::open(&store_path(dir)).expect("open store");
        let config = self.config(id);
        let node = Node::open(config, storage, S::default(), initial_voters).expect("open node");
        self.nodes.insert(id, node);
    }

    /// Crashes replica `id` (see [`crash`]): everything it acknowledged is on disk, and a store
    /// rolled back past deferred applies re-applies them from the log once restarted.
    pub fn stop(&mut self, id: u64) {
        if let (Some(node), Some(dir)) = (self.nodes.remove(&id), self.dirs.get(&id)) {
            crash(node, &store_path(dir));
        }
    }

    pub fn restart(&mut self, id: u64) {
        self.stop(id);
        self.start(id, &[]);
    }

    pub fn node(&self, id: u64) -> &Node<S> {
        &self.nodes[&id]
    }

    pub fn node_mut(&mut self, id: u64) -> &mut Node<S> {
        self.nodes.get_mut(&id).expect("node is running")
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// The rules the network judges every message by: install and remove
    /// them at any time (`partition`, `isolate`, `drop_randomly`, `delay`,
    /// `heal`); a delay counts in virtual time.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The length of one tick of virtual time (every replica's).
    pub fn tick_interval(&self) -> Duration {
        tick_interval(self.tune)
    }

    /// How many replicas were ever started (running or not): ids `1..=n`.
    pub fn replicas_known(&self) -> u64 {
        self.election_ticks.len() as u64
    }

    /// Runs every replica's Ready loop and delivers messages until nothing moves; returns the
    /// events reported meanwhile, each with its replica (they are also kept in `events`).
    pub fn drive(&mut self) -> Vec<(u64, Event)> {
        let mut reported = Vec::new();
        for _ in 0..MAX_ROUNDS_PER_DRIVE {
            let mut msgs = Vec::new();
            for (id, node) in &mut self.nodes {
                loop {
                    let out = node.handle_ready().expect("ready loop");
                    msgs.extend(out.messages);
                    reported.extend(out.events.iter().map(|e| (*id, e.clone())));
                    self.events.entry(*id).or_default().extend(out.events);
                    if !node.has_ready() {
                        break;
                    }
                }
            }
            if !deliver(&mut self.nodes, &self.network, msgs) {
                return reported;
            }
        }
        panic!("cluster did not settle within {MAX_ROUNDS_PER_DRIVE} rounds");
    }

    /// One tick of virtual time on every running replica, then drive to idle; returns the
    /// events reported meanwhile.
    pub fn tick(&mut self) -> Vec<(u64, Event)> {
        self.now += 1;
        self.clock.set(self.now);
        for node in self.nodes.values_mut() {
            node.tick();
            // The runtime makes the applied state durable on a timer of about a tick
            // (`server::raft_loop`); automatic compaction never passes that point.
            node.sync_state().expect("sync the applied state");
        }
        self.drive()
    }

    pub fn ticks(&mut self, n: u64) {
        for _ in 0..n {
            self.tick();
        }
    }

    /// The running replica that leads the highest term, if any.
    pub fn leader(&self) -> Option<u64> {
        self.nodes
            .values()
            .filter(|n| n.is_leader())
            .max_by_key(|n| n.term())
            .map(|n| n.id())
    }

    /// Ticks until `done` holds; panics after `max_ticks`.
    pub fn tick_until(&mut self, max_ticks: u64, what: &str, done: impl Fn(&Self) -> bool) {
        self.drive();
        for _ in 0..max_ticks {
            if done(self) {
                return;
            }
            self.tick();
        }
        assert!(
            done(self),
            "{what}: not reached within {max_ticks} ticks\n{}",
            self.describe()
        );
    }

    /// One line per running replica, for failure messages.
    pub fn describe(&self) -> String {
        let mut out = format!("t={} seed={}\n", self.now, self.seed);
        for node in self.nodes.values() {
            let state = node.storage().state();
            out += &format!(
                "  {}: {:?} term={} leader={} commit={} applied={} last={} voters={:?}\n",
                node.id(),
                node.role(),
                node.term(),
                node.leader_id(),
                node.commit_index(),
                state.applied,
                state.last_index,
                state.conf_state.voters,
            );
        }
        out
    }

    /// Ticks until some replica leads and every running replica in `among` follows it.
    pub fn wait_for_leader(&mut self, among: &[u64]) -> u64 {
        let among = among.to_vec();
        self.tick_until(200, "a leader everyone agrees on", |c| {
            c.leader().is_some_and(|l| {
                among.contains(&l)
                    && among
                        .iter()
                        .filter(|id| c.nodes.contains_key(id))
                        .all(|id| c.node(*id).leader_id() == l)
            })
        });
        self.leader().expect("leader")
    }

    fn request_context(&mut self) -> Vec<u8> {
        self.next_request += 1;
        self.next_request.to_le_bytes().to_vec()
    }

    /// Whether replica `id` applied the entry proposed with `context`; returns its index.
    pub fn applied_with_context(&self, id: u64, context: &[u8]) -> Option<u64> {
        self.events.get(&id)?.iter().find_map(|e| match e {
            Event::Applied {
                index, context: c, ..
            } if c == context => Some(*index),
            _ => None,
        })
    }
}

impl Cluster<KvStateMachine> {
    /// Writes `key = value` through the current leader and returns the log index once the
    /// leader has applied it (the moment a server would acknowledge the client). Retries with
    /// a new proposal when leadership moves. `None` if not acknowledged within `max_ticks`.
    pub fn try_put(&mut self, key: &str, value: &str, max_ticks: u64) -> Option<u64> {
        let data = KvCommand::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
        }
        .encode();
        let mut attempt: Option<(u64, Vec<u8>, u64)> = None;
        for _ in 0..max_ticks {
            if let Some((leader, context, _)) = &attempt
                && let Some(index) = self.applied_with_context(*leader, context)
            {
                return Some(index);
            }
            let stale = match &attempt {
                None => true,
                Some((leader, _, term)) => {
                    !self.nodes.contains_key(leader)
                        || !self.node(*leader).is_leader()
                        || self.node(*leader).term() != *term
                }
            };
            if let (true, Some(leader)) = (stale, self.leader()) {
                let context = self.request_context();
                let node = self.node_mut(leader);
                let term = node.term();
                if node.propose(context.clone(), data.clone()).is_ok() {
                    attempt = Some((leader, context, term));
                    self.drive();
                    continue;
                }
            }
            self.tick();
        }
        None
    }

    pub fn put(&mut self, key: &str, value: &str) -> u64 {
        self.try_put(key, value, 300)
            .unwrap_or_else(|| panic!("put {key}={value} was not acknowledged"))
    }
}

impl<S: StateMachine + Default> Cluster<S> {
    /// Proposes a membership change at the leader and waits until the leader applied it.
    pub fn change_membership(&mut self, changes: &[(ConfChangeType, u64)], joint: bool) {
        let leader = self.leader().expect("a leader to propose to");
        let mut change = ConfChangeV2::default();
        if joint {
            change.set_transition(ConfChangeTransition::Implicit);
        }
        for &(change_type, node_id) in changes {
            let mut single = ConfChangeSingle::default();
            single.set_change_type(change_type);
            single.node_id = node_id;
            change.mut_changes().push(single);
        }
        let context = self.request_context();
        self.node_mut(leader)
            .propose_conf_change(context, change)
            .expect("propose conf change");
        self.drive();
    }
}

impl Cluster<KvStateMachine> {
    /// The key-value state of replica `id`, read from its store.
    pub fn kv(&self, id: u64) -> BTreeMap<String, String> {
        let txn = self.node(id).storage().read().expect("read txn");
        KvStateMachine::dump(&txn)
            .expect("dump")
            .into_iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(&k).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect()
    }

    /// Asserts that every running replica applied the same state up to the same index.
    pub fn assert_converged(&mut self) {
        let ids = self.ids();
        let Some(&first) = ids.first() else { return };
        self.tick_until(200, "replicas converge", |c| {
            let applied = c.node(first).applied_index();
            ids.iter().all(|id| c.node(*id).applied_index() == applied)
        });
        let reference = self.kv(first);
        for id in &ids {
            assert_eq!(
                self.kv(*id),
                reference,
                "replica {id} diverged from {first}"
            );
        }
    }
}
