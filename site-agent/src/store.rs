//! What the agent remembers across restarts: the last coordinator revision
//! its assignment watch processed, and what it did for each job. Written
//! atomically (temporary file, fsync, rename, fsync of the directory), so a
//! crash leaves the old or the new file, never a mix.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const FILE: &str = "agent-state.json";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the state directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid agent state file: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: belongs to site {found:?}, but this agent is for site {expected:?}")]
    WrongSite {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the agent did for one job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Revision of the assignment last handled.
    pub revision: u64,
    pub ranks: u64,
    #[serde(default)]
    pub rendered_files: Vec<PathBuf>,
    /// The local scheduler's id for the submitted job, if submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_as: Option<String>,
}

/// The persisted state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentState {
    pub site_id: String,
    /// Every assignment up to this coordinator revision has been handled.
    pub last_revision: u64,
    pub jobs: BTreeMap<String, JobRecord>,
}

/// The state file of one agent.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// Opens (creating the directory) and loads the state, or starts empty.
    pub fn open(dir: &Path, site_id: &str) -> Result<(Self, AgentState), StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        let store = Self {
            dir: dir.to_path_buf(),
        };
        let path = store.path();
        let state = match std::fs::read(&path) {
            Ok(bytes) => {
                let state: AgentState =
                    serde_json::from_slice(&bytes).map_err(|source| StoreError::Parse {
                        path: path.clone(),
                        source,
                    })?;
                if state.site_id != site_id {
                    return Err(StoreError::WrongSite {
                        path,
                        found: state.site_id,
                        expected: site_id.to_string(),
                    });
                }
                state
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => AgentState {
                site_id: site_id.to_string(),
                ..AgentState::default()
            },
            Err(source) => return Err(StoreError::Read { path, source }),
        };
        Ok((store, state))
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Replaces the file with `state`, durably.
    pub fn save(&self, state: &AgentState) -> Result<(), StoreError> {
        let path = self.path();
        let write_error = |source| StoreError::Write {
            path: path.clone(),
            source,
        };
        let bytes =
            serde_json::to_vec_pretty(state).map_err(|e| write_error(std::io::Error::other(e)))?;
        crate::atomic::replace(&path, &bytes).map_err(write_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_belongs_to_one_site() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mut state) = Store::open(dir.path(), "north").unwrap();
        assert_eq!(state.last_revision, 0);
        state.last_revision = 42;
        state.jobs.insert(
            "llama".into(),
            JobRecord {
                revision: 40,
                ranks: 8,
                rendered_files: vec!["a.sbatch".into()],
                submitted_as: Some("17".into()),
            },
        );
        store.save(&state).unwrap();
        let (_, again) = Store::open(dir.path(), "north").unwrap();
        assert_eq!(again, state);
        let wrong = Store::open(dir.path(), "south").unwrap_err();
        assert!(
            wrong.to_string().contains("belongs to site \"north\""),
            "{wrong}"
        );
        std::fs::write(store.path(), b"{not json").unwrap();
        let garbage = Store::open(dir.path(), "north").unwrap_err();
        assert!(matches!(garbage, StoreError::Parse { .. }), "{garbage}");
    }
}
