//! A simulated disk for the store's power-loss tests ([`Disk::Sim`](super::disk::Disk)): files
//! and directories in memory that remember what was written and what was fsynced, and that can
//! lose power at any fsync.
//!
//! **What the model assumes.** It follows POSIX, not one file system, and is harsher than
//! ext4's ordered mode:
//!
//! - A file's bytes and length are durable as of its last `fsync`/`fdatasync`
//!   ([`SimFile::sync`], the state store's `sync_data`). Everything written after it sits in the
//!   page cache, and a power loss keeps any subset of it, in any order: each torn piece of the
//!   file takes its content from any moment since the fsync (the fsynced content, or just
//!   after any later write that touched it), independently of the others. A piece is a sector
//!   (512 or 4096 bytes, aligned), or, in the harshest runs, a stretch of bytes cut at random
//!   offsets, so a write can be torn anywhere. Bytes no write touched never change (sqlite's
//!   "powersafe overwrite", which redb assumes too).
//! - The length after a power loss is any length the file had since its fsync; bytes past the
//!   fsynced length that no surviving write covers read as zeroes (never as another file's old
//!   data).
//! - A file's name is durable once its directory is fsynced, not when the file is: a created,
//!   renamed or removed name that no directory fsync followed may be undone. Each such change
//!   survives or not on its own, and those that survive are applied in the order they were
//!   made (a rename is atomic: the target names the old or the new file, never nothing). A
//!   file or directory whose name is lost is gone, with what it held.
//! - A process crash (SIGKILL) loses nothing the OS accepted: the files stay as written.
//!
//! It does not model a disk that lies about fsync, media corruption of fsynced data, or
//! failing writes; nor directories renamed across parents (the store never does that).
//!
//! The test marks each step of its workload ([`SimDisk::begin_step`]); at every fsync (before
//! it takes effect) the disk may, with a seeded chance, keep an [`Image`] of what a power loss
//! or a process crash at that moment would leave, labelled with the step in flight. The test
//! opens each image on a disk of its own ([`SimDisk::from_image`]) and checks what the store
//! recovers. Every choice is drawn from a [`SeedRng`], so a seed replays.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use longhaul_core::rng::SeedRng;
use redb::{DatabaseError, StorageBackend};

/// A simulated disk; see the module documentation.
#[derive(Debug)]
pub struct SimDisk {
    state: Mutex<State>,
}

/// What a crash at one moment left on the disk.
#[derive(Debug, Clone)]
pub struct Image {
    /// The workload step in flight ([`SimDisk::begin_step`]).
    pub step: usize,
    /// Whether the step was still running (the image was taken at one of its fsyncs) rather
    /// than over ([`SimDisk::capture_now`]).
    pub during_step: bool,
    pub kind: Crash,
    state: State,
}

impl Image {
    /// How the power loss tore unsynced writes (none for a process crash).
    pub fn tear(&self) -> Option<String> {
        self.state.tear.map(|tear| format!("{tear:?}"))
    }
}

/// How the store's process stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// The machine lost power: only what was fsynced is sure to be there.
    PowerLoss,
    /// The machine lost power, and of what each file was written since its fsync only the
    /// writes at its start (offset 0) reached the disk: the order hardest on a format that
    /// keeps its header there. Names are as written.
    PowerLossKeepingHeaders,
    /// The process was killed: the files are as it wrote them.
    Killed,
}

/// How a power loss tears what was written since the last fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tear {
    /// In whole, aligned sectors of this many bytes.
    Sectors(usize),
    /// Anywhere: each write cut at a few random offsets.
    Bytes,
}

#[derive(Debug, Clone)]
struct State {
    root: PathBuf,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    /// Every directory by its path, the root included.
    dirs: BTreeMap<PathBuf, Dir>,
    rng: SeedRng,
    /// The chance that an fsync keeps an image first (0: none).
    capture_chance: f64,
    /// The kind of crash such an image is of (`None`: a power loss or, one in five, a process
    /// crash).
    capture_kind: Option<Crash>,
    step: usize,
    images: Vec<Image>,
    /// How the power loss that left this state tore writes, if one did.
    tear: Option<Tear>,
    /// Set by [`SimDisk::power_off`]: every operation fails.
    off: bool,
}

#[derive(Debug, Clone, Default)]
struct Inode {
    /// What the OS shows.
    current: Vec<u8>,
    /// What the disk holds for sure: the content as of the last fsync.
    durable: Vec<u8>,
    /// Changes since then, in order.
    pending: Vec<FileOp>,
}

#[derive(Debug, Clone)]
enum FileOp {
    Write { offset: usize, bytes: Vec<u8> },
    SetLen(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    File(u64),
    Dir,
}

#[derive(Debug, Clone, Default)]
struct Dir {
    current: BTreeMap<OsString, Node>,
    durable: BTreeMap<OsString, Node>,
    pending: Vec<DirOp>,
}

#[derive(Debug, Clone)]
enum DirOp {
    Link(OsString, Node),
    Rename(OsString, OsString),
    Unlink(OsString),
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file or directory", path.display()),
    )
}

/// The directory and the name of `path`.
fn split(path: &Path) -> io::Result<(&Path, OsString)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name.to_owned())),
        _ => Err(not_found(path)),
    }
}

impl Inode {
    fn apply(&mut self, op: FileOp) {
        apply_op(&mut self.current, &op);
        self.pending.push(op);
    }

    fn sync(&mut self) {
        for op in self.pending.drain(..) {
            apply_op(&mut self.durable, &op);
        }
    }
}

fn apply_op(bytes: &mut Vec<u8>, op: &FileOp) {
    match op {
        FileOp::Write {
            offset,
            bytes: data,
        } => {
            let end = offset + data.len();
            if bytes.len() < end {
                resize(bytes, end);
            }
            bytes[*offset..end].copy_from_slice(data);
        }
        FileOp::SetLen(len) => resize(bytes, *len),
    }
}

/// `bytes.resize(len, 0)`, with the zeroes copied from a zeroed allocation: an unoptimized
/// `resize` writes them one at a time, which dominated the power-loss test's time.
fn resize(bytes: &mut Vec<u8>, len: usize) {
    if len <= bytes.len() {
        bytes.truncate(len);
    } else {
        bytes.extend_from_slice(&vec![0; len - bytes.len()]);
    }
}

impl Dir {
    fn change(&mut self, op: DirOp) {
        apply_dir_op(&mut self.current, &op);
        self.pending.push(op);
    }
}

fn apply_dir_op(entries: &mut BTreeMap<OsString, Node>, op: &DirOp) {
    match op {
        DirOp::Link(name, node) => {
            entries.insert(name.clone(), *node);
        }
        DirOp::Rename(from, to) => {
            if let Some(node) = entries.remove(from) {
                entries.insert(to.clone(), node);
            }
        }
        DirOp::Unlink(name) => {
            entries.remove(name);
        }
    }
}

impl State {
    fn dir(&self, path: &Path) -> io::Result<&Dir> {
        self.dirs.get(path).ok_or_else(|| not_found(path))
    }

    fn dir_mut(&mut self, path: &Path) -> io::Result<&mut Dir> {
        self.dirs.get_mut(path).ok_or_else(|| not_found(path))
    }

    fn file(&self, path: &Path) -> io::Result<u64> {
        let (parent, name) = split(path)?;
        match self.dir(parent)?.current.get(&name) {
            Some(Node::File(inode)) => Ok(*inode),
            _ => Err(not_found(path)),
        }
    }

    fn inode(&mut self, inode: u64) -> io::Result<&mut Inode> {
        self.inodes
            .get_mut(&inode)
            .ok_or_else(|| io::Error::other(format!("inode {inode} is gone")))
    }

    /// The file at `path`, created empty if it is not there.
    fn file_or_new(&mut self, path: &Path) -> io::Result<u64> {
        if let Ok(inode) = self.file(path) {
            return Ok(inode);
        }
        let (parent, name) = split(path)?;
        let inode = self.next_inode;
        self.dir_mut(parent)?
            .change(DirOp::Link(name, Node::File(inode)));
        self.next_inode += 1;
        self.inodes.insert(inode, Inode::default());
        Ok(inode)
    }

    /// Called before every fsync takes effect: maybe keep what a crash now would leave.
    fn capture_point(&mut self) {
        let chance = self.capture_chance;
        if chance > 0.0 && self.rng.chance(chance) {
            self.capture(true);
        }
    }

    fn capture(&mut self, during_step: bool) {
        let kind = match self.capture_kind {
            Some(kind) => kind,
            None if self.rng.chance(0.2) => Crash::Killed,
            None => Crash::PowerLoss,
        };
        let mut state = self.crash(kind);
        state.images.clear();
        self.images.push(Image {
            step: self.step,
            during_step,
            kind,
            state,
        });
    }

    fn crash(&mut self, kind: Crash) -> State {
        match kind {
            Crash::PowerLoss => self.power_loss(),
            Crash::Killed => self.as_written(),
            Crash::PowerLossKeepingHeaders => self.keeping_headers(),
        }
    }

    /// See [`Crash::PowerLossKeepingHeaders`].
    fn keeping_headers(&self) -> State {
        let mut state = self.as_written();
        for inode in state.inodes.values_mut() {
            let mut bytes = std::mem::take(&mut inode.durable);
            for op in &inode.pending {
                if matches!(op, FileOp::Write { offset: 0, .. }) {
                    apply_op(&mut bytes, op);
                }
            }
            inode.current = bytes.clone();
            inode.durable = bytes;
            inode.pending.clear();
        }
        for dir in state.dirs.values_mut() {
            dir.durable = dir.current.clone();
            dir.pending.clear();
        }
        state.capture_chance = 0.0;
        state
    }

    /// The disk as a killed process leaves it: everything written stays, fsynced or not.
    fn as_written(&self) -> State {
        State {
            root: self.root.clone(),
            inodes: self.inodes.clone(),
            next_inode: self.next_inode,
            dirs: self.dirs.clone(),
            rng: self.rng.clone(),
            capture_chance: 0.0,
            capture_kind: None,
            step: self.step,
            // Not the images kept so far: an image does not hold others.
            images: Vec::new(),
            tear: self.tear,
            off: false,
        }
    }

    /// The disk as a power loss now leaves it; see the module documentation.
    fn power_loss(&mut self) -> State {
        let tear = match self.rng.index(3) {
            0 => Tear::Sectors(512),
            1 => Tear::Sectors(4096),
            _ => Tear::Bytes,
        };
        // Names first: each change since its directory's fsync survives or not.
        let mut names: BTreeMap<PathBuf, BTreeMap<OsString, Node>> = BTreeMap::new();
        for (path, dir) in &self.dirs {
            let mut entries = dir.durable.clone();
            for op in &dir.pending {
                if self.rng.chance(0.5) {
                    apply_dir_op(&mut entries, op);
                }
            }
            names.insert(path.clone(), entries);
        }
        // Then what is still reachable from the root, with what its files hold.
        let mut dirs = BTreeMap::new();
        let mut reachable = BTreeSet::new();
        let mut stack = vec![self.root.clone()];
        while let Some(path) = stack.pop() {
            let entries = names.remove(&path).unwrap_or_default();
            for (name, node) in &entries {
                match node {
                    Node::File(inode) => {
                        reachable.insert(*inode);
                    }
                    Node::Dir => stack.push(path.join(name)),
                }
            }
            dirs.insert(
                path,
                Dir {
                    current: entries.clone(),
                    durable: entries,
                    pending: Vec::new(),
                },
            );
        }
        let mut inodes = BTreeMap::new();
        for inode in reachable {
            if let Some(file) = self.inodes.get(&inode) {
                let bytes = torn(file, tear, &mut self.rng);
                inodes.insert(
                    inode,
                    Inode {
                        current: bytes.clone(),
                        durable: bytes,
                        pending: Vec::new(),
                    },
                );
            }
        }
        State {
            root: self.root.clone(),
            inodes,
            next_inode: self.next_inode,
            dirs,
            rng: self.rng.clone(),
            capture_chance: 0.0,
            capture_kind: None,
            step: self.step,
            images: Vec::new(),
            tear: Some(tear),
            off: false,
        }
    }
}

/// The range of bytes an op changes, given the length before it.
fn touched(op: &FileOp, len_before: usize) -> (usize, usize) {
    match op {
        FileOp::Write { offset, bytes } => (*offset, offset + bytes.len()),
        FileOp::SetLen(len) => ((*len).min(len_before), (*len).max(len_before)),
    }
}

/// What a power loss leaves of one file: its fsynced content, with each torn piece of what was
/// written since taken as of a random moment since the fsync, and one of its lengths since.
fn torn(file: &Inode, tear: Tear, rng: &mut SeedRng) -> Vec<u8> {
    if file.pending.is_empty() {
        return file.durable.clone();
    }
    let mut lengths = vec![file.durable.len()];
    let mut ranges = Vec::new();
    for op in &file.pending {
        let before = lengths[lengths.len() - 1];
        let mut after = before;
        apply_len(&mut after, op);
        lengths.push(after);
        let range = touched(op, before);
        if range.0 < range.1 {
            ranges.push(range);
        }
    }
    let pieces: Vec<(usize, usize)> = match tear {
        Tear::Sectors(size) => {
            let mut starts = BTreeSet::new();
            for &(start, end) in &ranges {
                let mut sector = start / size * size;
                while sector < end {
                    starts.insert(sector);
                    sector += size;
                }
            }
            starts.into_iter().map(|s| (s, s + size)).collect()
        }
        Tear::Bytes => {
            let mut cuts = BTreeSet::new();
            for &(start, end) in &ranges {
                cuts.insert(start);
                cuts.insert(end);
                for _ in 0..rng.up_to(3) {
                    cuts.insert(rng.between(start as u64, end as u64) as usize);
                }
            }
            let cuts: Vec<usize> = cuts.into_iter().collect();
            cuts.windows(2)
                .map(|w| (w[0], w[1]))
                .filter(|&(a, _)| ranges.iter().any(|&(s, e)| s <= a && a < e))
                .collect()
        }
    };
    let length = lengths[rng.index(lengths.len())];
    let mut out = file.durable.clone();
    resize(&mut out, length);
    for (start, end) in pieces {
        // The moments this piece changed: after each op that touched it.
        let mut moments = vec![0];
        let mut len = file.durable.len();
        for (i, op) in file.pending.iter().enumerate() {
            let (s, e) = touched(op, len);
            if s < end && start < e {
                moments.push(i + 1);
            }
            apply_len(&mut len, op);
        }
        let moment = moments[rng.index(moments.len())];
        let content = piece_as_of(file, &file.pending[..moment], start, end);
        let stop = end.min(length);
        if start < stop {
            out[start..stop].copy_from_slice(&content[..stop - start]);
        }
    }
    out
}

fn apply_len(len: &mut usize, op: &FileOp) {
    match op {
        FileOp::Write { offset, bytes } => *len = (*len).max(offset + bytes.len()),
        FileOp::SetLen(new) => *len = *new,
    }
}

/// Bytes `start..end` of the file after `ops` (zeroes past its length then).
fn piece_as_of(file: &Inode, ops: &[FileOp], start: usize, end: usize) -> Vec<u8> {
    let mut piece = vec![0; end - start];
    let durable = &file.durable;
    if start < durable.len() {
        let stop = end.min(durable.len());
        piece[..stop - start].copy_from_slice(&durable[start..stop]);
    }
    let mut len = durable.len();
    for op in ops {
        match op {
            FileOp::Write { offset, bytes } => {
                let (s, e) = (start.max(*offset), end.min(offset + bytes.len()));
                if s < e {
                    piece[s - start..e - start].copy_from_slice(&bytes[s - offset..e - offset]);
                }
            }
            FileOp::SetLen(new) => {
                for i in start.max(*new)..end {
                    piece[i - start] = 0;
                }
            }
        }
        apply_len(&mut len, op);
    }
    for i in start.max(len)..end {
        piece[i - start] = 0;
    }
    piece
}

impl SimDisk {
    /// An empty disk holding only the directory `root` (durably), under which every path of
    /// the test lies. `seed` drives every choice the disk makes.
    pub fn new(root: &Path, seed: u64) -> Arc<Self> {
        let mut dirs = BTreeMap::new();
        dirs.insert(root.to_owned(), Dir::default());
        Arc::new(Self {
            state: Mutex::new(State {
                root: root.to_owned(),
                inodes: BTreeMap::new(),
                next_inode: 1,
                dirs,
                rng: SeedRng::new(seed),
                capture_chance: 0.0,
                capture_kind: None,
                step: 0,
                images: Vec::new(),
                tear: None,
                off: false,
            }),
        })
    }

    /// A disk holding what `image` holds, with its own seed.
    pub fn from_image(image: Image, seed: u64) -> Arc<Self> {
        let mut state = image.state;
        state.rng = SeedRng::new(seed);
        state.capture_chance = 0.0;
        state.capture_kind = None;
        state.images = Vec::new();
        Arc::new(Self {
            state: Mutex::new(state),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The disk, if it has power.
    fn on(&self) -> io::Result<MutexGuard<'_, State>> {
        let state = self.lock();
        if state.off {
            return Err(io::Error::other("the simulated disk has no power"));
        }
        Ok(state)
    }

    /// Cuts the power for good: every operation fails from now on. A test that is done with a
    /// crashed store's disk calls this before dropping the store, so that the store's clean
    /// close fails at once instead of writing to a disk nobody looks at again.
    pub fn power_off(&self) {
        self.lock().off = true;
    }

    /// From now on, each fsync first keeps an image with this chance.
    pub fn set_capture_chance(&self, chance: f64) {
        self.set_capture(chance, None);
    }

    /// [`SimDisk::set_capture_chance`], with images of crashes of `kind` (`None`: power losses
    /// and, one in five, process crashes).
    pub fn set_capture(&self, chance: f64, kind: Option<Crash>) {
        let mut state = self.lock();
        state.capture_chance = chance;
        state.capture_kind = kind;
    }

    /// Labels the images taken from now on with workload step `step`.
    pub fn begin_step(&self, step: usize) {
        self.lock().step = step;
    }

    /// With the capture chance, keeps an image of the disk between two steps.
    pub fn maybe_capture_between_steps(&self) {
        let mut state = self.lock();
        let chance = state.capture_chance;
        if chance > 0.0 && state.rng.chance(chance) {
            state.capture(false);
        }
    }

    /// Keeps an image of what `kind` of crash now would leave, whatever the capture chance.
    pub fn capture_now(&self, kind: Crash) -> Image {
        let mut state = self.lock();
        let taken = state.crash(kind);
        Image {
            step: state.step,
            during_step: false,
            kind,
            state: taken,
        }
    }

    /// The images kept so far, in the order they were taken.
    pub fn take_images(&self) -> Vec<Image> {
        std::mem::take(&mut self.lock().images)
    }

    pub fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.on()?;
        if !dir.starts_with(&state.root) {
            return Err(not_found(dir));
        }
        let mut missing: Vec<&Path> = dir
            .ancestors()
            .take_while(|a| !state.dirs.contains_key(*a))
            .collect();
        missing.reverse();
        for path in missing {
            let (parent, name) = split(path)?;
            state.dir_mut(parent)?.change(DirOp::Link(name, Node::Dir));
            state.dirs.insert(path.to_owned(), Dir::default());
        }
        Ok(())
    }

    pub fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.on()?;
        state.dir(dir)?;
        state.capture_point();
        let dir = state.dir_mut(dir)?;
        dir.durable = dir.current.clone();
        dir.pending.clear();
        Ok(())
    }

    pub fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let state = self.on()?;
        Ok(state
            .dir(dir)?
            .current
            .keys()
            .map(|name| dir.join(name))
            .collect())
    }

    pub fn exists(&self, path: &Path) -> bool {
        let state = self.lock();
        state.dirs.contains_key(path) || state.file(path).is_ok()
    }

    pub fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut state = self.on()?;
        let inode = state.file(path)?;
        Ok(state.inode(inode)?.current.clone())
    }

    pub fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.on()?;
        state.file(path)?;
        let (parent, name) = split(path)?;
        state.dir_mut(parent)?.change(DirOp::Unlink(name));
        Ok(())
    }

    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.on()?;
        state.file(from)?;
        let (parent, from_name) = split(from)?;
        let (to_parent, to_name) = split(to)?;
        if parent != to_parent {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the simulated disk renames within a directory only",
            ));
        }
        state
            .dir_mut(parent)?
            .change(DirOp::Rename(from_name, to_name));
        Ok(())
    }

    /// `File::create`: the file at `path`, created if missing, emptied if not.
    pub fn create(self: &Arc<Self>, path: &Path) -> io::Result<SimFile> {
        let mut state = self.on()?;
        let inode = state.file_or_new(path)?;
        state.inode(inode)?.apply(FileOp::SetLen(0));
        Ok(SimFile {
            disk: self.clone(),
            inode,
            position: 0,
        })
    }

    pub fn open_write(self: &Arc<Self>, path: &Path) -> io::Result<SimFile> {
        let inode = self.on()?.file(path)?;
        Ok(SimFile {
            disk: self.clone(),
            inode,
            position: 0,
        })
    }

    /// A redb backend on the file at `path`, created if missing (as `Database::create` does).
    pub fn backend(self: &Arc<Self>, path: &Path) -> Result<SimBackend, DatabaseError> {
        let inode = self.on()?.file_or_new(path)?;
        Ok(SimBackend {
            disk: self.clone(),
            inode,
        })
    }

    fn with_inode<T>(&self, inode: u64, f: impl FnOnce(&mut Inode) -> T) -> io::Result<T> {
        Ok(f(self.on()?.inode(inode)?))
    }

    fn sync_inode(&self, inode: u64) -> io::Result<()> {
        let mut state = self.on()?;
        state.inode(inode)?;
        state.capture_point();
        state.inode(inode)?.sync();
        Ok(())
    }
}

/// A file of the simulated disk open for writing.
#[derive(Debug)]
pub struct SimFile {
    disk: Arc<SimDisk>,
    inode: u64,
    position: usize,
}

impl SimFile {
    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let offset = self.position;
        self.disk.with_inode(self.inode, |file| {
            file.apply(FileOp::Write {
                offset,
                bytes: bytes.to_vec(),
            });
        })?;
        self.position += bytes.len();
        Ok(())
    }

    /// `fsync` or `fdatasync`: the file's bytes and length become durable (not its name).
    pub fn sync(&self) -> io::Result<()> {
        self.disk.sync_inode(self.inode)
    }

    pub fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.disk
            .with_inode(self.inode, |file| file.apply(FileOp::SetLen(len)))
    }

    pub fn seek_to(&mut self, offset: u64) {
        self.position = usize::try_from(offset).unwrap_or(usize::MAX);
    }
}

/// redb's storage on a file of the simulated disk.
#[derive(Debug)]
pub struct SimBackend {
    disk: Arc<SimDisk>,
    inode: u64,
}

impl StorageBackend for SimBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.disk
            .with_inode(self.inode, |file| file.current.len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, io::Error> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        self.disk.with_inode(self.inode, |file| {
            file.current
                .get(start..start.saturating_add(len))
                .map(<[u8]>::to_vec)
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))
        })?
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.disk
            .with_inode(self.inode, |file| file.apply(FileOp::SetLen(len)))
    }

    fn sync_data(&self, _eventual: bool) -> Result<(), io::Error> {
        self.disk.sync_inode(self.inode)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let offset = usize::try_from(offset).map_err(io::Error::other)?;
        self.disk.with_inode(self.inode, |file| {
            file.apply(FileOp::Write {
                offset,
                bytes: data.to_vec(),
            });
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn root() -> PathBuf {
        PathBuf::from("/sim")
    }

    /// Over many power losses, the outcomes for the bytes of `path` seen.
    fn outcomes(disk: &SimDisk, path: &Path, tries: usize) -> BTreeSet<Option<Vec<u8>>> {
        (0..tries)
            .map(|_| {
                let image = disk.capture_now(Crash::PowerLoss);
                SimDisk::from_image(image, 0).read(path).ok()
            })
            .collect()
    }

    #[test]
    fn fsynced_bytes_survive_every_power_loss_and_later_ones_survive_whole_torn_or_not_at_all() {
        let disk = SimDisk::new(&root(), 1);
        let path = root().join("file");
        let mut file = disk.create(&path).unwrap();
        disk.sync_dir(&root()).unwrap();
        file.write_all(&[1; 1000]).unwrap();
        file.sync().unwrap();
        file.write_all(&[2; 9000]).unwrap();
        let seen = outcomes(&disk, &path, 200);
        let synced = |bytes: &Vec<u8>| bytes.len() >= 1000 && bytes[..1000] == [1; 1000];
        assert!(
            seen.iter().all(|b| b.as_ref().is_some_and(synced)),
            "{seen:?}"
        );
        let whole: Vec<u8> = [vec![1; 1000], vec![2; 9000]].concat();
        assert!(
            seen.contains(&Some(whole.clone())),
            "the write never survived whole"
        );
        assert!(
            seen.contains(&Some(vec![1; 1000])),
            "the write always survived"
        );
        // Torn: some of the new bytes there, others zeroes, or the file shorter than written.
        assert!(
            seen.iter().flatten().any(|b| *b != whole && b.len() > 1000),
            "the write was never torn"
        );
        file.sync().unwrap();
        assert_eq!(outcomes(&disk, &path, 20), BTreeSet::from([Some(whole)]));
    }

    #[test]
    fn a_name_is_durable_only_once_its_directory_is_fsynced() {
        let disk = SimDisk::new(&root(), 2);
        let (tmp, path) = (root().join("a.tmp"), root().join("a"));
        let mut file = disk.create(&tmp).unwrap();
        file.write_all(b"whole").unwrap();
        file.sync().unwrap();
        // The file is fsynced, its name is not.
        let seen = outcomes(&disk, &tmp, 100);
        assert_eq!(seen, BTreeSet::from([None, Some(b"whole".to_vec())]));
        disk.sync_dir(&root()).unwrap();
        disk.rename(&tmp, &path).unwrap();
        // A rename not followed by a directory fsync may be undone, never half done.
        let mut names = BTreeSet::new();
        for _ in 0..100 {
            let after = SimDisk::from_image(disk.capture_now(Crash::PowerLoss), 0);
            names.insert((after.read(&tmp).ok(), after.read(&path).ok()));
        }
        let whole = Some(b"whole".to_vec());
        assert_eq!(
            names,
            BTreeSet::from([(whole.clone(), None), (None, whole.clone())])
        );
        disk.sync_dir(&root()).unwrap();
        assert_eq!(outcomes(&disk, &path, 20), BTreeSet::from([whole]));
    }

    #[test]
    fn a_process_crash_keeps_everything_written_and_only_fsyncs_survive_a_later_power_loss() {
        let disk = SimDisk::new(&root(), 3);
        let path = root().join("file");
        let mut file = disk.create(&path).unwrap();
        disk.sync_dir(&root()).unwrap();
        file.write_all(b"unsynced").unwrap();
        let killed = SimDisk::from_image(disk.capture_now(Crash::Killed), 0);
        assert_eq!(killed.read(&path).unwrap(), b"unsynced");
        let seen = outcomes(&killed, &path, 100);
        assert!(seen.contains(&Some(Vec::new())), "{seen:?}");
    }

    #[test]
    fn fsyncs_keep_images_labelled_with_the_step_in_flight() {
        let disk = SimDisk::new(&root(), 4);
        disk.set_capture_chance(1.0);
        disk.begin_step(7);
        let file = disk.create(&root().join("file")).unwrap();
        file.sync().unwrap();
        disk.sync_dir(&root()).unwrap();
        let images = disk.take_images();
        assert_eq!(images.len(), 2);
        assert!(images.iter().all(|i| i.step == 7 && i.during_step));
    }
}
