//! The Ready-loop driver: one replica of the Raft group, sans IO.
//!
//! Input comes in through [`Node::tick`], [`Node::step`], [`Node::propose`],
//! [`Node::read_index`], [`Node::propose_conf_change`] and [`Node::transfer_leader`]; the caller
//! then calls [`Node::handle_ready`] and gets back the messages to send and the events to act on.
//! The node never sends anything itself, never reads a clock and never spawns a task: the
//! runtime (a gRPC server, or the test harness) moves the bytes and calls `tick` on a timer.

use std::time::Duration;

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeV2, ConfState, Entry, EntryType, Message, MessageType, Snapshot,
    SnapshotMetadata,
};
use raft::{RawNode, SnapshotStatus, StateRole, Storage as _};

use super::storage::{Batch, DiskStorage, StateFlush, StorageError, compress_snapshot};
use super::{BoxError, StateMachine};

/// Timing and flow-control settings of one replica.
///
/// Raft's timers are counted in ticks of `tick_interval`. etcd's tuning guide for WAN clusters:
/// the heartbeat interval should be about the round-trip time between the replicas farthest
/// apart, and the election timeout at least ten times that RTT (more where RTT varies), so that
/// a delayed heartbeat does not start an election. Across sites that is, e.g., 1000 km ≈ 10 ms
/// RTT: heartbeat 10 ms or more, election timeout 100 ms or more. See [`NodeConfig::for_rtt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// This replica's id: non-zero and unique in the group.
    pub id: u64,
    /// How often the runtime must call [`Node::tick`]. The node itself never reads it.
    pub tick_interval: Duration,
    /// Ticks between leader heartbeats.
    pub heartbeat_ticks: usize,
    /// Ticks without a leader before a follower campaigns. Raft randomizes the actual timeout in
    /// `[election_ticks, 2 * election_ticks)` unless the bounds below are set.
    pub election_ticks: usize,
    /// Overrides the lower bound of the randomized election timeout (0: `election_ticks`).
    pub min_election_ticks: usize,
    /// Overrides the upper bound (exclusive) of the randomized election timeout (0: twice
    /// `election_ticks`). Tests set both bounds per node from a seed, because raft-rs draws its
    /// randomness from a thread RNG that cannot be seeded.
    pub max_election_ticks: usize,
    /// Upper bound on the entries' bytes in one append message.
    pub max_size_per_msg: u64,
    /// How many append messages may be in flight to one follower.
    pub max_inflight_msgs: usize,
    /// Compact the log once it holds this many applied entries beyond the retained ones (0:
    /// only when asked). Bounds the log on disk. No snapshot is taken on this schedule: building
    /// one serializes the whole state, so it is built when a peer needs one (it is behind the
    /// compacted log) or on request ([`Node::create_snapshot`]); a restart needs none, the
    /// state is on disk.
    pub snapshot_interval_entries: u64,
    /// Applied entries kept when compacting, so that a follower only slightly behind catches up
    /// from the log instead of needing a snapshot (etcd keeps 5000).
    pub compaction_retained_entries: u64,
}

impl NodeConfig {
    /// Defaults for replicas in one building (sub-millisecond RTT): etcd's own defaults,
    /// a 100 ms heartbeat and a 1 s election timeout.
    pub fn new(id: u64) -> Self {
        Self {
            id,
            tick_interval: Duration::from_millis(100),
            heartbeat_ticks: 1,
            election_ticks: 10,
            min_election_ticks: 0,
            max_election_ticks: 0,
            max_size_per_msg: 1 << 20,
            // Enough to keep a long fat pipe busy without unbounded buffering.
            max_inflight_msgs: 256,
            snapshot_interval_entries: 10_000,
            compaction_retained_entries: 5_000,
        }
    }

    /// Follows etcd's WAN guidance for the largest round-trip time between replicas: one tick
    /// per RTT (at least 100 ms, so that small RTTs keep the in-building defaults), a heartbeat
    /// every tick and an election timeout of ten ticks.
    pub fn for_rtt(id: u64, max_rtt: Duration) -> Self {
        Self {
            tick_interval: max_rtt.max(Duration::from_millis(100)),
            ..Self::new(id)
        }
    }

    fn to_raft(&self, applied: u64) -> raft::Config {
        raft::Config {
            id: self.id,
            election_tick: self.election_ticks,
            heartbeat_tick: self.heartbeat_ticks,
            min_election_tick: self.min_election_ticks,
            max_election_tick: self.max_election_ticks,
            applied,
            max_size_per_msg: self.max_size_per_msg,
            max_inflight_msgs: self.max_inflight_msgs,
            // A replica cut off by a partition must not disrupt the majority with a higher term
            // when it returns (pre-vote), and a leader that lost its quorum must step down rather
            // than accept writes it cannot commit (check-quorum).
            pre_vote: true,
            check_quorum: true,
            ..raft::Config::default()
        }
    }
}

/// Errors of the node. After a `Storage` or `StateMachine` error the node must be dropped and
/// reopened from disk: raft's in-memory state may be ahead of what was persisted.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    #[error("state machine failed at entry {index}: {source}")]
    StateMachine {
        index: u64,
        #[source]
        source: BoxError,
    },
    #[error("a proposal must carry a command: data is empty")]
    EmptyProposal,
    #[error(
        "another membership change is in progress (or may be, under a leader elected since); retry once it is applied"
    )]
    ConfChangePending,
    #[error("committed entry {index} holds a corrupt {what}: {source}")]
    CorruptEntry {
        index: u64,
        what: &'static str,
        #[source]
        source: protobuf::ProtobufError,
    },
}

/// Something the caller must act on, produced by [`Node::handle_ready`].
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A committed command was applied. Its log entry is durable on a quorum; the applied state
    /// may not be on this replica's disk yet, but a crash only makes the replica apply the entry
    /// again. `context` is what the proposer passed to [`Node::propose`], so it can match the
    /// response to its request.
    Applied {
        index: u64,
        term: u64,
        context: Vec<u8>,
        response: Vec<u8>,
    },
    /// A linearizable read asked for with `context` may be served once the applied index
    /// reaches `index`.
    ReadIndexReady { context: Vec<u8>, index: u64 },
    /// The known leader changed (0: none known) or the term moved on.
    LeaderChanged { leader_id: u64, term: u64 },
    /// A membership change was applied at `index`; `context` is what the proposer passed to
    /// [`Node::propose_conf_change`] (empty for the automatic leave-joint change and snapshots).
    ConfChanged {
        index: u64,
        context: Vec<u8>,
        conf_state: ConfState,
    },
    /// The state machine was replaced by a snapshot from the leader.
    SnapshotInstalled { index: u64, term: u64 },
}

/// What one pass of the Ready loop produced.
#[derive(Debug, Default)]
pub struct Output {
    /// Messages for other replicas, in order. Send them after `handle_ready` returns: every
    /// message that depends on persisted state was released only after the fsync.
    pub messages: Vec<Message>,
    pub events: Vec<Event>,
}

/// One Raft replica: `raft::RawNode` over [`DiskStorage`], plus the state machine.
///
/// Two rules are added to raft's so that its *leader lease* (with check-quorum, a replica that
/// heard from the leader grants no pre-vote or vote for a later term for an election timeout)
/// has no exception; the site leases rely on it (`longhaul_core::lease`, step 4):
///
/// - a replica grants no pre-vote or vote during its first election timeout after it opens
///   (see [`Node::step`]): a restarted replica has forgotten which leader it heard last;
/// - a leadership hand-over waits an election timeout before raft gives the transferee its
///   go-ahead (see [`Node::transfer_leader`]): the transferee's campaign is forced, and skips
///   the voters' lease.
pub struct Node<S: StateMachine> {
    raw: RawNode<DiskStorage>,
    state_machine: S,
    config: NodeConfig,
    leader_id: u64,
    term: u64,
    /// Ticks since the node was opened, counted up to `election_ticks`.
    ticks_since_open: usize,
    /// A hand-over waiting out its election timeout.
    hand_over: Option<HandOver>,
}

/// A leadership hand-over held back (see [`Node::transfer_leader`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HandOver {
    to: u64,
    /// Ticks until raft is asked to transfer.
    ticks_left: usize,
}

impl<S: StateMachine> std::fmt::Debug for Node<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.config.id)
            .field("leader_id", &self.leader_id)
            .field("term", &self.term)
            .field("storage", self.raw.store())
            .finish_non_exhaustive()
    }
}

impl<S: StateMachine> Node<S> {
    /// Opens a replica on its store. A fresh store is bootstrapped with `initial_voters` (the
    /// same list on every founding replica); pass none for a replica that joins an existing
    /// group and learns everything from the leader. A store that was already initialized
    /// restarts from disk, and `initial_voters` is ignored.
    pub fn open(
        config: NodeConfig,
        mut storage: DiskStorage,
        mut state_machine: S,
        initial_voters: &[u64],
    ) -> Result<Self, NodeError> {
        if !storage.is_initialized() && !initial_voters.is_empty() {
            let conf_state = ConfState {
                voters: initial_voters.to_vec(),
                ..ConfState::default()
            };
            let empty_state = state_machine
                .snapshot(&storage.read()?)
                .map_err(|source| NodeError::StateMachine { index: 0, source })?;
            storage.write(|batch| batch.bootstrap(&conf_state, &empty_state))?;
        }
        // A crash between the log and the state commits of a snapshot install (or bootstrap)
        // leaves the state behind the log's start: restore it from the snapshot stored first.
        if storage.state_behind_log() {
            let snapshot = storage
                .stored_snapshot()?
                .ok_or(StorageError::NoSnapshotToRestore)?;
            let machine = &mut state_machine;
            storage.write(|batch| {
                batch.restore_state(&snapshot, |txn, data| {
                    machine
                        .restore(txn, data)
                        .map_err(StorageError::StateMachine)
                })
            })?;
        }
        let state = storage.state();
        // After a clean shutdown the two agree; after a crash the replica
        // applies the difference again once it learns the commit index.
        tracing::info!(
            applied = state.applied,
            last_index = state.last_index,
            "opened the store"
        );
        let raft_config = config.to_raft(state.applied);
        raft_config.validate()?;
        let logger = super::logging::raft_logger(config.id);
        let raw = RawNode::new(&raft_config, storage, &logger)?;
        let term = raw.raft.term;
        Ok(Self {
            raw,
            state_machine,
            config,
            leader_id: 0,
            term,
            ticks_since_open: 0,
            hand_over: None,
        })
    }

    pub fn id(&self) -> u64 {
        self.config.id
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The leader this replica knows of (0: none).
    pub fn leader_id(&self) -> u64 {
        self.raw.raft.leader_id
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    pub fn role(&self) -> StateRole {
        self.raw.raft.state
    }

    pub fn is_leader(&self) -> bool {
        self.role() == StateRole::Leader
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// The last applied index. It may not be durable yet (see [`Node::handle_ready`]); a crash
    /// rolls it back only to an index whose state is on disk, and the replica re-applies the
    /// rest of the committed log.
    pub fn applied_index(&self) -> u64 {
        self.raw.store().state().applied
    }

    pub fn conf_state(&self) -> &ConfState {
        &self.raw.store().state().conf_state
    }

    pub fn storage(&self) -> &DiskStorage {
        self.raw.store()
    }

    pub fn state_machine(&self) -> &S {
        &self.state_machine
    }

    /// Advances raft's logical clock by one tick. Returns whether there may be a ready.
    pub fn tick(&mut self) -> bool {
        self.ticks_since_open = (self.ticks_since_open + 1).min(self.config.election_ticks);
        if !self.is_leader() {
            self.hand_over = None;
        }
        if let Some(hand_over) = &mut self.hand_over {
            if hand_over.ticks_left <= 1 {
                let to = hand_over.to;
                self.hand_over = None;
                self.raw.transfer_leader(to);
            } else {
                hand_over.ticks_left -= 1;
            }
        } else if self.is_removed_leader() && self.raw.raft.lead_transferee.is_none() {
            // A hand-over can fail (the successor refuses to campaign while it has not applied
            // the change yet, and raft aborts the transfer after an election timeout): again.
            self.hand_over_leadership();
        }
        self.raw.tick()
    }

    /// Whether this replica leads and is handing leadership over: waiting out the hold of
    /// [`Node::transfer_leader`], or raft's transfer under way. A leader confirms no site
    /// lease meanwhile.
    pub fn is_handing_over(&self) -> bool {
        self.is_leader() && (self.hand_over.is_some() || self.raw.raft.lead_transferee.is_some())
    }

    /// Whether this replica leads a configuration it is no longer a voter of.
    fn is_removed_leader(&self) -> bool {
        let cs = self.conf_state();
        self.is_leader()
            && !cs.voters.contains(&self.config.id)
            && !cs.voters_outgoing.contains(&self.config.id)
    }

    /// Feeds a message from another replica. An error concerns that message only (e.g. it came
    /// from a peer that is no longer a member); the node stays usable.
    ///
    /// During its first election timeout after it opens, the node ignores requests for a
    /// pre-vote or vote for a later term (as raft ignores them from a replica that heard from
    /// the leader within an election timeout): it cannot know whether it heard from a leader
    /// just before it stopped. Forced votes of a hand-over pass. A hand-over asked for by a
    /// follower (`MsgTransferLeader`, forwarded by raft) is held as [`Node::transfer_leader`]
    /// holds one.
    pub fn step(&mut self, message: Message) -> Result<(), NodeError> {
        match message.get_msg_type() {
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
                if self.ticks_since_open < self.config.election_ticks
                    && message.term > self.raw.raft.term
                    && message.context != raft::CAMPAIGN_TRANSFER =>
            {
                tracing::debug!(
                    from = message.from,
                    term = message.term,
                    "ignored a vote request: within the first election timeout after opening"
                );
                Ok(())
            }
            MessageType::MsgTransferLeader if self.is_leader() => {
                self.transfer_leader(message.from);
                Ok(())
            }
            _ => Ok(self.raw.step(message)?),
        }
    }

    /// Proposes a command. Fails with `ProposalDropped` when this replica is not the leader or
    /// a leadership transfer is in progress; the caller retries at the leader. `data` must not
    /// be empty: an empty entry is the no-op a new leader appends, and is not applied.
    pub fn propose(&mut self, context: Vec<u8>, data: Vec<u8>) -> Result<(), NodeError> {
        if data.is_empty() {
            return Err(NodeError::EmptyProposal);
        }
        Ok(self.raw.propose(context, data)?)
    }

    /// Proposes a membership change. Several changes, or an explicit transition, go through
    /// joint consensus; with `ConfChangeTransition::Auto` or `Implicit` the leader leaves the
    /// joint configuration by itself once it is applied.
    ///
    /// Fails with [`NodeError::ConfChangePending`] while an earlier change is not applied yet:
    /// raft-rs would otherwise append this one as an empty entry and still return Ok, so a
    /// caller waiting for it would take the earlier change's outcome for its own.
    pub fn propose_conf_change(
        &mut self,
        context: Vec<u8>,
        change: ConfChangeV2,
    ) -> Result<(), NodeError> {
        if self.conf_change_pending() {
            return Err(NodeError::ConfChangePending);
        }
        Ok(self.raw.propose_conf_change(context, change)?)
    }

    /// The applied index holds an entry of the current term (for a leader: its own no-op, so
    /// every entry of earlier terms is applied too).
    pub fn applied_in_current_term(&self) -> bool {
        let raft = &self.raw.raft;
        raft.raft_log.term(raft.raft_log.applied).ok() == Some(raft.term)
    }

    /// A membership change is in the log and not applied yet (raft-rs's own rule: a new leader
    /// counts everything up to its last index as possibly one, until it has applied it).
    pub fn conf_change_pending(&self) -> bool {
        self.raw.raft.pending_conf_index > self.raw.raft.raft_log.applied
    }

    /// Asks for a linearizable read; answered by [`Event::ReadIndexReady`] with the same context.
    pub fn read_index(&mut self, context: Vec<u8>) {
        self.raw.read_index(context);
    }

    /// Asks the leader to hand leadership to `to` once `to` has caught up. On the leader the
    /// hand-over waits `election_ticks` ticks first ([`Node::is_handing_over`] meanwhile), then
    /// raft sends `to` its go-ahead: the transferee campaigns with a forced vote that skips the
    /// voters' leader lease, so the wait is what keeps every site lease this leader confirmed an
    /// election timeout older than any vote of the next term (`longhaul_core::lease`). A second
    /// request while one waits only changes the transferee. On a follower raft forwards the
    /// request to the leader, whose [`Node::step`] holds it the same way.
    pub fn transfer_leader(&mut self, to: u64) {
        if !self.is_leader() {
            self.raw.transfer_leader(to);
            return;
        }
        if to == self.config.id {
            return;
        }
        match &mut self.hand_over {
            Some(hand_over) => hand_over.to = to,
            None => {
                self.hand_over = Some(HandOver {
                    to,
                    ticks_left: self.config.election_ticks,
                });
            }
        }
    }

    /// Starts an election now (operators and tests; normally elections follow ticks).
    pub fn campaign(&mut self) -> Result<(), NodeError> {
        Ok(self.raw.campaign()?)
    }

    /// Tells raft that a message to `to` could not be delivered.
    pub fn report_unreachable(&mut self, to: u64) {
        self.raw.report_unreachable(to);
    }

    /// Tells raft whether a snapshot sent to `to` arrived.
    pub fn report_snapshot(&mut self, to: u64, status: SnapshotStatus) {
        self.raw.report_snapshot(to, status);
    }

    /// Whether [`Node::handle_ready`] has work to do.
    pub fn has_ready(&self) -> bool {
        self.raw.has_ready()
    }

    /// Runs one pass of the Ready loop. The order is the one raft-rs documents, and it is what
    /// makes an acknowledged write durable:
    ///
    /// 1. note a leader change (soft state);
    /// 2. take the leader's messages: they may be sent before the leader persists its own
    ///    entries (Raft thesis §10.2.1), so they go first in the out-box;
    /// 3. install a snapshot from the leader, if any: state machine, log, conf state and applied
    ///    index move to it;
    /// 4. append the new entries (truncating a conflicting suffix) and the hard state, in one
    ///    fsynced commit of the log store. The store writes it when raft-rs's `must_sync` holds
    ///    (a snapshot, new entries, or a new term or vote); a new commit index alone is not
    ///    written, as Raft keeps it in volatile state (the leader tells it again), so a Ready
    ///    that only moves the commit index and applies costs no fsync;
    /// 5. send the persisted messages (votes, append responses): they promise log entries, term
    ///    and vote, which are on disk once step 4 returned. They go before the apply, so that a
    ///    follower's acknowledgement (and with it the leader's commit) does not wait for the
    ///    entries this Ready lets it apply;
    /// 6. apply committed entries: state-machine changes, the new applied index and any new conf
    ///    state, in one transaction of the state store, committed without an fsync (see
    ///    [`DiskStorage`]: it becomes durable with the state store's next fsync). Raft only hands
    ///    out committed entries that an earlier Ready made durable in the log, so a crash rolls
    ///    the state store back to an older applied index whose state agrees with it, and the
    ///    restarted replica applies the rest of the log again;
    /// 7. report read states;
    /// 8. `advance`, then handle the light ready the same way: its messages first (everything
    ///    they promise is persisted by now), then the new commit index and the entries it lets
    ///    us apply, then `advance_apply`.
    ///
    /// Snapshots (when a peer needs one) and log compaction run after the loop. Compaction first
    /// fsyncs the state store, so the log never loses an entry that durable state does not hold
    /// yet.
    ///
    /// Call again while [`Node::has_ready`] (e.g. after leaving a joint configuration).
    pub fn handle_ready(&mut self) -> Result<Output, NodeError> {
        let mut early = Vec::new();
        let mut out = self.handle_ready_sending(&mut |messages| early.extend(messages))?;
        early.append(&mut out.messages);
        out.messages = early;
        Ok(out)
    }

    /// [`Node::handle_ready`], handing messages to `send_now` as soon as they may go: the
    /// leader's (step 2) before anything is persisted, so followers write the new entries while
    /// the leader does (Raft thesis §10.2.1); the persisted ones (step 5) and the light ready's
    /// (step 8) once the log commit returned, before any entry is applied. `Output::messages`
    /// is then empty; callers still send what it holds, after the rest.
    pub fn handle_ready_sending(
        &mut self,
        send_now: &mut dyn FnMut(Vec<Message>),
    ) -> Result<Output, NodeError> {
        let mut out = Output::default();
        if self.raw.has_ready() {
            let mut ready = self.raw.ready();
            // 1.
            if ready.ss().is_some() || self.raw.raft.term != self.term {
                self.note_leader(&mut out);
            }
            // 2.
            let leader_messages = ready.take_messages();
            if !leader_messages.is_empty() {
                send_now(leader_messages);
            }
            let committed = ready.take_committed_entries();
            // 3. and 4., one fsynced commit of the log store when raft must sync.
            let has_snapshot = !ready.snapshot().is_empty();
            if has_snapshot || !ready.entries().is_empty() || ready.hs().is_some() {
                let mut batch = self.raw.store().begin()?;
                if has_snapshot {
                    self.install_snapshot(&mut batch, ready.snapshot(), &mut out)?;
                }
                batch.append(ready.entries())?;
                metrics::counter!("longhaul_raft_entries_appended_total")
                    .increment(ready.entries().len() as u64);
                if let Some(hard_state) = ready.hs() {
                    batch.set_hard_state(hard_state)?;
                }
                self.raw.mut_store().commit(batch)?;
            }
            // 5.
            let persisted_messages = ready.take_persisted_messages();
            if !persisted_messages.is_empty() {
                send_now(persisted_messages);
            }
            // 6.
            if !committed.is_empty() {
                let mut batch = self.raw.store().begin()?;
                self.apply_entries(&mut batch, committed, &mut out)?;
                self.commit_applied(batch)?;
            }
            // 7.
            for read in ready.take_read_states() {
                out.events.push(Event::ReadIndexReady {
                    context: read.request_ctx,
                    index: read.index,
                });
            }
            // 8.
            let mut light = self.raw.advance(ready);
            let light_messages = light.take_messages();
            if !light_messages.is_empty() {
                send_now(light_messages);
            }
            let committed = light.take_committed_entries();
            if light.commit_index().is_some() || !committed.is_empty() {
                let mut batch = self.raw.store().begin()?;
                if let Some(commit) = light.commit_index() {
                    batch.set_commit(commit)?;
                }
                self.apply_entries(&mut batch, committed, &mut out)?;
                self.commit_applied(batch)?;
            }
            self.raw.advance_apply();
        }
        // Raft asked for a snapshot that is not built yet (a peer is behind the compacted log):
        // build it now; raft retries sending it on the next heartbeat round.
        if self.raw.store().take_snapshot_wanted() {
            self.create_snapshot()?;
        }
        self.maybe_compact()?;
        Ok(out)
    }

    fn note_leader(&mut self, out: &mut Output) {
        let (leader_id, term) = (self.raw.raft.leader_id, self.raw.raft.term);
        if (leader_id, term) != (self.leader_id, self.term) {
            self.leader_id = leader_id;
            self.term = term;
            out.events.push(Event::LeaderChanged { leader_id, term });
        }
    }

    fn install_snapshot(
        &mut self,
        batch: &mut Batch,
        snapshot: &Snapshot,
        out: &mut Output,
    ) -> Result<(), NodeError> {
        let state_machine = &mut self.state_machine;
        batch.apply_snapshot(snapshot, |txn, data| {
            state_machine
                .restore(txn, data)
                .map_err(StorageError::StateMachine)
        })?;
        let meta = snapshot.get_metadata();
        out.events.push(Event::SnapshotInstalled {
            index: meta.index,
            term: meta.term,
        });
        out.events.push(Event::ConfChanged {
            index: meta.index,
            context: Vec::new(),
            conf_state: meta.get_conf_state().clone(),
        });
        Ok(())
    }

    /// Applies committed entries into `batch`: state-machine changes, applied index and any new
    /// conf state are committed together, in one transaction.
    fn apply_entries(
        &mut self,
        batch: &mut Batch,
        entries: Vec<Entry>,
        out: &mut Output,
    ) -> Result<(), NodeError> {
        metrics::counter!("longhaul_raft_entries_applied_total").increment(entries.len() as u64);
        // Written once, after the last entry: the batch commits whole or not at all.
        let last = entries.last().map(|entry| entry.index);
        for entry in entries {
            let index = entry.index;
            match entry.get_entry_type() {
                EntryType::EntryNormal => {
                    // The empty entry a new leader appends carries no command.
                    if !entry.data.is_empty() {
                        let response = self
                            .state_machine
                            .apply(batch.state_txn()?, index, &entry.data)
                            .map_err(|source| NodeError::StateMachine { index, source })?;
                        out.events.push(Event::Applied {
                            index,
                            term: entry.term,
                            context: entry.context.to_vec(),
                            response,
                        });
                    }
                }
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    let conf_state = self.apply_conf_change(&entry)?;
                    batch.set_conf_state(&conf_state)?;
                    out.events.push(Event::ConfChanged {
                        index,
                        context: entry.context.to_vec(),
                        conf_state,
                    });
                }
            }
        }
        if let Some(index) = last {
            batch.set_applied(index)?;
        }
        Ok(())
    }

    /// Commits a batch of applied entries, then reacts to a membership change that removed
    /// this leader.
    fn commit_applied(&mut self, batch: Batch) -> Result<(), NodeError> {
        self.raw.mut_store().commit(batch)?;
        if self.is_removed_leader() {
            self.hand_over_leadership();
        }
        Ok(())
    }

    fn apply_conf_change(&mut self, entry: &Entry) -> Result<ConfState, NodeError> {
        let corrupt = |source| NodeError::CorruptEntry {
            index: entry.index,
            what: "conf change",
            source,
        };
        let conf_state = if entry.get_entry_type() == EntryType::EntryConfChange {
            let change = ConfChange::parse_from_bytes(&entry.data).map_err(corrupt)?;
            self.raw.apply_conf_change(&change)?
        } else {
            // Empty data is the leader's automatic "leave joint configuration" change.
            let change = ConfChangeV2::parse_from_bytes(&entry.data).map_err(corrupt)?;
            self.raw.apply_conf_change(&change)?
        };
        Ok(conf_state)
    }

    /// raft-rs keeps a removed leader leading (see its `post_conf_change`); it would go on
    /// heartbeating a group it is not part of. Hand leadership to the most caught-up voter.
    fn hand_over_leadership(&mut self) {
        let me = self.config.id;
        let voters = &self.raw.store().state().conf_state.voters;
        let successor = self
            .raw
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| **id != me && voters.contains(id))
            .max_by_key(|(id, progress)| (progress.matched, std::cmp::Reverse(**id)))
            .map(|(id, _)| *id);
        if let Some(successor) = successor {
            self.transfer_leader(successor);
        }
    }

    /// Builds a snapshot of the state machine at the applied index, compresses it with zstd and
    /// stores it (durably) so that lagging peers can be sent it. Returns its index.
    pub fn create_snapshot(&mut self) -> Result<u64, NodeError> {
        let store = self.raw.store();
        let state = store.state();
        let index = state.applied;
        if index == 0 || index == state.snapshot.index {
            return Ok(state.snapshot.index);
        }
        let mut meta = SnapshotMetadata {
            index,
            term: store.term(index)?,
            ..SnapshotMetadata::default()
        };
        meta.set_conf_state(state.conf_state.clone());
        // The state machine is read in a read transaction taken now: single-threaded use means
        // no apply can slip in between, so the data is exactly the state at `index`.
        let data = {
            let txn = store.read()?;
            self.state_machine
                .snapshot(&txn)
                .map_err(|source| NodeError::StateMachine { index, source })?
        };
        let compressed = compress_snapshot(&data)?;
        self.raw
            .mut_store()
            .write(|batch| batch.store_snapshot(&meta, &compressed))?;
        metrics::counter!("longhaul_snapshots_created_total").increment(1);
        Ok(index)
    }

    /// Makes everything applied so far durable (one fsync of the state store, if needed), e.g.
    /// before a planned shutdown, so that the restart re-applies nothing.
    pub fn sync_state(&mut self) -> Result<(), NodeError> {
        Ok(self.raw.mut_store().sync_state()?)
    }

    /// Starts making the applied state durable without waiting for the bulk of the writing:
    /// see [`DiskStorage::stage_state_sync`]. The caller fsyncs the returned file away from the
    /// loop, then calls [`Node::sync_state`].
    pub fn stage_state_sync(&mut self) -> Result<Option<StateFlush>, NodeError> {
        Ok(self.raw.store().stage_state_sync()?)
    }

    /// Removes log entries before `to` (bounded by the applied index; the state store is
    /// fsynced first). A peer that needs a removed entry gets a snapshot, built when raft asks
    /// for it.
    pub fn compact_log(&mut self, to: u64) -> Result<(), NodeError> {
        Ok(self.raw.mut_store().compact(to)?)
    }

    /// The automatic policy of [`NodeConfig::snapshot_interval_entries`]: once the log holds
    /// that many applied entries beyond the retained ones, compact it down to those, or to
    /// the state store's last fsync if that is older (compaction does not wait for an fsync of
    /// the state store: it would stall the loop for tens of milliseconds under load).
    fn maybe_compact(&mut self) -> Result<(), NodeError> {
        let interval = self.config.snapshot_interval_entries;
        let retained = self.config.compaction_retained_entries;
        let state = self.raw.store().state();
        let keep_from = (state.applied + 1)
            .saturating_sub(retained)
            .min(state.durable_applied + 1);
        if interval == 0 || keep_from < state.first_index() + interval {
            return Ok(());
        }
        self.raw.mut_store().compact_durable(keep_from)?;
        Ok(())
    }

    /// Snapshots the state machine at the applied index and compacts the log up to it. Peers
    /// that are further behind then catch up from the snapshot. Returns the snapshot index.
    pub fn snapshot_and_compact(&mut self) -> Result<u64, NodeError> {
        let index = self.create_snapshot()?;
        self.compact_log(index + 1)?;
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::super::kv::{KvCommand, KvStateMachine};
    use super::*;

    fn open(
        dir: &tempfile::TempDir,
        config: NodeConfig,
    ) -> Result<Node<KvStateMachine>, NodeError> {
        let storage = DiskStorage::open(&dir.path().join("raft.redb"))?;
        Node::open(config, storage, KvStateMachine, &[1])
    }

    fn put(key: &str) -> Vec<u8> {
        KvCommand::Put {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
        }
        .encode()
    }

    #[test]
    fn wan_config_follows_etcd_guidance() {
        let lan = NodeConfig::for_rtt(1, Duration::from_micros(300));
        assert_eq!(
            lan,
            NodeConfig::new(1),
            "sub-ms RTT keeps the in-building defaults"
        );
        let wan = NodeConfig::for_rtt(1, Duration::from_millis(250));
        assert_eq!(
            wan.tick_interval * wan.heartbeat_ticks as u32,
            Duration::from_millis(250)
        );
        assert!(wan.tick_interval * wan.election_ticks as u32 >= Duration::from_millis(2500));
    }

    #[test]
    fn invalid_timing_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let config = NodeConfig {
            heartbeat_ticks: 10,
            election_ticks: 10,
            ..NodeConfig::new(1)
        };
        let err = open(&dir, config).unwrap_err();
        assert!(err.to_string().contains("election tick"), "{err}");
    }

    #[test]
    fn single_replica_commits_alone_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = open(&dir, NodeConfig::new(1)).unwrap();
        node.campaign().unwrap();
        let out = node.handle_ready().unwrap();
        assert!(node.is_leader());
        assert!(out.events.contains(&Event::LeaderChanged {
            leader_id: 1,
            term: node.term()
        }));
        assert!(matches!(
            node.propose(b"ctx".to_vec(), Vec::new()),
            Err(NodeError::EmptyProposal)
        ));
        node.propose(b"ctx".to_vec(), put("a")).unwrap();
        let mut applied = Vec::new();
        while node.has_ready() {
            applied.extend(node.handle_ready().unwrap().events);
        }
        let index = applied.iter().find_map(|e| match e {
            Event::Applied { index, context, .. } if context == b"ctx" => Some(*index),
            _ => None,
        });
        let index = index.expect("applied");
        assert_eq!(node.applied_index(), index);
        let term = node.term();
        drop(node);

        let node = open(&dir, NodeConfig::new(1)).unwrap();
        assert_eq!((node.applied_index(), node.term()), (index, term));
        let txn = node.storage().read().unwrap();
        assert_eq!(
            KvStateMachine::get(&txn, b"a").unwrap(),
            Some(b"v".to_vec())
        );
    }

    fn get(node: &Node<KvStateMachine>, key: &str) -> Option<Vec<u8>> {
        let txn = node.storage().read().unwrap();
        KvStateMachine::get(&txn, key.as_bytes()).unwrap()
    }

    /// Proposes `key` and runs the Ready loop until it is applied; returns its index.
    fn put_and_apply(node: &mut Node<KvStateMachine>, key: &str) -> u64 {
        node.propose(key.as_bytes().to_vec(), put(key)).unwrap();
        let mut applied = None;
        while node.has_ready() {
            for event in node.handle_ready().unwrap().events {
                if let Event::Applied { index, context, .. } = event
                    && context == key.as_bytes()
                {
                    applied = Some(index);
                }
            }
        }
        applied.expect("applied")
    }

    #[test]
    fn crash_after_acknowledged_writes_replays_their_deferred_applies_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("raft.redb");
        let mut node = open(&dir, NodeConfig::new(1)).unwrap();
        node.campaign().unwrap();
        while node.has_ready() {
            node.handle_ready().unwrap();
        }
        let a = put_and_apply(&mut node, "a");
        node.sync_state().unwrap();
        // b's entry is fsynced in the log before it is applied and acknowledged; its apply is
        // not fsynced.
        let b = put_and_apply(&mut node, "b");
        assert_eq!(node.applied_index(), b);
        assert_eq!(node.storage().state().durable_applied, a);
        assert_eq!(get(&node, "b"), Some(b"v".to_vec()));
        crate::consensus::harness::crash(node, &store);

        let mut node = open(&dir, NodeConfig::new(1)).unwrap();
        // Back to a consistent older pair: a applied, b only in the log.
        assert_eq!(node.applied_index(), a);
        assert_eq!(get(&node, "a"), Some(b"v".to_vec()));
        assert_eq!(get(&node, "b"), None);
        assert_eq!(node.storage().state().last_index, b);
        // Once leader again, the replica commits its log and applies b again: the acknowledged
        // write is back before any new one.
        node.campaign().unwrap();
        let mut replayed = Vec::new();
        while node.has_ready() {
            for event in node.handle_ready().unwrap().events {
                if let Event::Applied { index, .. } = event {
                    replayed.push(index);
                }
            }
        }
        assert_eq!(replayed, vec![b]);
        assert_eq!(get(&node, "b"), Some(b"v".to_vec()));
    }

    fn add_learner(id: u64) -> ConfChangeV2 {
        let mut single = raft::eraftpb::ConfChangeSingle::default();
        single.set_change_type(raft::eraftpb::ConfChangeType::AddLearnerNode);
        single.node_id = id;
        let mut change = ConfChangeV2::default();
        change.set_changes(vec![single].into());
        change
    }

    /// raft-rs turns a second pending conf change into an empty entry and still returns Ok;
    /// the node refuses it instead, and each change answers with its own context.
    #[test]
    fn a_second_membership_change_is_refused_while_the_first_is_pending() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = open(&dir, NodeConfig::new(1)).unwrap();
        node.campaign().unwrap();
        while node.has_ready() {
            node.handle_ready().unwrap();
        }
        node.propose_conf_change(b"first".to_vec(), add_learner(2))
            .unwrap();
        assert!(node.conf_change_pending());
        assert!(matches!(
            node.propose_conf_change(b"second".to_vec(), add_learner(3)),
            Err(NodeError::ConfChangePending)
        ));
        let mut changed = Vec::new();
        while node.has_ready() {
            for event in node.handle_ready().unwrap().events {
                if let Event::ConfChanged {
                    context,
                    conf_state,
                    ..
                } = event
                {
                    changed.push((context, conf_state.learners.clone()));
                }
            }
        }
        assert_eq!(changed, vec![(b"first".to_vec(), vec![2])]);
        assert!(!node.conf_change_pending());
        node.propose_conf_change(b"third".to_vec(), add_learner(3))
            .unwrap();
    }
}
