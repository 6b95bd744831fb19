//! Power loss under the store, not only SIGKILL: [`DiskStorage`] on a simulated disk
//! (`sim_disk.rs`, whose documentation states the model) that loses power at random fsyncs,
//! and what it recovers.
//!
//! A seeded workload drives one store the way a replica's node does: appends with term and vote
//! changes (a new leader overwriting the uncommitted suffix), commit index moves, applies in
//! the open transaction or fsynced (a membership change every seventh entry), the state store's
//! fsync on its own and staged, reads, both compactions, snapshots built and installed, segment
//! rollovers (segments are made small), clean restarts. The disk keeps an image at a random
//! sample of fsyncs (and between steps): what a power loss, or a process crash, at that moment
//! leaves. Each image is opened on a disk of its own, and must:
//!
//! - open: a power loss only ever loses what was not acknowledged, so refusing would be a bug
//!   too (the checks would name the error); never panic;
//! - hold the log exactly as the last acknowledged step left it, or as the step in flight would
//!   have (a `commit` that returned is an acknowledged write: its record is there);
//! - hold a state store at an applied index no older than the last fsynced state commit and no
//!   newer than the step in flight, whose state machine and membership are exactly those of that
//!   index, with every later entry still in the log (or, after a crash inside a snapshot install,
//!   the stored snapshot to restore it from, as the node does);
//! - keep what it recovered: a power loss right after the open comes back to the same store; and
//!   so does a power loss during the open (a crash while recovering).
//!
//! `LONGHAUL_SEED` replays a run (the seed is printed on failure);
//! `LONGHAUL_POWER_LOSS_WORKLOADS` runs more workloads than the bounded default.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use longhaul_core::rng::{SeedRng, derive};
use raft::eraftpb::{ConfState, Entry, Snapshot, SnapshotMetadata};
use redb::{ReadableTable as _, WriteTransaction};

use super::disk::Disk;
use super::sim_disk::{Crash, Image, SimDisk};
use super::wal::MemLog;
use super::{DiskStorage, Result, STATE_MACHINE, StorageError, compress_snapshot, lock};

/// Workloads in the bounded run, and steps in each.
const WORKLOADS: u64 = 16;
const STEPS: usize = 90;
/// The chance that an fsync of the workload keeps an image first, and that the end of a step
/// does.
const CAPTURE_CHANCE: f64 = 0.06;
/// The chance that an fsync during recovery keeps an image (a crash while recovering).
const RECOVERY_CAPTURE_CHANCE: f64 = 0.25;
/// A segment rolls over after this many bytes, so that rollovers happen in every workload.
const SEGMENT_BYTES: u64 = 6 << 10;

fn root() -> PathBuf {
    PathBuf::from("/sim")
}

fn store_path() -> PathBuf {
    root().join("store.redb")
}

fn open(disk: &Arc<SimDisk>) -> Result<DiskStorage> {
    let mut store = DiskStorage::open_on(Disk::Sim(disk.clone()), &store_path())?;
    store.wal.set_segment_bytes(SEGMENT_BYTES);
    Ok(store)
}

/// The membership as of applied index `applied`: the founding voters, and a learner that
/// changes with every seventh entry (each one a membership change).
fn conf_for(applied: u64) -> ConfState {
    if applied == 0 {
        return ConfState::default();
    }
    let mut conf = ConfState {
        voters: vec![1, 2, 3],
        ..ConfState::default()
    };
    if applied >= 7 {
        conf.learners = vec![4 + (applied / 7) % 3];
    }
    conf
}

/// A state machine's content as snapshot data: `(index, length, data)` for each key.
fn serialize(state: &BTreeMap<u64, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, data) in state {
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(data);
    }
    out
}

fn deserialize(mut bytes: &[u8]) -> Option<BTreeMap<u64, Vec<u8>>> {
    let mut out = BTreeMap::new();
    while !bytes.is_empty() {
        let index = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let len = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize;
        out.insert(index, bytes.get(12..12 + len)?.to_vec());
        bytes = &bytes[12 + len..];
    }
    Some(out)
}

/// The state machine's table, read.
fn state_machine(store: &DiskStorage) -> Result<BTreeMap<u64, Vec<u8>>> {
    let txn = store.read()?;
    let table = txn.open_table(STATE_MACHINE)?;
    let mut out = BTreeMap::new();
    for item in table.iter()? {
        let (key, value) = item?;
        let key: [u8; 8] = key
            .value()
            .try_into()
            .map_err(|_| StorageError::CorruptLog("a state machine key that is not an index"))?;
        out.insert(u64::from_be_bytes(key), value.value().to_vec());
    }
    Ok(out)
}

/// Rewrites the state machine from snapshot data, as a state machine's `restore` does.
fn restore(txn: &WriteTransaction, data: &[u8]) -> Result<()> {
    let state = deserialize(data).ok_or(StorageError::CorruptLog("snapshot data"))?;
    let mut table = txn.open_table(STATE_MACHINE)?;
    table.retain(|_, _| false)?;
    for (index, value) in state {
        table.insert(index.to_be_bytes().as_slice(), value.as_slice())?;
    }
    Ok(())
}

/// What a step left acknowledged: the log as committed, and the state store's applied index,
/// as of its last fsync too.
#[derive(Debug, Clone)]
struct View {
    log: MemLog,
    applied: u64,
    durable_applied: u64,
    /// The commit index the workload had reached.
    commit: u64,
}

impl View {
    fn fresh() -> Self {
        Self {
            log: MemLog::default(),
            applied: 0,
            durable_applied: 0,
            commit: 0,
        }
    }

    fn of(store: &DiskStorage, commit: u64) -> Self {
        Self {
            log: lock(&store.log).clone(),
            applied: store.state.applied,
            durable_applied: store.state.durable_applied,
            commit,
        }
    }

    fn describe(&self) -> String {
        let log = &self.log;
        format!(
            "term {} vote {}, log ({}, {}] after ({}, {}), snapshot {}, applied {} (durable {})",
            log.hard_state.term,
            log.hard_state.vote,
            log.truncated.0,
            log.last_index(),
            log.truncated.0,
            log.truncated.1,
            log.snapshot.index,
            self.applied,
            self.durable_applied,
        )
    }
}

/// One seeded run of the store on a simulated disk.
struct Workload {
    rng: SeedRng,
    disk: Arc<SimDisk>,
    store: Option<DiskStorage>,
    /// The data of every committed entry (fixed once committed: Raft never changes it).
    committed: BTreeMap<u64, Vec<u8>>,
    commit: u64,
    /// `views[j]`: what was acknowledged after step `j` (`views[0]`: a fresh disk).
    views: Vec<View>,
}

impl Workload {
    fn new(seed: u64) -> Self {
        let disk = SimDisk::new(&root(), derive(seed, "disk", 0));
        disk.set_capture_chance(CAPTURE_CHANCE);
        Self {
            rng: SeedRng::new(derive(seed, "workload", 0)),
            disk,
            store: None,
            committed: BTreeMap::new(),
            commit: 0,
            views: vec![View::fresh()],
        }
    }

    fn store(&mut self) -> &mut DiskStorage {
        self.store
            .as_mut()
            .expect("the workload opens the store first")
    }

    /// The state machine at applied index `applied`: every committed entry's data under its
    /// index (the founding snapshot at index 1 holds none).
    fn expected(committed: &BTreeMap<u64, Vec<u8>>, applied: u64) -> BTreeMap<u64, Vec<u8>> {
        if applied < 2 {
            return BTreeMap::new();
        }
        committed
            .range(2..=applied)
            .map(|(i, d)| (*i, d.clone()))
            .collect()
    }

    fn data(&mut self) -> Vec<u8> {
        let len = match self.rng.up_to(19) {
            0 => self.rng.between(2000, 9000),
            1..=5 => self.rng.between(200, 2000),
            _ => self.rng.up_to(200),
        };
        self.rng.bytes(len as usize)
    }

    fn run(&mut self) -> Result<()> {
        for step in 1..=STEPS {
            self.disk.begin_step(step);
            match step {
                1 => self.store = Some(open(&self.disk)?),
                2 => {
                    // Uncompressed: bootstrap compresses it.
                    let empty = serialize(&BTreeMap::new());
                    self.store()
                        .write(|batch| batch.bootstrap(&conf_for(1), &empty))?;
                    self.commit = 1;
                }
                _ => self.step()?,
            }
            let commit = self.commit;
            let view = View::of(self.store(), commit);
            self.views.push(view);
            self.disk.maybe_capture_between_steps();
        }
        Ok(())
    }

    fn step(&mut self) -> Result<()> {
        let state = self.store().state().clone();
        let last = state.last_index;
        let applied = state.applied;
        match self.rng.up_to(99) {
            0..=24 => {
                let mut hard_state = state.hard_state.clone();
                // A new leader sometimes overwrites the uncommitted suffix.
                let first = if last > self.commit && self.rng.chance(0.3) {
                    hard_state.term += 1;
                    hard_state.vote = self.rng.between(1, 3);
                    self.rng.between(self.commit + 1, last)
                } else {
                    last + 1
                };
                let term = hard_state.term;
                let count = self.rng.between(1, 4);
                let entries: Vec<Entry> = (first..first + count)
                    .map(|index| Entry {
                        index,
                        term,
                        data: self.data().into(),
                        ..Entry::default()
                    })
                    .collect();
                hard_state.commit = self.commit;
                self.store()
                    .append_and_persist(&entries, Some(&hard_state))?;
            }
            25..=29 => {
                let mut hard_state = state.hard_state.clone();
                hard_state.term += 1;
                hard_state.vote = self.rng.up_to(3);
                self.store()
                    .write(|batch| batch.set_hard_state(&hard_state))?;
            }
            30..=44 if last > self.commit => {
                let commit = self.rng.between(self.commit + 1, last);
                for index in self.commit + 1..=commit {
                    let data = lock(&self.store().log)
                        .get(index)
                        .map(|e| e.data.to_vec())
                        .ok_or(StorageError::CorruptLog("a committed entry is missing"))?;
                    self.committed.insert(index, data);
                }
                self.commit = commit;
                self.store().write(|batch| batch.set_commit(commit))?;
            }
            45..=64 if self.commit > applied => {
                let to = self.commit.min(applied + self.rng.between(1, 8));
                let sync = self.rng.chance(0.15);
                let store = self.store();
                let entries = store
                    .entries_in(applied + 1, to + 1, None)
                    .map_err(|_| StorageError::CorruptLog("an entry to apply is missing"))?;
                let mut batch = store.begin()?;
                for entry in entries {
                    batch
                        .state_txn()?
                        .open_table(STATE_MACHINE)?
                        .insert(entry.index.to_be_bytes().as_slice(), &*entry.data)?;
                    if entry.index % 7 == 0 {
                        batch.set_conf_state(&conf_for(entry.index))?;
                    }
                    batch.set_applied(entry.index)?;
                }
                if sync {
                    batch.sync_state();
                }
                store.commit(batch)?;
            }
            65..=69 => self.store().sync_state()?,
            70..=74 => {
                // As the server's loop does: flush the pages elsewhere, then the small commit.
                let store = self.store();
                if let Some(flush) = store.stage_state_sync()? {
                    flush.sync_data().map_err(StorageError::StateFile)?;
                    store.sync_state()?;
                }
            }
            75..=78 => {
                let seen = state_machine(self.store())?;
                if seen != Self::expected(&self.committed, applied) {
                    return Err(StorageError::CorruptLog(
                        "a read does not see the state machine as applied",
                    ));
                }
            }
            79..=84 => {
                let to = self.rng.between(state.first_index(), applied + 1);
                self.store().compact_durable(to)?;
            }
            85..=87 => {
                let to = self.rng.between(state.first_index(), applied + 1);
                self.store().compact(to)?;
            }
            88..=92 if applied > 1 && applied != state.snapshot.index => {
                // As the node builds a snapshot: the state machine at the applied index.
                let store = self.store();
                let mut meta = SnapshotMetadata {
                    index: applied,
                    term: raft::Storage::term(store, applied)
                        .map_err(|_| StorageError::CorruptLog("the applied entry has no term"))?,
                    ..SnapshotMetadata::default()
                };
                meta.set_conf_state(state.conf_state.clone());
                let data = compress_snapshot(&serialize(&state_machine(store)?))?;
                store.write(|batch| batch.store_snapshot(&meta, &data))?;
            }
            93..=95 => {
                // The leader sends a snapshot past the end of this log.
                let index = last + self.rng.between(1, 6);
                for i in self.commit + 1..=index {
                    let data = self.data();
                    self.committed.insert(i, data);
                }
                self.commit = index;
                let mut meta = SnapshotMetadata {
                    index,
                    term: state.hard_state.term + self.rng.up_to(1),
                    ..SnapshotMetadata::default()
                };
                meta.set_conf_state(conf_for(index));
                let data = serialize(&Self::expected(&self.committed, index));
                let mut snapshot = Snapshot::default();
                snapshot.set_metadata(meta);
                snapshot.data = compress_snapshot(&data)?.into();
                self.store().apply_snapshot(&snapshot, restore)?;
            }
            96..=99 => {
                // A clean restart.
                drop(self.store.take());
                self.store = Some(open(&self.disk)?);
            }
            _ => {}
        }
        Ok(())
    }
}

/// What the checks of one run counted.
#[derive(Debug, Default)]
struct Tally {
    images: usize,
    process_crashes: usize,
    during_recovery: usize,
    rollbacks_of_the_step_in_flight: usize,
}

/// Opens `image` and checks what the store recovered against what was acknowledged before the
/// step in flight (`before`) and what that step would have left (`after`); then crashes it
/// again, during and right after its recovery.
fn check_image(
    image: Image,
    before: &View,
    after: &View,
    committed: &BTreeMap<u64, Vec<u8>>,
    rng: &mut SeedRng,
    tally: &mut Tally,
) -> std::result::Result<(), String> {
    let kind = image.kind;
    let disk = SimDisk::from_image(image, rng.next_u64());
    disk.set_capture_chance(RECOVERY_CAPTURE_CHANCE);
    let mut store =
        open(&disk).map_err(|error| format!("the store does not open after the crash: {error}"))?;
    disk.set_capture_chance(0.0);
    let recovered = check_recovered(&mut store, before, after, committed)?;
    if recovered.log == before.log && before.log != after.log {
        tally.rollbacks_of_the_step_in_flight += 1;
    }
    tally.images += 1;
    if kind == Crash::Killed {
        tally.process_crashes += 1;
    }

    // What the open recovered (and fsynced) survives a power loss right after it.
    let again = disk.capture_now(Crash::PowerLoss);
    let during_recovery = disk.take_images();
    disk.power_off();
    drop(store);
    let disk_again = SimDisk::from_image(again, rng.next_u64());
    let mut store = open(&disk_again).map_err(|error| {
        format!("the store does not open after a crash after recovery: {error}")
    })?;
    check_recovered(&mut store, &recovered, &recovered, committed)
        .map_err(|error| format!("a crash right after recovery: {error}"))?;
    disk_again.power_off();
    drop(store);

    // A crash while recovering leaves the same choices as the first crash.
    for during in during_recovery.into_iter().take(2) {
        let disk = SimDisk::from_image(during, rng.next_u64());
        let mut store = open(&disk).map_err(|error| {
            format!("the store does not open after a crash during recovery: {error}")
        })?;
        check_recovered(&mut store, before, after, committed)
            .map_err(|error| format!("a crash during recovery: {error}"))?;
        disk.power_off();
        tally.during_recovery += 1;
    }
    Ok(())
}

/// Checks a reopened store against the two acceptable outcomes; restores the state store from
/// the stored snapshot when it is behind the log (as `Node::open` does). Returns what it holds.
fn check_recovered(
    store: &mut DiskStorage,
    before: &View,
    after: &View,
    committed: &BTreeMap<u64, Vec<u8>>,
) -> std::result::Result<View, String> {
    let log = lock(&store.log).clone();
    if log != before.log && log != after.log {
        let got = View {
            log,
            ..View::of(store, 0)
        };
        return Err(format!(
            "the log is neither as acknowledged nor as the step in flight would leave it:\n  \
             recovered:    {}\n  acknowledged: {}\n  in flight:    {}",
            got.describe(),
            before.describe(),
            after.describe()
        ));
    }
    // Every entry that was committed before the step is the committed one.
    for entry in &log.entries {
        if entry.index <= before.commit && committed.get(&entry.index) != Some(&entry.data.to_vec())
        {
            return Err(format!("committed entry {} changed", entry.index));
        }
    }
    let applied = store.state.applied;
    if applied < before.durable_applied || applied > after.applied {
        return Err(format!(
            "the state store is at applied index {applied}, outside [{}, {}]: the last fsynced \
             state commit and the step in flight",
            before.durable_applied, after.applied
        ));
    }
    check_state_machine(store, applied, committed)?;
    if store.state_behind_log() {
        // Only a crash inside a snapshot install (or a bootstrap) leaves this, and the log then
        // starts at the stored snapshot.
        if log.truncated.0 != log.snapshot.index {
            return Err(format!(
                "the state store (applied {applied}) is behind the log's start {} and that is \
                 not the stored snapshot {}",
                log.truncated.0, log.snapshot.index
            ));
        }
        let snapshot = store
            .stored_snapshot()
            .map_err(|error| format!("the stored snapshot cannot be read: {error}"))?
            .ok_or("the state store is behind the log and no snapshot is stored")?;
        store
            .write(|batch| batch.restore_state(&snapshot, restore))
            .map_err(|error| format!("restoring the stored snapshot failed: {error}"))?;
        check_state_machine(store, store.state.applied, committed)?;
    } else {
        let commit = raft::Storage::initial_state(store)
            .map_err(|error| error.to_string())?
            .hard_state
            .commit;
        if commit < applied {
            return Err(format!(
                "commit index {commit} below applied index {applied}"
            ));
        }
    }
    // The commit index that goes with the log recovered: an install cut short commits the
    // leader's entries, which may differ from this log's uncommitted ones.
    let commit = if log == after.log {
        after.commit
    } else {
        before.commit
    };
    Ok(View {
        log,
        ..View::of(store, commit)
    })
}

fn check_state_machine(
    store: &DiskStorage,
    applied: u64,
    committed: &BTreeMap<u64, Vec<u8>>,
) -> std::result::Result<(), String> {
    let seen = state_machine(store).map_err(|error| format!("reading the state: {error}"))?;
    let expected = Workload::expected(committed, applied);
    if seen != expected {
        let keys = |m: &BTreeMap<u64, Vec<u8>>| m.keys().copied().collect::<Vec<_>>();
        return Err(format!(
            "the state machine at applied index {applied} holds entries {:?}, expected {:?} \
             (or different data)",
            keys(&seen),
            keys(&expected)
        ));
    }
    if store.state.conf_state != conf_for(applied) {
        return Err(format!(
            "the membership at applied index {applied} is {:?}, expected {:?}",
            store.state.conf_state,
            conf_for(applied)
        ));
    }
    Ok(())
}

/// Prints how to replay a failing seed when a check panics (the checks themselves return
/// errors; a panic is the store's).
struct ReplayHint(u64);

impl Drop for ReplayHint {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "power loss: seed {0} (replay with LONGHAUL_SEED={0})",
                self.0
            );
        }
    }
}

/// Names what was being checked when the store panicked.
struct PanicContext(String);

impl Drop for PanicContext {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("power loss: the store panicked on {}", self.0);
        }
    }
}

/// Runs workload `index` of `seed` and checks every image it kept.
fn run_workload(seed: u64, index: u64, tally: &mut Tally) -> std::result::Result<(), String> {
    let workload_seed = derive(seed, "power-loss", index);
    let mut workload = Workload::new(workload_seed);
    workload
        .run()
        .map_err(|error| format!("workload {index}: the workload failed: {error}"))?;
    let images = workload.disk.take_images();
    workload.disk.power_off();
    drop(workload.store.take());
    let mut rng = SeedRng::new(derive(workload_seed, "checks", 0));
    for (i, image) in images.into_iter().enumerate() {
        let after = &workload.views[image.step];
        let before = if image.during_step {
            &workload.views[image.step - 1]
        } else {
            after
        };
        let what = format!(
            "workload {index}, image {i} ({:?} {} step {}, torn {:?})",
            image.kind,
            if image.during_step { "during" } else { "after" },
            image.step,
            image.tear()
        );
        let _context = PanicContext(what.clone());
        check_image(image, before, after, &workload.committed, &mut rng, tally)
            .map_err(|error| format!("{what}: {error}"))?;
    }
    Ok(())
}

#[test]
fn no_acknowledged_write_is_lost_to_a_power_loss_and_the_store_always_reopens() {
    let seed = crate::consensus::harness::seed_or(0x9e37_79b9);
    let workloads = std::env::var("LONGHAUL_POWER_LOSS_WORKLOADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(WORKLOADS);
    let _hint = ReplayHint(seed);
    let started = std::time::Instant::now();
    let mut tally = Tally::default();
    for index in 0..workloads {
        if let Err(error) = run_workload(seed, index, &mut tally) {
            panic!("power loss: {error}\nseed {seed} (replay with LONGHAUL_SEED={seed})");
        }
    }
    eprintln!(
        "power loss: {} crash images ({} process crashes, {} more during recovery, {} rolled \
         back the step in flight) over {workloads} workloads of {STEPS} steps in {:.1} s; seed \
         {seed}",
        tally.images,
        tally.process_crashes,
        tally.during_recovery,
        tally.rollbacks_of_the_step_in_flight,
        started.elapsed().as_secs_f64()
    );
    // The run must exercise what it claims to, or it would pass vacuously.
    assert!(tally.images >= 10 * workloads as usize, "{tally:?}");
    assert!(
        tally.during_recovery > 0 && tally.process_crashes > 0,
        "{tally:?}"
    );
    assert!(tally.rollbacks_of_the_step_in_flight > 0, "{tally:?}");
}
