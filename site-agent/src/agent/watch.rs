//! The assignment watch's decisions, sans-IO: which revision to resume
//! from, what each watch message means for the site's jobs, when the state
//! must be persisted, and when to open the watch again.
//!
//! **Nothing here makes a call, sleeps, reads a clock or renders a file.**
//! The watch task in `agent.rs` opens the stream when
//! [`Watch::poll_open`] says so, feeds each message to
//! [`Watch::handle_message`], and carries out the [`WatchEvent`]s: it hands
//! assignments to the handler (and the outcome back), removes jobs,
//! persists [`Watch::state`] and keeps the status board.
//!
//! The rules: the watch resumes after the last revision handled (persisted
//! in the agent's state directory), so after a reconnect or a restart
//! nothing is missed and nothing is handled twice. A job's assignment at or
//! below the revision already handled for it is a repeat (a full listing
//! repeats every job) and only moves the last revision. A watch from
//! revision 0 lists every current assignment; its sync point ends that
//! listing, and jobs it did not name no longer run here. A failed handler
//! still counts as handled: retrying cannot fix a rendering error, and the
//! job's next assignment tries again. History compacted past the revision
//! asked for means listing from scratch; any other failure, or the end of
//! the stream, moves to the next replica after a backoff.

use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

use longhaul_proto::v1 as pb;
use tonic::Code;

use super::backoff::Backoff;
use crate::store::{AgentState, JobRecord};

/// What happened, for the driver to carry out in this order.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// The replica in use failed or ended the stream: use the next.
    SwitchReplica,
    /// Hand this assignment to the handler, and its outcome to
    /// [`Watch::handle_assigned`].
    Assign(Box<pb::Assignment>),
    /// Tell the handler that `job_id` no longer runs here.
    Remove {
        job_id: String,
        record: JobRecord,
        why: Removal,
    },
    /// The assignment of `revision` was acted on (rendered, submitted or
    /// removed).
    Handled { revision: u64 },
    /// The state changed: persist [`Watch::state`] and show it.
    Persist,
}

/// Why a job no longer runs here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its assignment of `revision` removed it.
    Removed { revision: u64 },
    /// A full listing did not name it.
    NotListed,
}

/// What a failed attempt to open the watch led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenFailure {
    /// The history after `after` is compacted: list from scratch, at once.
    Compacted { after: u64 },
    /// Try the next replica after a backoff.
    NextReplica,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Open the watch at `at`.
    Closed { at: Instant },
    /// Opening the watch after revision `after`.
    Opening { after: u64 },
    /// Messages arrive.
    Open,
}

/// The assignment given to the handler, until its outcome comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Assigning {
    job_id: String,
    revision: u64,
    ranks: u64,
}

/// The assignment watch of one site.
#[derive(Debug)]
pub struct Watch {
    state: AgentState,
    phase: Phase,
    backoff: Backoff,
    /// The jobs a full listing named so far, until its sync point.
    listed: Option<BTreeSet<String>>,
    assigning: Option<Assigning>,
    /// Messages that arrived while the handler was busy, in order.
    waiting: VecDeque<pb::Assignment>,
    events: VecDeque<WatchEvent>,
}

impl Watch {
    /// A watch over `state` as loaded from the store; it opens at `now`.
    pub fn new(state: AgentState, now: Instant) -> Self {
        Self {
            state,
            phase: Phase::Closed { at: now },
            backoff: Backoff::new(),
            listed: None,
            assigning: None,
            waiting: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// What the agent has handled: persisted on [`WatchEvent::Persist`].
    pub fn state(&self) -> &AgentState {
        &self.state
    }

    /// The revision to watch after, when the watch is due to open at `now`.
    /// Answer with [`Watch::handle_opened`] or [`Watch::handle_open_failed`].
    pub fn poll_open(&mut self, now: Instant) -> Option<u64> {
        match self.phase {
            Phase::Closed { at } if at <= now => {
                let after = self.state.last_revision;
                self.phase = Phase::Opening { after };
                Some(after)
            }
            _ => None,
        }
    }

    /// When the watch is due to open; `None` while it is open or opening.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closed { at } => Some(at),
            Phase::Opening { .. } | Phase::Open => None,
        }
    }

    /// The next thing to carry out, oldest first.
    pub fn poll_event(&mut self) -> Option<WatchEvent> {
        self.events.pop_front()
    }

    /// The watch is open; messages follow.
    pub fn handle_opened(&mut self) {
        let Phase::Opening { after } = self.phase else {
            return;
        };
        // From revision 0 the server lists every current assignment.
        self.listed = (after == 0).then(BTreeSet::new);
        self.phase = Phase::Open;
    }

    /// Opening the watch failed at `now` with `code`.
    pub fn handle_open_failed(&mut self, now: Instant, code: Code) -> OpenFailure {
        let after = match self.phase {
            Phase::Opening { after } => after,
            _ => self.state.last_revision,
        };
        if code == Code::OutOfRange {
            self.state.last_revision = 0;
            self.phase = Phase::Closed { at: now };
            return OpenFailure::Compacted { after };
        }
        self.close(now);
        OpenFailure::NextReplica
    }

    /// The stream ended at `now` (closed by the server or broken).
    pub fn handle_stream_ended(&mut self, now: Instant) {
        self.listed = None;
        self.close(now);
    }

    /// A message arrived on the open watch.
    pub fn handle_message(&mut self, message: pb::Assignment) {
        self.backoff.reset();
        if self.assigning.is_some() {
            self.waiting.push_back(message);
            return;
        }
        self.process(message);
    }

    /// The handler's outcome for the last [`WatchEvent::Assign`]: what it
    /// did, or why it could not.
    pub fn handle_assigned(&mut self, outcome: Result<JobRecord, String>) {
        let Some(done) = self.assigning.take() else {
            return;
        };
        let record = outcome.unwrap_or_else(|_| JobRecord {
            revision: done.revision,
            ranks: done.ranks,
            ..JobRecord::default()
        });
        self.state.jobs.insert(done.job_id, record);
        self.handled(done.revision);
        while self.assigning.is_none() {
            let Some(message) = self.waiting.pop_front() else {
                break;
            };
            self.process(message);
        }
    }

    fn close(&mut self, now: Instant) {
        self.events.push_back(WatchEvent::SwitchReplica);
        self.phase = Phase::Closed {
            at: now + self.backoff.next_pause(),
        };
    }

    fn process(&mut self, message: pb::Assignment) {
        if message.sync_point {
            self.sync_point(message.revision);
            return;
        }
        if let Some(listed) = self.listed.as_mut() {
            listed.insert(message.job_id.clone());
        }
        let known = self.state.jobs.get(&message.job_id);
        // A full listing repeats jobs already handled; a removal of a job
        // this site never had is only progress.
        let nothing_to_do = known.is_some_and(|r| r.revision >= message.revision)
            || (known.is_none() && message.removed);
        if nothing_to_do {
            if message.revision > self.state.last_revision {
                self.state.last_revision = message.revision;
                self.events.push_back(WatchEvent::Persist);
            }
            return;
        }
        if message.removed {
            if let Some(record) = self.state.jobs.remove(&message.job_id) {
                self.events.push_back(WatchEvent::Remove {
                    job_id: message.job_id,
                    record,
                    why: Removal::Removed {
                        revision: message.revision,
                    },
                });
            }
            self.handled(message.revision);
            return;
        }
        self.assigning = Some(Assigning {
            job_id: message.job_id.clone(),
            revision: message.revision,
            ranks: message.ranks.len() as u64,
        });
        self.events.push_back(WatchEvent::Assign(Box::new(message)));
    }

    /// The end of the initial part: a full listing's unnamed jobs are gone.
    fn sync_point(&mut self, revision: u64) {
        if let Some(listed) = self.listed.take() {
            let gone: Vec<String> = self
                .state
                .jobs
                .keys()
                .filter(|job| !listed.contains(*job))
                .cloned()
                .collect();
            for job_id in gone {
                if let Some(record) = self.state.jobs.remove(&job_id) {
                    self.events.push_back(WatchEvent::Remove {
                        job_id,
                        record,
                        why: Removal::NotListed,
                    });
                }
            }
        }
        if revision > self.state.last_revision {
            self.state.last_revision = revision;
            self.events.push_back(WatchEvent::Persist);
        }
    }

    fn handled(&mut self, revision: u64) {
        self.state.last_revision = self.state.last_revision.max(revision);
        self.events.push_back(WatchEvent::Handled { revision });
        self.events.push_back(WatchEvent::Persist);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn events(watch: &mut Watch) -> Vec<WatchEvent> {
        std::iter::from_fn(|| watch.poll_event()).collect()
    }

    fn assignment(job: &str, revision: u64) -> pb::Assignment {
        pb::Assignment {
            job_id: job.into(),
            revision,
            ..pb::Assignment::default()
        }
    }

    fn removal(job: &str, revision: u64) -> pb::Assignment {
        pb::Assignment {
            removed: true,
            ..assignment(job, revision)
        }
    }

    fn sync_point(revision: u64) -> pb::Assignment {
        pb::Assignment {
            sync_point: true,
            revision,
            ..pb::Assignment::default()
        }
    }

    fn record(revision: u64) -> JobRecord {
        JobRecord {
            revision,
            ranks: 4,
            submitted_as: Some(format!("slurm-{revision}")),
            ..JobRecord::default()
        }
    }

    /// A state that handled `jobs` (name, revision) up to `last_revision`.
    fn state(last_revision: u64, jobs: &[(&str, u64)]) -> AgentState {
        AgentState {
            site_id: "north".into(),
            last_revision,
            jobs: jobs
                .iter()
                .map(|(job, revision)| (job.to_string(), record(*revision)))
                .collect(),
        }
    }

    /// A watch over `state`, open.
    fn open(state: AgentState, start: Instant) -> Watch {
        let mut watch = Watch::new(state, start);
        assert!(watch.poll_open(start).is_some());
        watch.handle_opened();
        watch
    }

    #[test]
    fn resumes_after_the_persisted_revision_and_waits_while_opening() {
        let start = Instant::now();
        let mut watch = Watch::new(state(41, &[("llama", 40)]), start);
        assert_eq!(watch.poll_timeout(), Some(start));
        assert_eq!(watch.poll_open(start), Some(41));
        assert_eq!(watch.poll_open(start), None);
        assert_eq!(watch.poll_timeout(), None);
    }

    #[test]
    fn a_new_assignment_is_handed_over_recorded_and_persisted() {
        let start = Instant::now();
        let mut watch = open(state(10, &[]), start);
        let message = pb::Assignment {
            ranks: vec![pb::RankBinding::default(); 3],
            ..assignment("llama", 12)
        };
        watch.handle_message(message.clone());
        assert_eq!(events(&mut watch), [WatchEvent::Assign(Box::new(message))]);
        // Nothing counts as handled until the handler is done.
        assert_eq!(watch.state().last_revision, 10);
        watch.handle_assigned(Ok(record(12)));
        assert_eq!(
            events(&mut watch),
            [WatchEvent::Handled { revision: 12 }, WatchEvent::Persist]
        );
        assert_eq!(watch.state().last_revision, 12);
        assert_eq!(watch.state().jobs.get("llama"), Some(&record(12)));
    }

    #[test]
    fn an_assignment_the_handler_failed_counts_as_handled() {
        let start = Instant::now();
        let mut watch = open(state(10, &[]), start);
        watch.handle_message(pb::Assignment {
            ranks: vec![pb::RankBinding::default(); 3],
            ..assignment("llama", 12)
        });
        events(&mut watch);
        watch.handle_assigned(Err("no such partition".into()));
        assert_eq!(
            events(&mut watch),
            [WatchEvent::Handled { revision: 12 }, WatchEvent::Persist]
        );
        assert_eq!(
            watch.state().jobs.get("llama"),
            Some(&JobRecord {
                revision: 12,
                ranks: 3,
                ..JobRecord::default()
            })
        );
        // So a reconnect does not hand it over again.
        watch.handle_message(assignment("llama", 12));
        assert_eq!(events(&mut watch), []);
    }

    #[test]
    fn an_assignment_at_or_below_the_handled_revision_is_not_handled_twice() {
        let start = Instant::now();
        let mut watch = open(state(20, &[("llama", 15)]), start);
        watch.handle_message(assignment("llama", 15));
        assert_eq!(events(&mut watch), []);
        watch.handle_message(assignment("llama", 14));
        assert_eq!(events(&mut watch), []);
        assert_eq!(watch.state().last_revision, 20);
        // A repeat above the last revision (a full listing after a
        // compaction) only moves the last revision.
        let mut listing = open(state(20, &[("llama", 25)]), start);
        listing.handle_message(assignment("llama", 25));
        assert_eq!(events(&mut listing), [WatchEvent::Persist]);
        assert_eq!(listing.state().last_revision, 25);
        assert_eq!(listing.state().jobs.get("llama"), Some(&record(25)));
    }

    #[test]
    fn a_removal_removes_a_known_job_and_is_only_progress_for_an_unknown_one() {
        let start = Instant::now();
        let mut watch = open(state(20, &[("llama", 15)]), start);
        watch.handle_message(removal("llama", 21));
        assert_eq!(
            events(&mut watch),
            [
                WatchEvent::Remove {
                    job_id: "llama".into(),
                    record: record(15),
                    why: Removal::Removed { revision: 21 }
                },
                WatchEvent::Handled { revision: 21 },
                WatchEvent::Persist
            ]
        );
        assert!(watch.state().jobs.is_empty());
        watch.handle_message(removal("mistral", 22));
        assert_eq!(events(&mut watch), [WatchEvent::Persist]);
        assert_eq!(watch.state().last_revision, 22);
        watch.handle_message(removal("mistral", 22));
        assert_eq!(events(&mut watch), []);
    }

    #[test]
    fn the_sync_point_of_a_full_listing_removes_the_jobs_it_did_not_name() {
        let start = Instant::now();
        let mut watch = open(state(0, &[("llama", 5), ("gone", 6)]), start);
        watch.handle_message(assignment("llama", 5));
        assert_eq!(events(&mut watch), [WatchEvent::Persist]);
        watch.handle_message(sync_point(30));
        assert_eq!(
            events(&mut watch),
            [
                WatchEvent::Remove {
                    job_id: "gone".into(),
                    record: record(6),
                    why: Removal::NotListed
                },
                WatchEvent::Persist
            ]
        );
        assert_eq!(watch.state().last_revision, 30);
        assert_eq!(watch.state().jobs.keys().collect::<Vec<_>>(), ["llama"]);
        // The sync point ended the listing: a later sync point (or an
        // assignment after it) removes nothing more.
        watch.handle_message(assignment("mistral", 31));
        events(&mut watch);
        watch.handle_assigned(Ok(record(31)));
        events(&mut watch);
        watch.handle_message(sync_point(32));
        assert_eq!(events(&mut watch), [WatchEvent::Persist]);
        assert_eq!(watch.state().jobs.len(), 2);
    }

    #[test]
    fn a_watch_resumed_after_a_revision_removes_nothing_at_its_sync_point() {
        let start = Instant::now();
        let mut watch = open(state(30, &[("llama", 5)]), start);
        watch.handle_message(sync_point(30));
        assert_eq!(events(&mut watch), []);
        assert_eq!(watch.state().jobs.len(), 1);
    }

    #[test]
    fn messages_during_an_assignment_wait_their_turn() {
        let start = Instant::now();
        let mut watch = open(state(10, &[("mistral", 3)]), start);
        watch.handle_message(assignment("llama", 11));
        watch.handle_message(removal("mistral", 12));
        assert!(matches!(
            events(&mut watch).as_slice(),
            [WatchEvent::Assign(a)] if a.job_id == "llama"
        ));
        watch.handle_assigned(Ok(record(11)));
        assert_eq!(
            events(&mut watch),
            [
                WatchEvent::Handled { revision: 11 },
                WatchEvent::Persist,
                WatchEvent::Remove {
                    job_id: "mistral".into(),
                    record: record(3),
                    why: Removal::Removed { revision: 12 }
                },
                WatchEvent::Handled { revision: 12 },
                WatchEvent::Persist
            ]
        );
    }

    #[test]
    fn a_compacted_history_lists_from_scratch_at_once() {
        let start = Instant::now();
        let mut watch = Watch::new(state(41, &[("llama", 40)]), start);
        assert_eq!(watch.poll_open(start), Some(41));
        assert_eq!(
            watch.handle_open_failed(start, Code::OutOfRange),
            OpenFailure::Compacted { after: 41 }
        );
        assert_eq!(events(&mut watch), []);
        assert_eq!(watch.poll_open(start), Some(0));
        watch.handle_opened();
        // A full listing: its sync point removes what it did not name.
        watch.handle_message(sync_point(50));
        assert!(matches!(
            events(&mut watch).as_slice(),
            [
                WatchEvent::Remove {
                    why: Removal::NotListed,
                    ..
                },
                WatchEvent::Persist
            ]
        ));
    }

    #[test]
    fn failures_move_to_the_next_replica_with_a_backoff_that_a_message_resets() {
        let start = Instant::now();
        let mut watch = Watch::new(state(7, &[]), start);
        let mut now = start;
        let mut waits = Vec::new();
        for _ in 0..3 {
            assert_eq!(watch.poll_open(now), Some(7));
            assert_eq!(
                watch.handle_open_failed(now, Code::Unavailable),
                OpenFailure::NextReplica
            );
            assert_eq!(events(&mut watch), [WatchEvent::SwitchReplica]);
            let at = watch.poll_timeout().unwrap();
            assert_eq!(watch.poll_open(at - ms(1)), None);
            waits.push(at - now);
            now = at;
        }
        assert_eq!(waits, [ms(100), ms(200), ms(400)]);
        // The end of a stream that delivered nothing backs off further.
        assert_eq!(watch.poll_open(now), Some(7));
        watch.handle_opened();
        watch.handle_stream_ended(now);
        assert_eq!(events(&mut watch), [WatchEvent::SwitchReplica]);
        assert_eq!(watch.poll_timeout(), Some(now + ms(800)));
        now += ms(800);
        // A message shows the replica works: the backoff starts over.
        assert_eq!(watch.poll_open(now), Some(7));
        watch.handle_opened();
        watch.handle_message(sync_point(7));
        watch.handle_stream_ended(now);
        assert_eq!(events(&mut watch), [WatchEvent::SwitchReplica]);
        assert_eq!(watch.poll_timeout(), Some(now + ms(100)));
    }

    #[test]
    fn a_reopened_watch_resumes_after_what_was_handled_on_the_last_one() {
        let start = Instant::now();
        let mut watch = open(state(7, &[]), start);
        watch.handle_message(assignment("llama", 9));
        watch.handle_assigned(Ok(record(9)));
        watch.handle_stream_ended(start);
        let at = watch.poll_timeout().unwrap();
        assert_eq!(watch.poll_open(at), Some(9));
    }
}
