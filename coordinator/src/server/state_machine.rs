//! The coordinator's [`StateMachine`]: the pure [`ClusterState`] kept in
//! memory for reads, and persisted change by change into the store's
//! state-machine table in the same transaction as the applied index.
//!
//! Table layout (keys are UTF-8):
//! - `meta/revision` → the revision, 8 bytes little-endian;
//! - `entity/<key>` → the latest [`Change`] of an entity (JSON), e.g.
//!   `entity/site/north`, `entity/round/<job>/<round, 20 digits>`, and
//!   under it each report of the round,
//!   `…/<site>/<fragment, 10 digits>/contributed|applied`, written alone
//!   (O(1) bytes per report; the round's record is written at its opening,
//!   exclusions and abort); a removal removes the entity's key and the keys
//!   under it (the round and its reports, when it falls out of the rounds
//!   kept for its job);
//! - `history/<revision, 20 digits>/<n>` → the n-th [`Event`] of a revision
//!   (JSON), for watches that resume after a restart (`n` is not padded,
//!   so loading orders the events by the numbers, not by the keys).

use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use longhaul_core::state::{
    ApplyError, Change, ClusterState, DEFAULT_HISTORY_LIMIT, Event, Request,
};
use redb::{ReadTransaction, ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};

use crate::consensus::storage::STATE_MACHINE;
use crate::consensus::{BoxError, StateMachine};

const REVISION_KEY: &[u8] = b"meta/revision";
const ENTITY_PREFIX: &str = "entity/";
const HISTORY_PREFIX: &str = "history/";

/// What the proposer of a command learns once it is applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ApplyResponse {
    Applied { revision: u64 },
    Refused { error: ApplyError },
}

/// Shared, read-mostly view of the applied state.
#[derive(Debug, Clone, Default)]
pub struct SharedState(Arc<RwLock<ClusterState>>);

impl SharedState {
    /// A read guard. A poisoned lock means a panic mid-apply, which the node
    /// treats as fatal anyway; readers still see the last complete state.
    pub fn read(&self) -> RwLockReadGuard<'_, ClusterState> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn replace(&self, state: ClusterState) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = state;
    }

    fn apply(&self, request: &Request) -> Result<longhaul_core::state::Applied, ApplyError> {
        self.0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .apply(request)
    }
}

/// Events applied since the runtime last took them, for watchers.
#[derive(Debug, Clone, Default)]
pub struct AppliedEvents(Arc<Mutex<Vec<Event>>>);

impl AppliedEvents {
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    fn extend(&self, events: Vec<Event>) {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend(events);
    }
}

#[derive(Debug)]
pub struct CoordinatorStateMachine {
    state: SharedState,
    applied_events: AppliedEvents,
}

/// `serde_json::to_vec(&Event { revision, change })`, byte for byte, from the change's own
/// encoding (`change_json`): the same bytes without encoding the change a second time.
fn event_json(revision: u64, change_json: &[u8]) -> Vec<u8> {
    const HEAD: &[u8] = b"{\"revision\":";
    const MIDDLE: &[u8] = b",\"change\":";
    let revision = revision.to_string();
    let mut out =
        Vec::with_capacity(HEAD.len() + revision.len() + MIDDLE.len() + change_json.len() + 1);
    out.extend_from_slice(HEAD);
    out.extend_from_slice(revision.as_bytes());
    out.extend_from_slice(MIDDLE);
    out.extend_from_slice(change_json);
    out.push(b'}');
    out
}

fn history_key(revision: u64, n: usize) -> String {
    format!("{HISTORY_PREFIX}{revision:020}/{n}")
}

/// The (revision, n) of a history key, as numbers.
fn history_position(key: &[u8]) -> Result<(u64, u64), BoxError> {
    let corrupt = || format!("corrupt history key {:?}", String::from_utf8_lossy(key));
    let rest = std::str::from_utf8(&key[HISTORY_PREFIX.len()..]).map_err(|_| corrupt())?;
    let (revision, n) = rest.split_once('/').ok_or_else(corrupt)?;
    Ok((
        revision.parse().map_err(|_| corrupt())?,
        n.parse().map_err(|_| corrupt())?,
    ))
}

impl CoordinatorStateMachine {
    /// Loads the state persisted in the store (empty on a fresh store).
    pub fn load(txn: &ReadTransaction) -> Result<Self, BoxError> {
        let mut revision = 0;
        let mut entities = Vec::new();
        let mut history = Vec::new();
        match txn.open_table(STATE_MACHINE) {
            Ok(table) => {
                for item in table.iter()? {
                    let (key, value) = item?;
                    let key = key.value();
                    if key == REVISION_KEY {
                        let bytes: [u8; 8] = value
                            .value()
                            .try_into()
                            .map_err(|_| "corrupt revision in the state-machine table")?;
                        revision = u64::from_le_bytes(bytes);
                    } else if key.starts_with(ENTITY_PREFIX.as_bytes()) {
                        entities.push(serde_json::from_slice::<Change>(value.value())?);
                    } else if key.starts_with(HISTORY_PREFIX.as_bytes()) {
                        let event = serde_json::from_slice::<Event>(value.value())?;
                        history.push((history_position(key)?, event));
                    }
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(error) => return Err(error.into()),
        }
        // The keys' `n` is not zero-padded, so the table holds n = 10 before
        // n = 2: order by the numbers, as the events were applied.
        history.sort_by_key(|(position, _)| *position);
        Ok(Self {
            state: SharedState(Arc::new(RwLock::new(ClusterState::from_parts(
                revision,
                entities,
                history.into_iter().map(|(_, event)| event),
                DEFAULT_HISTORY_LIMIT,
            )))),
            applied_events: AppliedEvents::default(),
        })
    }

    pub fn shared(&self) -> SharedState {
        self.state.clone()
    }

    /// Where applied events collect until the runtime publishes them.
    pub fn applied_events(&self) -> AppliedEvents {
        self.applied_events.clone()
    }

    fn persist_all(txn: &WriteTransaction, state: &ClusterState) -> Result<(), BoxError> {
        // Dropping the table frees its pages at once; emptying it key by key would not.
        txn.delete_table(STATE_MACHINE)?;
        let mut table = txn.open_table(STATE_MACHINE)?;
        table.insert(REVISION_KEY, state.revision().to_le_bytes().as_slice())?;
        for change in state.entities() {
            if let Some(key) = change.key() {
                let key = format!("{ENTITY_PREFIX}{key}");
                table.insert(key.as_bytes(), serde_json::to_vec(&change)?.as_slice())?;
            }
        }
        let events = state.events_after(0).unwrap_or_default();
        let mut previous = 0;
        let mut n = 0;
        for event in events {
            n = if event.revision == previous { n + 1 } else { 0 };
            previous = event.revision;
            let key = history_key(event.revision, n);
            table.insert(key.as_bytes(), serde_json::to_vec(&event)?.as_slice())?;
        }
        Ok(())
    }
}

impl StateMachine for CoordinatorStateMachine {
    fn apply(
        &mut self,
        txn: &WriteTransaction,
        _index: u64,
        data: &[u8],
    ) -> Result<Vec<u8>, BoxError> {
        let started = std::time::Instant::now();
        let response = match serde_json::from_slice::<Request>(data) {
            Err(error) => ApplyResponse::Refused {
                error: ApplyError::invalid("command", format!("undecodable command: {error}")),
            },
            Ok(request) => match self.state.apply(&request) {
                Err(error) => ApplyResponse::Refused { error },
                Ok(applied) => {
                    let mut table = txn.open_table(STATE_MACHINE)?;
                    table.insert(REVISION_KEY, applied.revision.to_le_bytes().as_slice())?;
                    for (n, event) in applied.events.iter().enumerate() {
                        // The change is encoded once: the entity's value, and inside the
                        // history event.
                        let change = serde_json::to_vec(&event.change)?;
                        match (&event.change, event.change.key()) {
                            (change, Some(key)) if change.is_removal() => {
                                let key = format!("{ENTITY_PREFIX}{key}");
                                table.remove(key.as_bytes())?;
                                // And its parts (a round's reports): the keys
                                // from KEY/ up to KEY0, '0' following '/'.
                                let (start, end) = (format!("{key}/"), format!("{key}0"));
                                let mut parts = Vec::new();
                                for item in table.range(start.as_bytes()..end.as_bytes())? {
                                    parts.push(item?.0.value().to_vec());
                                }
                                for part in parts {
                                    table.remove(part.as_slice())?;
                                }
                            }
                            (_, Some(key)) => {
                                let key = format!("{ENTITY_PREFIX}{key}");
                                table.insert(key.as_bytes(), change.as_slice())?;
                            }
                            (_, None) => {}
                        }
                        let key = history_key(event.revision, n);
                        table.insert(
                            key.as_bytes(),
                            event_json(event.revision, &change).as_slice(),
                        )?;
                    }
                    for revision in applied.evicted {
                        let start = history_key(revision, 0);
                        let end = history_key(revision + 1, 0);
                        // Found first, then removed one by one: redb 2.6's `retain_in` copies
                        // the tree path of every key it deletes.
                        let mut evicted = Vec::new();
                        for item in table.range(start.as_bytes()..end.as_bytes())? {
                            evicted.push(item?.0.value().to_vec());
                        }
                        for key in evicted {
                            table.remove(key.as_slice())?;
                        }
                    }
                    self.applied_events.extend(applied.events);
                    ApplyResponse::Applied {
                        revision: applied.revision,
                    }
                }
            },
        };
        metrics::histogram!("longhaul_apply_seconds").record(started.elapsed().as_secs_f64());
        Ok(serde_json::to_vec(&response)?)
    }

    fn snapshot(&self, _txn: &ReadTransaction) -> Result<Vec<u8>, BoxError> {
        // The in-memory state is the applied state: the node snapshots right
        // after applying, under the same single-threaded loop.
        let started = std::time::Instant::now();
        let data = serde_json::to_vec(&*self.state.read())?;
        metrics::histogram!("longhaul_snapshot_serialize_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(data)
    }

    fn restore(&mut self, txn: &WriteTransaction, data: &[u8]) -> Result<(), BoxError> {
        let state: ClusterState = serde_json::from_slice(data)?;
        Self::persist_all(txn, &state)?;
        // Watchers are at most at the revision this replica had. The
        // snapshot's retained history after it is published as if applied,
        // in order, so live watches go on without a gap; where that history
        // no longer reaches back, the first event published comes after a
        // gap, and each watch fails with OUT_OF_RANGE instead of jumping.
        let before = self.state.read().revision();
        let caught_up: Vec<Event> = state
            .history()
            .filter(|event| event.revision > before)
            .cloned()
            .collect();
        self.state.replace(state);
        self.applied_events.extend(caught_up);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use longhaul_core::state::{Command, JobState, Placement};
    use longhaul_core::{JobSpec, Topology};

    use super::*;

    /// A job record as older releases stored it: the plan's JSON as a
    /// string inside the entity's JSON.
    fn legacy_job_entity() -> (Vec<u8>, longhaul_core::placement::Plan) {
        let topology = Topology::from_toml(
            "t.toml",
            include_str!("../../../deploy/examples/two-campuses-80km.toml"),
        )
        .unwrap();
        let spec = JobSpec::from_toml(
            "j.toml",
            include_str!("../../../deploy/examples/llama-70b.job.toml"),
        )
        .unwrap();
        let plan = longhaul_core::placement::place(&topology, &spec).unwrap();
        let mut state = ClusterState::default();
        state
            .apply(&Request::new(Command::SubmitJob {
                job_id: "llama".into(),
                spec,
                placement: Placement::Placed {
                    plan: Box::new(plan.clone()),
                },
            }))
            .unwrap();
        let record = state.job("llama").unwrap().clone();
        let mut value = serde_json::to_value(Change::Job { record }).unwrap();
        let placement = value
            .pointer_mut("/record/placement")
            .and_then(|p| p.as_object_mut())
            .unwrap();
        let typed = placement.remove("plan").unwrap();
        placement.insert("plan_json".into(), typed.to_string().into());
        (serde_json::to_vec(&value).unwrap(), plan)
    }

    /// The history's events are built from the entity's encoding; they must be exactly what
    /// encoding the event gives, so that `load` (and older readers) decode them alike.
    #[test]
    fn a_history_event_built_from_its_change_is_the_event_encoded() {
        let (_, plan) = legacy_job_entity();
        let mut state = ClusterState::default();
        let spec = JobSpec::from_toml(
            "j.toml",
            include_str!("../../../deploy/examples/llama-70b.job.toml"),
        )
        .unwrap();
        let mut events = Vec::new();
        for (job_id, placement) in [
            ("placed", Placement::placed(plan)),
            (
                "infeasible",
                Placement::Infeasible {
                    reason: "no \"site\" is up\n".into(),
                },
            ),
        ] {
            let applied = state
                .apply(&Request::new(Command::SubmitJob {
                    job_id: job_id.into(),
                    spec: spec.clone(),
                    placement,
                }))
                .unwrap();
            events.extend(applied.events);
        }
        events.extend(
            state
                .apply(&Request::new(Command::CancelJob {
                    job_id: "placed".into(),
                    at_unix_ms: 0,
                }))
                .unwrap()
                .events,
        );
        assert!(events.len() >= 3);
        for event in events {
            let change = serde_json::to_vec(&event.change).unwrap();
            assert_eq!(
                event_json(event.revision, &change),
                serde_json::to_vec(&event).unwrap()
            );
        }
        let large = Event {
            revision: u64::MAX,
            change: Change::MemberRemoved { member_id: 7 },
        };
        let change = serde_json::to_vec(&large.change).unwrap();
        assert_eq!(
            event_json(large.revision, &change),
            serde_json::to_vec(&large).unwrap()
        );
    }

    #[test]
    fn a_state_file_with_plans_stored_as_strings_loads_them_typed() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("state.redb")).unwrap();
        let (entity, plan) = legacy_job_entity();
        assert!(String::from_utf8_lossy(&entity).contains("plan_json"));
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(STATE_MACHINE).unwrap();
            table
                .insert(
                    format!("{ENTITY_PREFIX}job/llama").as_bytes(),
                    entity.as_slice(),
                )
                .unwrap();
            table
                .insert(REVISION_KEY, 1u64.to_le_bytes().as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
        let machine = CoordinatorStateMachine::load(&db.begin_read().unwrap()).unwrap();
        let state = machine.shared();
        let state = state.read();
        let job = state.job("llama").unwrap();
        assert_eq!(job.state, JobState::Placed);
        assert_eq!(job.placement.plan(), Some(&plan));
        assert_eq!(state.revision(), 1);
    }

    #[test]
    fn a_revision_of_more_than_ten_events_replays_in_order_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("state.redb")).unwrap();
        let events: Vec<Event> = (0..12)
            .map(|member_id| Event {
                revision: 1,
                change: Change::MemberRemoved { member_id },
            })
            .collect();
        let txn = db.begin_write().unwrap();
        {
            // As `apply` writes them: the n-th event of the revision at n.
            let mut table = txn.open_table(STATE_MACHINE).unwrap();
            for (n, event) in events.iter().enumerate() {
                let key = history_key(event.revision, n);
                table
                    .insert(
                        key.as_bytes(),
                        serde_json::to_vec(event).unwrap().as_slice(),
                    )
                    .unwrap();
            }
            table
                .insert(REVISION_KEY, 1u64.to_le_bytes().as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
        let machine = CoordinatorStateMachine::load(&db.begin_read().unwrap()).unwrap();
        let loaded: Vec<Event> = machine.shared().read().history().cloned().collect();
        assert_eq!(loaded, events);
    }
}

#[cfg(test)]
mod watch_tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use longhaul_core::state::Command;
    use tonic::Status;

    use super::*;

    fn noop() -> Request {
        Request::new(Command::Noop {
            payload: String::new(),
        })
    }

    /// Runs `follow_live` from `last` over `live` (then closed) and returns
    /// what it sent: revisions, or the status it ended with.
    async fn follow(
        state: &SharedState,
        last: u64,
        live: Vec<Event>,
    ) -> (Vec<u64>, Option<Status>) {
        let (events, rx) = tokio::sync::broadcast::channel(64);
        for event in live {
            events.send(event).unwrap();
        }
        drop(events);
        let (tx, mut out) = tokio::sync::mpsc::channel(64);
        super::super::service::follow_live(rx, state.clone(), last, &tx, |e| Some(e.revision))
            .await;
        drop(tx);
        let mut revisions = Vec::new();
        let mut ended = None;
        while let Some(item) = out.recv().await {
            match item {
                Ok(revision) => revisions.push(revision),
                Err(status) => ended = Some(status),
            }
        }
        (revisions, ended)
    }

    fn event(revision: u64) -> Event {
        Event {
            revision,
            change: Change::Noop,
        }
    }

    #[tokio::test]
    async fn every_change_of_a_revision_is_sent_not_only_its_first() {
        // A site marked down and the round it is excluded from share one
        // revision: both reach the watch, then the next revision.
        let state = SharedState::default();
        let (sent, _) = follow(&state, 0, vec![event(1), event(1), event(2), event(2)]).await;
        assert_eq!(sent, vec![1, 1, 2, 2]);
        // Copies of revisions already sent are not sent again.
        let (sent, _) = follow(&state, 1, vec![event(1), event(2), event(2), event(3)]).await;
        assert_eq!(sent, vec![2, 2, 3]);
    }

    #[tokio::test]
    async fn a_gap_in_the_live_feed_is_filled_from_the_history_or_fails_out_of_range() {
        let state = SharedState::default();
        for _ in 0..5 {
            state.apply(&noop()).unwrap();
        }
        let history: Vec<Event> = state.read().history().cloned().collect();
        // The live feed jumps from 1 to 5 (as after a snapshot install): the
        // watch sends 2, 3, 4, 5 from the history, in order.
        let (sent, ended) = follow(&state, 1, vec![history[4].clone()]).await;
        assert_eq!(sent, vec![2, 3, 4, 5]);
        assert_eq!(ended.map(|s| s.code()), Some(tonic::Code::Unavailable));

        // The history no longer reaches back: OUT_OF_RANGE, nothing skipped.
        let mut small = ClusterState::from_parts(0, Vec::new(), Vec::new(), 2);
        for _ in 0..5 {
            small.apply(&noop()).unwrap();
        }
        let state = SharedState::default();
        state.replace(small);
        let (sent, ended) = follow(&state, 1, vec![history[4].clone()]).await;
        assert!(sent.is_empty(), "{sent:?}");
        assert_eq!(ended.map(|s| s.code()), Some(tonic::Code::OutOfRange));
    }
}
