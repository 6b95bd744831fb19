//! The state machine of the linearizability tests, run on the harness's cluster: `KvCommand`
//! has no compare-and-set, so [`Registers`] holds `u64` registers keyed by one byte and applies
//! writes and compare-and-sets, the model the checker knows.

use redb::{ReadTransaction, ReadableTable, WriteTransaction};

use super::harness::Cluster;
use super::storage::STATE_MACHINE;
use super::{BoxError, StateMachine};

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

/// The cluster the linearizability tests drive: the harness's, of [`Registers`] replicas that
/// snapshot often, so that restarted and partitioned replicas also catch up from snapshots and
/// reads are served from restored state machines.
pub(super) type Sim = Cluster<Registers>;

pub(super) fn registers_cluster(replicas: u64, seed: u64) -> Sim {
    Cluster::with_config(replicas, seed, |config| {
        config.snapshot_interval_entries = 40;
        config.compaction_retained_entries = 10;
    })
}

pub(super) fn replay_hint(seed: u64) -> String {
    format!(
        "seed = {seed}; replay with LONGHAUL_SEED={seed} cargo test -p longhaul-coordinator --lib linearizability"
    )
}

impl Cluster<Registers> {
    pub(super) fn read(&self, id: u64, key: u8) -> Option<u64> {
        let txn = self.node(id).storage().read().expect("read txn");
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
