//! Stores of older versions, moved on open. Before the raft log became the write-ahead log
//! ([`super::wal`]) it was kept in a redb file at the path given to
//! [`DiskStorage::open`](super::DiskStorage::open) (tables `raft_log`, `raft_hard_state`,
//! `raft_log_truncated`, `raft_snapshot_meta`, `raft_snapshot_data`), and before the state
//! file existed the state tables were in that file too. [`open_log`] moves both out and
//! removes the old file; every step is safe to repeat after a crash.

use std::path::Path;

use raft::eraftpb::Entry;
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle};

use super::disk::Disk;
use super::wal::{LogOp, MemLog, Wal};
use super::{
    APPLIED, CONF_STATE, Result, STATE_MACHINE, StorageError, decode, durable_write, open_database,
};

// Tables of the log in the old redb file.
pub(super) const LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("raft_log");
pub(super) const HARD_STATE: TableDefinition<'_, (), &[u8]> =
    TableDefinition::new("raft_hard_state");
// The log start is kept apart from the snapshot because the log may be compacted past the
// stored snapshot, and raft still needs the term of the entry just before the log.
pub(super) const LOG_TRUNCATED: TableDefinition<'_, (), (u64, u64)> =
    TableDefinition::new("raft_log_truncated");
pub(super) const SNAPSHOT_META: TableDefinition<'_, (), &[u8]> =
    TableDefinition::new("raft_snapshot_meta");
pub(super) const SNAPSHOT_DATA: TableDefinition<'_, (), &[u8]> =
    TableDefinition::new("raft_snapshot_data");

/// Opens the write-ahead log in `wal_dir`, first moving into it the store's old redb file at
/// `path` if there is one and the log was not written yet, and removes that file.
pub(super) fn open_log(
    disk: &Disk,
    path: &Path,
    wal_dir: &Path,
    state_db: &Database,
) -> Result<(Wal, MemLog)> {
    let legacy = disk.exists(path);
    let (wal, mem) = if legacy && !Wal::exists(disk, wal_dir)? {
        import_legacy_log(disk, path, wal_dir, state_db)?
    } else {
        Wal::open(disk, wal_dir, || Ok(MemLog::default()))?
    };
    if legacy {
        // Imported now or before a crash (the log is only written once the import is).
        disk.remove_file(path)
            .map_err(|source| StorageError::LogFile {
                what: "remove the store's old log file",
                path: path.to_owned(),
                source,
            })?;
    }
    Ok((wal, mem))
}

/// Moves a store written before the log left redb: its state tables (if it predates the
/// state file too) go to the state file, fsynced, then its log becomes the first segment of
/// the write-ahead log. [`open_log`] removes the old file afterwards; a crash before that
/// finds the log written and only repeats the removal.
fn import_legacy_log(
    disk: &Disk,
    path: &Path,
    wal_dir: &Path,
    state_db: &Database,
) -> Result<(Wal, MemLog)> {
    let log_db = open_database(disk, path, false)?;
    move_state_tables(&log_db, state_db)?;
    let txn = log_db.begin_read()?;
    let names: Vec<String> = txn.list_tables()?.map(|t| t.name().to_string()).collect();
    let holds = |name: &str| names.iter().any(|n| n == name);
    let single = |def: TableDefinition<'_, (), &[u8]>| -> Result<Option<Vec<u8>>> {
        if !holds(def.name()) {
            return Ok(None);
        }
        Ok(txn.open_table(def)?.get(())?.map(|v| v.value().to_vec()))
    };
    let mut mem = MemLog::default();
    if let Some(bytes) = single(HARD_STATE)? {
        mem.hard_state = decode("hard state", &bytes)?;
    }
    if let Some(bytes) = single(SNAPSHOT_META)? {
        mem.snapshot = decode("snapshot metadata", &bytes)?;
    }
    let snapshot_data = single(SNAPSHOT_DATA)?;
    if holds(LOG_TRUNCATED.name())
        && let Some(v) = txn.open_table(LOG_TRUNCATED)?.get(())?
    {
        mem.truncated = v.value();
    }
    if holds(LOG.name()) {
        let mut entries = Vec::new();
        for item in txn.open_table(LOG)?.iter()? {
            let (_, bytes) = item?;
            entries.push(decode::<Entry>("log entry", bytes.value())?);
        }
        mem.apply(LogOp::Append(entries))?;
    }
    let snapshot = mem.snapshot.clone();
    Wal::open(disk, wal_dir, move || {
        if let Some(data) = snapshot_data.filter(|_| snapshot.index != 0) {
            Wal::write_snapshot_in(disk, wal_dir, &snapshot, &data)?;
        }
        tracing::info!(
            from = %path.display(),
            to = %wal_dir.display(),
            entries = mem.entries.len(),
            "moved the raft log out of the redb file into the write-ahead log"
        );
        Ok(mem)
    })
}

/// Moves the state tables of a store written before the log and the state were split from
/// the log file into the state file: copied (fsynced) first, then dropped from the log file,
/// so a crash in between only repeats the drop.
fn move_state_tables(log_db: &Database, state_db: &Database) -> Result<()> {
    let old = log_db.begin_read()?;
    let names: Vec<String> = old.list_tables()?.map(|t| t.name().to_string()).collect();
    let holds = |name: &str| names.iter().any(|n| n == name);
    if !holds(APPLIED.name()) && !holds(CONF_STATE.name()) && !holds(STATE_MACHINE.name()) {
        return Ok(());
    }
    let moved = {
        let txn = state_db.begin_read()?;
        match txn.open_table(APPLIED) {
            Ok(table) => !table.is_empty()?,
            Err(redb::TableError::TableDoesNotExist(_)) => false,
            Err(error) => return Err(error.into()),
        }
    };
    if !moved {
        let txn = durable_write(state_db)?;
        if holds(APPLIED.name())
            && let Some(applied) = old.open_table(APPLIED)?.get(())?
        {
            txn.open_table(APPLIED)?.insert((), applied.value())?;
        }
        if holds(CONF_STATE.name())
            && let Some(conf_state) = old.open_table(CONF_STATE)?.get(())?
        {
            txn.open_table(CONF_STATE)?.insert((), conf_state.value())?;
        }
        if holds(STATE_MACHINE.name()) {
            let mut to = txn.open_table(STATE_MACHINE)?;
            for item in old.open_table(STATE_MACHINE)?.iter()? {
                let (key, value) = item?;
                to.insert(key.value(), value.value())?;
            }
        }
        txn.commit()?;
    }
    drop(old);
    let txn = durable_write(log_db)?;
    txn.delete_table(APPLIED)?;
    txn.delete_table(CONF_STATE)?;
    txn.delete_table(STATE_MACHINE)?;
    txn.commit()?;
    Ok(())
}
