//! The write-ahead log: the Raft log, hard state and snapshot metadata as one append-only file,
//! fsynced once per commit, the way etcd keeps its WAL.
//!
//! A commit is one record, `[length u32][crc32 u32][ops]`, appended and `fdatasync`ed: an append
//! of a few hundred bytes at the end of one file, where a B-tree commit writes several scattered
//! pages. The whole log lives in memory too ([`MemLog`]); the file is read only on open, which
//! replays it. A crash can leave the last record torn: cut short, or, after a power loss, with
//! any of its bytes lost (a power loss keeps any subset of the sectors of an unsynced write,
//! those of its header too): replay stops there and cuts the file back to the last whole
//! record. That record was never acknowledged, since a commit returns only after its fsync,
//! and it is the only one that can be torn. A bad record that a whole record follows is
//! corruption, and open refuses it (see `scan`).
//!
//! The log lives in numbered segments, `<seq>.wal` in the log directory. Each segment starts
//! with base records that restate everything (the log's start, the hard state, the snapshot
//! metadata and every entry still in the log), so only the newest segment is needed. A segment
//! is written as `<seq>.wal.tmp`, fsynced and renamed into place, so a `.wal` file always holds
//! a whole base. Once as much was appended as the base holds (and at least [`SEGMENT_BYTES`]),
//! the next segment is written and the older one deleted.
//!
//! Snapshot data is kept beside the segments in `snap-<term>-<index>.zst`, written and fsynced
//! before the record that names it; files that no record names are removed on open.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use raft::eraftpb::{Entry, HardState, SnapshotMetadata};

use super::disk::{Disk, DiskFile};
use super::{Result, StorageError, decode, encode};

/// A segment is rolled over once it is larger than this.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// A record longer than this is taken for corruption rather than read into memory.
const MAX_RECORD_BYTES: u32 = 1 << 30;

const HEADER_BYTES: usize = 8;

/// A segment's base splits the log's entries over records of about this size.
const BASE_RECORD_BYTES: usize = 16 << 20;

/// One change to the log, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum LogOp {
    /// Entries from their first index on, replacing any entries at or after it.
    Append(Vec<Entry>),
    /// Every entry up to `index` (of `term`) is removed; the log starts after it.
    Compact {
        index: u64,
        term: u64,
    },
    /// The whole log is removed and starts after `index` (of `term`): a snapshot install.
    Reset {
        index: u64,
        term: u64,
    },
    HardState(HardState),
    /// The stored snapshot is now the one with this metadata (its data is in its own file).
    Snapshot(SnapshotMetadata),
}

const TAG_APPEND: u8 = 1;
const TAG_COMPACT: u8 = 2;
const TAG_RESET: u8 = 3;
const TAG_HARD_STATE: u8 = 4;
const TAG_SNAPSHOT: u8 = 5;

/// The log as replayed, kept in memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemLog {
    pub hard_state: HardState,
    /// Index and term of the last entry removed from the log.
    pub truncated: (u64, u64),
    /// Every entry after `truncated.0`, in order, without gaps.
    pub entries: VecDeque<Entry>,
    pub snapshot: SnapshotMetadata,
}

impl MemLog {
    pub fn last_index(&self) -> u64 {
        self.entries.back().map_or(self.truncated.0, |e| e.index)
    }

    /// The entry at `index`, if the log holds it.
    pub fn get(&self, index: u64) -> Option<&Entry> {
        let offset = index.checked_sub(self.truncated.0.checked_add(1)?)?;
        self.entries.get(usize::try_from(offset).ok()?)
    }

    /// Applies one op. Ops are checked before they are recorded ([`super::Batch`]); replay
    /// applies what was recorded, and refuses a record that does not fit the log.
    pub fn apply(&mut self, op: LogOp) -> Result<()> {
        match op {
            LogOp::Append(entries) => {
                let Some(first) = entries.first().map(|e| e.index) else {
                    return Ok(());
                };
                // Not `zip(first..)`: that range overflows, and panics, at u64::MAX.
                if entries
                    .iter()
                    .enumerate()
                    .any(|(i, entry)| first.checked_add(i as u64) != Some(entry.index))
                {
                    return Err(corrupt("appended entries are not consecutive"));
                }
                if first <= self.truncated.0 {
                    return Err(StorageError::OverwriteCompacted {
                        first_new: first,
                        truncated: self.truncated.0,
                    });
                }
                if first > self.last_index().saturating_add(1) {
                    return Err(StorageError::Gap {
                        first_new: first,
                        last: self.last_index(),
                    });
                }
                let keep = usize::try_from(first - self.truncated.0 - 1).unwrap_or(usize::MAX);
                self.entries.truncate(keep);
                self.entries.extend(entries);
            }
            LogOp::Compact { index, term } => {
                if index < self.truncated.0 {
                    return Err(corrupt("compaction below the log's start"));
                }
                let drop = index.saturating_sub(self.truncated.0);
                let drop = usize::try_from(drop)
                    .unwrap_or(usize::MAX)
                    .min(self.entries.len());
                self.entries.drain(..drop);
                self.truncated = (index, term);
            }
            LogOp::Reset { index, term } => {
                self.entries.clear();
                self.truncated = (index, term);
            }
            LogOp::HardState(hard_state) => self.hard_state = hard_state,
            LogOp::Snapshot(meta) => self.snapshot = meta,
        }
        Ok(())
    }

    /// The records (lists of ops) that rebuild this log from nothing: a segment's base. The
    /// entries are split over records of about [`BASE_RECORD_BYTES`], so that a long log is not
    /// one huge record.
    fn base(&self) -> Vec<Vec<LogOp>> {
        let mut ops = vec![
            LogOp::Reset {
                index: self.truncated.0,
                term: self.truncated.1,
            },
            LogOp::HardState(self.hard_state.clone()),
        ];
        if self.snapshot.index != 0 {
            ops.push(LogOp::Snapshot(self.snapshot.clone()));
        }
        let mut records = Vec::new();
        let mut chunk = Vec::new();
        let mut bytes = 0;
        for entry in &self.entries {
            bytes += entry.data.len() + entry.context.len() + 32;
            chunk.push(entry.clone());
            if bytes >= BASE_RECORD_BYTES {
                ops.push(LogOp::Append(std::mem::take(&mut chunk)));
                records.push(std::mem::take(&mut ops));
                bytes = 0;
            }
        }
        if !chunk.is_empty() {
            ops.push(LogOp::Append(chunk));
        }
        if !ops.is_empty() {
            records.push(ops);
        }
        records
    }
}

fn corrupt(what: &'static str) -> StorageError {
    StorageError::CorruptLog(what)
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn encode_ops(ops: &[LogOp], out: &mut Vec<u8>) -> Result<()> {
    for op in ops {
        match op {
            LogOp::Append(entries) => {
                out.push(TAG_APPEND);
                out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
                for entry in entries {
                    put_bytes(out, &encode("log entry", entry)?);
                }
            }
            LogOp::Compact { index, term } | LogOp::Reset { index, term } => {
                out.push(if matches!(op, LogOp::Compact { .. }) {
                    TAG_COMPACT
                } else {
                    TAG_RESET
                });
                out.extend_from_slice(&index.to_le_bytes());
                out.extend_from_slice(&term.to_le_bytes());
            }
            LogOp::HardState(hard_state) => {
                out.push(TAG_HARD_STATE);
                put_bytes(out, &encode("hard state", hard_state)?);
            }
            LogOp::Snapshot(meta) => {
                out.push(TAG_SNAPSHOT);
                put_bytes(out, &encode("snapshot metadata", meta)?);
            }
        }
    }
    Ok(())
}

/// Reads the payload of a record back into ops.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.0.len() < n {
            return Err(corrupt("a record ends inside an op"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn bytes(&mut self) -> Result<&[u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn ops(mut self) -> Result<Vec<LogOp>> {
        let mut ops = Vec::new();
        while let Some((&tag, _)) = self.0.split_first() {
            self.0 = &self.0[1..];
            ops.push(match tag {
                TAG_APPEND => {
                    let n = self.u32()?;
                    let mut entries = Vec::with_capacity(n.min(4096) as usize);
                    for _ in 0..n {
                        entries.push(decode("log entry", self.bytes()?)?);
                    }
                    LogOp::Append(entries)
                }
                TAG_COMPACT => LogOp::Compact {
                    index: self.u64()?,
                    term: self.u64()?,
                },
                TAG_RESET => LogOp::Reset {
                    index: self.u64()?,
                    term: self.u64()?,
                },
                TAG_HARD_STATE => LogOp::HardState(decode("hard state", self.bytes()?)?),
                TAG_SNAPSHOT => LogOp::Snapshot(decode("snapshot metadata", self.bytes()?)?),
                _ => return Err(corrupt("unknown op in a record")),
            });
        }
        Ok(ops)
    }
}

fn record(ops: &[LogOp]) -> Result<Vec<u8>> {
    let mut out = vec![0; HEADER_BYTES];
    encode_ops(ops, &mut out)?;
    let bytes = out.len() - HEADER_BYTES;
    let len = u32::try_from(bytes)
        .ok()
        .filter(|&len| len <= MAX_RECORD_BYTES)
        .ok_or(StorageError::RecordTooLarge {
            bytes,
            limit: MAX_RECORD_BYTES,
        })?;
    let crc = crc32fast::hash(&out[HEADER_BYTES..]);
    out[..4].copy_from_slice(&len.to_le_bytes());
    out[4..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// A record of `ops` as the log writes it: `[length u32][crc32 u32][ops]`.
pub fn encode_record(ops: &[LogOp]) -> Result<Vec<u8>> {
    record(ops)
}

/// Decodes the payload of a whole record into its ops, as replay does. Pure, so that it can be
/// fuzzed: any bytes give ops or an error.
pub fn decode_ops(payload: &[u8]) -> Result<Vec<LogOp>> {
    Reader(payload).ops()
}

/// How a segment's bytes end.
#[derive(Debug, PartialEq)]
enum Tail {
    /// After the last whole record, nothing.
    Clean,
    /// A record torn by a crash during its write: cut short, or with some of its bytes (its
    /// header's too) lost to zeroes, with nothing but the rest of it after it.
    Torn,
}

/// Why a record is not whole.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bad {
    CutShort,
    ZeroLength,
    TooLong,
    Checksum,
}

impl Bad {
    /// What open reports when whole records follow the bad one (corruption).
    fn followed(self) -> &'static str {
        match self {
            Bad::CutShort => "a record cut short, and whole records follow it",
            Bad::ZeroLength => "a record of length zero, and whole records follow it",
            Bad::TooLong => "a record longer than the limit, and whole records follow it",
            Bad::Checksum => "a record fails its checksum, and whole records follow it",
        }
    }
}

/// The payload of the record at `at` if it is whole: a header, a length that is neither zero
/// nor over the limit and fits in `bytes`, and a payload that matches its checksum.
fn whole_record(bytes: &[u8], at: usize) -> std::result::Result<&[u8], Bad> {
    let header = bytes
        .get(at..at.saturating_add(HEADER_BYTES))
        .ok_or(Bad::CutShort)?;
    let word =
        |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    let (len, crc) = (word(0), word(4));
    if len == 0 {
        return Err(Bad::ZeroLength);
    }
    if len > MAX_RECORD_BYTES {
        return Err(Bad::TooLong);
    }
    let start = at + HEADER_BYTES;
    let payload = bytes
        .get(start..start.saturating_add(len as usize))
        .ok_or(Bad::CutShort)?;
    if crc32fast::hash(payload) != crc {
        return Err(Bad::Checksum);
    }
    Ok(payload)
}

/// What follows a bad record.
#[derive(Debug, PartialEq)]
enum After {
    /// No whole record: the bad one is a torn tail.
    NoRecord,
    /// A whole record: the bad one is corruption.
    Record,
    /// The search gave up (see [`after_bad_record`]).
    Unknown,
}

/// Whether a whole record starts anywhere after offset `at`, where a bad record starts. A
/// record's length is not to be trusted there, so every offset is a candidate; one is hashed
/// only if its length fits and its payload starts with an op's tag, as every record's does.
/// Hashing stops after about 16 bytes per byte searched (plus 1 MiB), which a torn tail of
/// ordinary records never needs; a search cut short reports [`After::Unknown`].
fn after_bad_record(bytes: &[u8], at: usize) -> After {
    let mut budget = (bytes.len() - at)
        .saturating_mul(16)
        .saturating_add(1 << 20);
    for candidate in at + 1..bytes.len() {
        let Some(header) = bytes.get(candidate..candidate + HEADER_BYTES) else {
            break;
        };
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let start = candidate + HEADER_BYTES;
        let fits = len != 0 && len <= MAX_RECORD_BYTES && bytes.len() - start >= len as usize;
        if !fits || !(TAG_APPEND..=TAG_SNAPSHOT).contains(&bytes[start]) {
            continue;
        }
        if budget < len as usize {
            return After::Unknown;
        }
        budget -= len as usize;
        if whole_record(bytes, candidate).is_ok() {
            return After::Record;
        }
    }
    After::NoRecord
}

/// The whole records of a segment and where they end. Only the last record can be torn: each
/// commit is fsynced before the next record is written, and open fsyncs what it keeps, so at
/// most one record is ever unsynced. A power loss may keep any part of that record, header
/// included, in any order, so what follows a torn record is the rest of it (its bytes, or
/// zeroes where they were lost), never a whole record. A bad record that a whole record follows
/// is therefore corruption, and an error: cutting it off would drop acknowledged records after
/// it.
type Scanned<'a> = (Vec<(usize, &'a [u8])>, usize, Tail);

fn scan(bytes: &[u8]) -> std::result::Result<Scanned<'_>, (usize, &'static str)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match whole_record(bytes, at) {
            Ok(payload) => {
                out.push((at, payload));
                at += HEADER_BYTES + payload.len();
            }
            Err(bad) => {
                return match after_bad_record(bytes, at) {
                    After::NoRecord => Ok((out, at, Tail::Torn)),
                    After::Record => Err((at, bad.followed())),
                    After::Unknown => Err((
                        at,
                        "a bad record, and the search for whole records after it gave up",
                    )),
                };
            }
        }
    }
    Ok((out, at, Tail::Clean))
}

/// A segment's bytes as replayed: the log they hold, where its last whole record ends, and
/// whether a torn record follows (which open cuts off).
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    pub log: MemLog,
    pub end: usize,
    pub torn: bool,
}

/// Replays the bytes of the segment at `path` (named in errors only): what open does before it
/// touches the file. Pure, so that it can be fuzzed: any bytes give a log or a
/// [`StorageError::CorruptSegment`].
pub fn replay(path: &Path, bytes: &[u8]) -> Result<Replayed> {
    let corrupt = |(offset, reason)| StorageError::CorruptSegment {
        path: path.to_owned(),
        offset,
        reason,
    };
    let (records, end, tail) = scan(bytes).map_err(corrupt)?;
    if records.is_empty() {
        return Err(corrupt((0, "the segment has no whole base record")));
    }
    let mut log = MemLog::default();
    for &(offset, payload) in &records {
        let ops = Reader(payload)
            .ops()
            .map_err(|_| corrupt((offset, "a record that does not decode")))?;
        for op in ops {
            log.apply(op)
                .map_err(|_| corrupt((offset, "a record that does not fit the log")))?;
        }
    }
    Ok(Replayed {
        log,
        end,
        torn: tail == Tail::Torn,
    })
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StorageError + 'a {
    move |source| StorageError::LogFile {
        what,
        path: path.to_owned(),
        source,
    }
}

fn sync_dir(disk: &Disk, dir: &Path) -> Result<()> {
    disk.sync_dir(dir)
        .map_err(io("fsync the log directory", dir))
}

fn segment_name(seq: u64) -> String {
    format!("{seq:016x}.wal")
}

fn snapshot_name(meta: &SnapshotMetadata) -> String {
    format!("snap-{:016x}-{:016x}.zst", meta.term, meta.index)
}

/// The open log: the newest segment, appended to.
pub struct Wal {
    disk: Disk,
    dir: PathBuf,
    /// The newest segment, open in `file`.
    path: PathBuf,
    file: DiskFile,
    seq: u64,
    size: u64,
    /// Bytes of the segment's base records: it rolls over once as much again was appended.
    base_bytes: u64,
    /// [`SEGMENT_BYTES`]; tests make it small to roll over often.
    segment_bytes: u64,
    /// Set by a failed write or fsync: what is on disk is then unknown, and nothing more is
    /// appended until the log is reopened (replayed from what the file holds).
    failed: bool,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .field("seq", &self.seq)
            .field("size", &self.size)
            .field("failed", &self.failed)
            .finish()
    }
}

impl Wal {
    /// Whether `dir` holds a log. A segment is renamed into place only once its base records
    /// are written and fsynced, so a segment file is a log (or a corrupt one, which open
    /// refuses).
    pub fn exists(disk: &Disk, dir: &Path) -> Result<bool> {
        Ok(!Self::segments(disk, dir)?.is_empty())
    }

    fn segments(disk: &Disk, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
        let paths = match disk.list_dir(dir) {
            Ok(paths) => paths,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("list the log directory", dir)(e)),
        };
        let mut segments = Vec::new();
        for path in paths {
            let Some(seq) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".wal"))
                .and_then(|n| u64::from_str_radix(n, 16).ok())
            else {
                continue;
            };
            segments.push((seq, path));
        }
        segments.sort();
        Ok(segments)
    }

    /// Removes files a crash left half-written (`*.tmp`: a segment or a snapshot that was
    /// never renamed into place).
    fn remove_temporaries(disk: &Disk, dir: &Path) -> Result<()> {
        let paths = disk
            .list_dir(dir)
            .map_err(io("list the log directory", dir))?;
        for path in paths {
            if path.extension().is_some_and(|e| e == "tmp") {
                disk.remove_file(&path)
                    .map_err(io("remove a half-written file", &path))?;
            }
        }
        Ok(())
    }

    /// Opens the log in `dir`, replaying its newest segment; creates it, holding `log` (e.g.
    /// an empty one), when there is none. A torn last record is cut off; corruption anywhere
    /// else is an error that leaves the files as they are.
    pub fn open(
        disk: &Disk,
        dir: &Path,
        log: impl FnOnce() -> Result<MemLog>,
    ) -> Result<(Self, MemLog)> {
        disk.create_dir_all(dir)
            .map_err(io("create the log directory", dir))?;
        // The directory's own entry must survive a power loss as well as the files in it.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(disk, parent)?;
        }
        Self::remove_temporaries(disk, dir)?;
        let segments = Self::segments(disk, dir)?;
        let Some(((seq, path), older)) = segments.split_last() else {
            let mem = log()?;
            let wal = Self::create_segment(disk, dir, 0, &mem)?;
            return Ok((wal, mem));
        };
        let bytes = disk.read(path).map_err(io("read a log segment", path))?;
        let Replayed {
            log: mem,
            end,
            torn,
        } = replay(path, &bytes)?;
        let mut file = disk
            .open_write(path)
            .map_err(io("open a log segment", path))?;
        if torn {
            // Only the last record can be torn under the model (each commit is fsynced before
            // the next is written); damage beyond it (bit rot, a disk that lies about fsync)
            // would be cut as well. The cut bytes are kept beside the segment, fsynced, before
            // the cut, so nothing is ever lost for good without a trace.
            let kept = path.with_file_name(format!(
                "{}.torn-{end}",
                path.file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("segment")
            ));
            let mut torn_file = disk
                .create(&kept)
                .map_err(io("keep the torn tail of the log", &kept))?;
            torn_file
                .write_all(&bytes[end..])
                .and_then(|()| torn_file.sync_all())
                .map_err(io("keep the torn tail of the log", &kept))?;
            sync_dir(disk, dir)?;
            tracing::error!(
                segment = %path.display(),
                kept = end,
                dropped = bytes.len() - end,
                saved_to = %kept.display(),
                "the log ends in a torn record (a crash during a write); it is cut off, the cut \
                 bytes saved beside it"
            );
            metrics::counter!("longhaul_log_torn_tails_total").increment(1);
            file.set_len(end as u64)
                .map_err(io("cut a torn record off the log", path))?;
        }
        // What replay read may have been only in the page cache (a crash after a write, before
        // its fsync): make it durable before anything builds on it or an older segment goes.
        file.sync_all().map_err(io("fsync the log segment", path))?;
        sync_dir(disk, dir)?;
        file.seek_to(end as u64)
            .map_err(io("open a log segment", path))?;
        for (_, older) in older {
            disk.remove_file(older)
                .map_err(io("remove an old log segment", older))?;
        }
        let wal = Self {
            disk: disk.clone(),
            dir: dir.to_owned(),
            path: path.clone(),
            file,
            seq: *seq,
            size: end as u64,
            // Not known after a restart; the segment is at least this large.
            base_bytes: 0,
            segment_bytes: SEGMENT_BYTES,
            failed: false,
        };
        wal.remove_unused_snapshots(&mem.snapshot)?;
        Ok((wal, mem))
    }

    /// Writes a new segment holding `mem` in its base records: written to a temporary file,
    /// fsynced, renamed into place, and the directory fsynced, so a segment file always holds
    /// a whole base.
    fn create_segment(disk: &Disk, dir: &Path, seq: u64, mem: &MemLog) -> Result<Self> {
        let path = dir.join(segment_name(seq));
        let tmp = path.with_extension("wal.tmp");
        let mut bytes = Vec::new();
        for ops in mem.base() {
            bytes.extend(record(&ops)?);
        }
        let mut file = disk
            .create(&tmp)
            .map_err(io("create a log segment", &tmp))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(io("write a log segment", &tmp))?;
        disk.rename(&tmp, &path)
            .map_err(io("rename a new log segment", &path))?;
        sync_dir(disk, dir)?;
        Ok(Self {
            disk: disk.clone(),
            dir: dir.to_owned(),
            path,
            file,
            seq,
            size: bytes.len() as u64,
            base_bytes: bytes.len() as u64,
            segment_bytes: SEGMENT_BYTES,
            failed: false,
        })
    }

    /// Rolls over once this many bytes were appended to a segment (and at least as many as
    /// its base holds), instead of [`SEGMENT_BYTES`]: tests roll over often this way.
    #[cfg(test)]
    pub fn set_segment_bytes(&mut self, bytes: u64) {
        self.segment_bytes = bytes;
    }

    /// Appends one record of `ops` and fsyncs it. After a failed write or fsync the log
    /// refuses every commit: what reached the disk is unknown until it is reopened.
    pub fn commit(&mut self, ops: &[LogOp]) -> Result<()> {
        if self.failed {
            return Err(StorageError::LogFailed);
        }
        let bytes = record(ops)?;
        let path = &self.path;
        if let Err(error) = self.file.write_all(&bytes) {
            self.failed = true;
            // Best effort: take a partial record back off the end.
            let _ = self.file.set_len(self.size);
            return Err(io("append to the log", path)(error));
        }
        // The fsync is what every acknowledged write waits for.
        let started = std::time::Instant::now();
        if let Err(error) = self.file.sync_data() {
            self.failed = true;
            tracing::error!(
                %error,
                segment = %path.display(),
                "fsync of the raft log failed: nothing more is written; restart the replica"
            );
            return Err(io("fsync the log", path)(error));
        }
        metrics::histogram!("longhaul_fsync_seconds").record(started.elapsed().as_secs_f64());
        self.size += bytes.len() as u64;
        Ok(())
    }

    /// Once as many bytes were appended to the segment as its base holds, and at least
    /// [`SEGMENT_BYTES`], starts the next one with `mem` (the log as committed) as its base and
    /// deletes the full one. The rewrite is then paid for by what was appended: O(1) per byte
    /// however long the log is.
    pub fn roll_over_if_full(&mut self, mem: &MemLog) -> Result<()> {
        let appended = self.size.saturating_sub(self.base_bytes);
        if appended < self.segment_bytes.max(self.base_bytes) {
            return Ok(());
        }
        let old = self.path.clone();
        let segment_bytes = self.segment_bytes;
        *self = Self::create_segment(&self.disk, &self.dir, self.seq + 1, mem)?;
        self.segment_bytes = segment_bytes;
        self.disk
            .remove_file(&old)
            .map_err(io("remove a full log segment", &old))?;
        metrics::counter!("longhaul_log_segments_total").increment(1);
        Ok(())
    }

    fn snapshot_path(&self, meta: &SnapshotMetadata) -> PathBuf {
        self.dir.join(snapshot_name(meta))
    }

    /// Writes snapshot data for `meta` into its own file and fsyncs it (and the directory), so
    /// a record may name it.
    pub fn write_snapshot(&self, meta: &SnapshotMetadata, data: &[u8]) -> Result<()> {
        Self::write_snapshot_in(&self.disk, &self.dir, meta, data)
    }

    /// [`Wal::write_snapshot`] for a log directory not opened yet.
    pub fn write_snapshot_in(
        disk: &Disk,
        dir: &Path,
        meta: &SnapshotMetadata,
        data: &[u8],
    ) -> Result<()> {
        let path = dir.join(snapshot_name(meta));
        let tmp = path.with_extension("tmp");
        let mut file = disk
            .create(&tmp)
            .map_err(io("create a snapshot file", &tmp))?;
        file.write_all(data)
            .and_then(|()| file.sync_all())
            .map_err(io("write a snapshot file", &tmp))?;
        disk.rename(&tmp, &path)
            .map_err(io("rename a snapshot file", &path))?;
        sync_dir(disk, dir)
    }

    /// The data of the snapshot with this metadata.
    pub fn read_snapshot(&self, meta: &SnapshotMetadata) -> Result<Vec<u8>> {
        let path = self.snapshot_path(meta);
        self.disk
            .read(&path)
            .map_err(io("read the stored snapshot", &path))
    }

    /// Removes snapshot files other than the one for `keep` (older ones, and any written for a
    /// commit that did not happen).
    pub fn remove_unused_snapshots(&self, keep: &SnapshotMetadata) -> Result<()> {
        let keep = (keep.index != 0).then(|| snapshot_name(keep));
        let paths = self
            .disk
            .list_dir(&self.dir)
            .map_err(io("list the log directory", &self.dir))?;
        for path in paths {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.starts_with("snap-") && Some(name) != keep.as_deref() {
                self.disk
                    .remove_file(&path)
                    .map_err(io("remove an old snapshot", &path))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "wal_proptests.rs"]
mod proptests;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use std::fs::OpenOptions;
    use std::io::Write as _;

    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: vec![index as u8; 40].into(),
            ..Entry::default()
        }
    }

    fn segment_files(dir: &Path) -> Vec<PathBuf> {
        Wal::segments(&Disk::Os, dir)
            .unwrap()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    #[test]
    fn records_round_trip_every_op() {
        let mut meta = SnapshotMetadata {
            index: 7,
            term: 2,
            ..SnapshotMetadata::default()
        };
        meta.mut_conf_state().voters = vec![1, 2, 3];
        let ops = vec![
            LogOp::Reset { index: 3, term: 1 },
            LogOp::Append(vec![entry(4, 1), entry(5, 2)]),
            LogOp::Compact { index: 4, term: 1 },
            LogOp::HardState(HardState {
                term: 2,
                vote: 3,
                commit: 5,
                ..HardState::default()
            }),
            LogOp::Snapshot(meta),
        ];
        let bytes = record(&ops).unwrap();
        let (payloads, end, tail) = scan(&bytes).unwrap();
        assert_eq!((end, tail), (bytes.len(), Tail::Clean));
        assert_eq!(Reader(payloads[0].1).ops().unwrap(), ops);
    }

    #[test]
    fn a_torn_tail_ends_the_log_at_the_last_whole_record_and_corruption_before_data_is_an_error() {
        let one = record(&[LogOp::Append(vec![entry(1, 1)])]).unwrap();
        let two = record(&[LogOp::Append(vec![entry(2, 1)])]).unwrap();
        let three = record(&[LogOp::Append(vec![entry(3, 1)])]).unwrap();
        let whole = [one.clone(), two.clone()].concat();
        for cut in 1..two.len() {
            let (payloads, end, tail) = scan(&whole[..one.len() + cut]).unwrap();
            assert_eq!(
                (payloads.len(), end, tail),
                (1, one.len(), Tail::Torn),
                "cut at {cut}"
            );
        }
        // The last record's payload never reached the disk, the file's length did.
        let mut zeroed_payload = whole.clone();
        zeroed_payload[one.len() + HEADER_BYTES..].fill(0);
        assert_eq!(scan(&zeroed_payload).unwrap().1, one.len());
        // Zeroes after the end (an extended file) are not a record.
        let zeroed = [whole.clone(), vec![0; 64]].concat();
        assert_eq!(scan(&zeroed).unwrap().1, whole.len());
        // A flipped byte in the last record: torn. In a record that others follow: corrupt.
        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(scan(&flipped).unwrap().1, one.len());
        let mut middle = [one.clone(), two.clone(), three].concat();
        middle[one.len() + HEADER_BYTES + 3] ^= 1;
        assert_eq!(scan(&middle).unwrap_err().0, one.len());
    }

    /// A segment of `records`, then the record `torn` of which only the bytes `kept` survived
    /// a power loss (zeroes elsewhere; `kept` gets the offset in the file and in the record),
    /// as written through `Wal` to a file in `dir`. Returns the log as committed before the
    /// torn record.
    fn segment_with_torn_record(
        dir: &Path,
        records: usize,
        torn: &[LogOp],
        kept: impl Fn(usize, usize) -> bool,
    ) -> MemLog {
        let (mut wal, mut mem) = Wal::open(&Disk::Os, dir, || Ok(MemLog::default())).unwrap();
        for index in 1..=records as u64 {
            let op = LogOp::Append(vec![entry(index, 1)]);
            mem.apply(op.clone()).unwrap();
            wal.commit(&[op]).unwrap();
        }
        let path = wal.path.clone();
        drop(wal);
        let mut bytes = std::fs::read(&path).unwrap();
        let start = bytes.len();
        bytes.extend(record(torn).unwrap());
        for (offset, byte) in bytes.iter_mut().enumerate().skip(start) {
            if !kept(offset, offset - start) {
                *byte = 0;
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        mem
    }

    /// Found by the power-loss test: a power loss during an append kept a later sector of the
    /// record and lost the one with its header. Open took the zero length with data after it
    /// for corruption and refused the store, though nothing acknowledged was lost (and after a
    /// power cut to the whole cluster, every replica would have refused).
    #[test]
    fn a_torn_last_record_whose_header_sector_was_lost_is_cut_off_not_taken_for_corruption() {
        let big = Entry {
            index: 3,
            term: 1,
            data: vec![0x5a; 1500].into(),
            ..Entry::default()
        };
        let torn = [LogOp::Append(vec![big])];
        // The sector holding the header lost, the next ones kept.
        let dir = tempfile::tempdir().unwrap();
        let mem = segment_with_torn_record(dir.path(), 2, &torn, |offset, _| offset >= 512 * 2);
        let (_wal, replayed) = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap();
        assert_eq!(replayed, mem);

        // The header torn inside: the second byte of its length lost, so the length it gives
        // ends the record early, before more of its bytes.
        let dir = tempfile::tempdir().unwrap();
        let mem = segment_with_torn_record(dir.path(), 2, &torn, |_, in_record| in_record != 1);
        let (_wal, replayed) = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap();
        assert_eq!(replayed, mem);
        // Appends after the reopen go where the torn record began.
        drop(_wal);
        let (mut wal, _) = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap();
        wal.commit(&[LogOp::Append(vec![entry(3, 2)])]).unwrap();
        drop(wal);
        let (_wal, replayed) = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap();
        assert_eq!(replayed.get(3).unwrap().term, 2);
    }

    /// Found by the proptests (and the fuzz target): an append whose entries reach index
    /// u64::MAX, in a record whose checksum holds, made replay panic on the overflow of the
    /// range it checked the indexes against.
    #[test]
    fn a_record_appending_at_the_last_index_there_is_replays_without_overflowing() {
        let at = |index| Entry {
            index,
            term: 1,
            ..Entry::default()
        };
        let base = record(&[LogOp::Reset {
            index: u64::MAX - 1,
            term: 1,
        }])
        .unwrap();
        let last = record(&[LogOp::Append(vec![at(u64::MAX)])]).unwrap();
        let replayed = replay(Path::new("s"), &[base.clone(), last].concat()).unwrap();
        assert_eq!(replayed.log.last_index(), u64::MAX);
        let past = record(&[LogOp::Append(vec![at(u64::MAX), at(u64::MAX)])]).unwrap();
        let error = replay(Path::new("s"), &[base, past].concat()).unwrap_err();
        assert!(
            matches!(error, StorageError::CorruptSegment { reason, .. } if reason.contains("does not fit")),
            "{error}"
        );
    }

    /// Review finding while fixing the above: a record in the middle whose length was
    /// corrupted to run past the end of the file was taken for a torn tail, and open cut off
    /// every acknowledged record after it.
    #[test]
    fn a_record_whose_length_runs_past_the_file_before_whole_records_is_refused() {
        let one = record(&[LogOp::Append(vec![entry(1, 1)])]).unwrap();
        let two = record(&[LogOp::Append(vec![entry(2, 1)])]).unwrap();
        let three = record(&[LogOp::Append(vec![entry(3, 1)])]).unwrap();
        let mut bytes = [one.clone(), two, three].concat();
        bytes[one.len() + 2] = 0x10;
        assert_eq!(
            scan(&bytes).unwrap_err(),
            (one.len(), Bad::CutShort.followed())
        );
        // The same length at the end of the file is a torn tail.
        let mut last = [
            one.clone(),
            record(&[LogOp::Append(vec![entry(2, 1)])]).unwrap(),
        ]
        .concat();
        last[one.len() + 2] = 0x10;
        assert_eq!(scan(&last).unwrap().1, one.len());
    }

    #[test]
    fn replay_applies_appends_overwrites_and_compaction_and_cuts_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, mut mem) =
            Wal::open(&Disk::Os, dir.path(), || Ok(MemLog::default())).unwrap();
        let mut commit = |ops: Vec<LogOp>| {
            for op in ops.clone() {
                mem.apply(op).unwrap();
            }
            wal.commit(&ops).unwrap();
        };
        commit(vec![LogOp::Append((1..=5).map(|i| entry(i, 1)).collect())]);
        commit(vec![LogOp::Append(vec![entry(4, 2), entry(5, 2)])]);
        commit(vec![LogOp::Compact { index: 2, term: 1 }]);
        let path = segment_files(dir.path())[0].clone();
        let len = std::fs::metadata(&path).unwrap().len();
        // A torn append after them.
        let torn = record(&[LogOp::Append(vec![entry(6, 2)])]).unwrap();
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&torn[..torn.len() - 3]).unwrap();
        drop(file);

        let (mut wal, replayed) = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap();
        assert_eq!(replayed.truncated, (2, 1));
        let got: Vec<(u64, u64)> = replayed.entries.iter().map(|e| (e.index, e.term)).collect();
        assert_eq!(got, vec![(3, 1), (4, 2), (5, 2)]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
        // The cut bytes are kept beside the segment, not lost without a trace.
        let saved = path.with_file_name(format!(
            "{}.torn-{len}",
            path.file_name().unwrap().to_str().unwrap()
        ));
        assert_eq!(std::fs::read(&saved).unwrap(), &torn[..torn.len() - 3]);

        // Appends after a reopen go after the last whole record.
        wal.commit(&[LogOp::Append(vec![entry(6, 3)])]).unwrap();
        drop(wal);
        let (_wal, replayed) = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap();
        assert_eq!(replayed.last_index(), 6);
        assert_eq!(replayed.get(6).unwrap().term, 3);
        assert_eq!(replayed.get(3).unwrap().term, 1);
    }

    #[test]
    fn a_full_segment_rolls_over_to_one_that_restates_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, mut mem) =
            Wal::open(&Disk::Os, dir.path(), || Ok(MemLog::default())).unwrap();
        // Entries of ~1 MiB: the segment fills after ~64 of them.
        let big = |index| Entry {
            index,
            term: 1,
            data: vec![0xab; 1 << 20].into(),
            ..Entry::default()
        };
        for index in 1..=70 {
            let ops = vec![LogOp::Append(vec![big(index)])];
            mem.apply(ops[0].clone()).unwrap();
            if index % 10 == 0 {
                let compact = LogOp::Compact { index, term: 1 };
                mem.apply(compact.clone()).unwrap();
                wal.commit(&[ops[0].clone(), compact]).unwrap();
            } else {
                wal.commit(&ops).unwrap();
            }
            wal.roll_over_if_full(&mem).unwrap();
        }
        let segments = segment_files(dir.path());
        assert_eq!(segments.len(), 1, "the full segment is deleted");
        assert!(segments[0].ends_with(segment_name(1)));
        drop(wal);
        let (_wal, replayed) = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap();
        assert_eq!(replayed, mem);
    }

    #[test]
    fn a_rollover_cut_short_leaves_the_full_segment_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, mut mem) =
            Wal::open(&Disk::Os, dir.path(), || Ok(MemLog::default())).unwrap();
        let op = LogOp::Append(vec![entry(1, 1)]);
        mem.apply(op.clone()).unwrap();
        wal.commit(&[op]).unwrap();
        drop(wal);
        // A rollover that died while writing the next segment, before its rename.
        std::fs::write(dir.path().join("0000000000000001.wal.tmp"), [7, 0, 0, 0, 1]).unwrap();
        let (_wal, replayed) = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap();
        assert_eq!(replayed, mem);
        assert_eq!(segment_files(dir.path()).len(), 1);
        assert!(!dir.path().join("0000000000000001.wal.tmp").exists());
    }

    /// Review finding: a corrupt record that whole records follow is not a torn tail; cutting
    /// it off would drop acknowledged entries and the vote after it.
    #[test]
    fn corruption_in_the_middle_of_a_segment_is_refused_and_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, mut mem) =
            Wal::open(&Disk::Os, dir.path(), || Ok(MemLog::default())).unwrap();
        let base_len = wal.size as usize;
        let mut commit = |ops: Vec<LogOp>| {
            for op in ops.clone() {
                mem.apply(op).unwrap();
            }
            wal.commit(&ops).unwrap();
        };
        commit(vec![LogOp::Append(vec![entry(1, 1)])]);
        commit(vec![LogOp::Append(vec![entry(2, 1)])]);
        commit(vec![
            LogOp::Append(vec![entry(3, 2)]),
            LogOp::HardState(HardState {
                term: 2,
                vote: 3,
                ..HardState::default()
            }),
        ]);
        drop(wal);
        let path = dir.path().join(segment_name(0));
        let mut bytes = std::fs::read(&path).unwrap();
        let first_len = record(&[LogOp::Append(vec![entry(1, 1)])]).unwrap().len();
        bytes[base_len + first_len + HEADER_BYTES + 20] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let error = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap_err();
        assert!(
            matches!(error, StorageError::CorruptSegment { offset, .. } if offset == base_len + first_len),
            "{error}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "the segment was changed"
        );
    }

    /// Review finding: a corrupt base in the only segment must not become a fresh, empty log
    /// (which would forget the term and vote).
    #[test]
    fn a_corrupt_base_is_refused_not_replaced_by_an_empty_log() {
        let dir = tempfile::tempdir().unwrap();
        let voted = MemLog {
            hard_state: HardState {
                term: 7,
                vote: 2,
                ..HardState::default()
            },
            ..MemLog::default()
        };
        drop(Wal::open(&Disk::Os, dir.path(), || Ok(voted.clone())).unwrap());
        let path = dir.path().join(segment_name(0));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_BYTES + 2] ^= 1;
        bytes.extend(record(&[LogOp::Append(vec![entry(1, 7)])]).unwrap());
        std::fs::write(&path, &bytes).unwrap();
        assert!(Wal::open(&Disk::Os, dir.path(), || Ok(MemLog::default())).is_err());
        assert!(path.exists());
    }

    /// Review finding: with a log longer than a segment, each rollover must be paid for by as
    /// many appended bytes, not happen on every commit.
    #[test]
    fn a_log_longer_than_a_segment_rolls_over_only_after_as_much_again_was_appended() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, mut mem) =
            Wal::open(&Disk::Os, dir.path(), || Ok(MemLog::default())).unwrap();
        let big = |index| Entry {
            index,
            term: 1,
            data: vec![0xcd; 4 << 20].into(),
            ..Entry::default()
        };
        // Never compacted: 88 MiB of log, more than a segment.
        for index in 1..=22 {
            let op = LogOp::Append(vec![big(index)]);
            mem.apply(op.clone()).unwrap();
            wal.commit(&[op]).unwrap();
            wal.roll_over_if_full(&mem).unwrap();
        }
        assert_eq!(wal.seq, 1, "one rollover after 64 MiB, not one per commit");
        // The new segment's base is split over records of bounded size, and replays.
        drop(wal);
        let (_wal, replayed) = Wal::open(&Disk::Os, dir.path(), || unreachable!()).unwrap();
        assert_eq!(replayed, mem);
    }
}
