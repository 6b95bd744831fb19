//! Files replaced atomically and durably: the contents go to a temporary
//! file beside the target, which is fsynced, renamed over the target, and
//! the folder fsynced, so a crash leaves the old file or the new one, whole.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Distinguishes temporary files of one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary path beside `path`, unique to this process and call.
pub(crate) fn temp_beside(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.join(format!(
        ".{file_name}.tmp-{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Writes `contents` to a new file at `path` (which must not exist) and
/// fsyncs it.
pub(crate) fn write_synced(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let mut file = File::create_new(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

/// Makes renames in `dir` durable. Directories cannot be opened for syncing
/// on every platform; where they cannot, the rename's own guarantees stand.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Replaces `path` with `contents`, atomically and durably; on an error the
/// old file is left as it was and the temporary file removed.
pub(crate) fn replace(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let temp = temp_beside(path);
    let result = write_synced(&temp, contents).and_then(|()| std::fs::rename(&temp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    #[test]
    fn a_replaced_file_holds_the_new_contents_and_no_temporary_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        replace(&path, b"one").unwrap();
        replace(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[test]
    fn a_failed_replace_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        replace(&path, b"old").unwrap();
        // A non-empty directory where the file should be: the rename fails.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir_all(blocked.join("x")).unwrap();
        assert!(replace(&blocked, b"new").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let temps = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".tmp-")
            })
            .count();
        assert_eq!(temps, 0, "the temporary file is removed");
    }
}
