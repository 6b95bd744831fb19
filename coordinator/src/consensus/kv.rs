//! A key-value state machine: enough to test replication, and an example of the
//! [`StateMachine`] contract.

use std::collections::BTreeMap;

use redb::{ReadTransaction, ReadableTable, WriteTransaction};

use super::storage::STATE_MACHINE;
use super::{BoxError, StateMachine};

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;

/// Response prefix: the command was applied; the previous value (if any) follows.
pub const RESPONSE_OK: u8 = 0;
/// Response prefix: the command could not be decoded and changed nothing.
pub const RESPONSE_BAD_COMMAND: u8 = 1;

/// Keys and values as bytes, stored in the [`STATE_MACHINE`] table.
#[derive(Debug, Default)]
pub struct KvStateMachine;

/// The in-memory form of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCommand {
    Put { key: Vec<u8>, value: Vec<u8> },
    Delete { key: Vec<u8> },
}

fn put_len_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn take_len_prefixed<'a>(input: &mut &'a [u8]) -> Option<&'a [u8]> {
    let (len, rest) = input.split_first_chunk::<8>()?;
    let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
    if rest.len() < len {
        return None;
    }
    let (bytes, rest) = rest.split_at(len);
    *input = rest;
    Some(bytes)
}

impl KvCommand {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            KvCommand::Put { key, value } => {
                out.push(OP_PUT);
                put_len_prefixed(&mut out, key);
                put_len_prefixed(&mut out, value);
            }
            KvCommand::Delete { key } => {
                out.push(OP_DELETE);
                put_len_prefixed(&mut out, key);
            }
        }
        out
    }

    pub fn decode(data: &[u8]) -> Option<Self> {
        let (&op, mut rest) = data.split_first()?;
        let command = match op {
            OP_PUT => {
                let key = take_len_prefixed(&mut rest)?.to_vec();
                let value = take_len_prefixed(&mut rest)?.to_vec();
                KvCommand::Put { key, value }
            }
            OP_DELETE => KvCommand::Delete {
                key: take_len_prefixed(&mut rest)?.to_vec(),
            },
            _ => return None,
        };
        rest.is_empty().then_some(command)
    }
}

impl KvStateMachine {
    /// Reads one key.
    pub fn get(txn: &ReadTransaction, key: &[u8]) -> Result<Option<Vec<u8>>, BoxError> {
        let table = txn.open_table(STATE_MACHINE)?;
        Ok(table.get(key)?.map(|v| v.value().to_vec()))
    }

    /// Reads every key.
    pub fn dump(txn: &ReadTransaction) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, BoxError> {
        let table = txn.open_table(STATE_MACHINE)?;
        let mut out = BTreeMap::new();
        for item in table.iter()? {
            let (k, v) = item?;
            out.insert(k.value().to_vec(), v.value().to_vec());
        }
        Ok(out)
    }
}

impl StateMachine for KvStateMachine {
    fn apply(
        &mut self,
        txn: &WriteTransaction,
        _index: u64,
        data: &[u8],
    ) -> Result<Vec<u8>, BoxError> {
        let Some(command) = KvCommand::decode(data) else {
            return Ok(vec![RESPONSE_BAD_COMMAND]);
        };
        let mut table = txn.open_table(STATE_MACHINE)?;
        let previous = match &command {
            KvCommand::Put { key, value } => table.insert(key.as_slice(), value.as_slice())?,
            KvCommand::Delete { key } => table.remove(key.as_slice())?,
        };
        let mut response = vec![RESPONSE_OK];
        if let Some(previous) = previous {
            response.extend_from_slice(previous.value());
        }
        Ok(response)
    }

    fn snapshot(&self, txn: &ReadTransaction) -> Result<Vec<u8>, BoxError> {
        let mut out = Vec::new();
        for (key, value) in Self::dump(txn)? {
            put_len_prefixed(&mut out, &key);
            put_len_prefixed(&mut out, &value);
        }
        Ok(out)
    }

    fn restore(&mut self, txn: &WriteTransaction, data: &[u8]) -> Result<(), BoxError> {
        let mut pairs = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let key = take_len_prefixed(&mut rest).ok_or("truncated key in kv snapshot")?;
            let value = take_len_prefixed(&mut rest).ok_or("truncated value in kv snapshot")?;
            pairs.push((key, value));
        }
        let mut table = txn.open_table(STATE_MACHINE)?;
        table.retain(|_, _| false)?;
        for (key, value) in pairs {
            table.insert(key, value)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, redb::Database) {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("kv.redb")).unwrap();
        (dir, db)
    }

    fn apply(db: &redb::Database, sm: &mut KvStateMachine, data: &[u8]) -> Vec<u8> {
        let txn = db.begin_write().unwrap();
        let response = sm.apply(&txn, 1, data).unwrap();
        txn.commit().unwrap();
        response
    }

    #[test]
    fn commands_round_trip_and_garbage_is_refused() {
        let put = KvCommand::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        };
        assert_eq!(KvCommand::decode(&put.encode()), Some(put.clone()));
        let delete = KvCommand::Delete { key: b"k".to_vec() };
        assert_eq!(KvCommand::decode(&delete.encode()), Some(delete));
        let mut trailing = put.encode();
        trailing.push(0);
        for bad in [&b""[..], b"\x09", &put.encode()[..5], &trailing] {
            assert_eq!(KvCommand::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bad_command_is_answered_not_applied() {
        let (_dir, db) = store();
        let mut sm = KvStateMachine;
        assert_eq!(apply(&db, &mut sm, b"garbage"), vec![RESPONSE_BAD_COMMAND]);
        let put = KvCommand::Put {
            key: b"k".to_vec(),
            value: b"v1".to_vec(),
        };
        assert_eq!(apply(&db, &mut sm, &put.encode()), vec![RESPONSE_OK]);
        let overwrite = KvCommand::Put {
            key: b"k".to_vec(),
            value: b"v2".to_vec(),
        };
        assert_eq!(apply(&db, &mut sm, &overwrite.encode()), b"\x00v1".to_vec());
        let txn = db.begin_read().unwrap();
        assert_eq!(
            KvStateMachine::get(&txn, b"k").unwrap(),
            Some(b"v2".to_vec())
        );
    }

    #[test]
    fn snapshot_restores_into_another_store() {
        let (_dir, db) = store();
        let mut sm = KvStateMachine;
        for i in 0..10u8 {
            let put = KvCommand::Put {
                key: vec![i],
                value: vec![i; 3],
            };
            apply(&db, &mut sm, &put.encode());
        }
        let snapshot = sm.snapshot(&db.begin_read().unwrap()).unwrap();
        let (_dir2, other) = store();
        let txn = other.begin_write().unwrap();
        txn.open_table(STATE_MACHINE)
            .unwrap()
            .insert(b"stale".as_slice(), b"x".as_slice())
            .unwrap();
        sm.restore(&txn, &snapshot).unwrap();
        txn.commit().unwrap();
        let original = KvStateMachine::dump(&db.begin_read().unwrap()).unwrap();
        assert_eq!(
            KvStateMachine::dump(&other.begin_read().unwrap()).unwrap(),
            original
        );
        let txn = other.begin_write().unwrap();
        assert!(sm.restore(&txn, &snapshot[..snapshot.len() - 1]).is_err());
    }
}
