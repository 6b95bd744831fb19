//! A cluster of [`Registers`] replicas for the linearizability tests.
//!
//! It is driven like `harness::Cluster` and reuses its fault filters, but runs its own state
//! machine, because `KvCommand` has no compare-and-set: `Registers` holds `u64` registers keyed
//! by one byte and applies writes and compare-and-sets, the model the checker knows.

use std::collections::BTreeMap;

use longhaul_core::rng::SeedRng;
use raft::eraftpb::Message;
use redb::{ReadTransaction, ReadableTable, WriteTransaction};
use tempfile::TempDir;

use super::harness::{Filter, crash, deliver, store_path};
use super::storage::STATE_MACHINE;
use super::{BoxError, Event, Node, NodeConfig, RedbStorage, StateMachine};

const OP_WRITE: u8 = 1;
const OP_CAS: u8 = 2;
/// Response to a command that could not be decoded; never expected.
pub(super) const RESPONSE_BAD_COMMAND: u8 = 0xff;

/// Registers keyed by one byte, holding `u64`s: the model the checker knows.
#[derive(Debug, Default)]
pub(super) struct Registers;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Command {
    Write {
        key: u8,
        value: u64,
    },
    Cas {
        key: u8,
        expected: Option<u64>,
        new: u64,
    },
}

impl Command {
    pub(super) fn encode(&self) -> Vec<u8> {
        match self {
            Command::Write { key, value } => {
                let mut out = vec![OP_WRITE, *key];
                out.extend_from_slice(&value.to_le_bytes());
                out
            }
            Command::Cas { key, expected, new } => {
                let mut out = vec![OP_CAS, *key, u8::from(expected.is_some())];
                out.extend_from_slice(&expected.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(&new.to_le_bytes());
                out
            }
        }
    }

    fn decode(data: &[u8]) -> Option<Self> {
        let word = |bytes: &[u8]| Some(u64::from_le_bytes(bytes.try_into().ok()?));
        match data {
            [OP_WRITE, key, value @ ..] => Some(Command::Write {
                key: *key,
                value: word(value)?,
            }),
            [OP_CAS, key, has_expected, rest @ ..] if rest.len() == 16 => Some(Command::Cas {
                key: *key,
                expected: (*has_expected == 1).then_some(word(&rest[..8])?),
                new: word(&rest[8..])?,
            }),
            _ => None,
        }
    }
}

fn get(txn: &ReadTransaction, key: u8) -> Result<Option<u64>, BoxError> {
    let table = txn.open_table(STATE_MACHINE)?;
    let value = table.get([key].as_slice())?;
    Ok(value
        .map(|v| v.value().try_into().map(u64::from_le_bytes))
        .transpose()?)
}

impl StateMachine for Registers {
    fn apply(
        &mut self,
        txn: &WriteTransaction,
        _index: u64,
        data: &[u8],
    ) -> Result<Vec<u8>, BoxError> {
        let Some(command) = Command::decode(data) else {
            return Ok(vec![RESPONSE_BAD_COMMAND]);
        };
        let mut table = txn.open_table(STATE_MACHINE)?;
        let (key, value) = match command {
            Command::Write { key, value } => (key, value),
            Command::Cas { key, expected, new } => {
                let current = table
                    .get([key].as_slice())?
                    .map(|v| v.value().try_into().map(u64::from_le_bytes))
                    .transpose()?;
                if current != expected {
                    return Ok(vec![0]);
                }
                (key, new)
            }
        };
        table.insert([key].as_slice(), value.to_le_bytes().as_slice())?;
        Ok(vec![1])
    }

    fn snapshot(&self, txn: &ReadTransaction) -> Result<Vec<u8>, BoxError> {
        let mut out = Vec::new();
        for item in txn.open_table(STATE_MACHINE)?.iter()? {
            let (key, value) = item?;
            out.extend_from_slice(key.value());
            out.extend_from_slice(value.value());
        }
        Ok(out)
    }

    fn restore(&mut self, txn: &WriteTransaction, data: &[u8]) -> Result<(), BoxError> {
        let mut table = txn.open_table(STATE_MACHINE)?;
        table.retain(|_, _| false)?;
        // Each register is its one-byte key followed by its eight-byte value.
        for pair in data.chunks(9) {
            if pair.len() != 9 {
                return Err("truncated register in snapshot".into());
            }
            let (key, value) = pair.split_at(1);
            table.insert(key, value)?;
        }
        Ok(())
    }
}

/// A directory for a replica's store, in memory where the OS offers one. A simulated crash
/// ([`Sim::crash`]) keeps what the process wrote to the file, as SIGKILL does, so the fsyncs
/// only cost time: on a disk they make one seed take ~20 s instead of ~2.
fn scratch_dir() -> std::io::Result<TempDir> {
    let memory = std::path::Path::new("/dev/shm");
    if memory.is_dir() {
        tempfile::Builder::new()
            .prefix("longhaul-lin")
            .tempdir_in(memory)
    } else {
        tempfile::tempdir()
    }
}

/// Bound on delivery rounds in one [`Sim::drive`], as in the harness.
const MAX_ROUNDS_PER_DRIVE: usize = 10_000;

/// Replicas of [`Registers`] on redb files, a filtered transport and a virtual clock.
pub(super) struct Sim {
    pub(super) seed: u64,
    pub(super) rng: SeedRng,
    dirs: BTreeMap<u64, TempDir>,
    pub(super) nodes: BTreeMap<u64, Node<Registers>>,
    pub(super) election_ticks: BTreeMap<u64, usize>,
    pub(super) filters: Vec<Box<dyn Filter>>,
    pub(super) now: u64,
}

impl Drop for Sim {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", replay_hint(self.seed));
        }
    }
}

pub(super) fn replay_hint(seed: u64) -> String {
    format!(
        "seed = {seed}; replay with LONGHAUL_SEED={seed} cargo test -p longhaul-coordinator --lib linearizability"
    )
}

impl Sim {
    pub(super) fn new(replicas: u64, seed: u64) -> Self {
        let mut sim = Self {
            seed,
            rng: SeedRng::new(seed),
            dirs: BTreeMap::new(),
            nodes: BTreeMap::new(),
            election_ticks: BTreeMap::new(),
            filters: Vec::new(),
            now: 0,
        };
        let voters: Vec<u64> = (1..=replicas).collect();
        for id in 1..=replicas {
            sim.start(id, &voters);
        }
        sim
    }

    pub(super) fn start(&mut self, id: u64, initial_voters: &[u64]) {
        // Distinct seeded election timeouts, as in the harness: raft-rs's own are unseedable.
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
        let config = NodeConfig {
            min_election_ticks: timeout,
            max_election_ticks: timeout + 1,
            // Snapshot often, so that restarted and partitioned replicas also catch up from
            // snapshots and reads are served from restored state machines.
            snapshot_interval_entries: 40,
            compaction_retained_entries: 10,
            ..NodeConfig::new(id)
        };
        let dir = self
            .dirs
            .entry(id)
            .or_insert_with(|| scratch_dir().expect("temp dir"));
        let storage = RedbStorage::open(&store_path(dir)).expect("open store");
        let node = Node::open(config, storage, Registers, initial_voters).expect("open node");
        self.nodes.insert(id, node);
    }

    /// Crashes replica `id` as SIGKILL would: applies not yet made durable by an fsync are lost
    /// (see [`crash`]).
    pub(super) fn crash(&mut self, id: u64) {
        if let (Some(node), Some(dir)) = (self.nodes.remove(&id), self.dirs.get(&id)) {
            crash(node, &store_path(dir));
        }
    }

    /// Runs every replica's Ready loop and delivers messages until nothing moves; returns the
    /// events, each with its replica.
    pub(super) fn drive(&mut self) -> Vec<(u64, Event)> {
        let mut events = Vec::new();
        for _ in 0..MAX_ROUNDS_PER_DRIVE {
            let mut msgs: Vec<Message> = Vec::new();
            for (id, node) in &mut self.nodes {
                loop {
                    let out = node.handle_ready().expect("ready loop");
                    msgs.extend(out.messages);
                    events.extend(out.events.into_iter().map(|e| (*id, e)));
                    if !node.has_ready() {
                        break;
                    }
                }
            }
            let filters: Vec<&dyn Filter> = self.filters.iter().map(|f| f.as_ref()).collect();
            if !deliver(&mut self.nodes, &filters, msgs) {
                return events;
            }
        }
        panic!("cluster did not settle within {MAX_ROUNDS_PER_DRIVE} rounds");
    }

    pub(super) fn tick(&mut self) -> Vec<(u64, Event)> {
        self.now += 1;
        for node in self.nodes.values_mut() {
            node.tick();
            // The runtime makes the applied state durable on a timer of about a tick
            // (`server::raft_loop`); automatic compaction never passes that point.
            node.sync_state().expect("sync the applied state");
        }
        self.drive()
    }

    pub(super) fn leader(&self) -> Option<u64> {
        self.nodes
            .values()
            .filter(|n| n.is_leader())
            .max_by_key(|n| n.term())
            .map(|n| n.id())
    }

    pub(super) fn read(&self, id: u64, key: u8) -> Option<u64> {
        let txn = self.nodes[&id].storage().read().expect("read txn");
        get(&txn, key).expect("read register")
    }
}

#[test]
fn commands_round_trip_and_garbage_is_refused() {
    let commands = [
        Command::Write { key: 1, value: 7 },
        Command::Cas {
            key: 2,
            expected: None,
            new: 3,
        },
        Command::Cas {
            key: 0,
            expected: Some(5),
            new: 6,
        },
    ];
    for command in commands {
        assert_eq!(Command::decode(&command.encode()), Some(command));
    }
    for bad in [&b""[..], b"\x01\x00", b"\x03\x00", &[OP_CAS, 0, 1, 0]] {
        assert_eq!(Command::decode(bad), None, "{bad:?}");
    }
}
