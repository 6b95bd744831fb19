//! [`Disk`], the one seam between the store and the file system.
//!
//! The daemon uses [`Disk::Os`]: each of its arms is exactly the call the store made before
//! the seam existed (the same open, write, `fdatasync`/`fsync`, directory `fsync`, rename and
//! unlink; the state file is redb's, through [`RepairingBackend`], which works around
//! crash-safety defects of redb 2), so the seam itself changes nothing the daemon does. The
//! store's own tests put a simulated disk under it instead (`Disk::Sim`,
//! `storage/sim_disk.rs`), which remembers what was written and what was fsynced and can lose
//! power; that variant exists only in test builds.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use redb::backends::FileBackend;
use redb::{Database, DatabaseError};

use super::redb_backend::RepairingBackend;

/// Where the store's files live: the operating system's file system, or (in tests) a
/// simulated disk.
#[derive(Debug, Clone)]
pub enum Disk {
    Os,
    #[cfg(test)]
    Sim(std::sync::Arc<super::sim_disk::SimDisk>),
}

impl Disk {
    pub fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        match self {
            Disk::Os => std::fs::create_dir_all(dir),
            #[cfg(test)]
            Disk::Sim(sim) => sim.create_dir_all(dir),
        }
    }

    /// Fsyncs a directory, which makes the names created, renamed and removed in it durable.
    pub fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        match self {
            Disk::Os => File::open(dir).and_then(|d| d.sync_all()),
            #[cfg(test)]
            Disk::Sim(sim) => sim.sync_dir(dir),
        }
    }

    /// The paths of the entries of `dir`, in no particular order.
    pub fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        match self {
            Disk::Os => std::fs::read_dir(dir)?
                .map(|item| item.map(|item| item.path()))
                .collect(),
            #[cfg(test)]
            Disk::Sim(sim) => sim.list_dir(dir),
        }
    }

    pub fn exists(&self, path: &Path) -> bool {
        match self {
            Disk::Os => path.exists(),
            #[cfg(test)]
            Disk::Sim(sim) => sim.exists(path),
        }
    }

    pub fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        match self {
            Disk::Os => std::fs::read(path),
            #[cfg(test)]
            Disk::Sim(sim) => sim.read(path),
        }
    }

    /// The first `len` bytes of the file at `path` (fewer if it is shorter).
    pub fn read_prefix(&self, path: &Path, len: usize) -> io::Result<Vec<u8>> {
        match self {
            Disk::Os => {
                let mut prefix = Vec::with_capacity(len);
                File::open(path)?
                    .take(len as u64)
                    .read_to_end(&mut prefix)?;
                Ok(prefix)
            }
            #[cfg(test)]
            Disk::Sim(sim) => sim.read(path).map(|mut bytes| {
                bytes.truncate(len);
                bytes
            }),
        }
    }

    pub fn remove_file(&self, path: &Path) -> io::Result<()> {
        match self {
            Disk::Os => std::fs::remove_file(path),
            #[cfg(test)]
            Disk::Sim(sim) => sim.remove_file(path),
        }
    }

    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match self {
            Disk::Os => std::fs::rename(from, to),
            #[cfg(test)]
            Disk::Sim(sim) => sim.rename(from, to),
        }
    }

    /// Opens `path` for writing, created if missing and emptied if not (`File::create`).
    pub fn create(&self, path: &Path) -> io::Result<DiskFile> {
        match self {
            Disk::Os => OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
                .map(DiskFile::Os),
            #[cfg(test)]
            Disk::Sim(sim) => sim.create(path).map(DiskFile::Sim),
        }
    }

    /// Opens an existing file for writing, as it is.
    pub fn open_write(&self, path: &Path) -> io::Result<DiskFile> {
        match self {
            Disk::Os => OpenOptions::new().write(true).open(path).map(DiskFile::Os),
            #[cfg(test)]
            Disk::Sim(sim) => sim.open_write(path).map(DiskFile::Sim),
        }
    }

    /// Opens (or creates) a redb database at `path`, as `Database::create` does (the file
    /// opened read-write, created if missing, locked by redb's `FileBackend`), through a
    /// [`RepairingBackend`]: see there for what it changes and why.
    ///
    /// With `fresh` (the store has no log yet, so the state file holds nothing of ours), a
    /// state file whose creation a crash cut short (not empty, no redb magic number) is
    /// emptied first, so that redb creates it again — under redb's own file lock, which the
    /// backend takes, so a second process opening the same store cannot empty a file the first
    /// is creating.
    pub fn open_database(&self, path: &Path, fresh: bool) -> Result<Database, DatabaseError> {
        let builder = redb::Builder::new();
        match self {
            Disk::Os => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)?;
                let backend = FileBackend::new(file)?;
                if fresh {
                    empty_if_unfinished(&backend, path)?;
                }
                builder.create_with_backend(RepairingBackend::new(backend))
            }
            #[cfg(test)]
            Disk::Sim(sim) => {
                let backend = sim.backend(path)?;
                if fresh {
                    empty_if_unfinished(&backend, path)?;
                }
                builder.create_with_backend(RepairingBackend::new(backend))
            }
        }
    }

    /// A handle that fsyncs the file at `path` (see [`StateFlush`]).
    pub fn state_flush(&self, path: &Path) -> io::Result<StateFlush> {
        match self {
            Disk::Os => File::open(path).map(|file| StateFlush(DiskFile::Os(file))),
            #[cfg(test)]
            Disk::Sim(sim) => sim
                .open_write(path)
                .map(|file| StateFlush(DiskFile::Sim(file))),
        }
    }
}

/// A file of the store open for writing.
#[derive(Debug)]
pub enum DiskFile {
    Os(File),
    #[cfg(test)]
    Sim(super::sim_disk::SimFile),
}

impl DiskFile {
    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            DiskFile::Os(file) => file.write_all(bytes),
            #[cfg(test)]
            DiskFile::Sim(file) => file.write_all(bytes),
        }
    }

    /// `fdatasync`: the data and what is needed to read it back (the length), not other
    /// metadata.
    pub fn sync_data(&self) -> io::Result<()> {
        match self {
            DiskFile::Os(file) => file.sync_data(),
            #[cfg(test)]
            DiskFile::Sim(file) => file.sync(),
        }
    }

    /// `fsync`. Neither this nor [`DiskFile::sync_data`] makes the file's name durable: that
    /// takes an fsync of its directory.
    pub fn sync_all(&self) -> io::Result<()> {
        match self {
            DiskFile::Os(file) => file.sync_all(),
            #[cfg(test)]
            DiskFile::Sim(file) => file.sync(),
        }
    }

    pub fn set_len(&self, len: u64) -> io::Result<()> {
        match self {
            DiskFile::Os(file) => file.set_len(len),
            #[cfg(test)]
            DiskFile::Sim(file) => file.set_len(len),
        }
    }

    /// Moves the position the next write goes to.
    pub fn seek_to(&mut self, offset: u64) -> io::Result<()> {
        match self {
            DiskFile::Os(file) => file.seek(SeekFrom::Start(offset)).map(|_| ()),
            #[cfg(test)]
            DiskFile::Sim(file) => {
                file.seek_to(offset);
                Ok(())
            }
        }
    }
}

/// A handle on the state file for flushing its pages ahead of the commit that makes them
/// durable ([`DiskStorage::stage_state_sync`](super::DiskStorage::stage_state_sync)); `Send`,
/// so the flush can run on another thread.
#[derive(Debug)]
pub struct StateFlush(DiskFile);

impl StateFlush {
    /// `fdatasync` of the state file.
    pub fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

/// redb's magic number, which starts every redb file. redb writes it into a new file only once
/// the rest of the file's initialization is durable.
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// Empties a state file that is not empty and has no redb magic number: redb sizes a new file
/// first and writes its magic number last, but refuses to open a file that is not empty and
/// has no magic number, so a crash (a power loss, or SIGKILL after that first `set_len`)
/// during a fresh store's first open left a store that never opened again.
fn empty_if_unfinished(backend: &impl redb::StorageBackend, path: &Path) -> io::Result<()> {
    let len = backend.len()?;
    if len == 0 {
        return Ok(());
    }
    let head = backend.read(0, REDB_MAGIC.len().min(len as usize))?;
    if head == REDB_MAGIC {
        return Ok(());
    }
    tracing::warn!(
        state_file = %path.display(),
        "the state file's creation was cut short by a crash (no redb header, no log yet); it is \
         created again"
    );
    backend.set_len(0)?;
    backend.sync_data(false)
}
