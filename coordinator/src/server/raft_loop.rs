//! The runtime around the sans-IO [`Node`]: one dedicated thread owns the
//! node, ticks it, feeds it proposals, reads and peer messages, runs the
//! Ready loop and hands outgoing messages to the transport. The thread runs
//! its own single-threaded tokio runtime (timers and channels only), so the
//! log's fsyncs and the applies block that thread and never one of the
//! server runtime's workers, which keep serving gRPC meanwhile; everything
//! reaches the loop through channels.
//!
//! Inputs are drained in batches before each Ready pass, so many concurrent
//! proposals share one fsync (group commit). Everything that waits on the
//! node (a proposal, a read) holds a oneshot and is answered from this task;
//! callers bound the wait with their deadline.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use longhaul_core::state::{Event, Request};
use raft::eraftpb::{ConfChangeV2, ConfState, Message};
use raft::{SnapshotStatus, StateRole};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::state_machine::{AppliedEvents, ApplyResponse, CoordinatorStateMachine, SharedState};
use super::transport::Outbox;
use crate::consensus::{Event as NodeEvent, Node, NodeError};

/// Why a proposal or read could not be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsensusError {
    #[error("no leader is known; retry shortly")]
    NoLeader,
    #[error("this replica is not the leader (leader is {leader_id})")]
    NotLeader { leader_id: u64 },
    #[error(
        "leadership changed before the write was acknowledged; it may or may not have been applied"
    )]
    OutcomeUnknown,
    #[error("leadership is being handed over; retry shortly")]
    HandingOver,
    #[error("the consensus loop has stopped: {0}")]
    Stopped(String),
    #[error("{0}")]
    Rejected(String),
    #[error("{0}")]
    ConfChangePending(String),
    #[error("the linearizable read was not confirmed within {} ms; retry", .0.as_millis())]
    ReadTimedOut(Duration),
    #[error("{0} linearizable reads are already waiting; retry shortly")]
    TooManyReads(usize),
}

/// A snapshot of the replica's raft status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Status {
    pub id: u64,
    pub leader_id: u64,
    pub term: u64,
    pub role: Role,
    pub commit_index: u64,
    pub applied_index: u64,
    pub conf_state: ConfState,
    /// Snapshots installed from a leader since this replica started.
    pub snapshots_installed: u64,
    /// This replica leads and has applied an entry of its own term: every write an earlier
    /// leader acknowledged is in its applied state, so the state is fit to judge a write by.
    pub leader_ready: bool,
    /// This replica leads and is handing leadership over (`Node::is_handing_over`).
    pub handing_over: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    #[default]
    Follower,
    Candidate,
    Leader,
}

/// Where a proposal's outcome goes: the encoded [`ApplyResponse`], decoded by the proposer.
type ProposalReply = oneshot::Sender<Result<Vec<u8>, ConsensusError>>;

pub(crate) enum Input {
    Propose {
        /// The encoded [`Request`]: encoded by the caller, off the consensus loop.
        command: Vec<u8>,
        reply: ProposalReply,
    },
    ReadIndex {
        reply: oneshot::Sender<Result<(), ConsensusError>>,
    },
    ConfirmLeadership {
        reply: oneshot::Sender<Result<(), ConsensusError>>,
    },
    ConfChange {
        change: ConfChangeV2,
        reply: oneshot::Sender<Result<ConfState, ConsensusError>>,
    },
    TransferLeader {
        to: u64,
    },
    Raft(Message),
    Unreachable(u64),
    SnapshotReport {
        to: u64,
        ok: bool,
    },
}

/// A cheap, cloneable handle on the consensus loop.
#[derive(Debug, Clone)]
pub struct RaftHandle {
    input: mpsc::Sender<Input>,
    status: watch::Receiver<Status>,
    state: SharedState,
    events: broadcast::Sender<Event>,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Input::Propose { .. } => "Propose",
            Input::ReadIndex { .. } => "ReadIndex",
            Input::ConfirmLeadership { .. } => "ConfirmLeadership",
            Input::ConfChange { .. } => "ConfChange",
            Input::TransferLeader { .. } => "TransferLeader",
            Input::Raft(_) => "Raft",
            Input::Unreachable(_) => "Unreachable",
            Input::SnapshotReport { .. } => "SnapshotReport",
        })
    }
}

impl RaftHandle {
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// A receiver that changes whenever the status does.
    pub fn watch_status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    pub fn state(&self) -> &SharedState {
        &self.state
    }

    /// Applied events as they happen (after they are durable).
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Proposes a write at this replica, which must be the leader. The command is encoded here
    /// and the response decoded here, in the caller's task, so that the one consensus loop
    /// spends no time on either.
    pub async fn propose(&self, request: Request) -> Result<ApplyResponse, ConsensusError> {
        let command =
            serde_json::to_vec(&request).map_err(|e| ConsensusError::Rejected(e.to_string()))?;
        let (reply, answer) = oneshot::channel();
        self.send(Input::Propose { command, reply }).await?;
        let response = answer
            .await
            .map_err(|_| ConsensusError::Stopped("proposal dropped".into()))??;
        serde_json::from_slice::<ApplyResponse>(&response)
            .map_err(|e| ConsensusError::Rejected(format!("undecodable response: {e}")))
    }

    /// Waits until this replica has applied everything committed when the read
    /// was asked for (raft's ReadIndex); then reads of [`RaftHandle::state`]
    /// are linearizable.
    pub async fn read_index(&self) -> Result<(), ConsensusError> {
        let (reply, answer) = oneshot::channel();
        self.send(Input::ReadIndex { reply }).await?;
        answer
            .await
            .map_err(|_| ConsensusError::Stopped("read dropped".into()))?
    }

    /// Waits until a quorum of voters acknowledged a heartbeat this replica sent as leader
    /// after the call (raft's ReadIndex round: no disk write): then it still led when the call
    /// was made, and no later leader can have been elected before the call (the site leases
    /// rely on it, `longhaul_core::lease`). Refused on a follower and while this replica hands
    /// leadership over.
    pub async fn confirm_leadership(&self) -> Result<(), ConsensusError> {
        let (reply, answer) = oneshot::channel();
        self.send(Input::ConfirmLeadership { reply }).await?;
        answer
            .await
            .map_err(|_| ConsensusError::Stopped("confirmation dropped".into()))?
    }

    pub async fn change_membership(
        &self,
        change: ConfChangeV2,
    ) -> Result<ConfState, ConsensusError> {
        let (reply, answer) = oneshot::channel();
        self.send(Input::ConfChange { change, reply }).await?;
        answer
            .await
            .map_err(|_| ConsensusError::Stopped("membership change dropped".into()))?
    }

    pub async fn transfer_leader(&self, to: u64) -> Result<(), ConsensusError> {
        self.send(Input::TransferLeader { to }).await
    }

    pub(crate) async fn step(&self, message: Message) -> Result<(), ConsensusError> {
        self.send(Input::Raft(message)).await
    }

    pub(crate) fn report_unreachable(&self, to: u64) {
        let _ = self.input.try_send(Input::Unreachable(to));
    }

    pub(crate) fn report_snapshot(&self, to: u64, ok: bool) {
        let _ = self.input.try_send(Input::SnapshotReport { to, ok });
    }

    async fn send(&self, input: Input) -> Result<(), ConsensusError> {
        self.input
            .send(input)
            .await
            .map_err(|_| ConsensusError::Stopped("input channel closed".into()))
    }
}

/// Most inputs handled before one Ready pass: bounds the latency one pass adds.
const MAX_BATCH: usize = 4096;

/// How often the applied state is made durable (when anything was applied since), as etcd
/// commits its backend every 100 ms. Acknowledged writes do not wait for it: their log entries
/// are fsynced before they are applied. It bounds what a restart re-applies. The bulk of the
/// writing is fsynced on a blocking thread while the loop goes on (`Node::stage_state_sync`);
/// the loop then only waits for a small final fsync.
const STATE_SYNC_INTERVAL: Duration = Duration::from_millis(100);
/// A pass of the loop at least this long is logged (at debug): it delays every message and
/// proposal that arrives meanwhile.
const SLOW_PASS: Duration = Duration::from_millis(10);

/// A linearizable read waiting for its ReadIndex confirmation is failed after this long (or
/// as soon as its caller is gone), not only when the leader is lost: a confirmation may never
/// come (a dropped message to a leader that stays leader), and every wait of a caller is
/// bounded by less than this anyway (`forward::DEFAULT_WAIT`, or its own deadline capped by it).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A proposal not applied after this long is answered with an unknown
/// outcome (its entry may still commit), so that no caller waits forever on
/// an entry a later leader overwrote without this replica seeing a change
/// of leader.
const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(10);

/// At most this many reads wait for a confirmation; more are refused at once.
const MAX_PENDING_READS: usize = 65_536;

type ReadReply = oneshot::Sender<Result<(), ConsensusError>>;

struct Pending {
    proposals: HashMap<u64, (Instant, ProposalReply)>,
    reads: HashMap<u64, (Instant, ReadReply)>,
    ready_reads: Vec<(u64, ReadReply)>,
    /// By the sequence number in the change's context: each is answered when its own entry
    /// applies.
    conf_changes: HashMap<u64, oneshot::Sender<Result<ConfState, ConsensusError>>>,
}

impl Pending {
    /// Asks raft for a ReadIndex round answered to `reply`, unless too many already wait.
    fn ask_read(
        &mut self,
        node: &mut Node<CoordinatorStateMachine>,
        seq: u64,
        context: Vec<u8>,
        reply: ReadReply,
    ) {
        if self.reads.len() >= MAX_PENDING_READS {
            let _ = reply.send(Err(ConsensusError::TooManyReads(self.reads.len())));
            return;
        }
        node.read_index(context);
        self.reads.insert(seq, (Instant::now(), reply));
    }

    /// Fails the reads waiting for a confirmation since before `now - max_age`, and forgets
    /// those whose caller is gone; returns how many went.
    fn expire_reads(&mut self, now: Instant, max_age: Duration) -> usize {
        let before = self.reads.len();
        let expired: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, (asked, reply))| {
                reply.is_closed() || now.saturating_duration_since(*asked) > max_age
            })
            .map(|(seq, _)| *seq)
            .collect();
        for seq in expired {
            if let Some((_, reply)) = self.reads.remove(&seq) {
                let _ = reply.send(Err(ConsensusError::ReadTimedOut(max_age)));
            }
        }
        self.ready_reads.retain(|(_, reply)| !reply.is_closed());
        self.conf_changes.retain(|_, reply| !reply.is_closed());
        before - self.reads.len()
    }

    /// Answers the proposals waiting since before `now - max_age` with an unknown outcome;
    /// returns how many.
    fn expire_proposals(&mut self, now: Instant, max_age: Duration) -> usize {
        let expired: Vec<u64> = self
            .proposals
            .iter()
            .filter(|(_, (proposed, _))| now.saturating_duration_since(*proposed) > max_age)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in &expired {
            if let Some((proposed, reply)) = self.proposals.remove(seq) {
                tracing::warn!(
                    seq,
                    waited_ms = now.saturating_duration_since(proposed).as_millis() as u64,
                    "a proposal was not applied in time; its outcome is unknown"
                );
                let _ = reply.send(Err(ConsensusError::OutcomeUnknown));
            }
        }
        expired.len()
    }

    /// Answers every proposal and membership change in flight with an unknown outcome (they
    /// may still commit under another leader, or be lost); returns how many proposals.
    fn abandon_proposals(&mut self) -> u64 {
        let lost = self.proposals.len() as u64;
        for (_, (_, reply)) in self.proposals.drain() {
            let _ = reply.send(Err(ConsensusError::OutcomeUnknown));
        }
        for (_, reply) in self.conf_changes.drain() {
            let _ = reply.send(Err(ConsensusError::OutcomeUnknown));
        }
        lost
    }
}

/// Context bytes that identify a request of this process: replica id, a
/// boot nonce (so a restarted replica never matches an old entry), sequence.
fn context(id: u64, boot: u64, seq: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&boot.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out
}

fn parse_context(bytes: &[u8], id: u64, boot: u64) -> Option<u64> {
    let (ours, seq) = bytes.split_at_checked(16)?;
    (*ours == context(id, boot, 0)[..16]).then_some(())?;
    Some(u64::from_le_bytes(seq.try_into().ok()?))
}

/// The consensus loop's thread. Dropping it (or [`ConsensusThread::stop`])
/// tells the loop to stop; the node, and with it the store, is closed on
/// the thread.
#[derive(Debug)]
pub struct ConsensusThread {
    stop: Option<oneshot::Sender<()>>,
    /// Until the loop's outcome was taken.
    done: Option<oneshot::Receiver<Result<(), NodeError>>>,
}

impl ConsensusThread {
    /// Waits until the loop ends by itself (an error, or every input sender
    /// gone), and says why.
    /// Once it ended, waits forever (the outcome is taken once).
    pub async fn wait(&mut self) -> Result<(), super::ServerError> {
        let Some(done) = self.done.as_mut() else {
            return std::future::pending().await;
        };
        let outcome = done.await;
        self.done = None;
        match outcome {
            Ok(result) => result.map_err(Into::into),
            // The thread ended without a word: it panicked.
            Err(_) => Err(super::ServerError::Config(
                "consensus thread failed: it panicked".into(),
            )),
        }
    }

    /// Tells the loop to stop and waits (at most `limit`, with a warning
    /// if that passes) until the node and its store are closed.
    pub async fn stop(&mut self, limit: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(done) = self.done.take() else {
            return;
        };
        if tokio::time::timeout(limit, done).await.is_err() {
            tracing::warn!(
                ?limit,
                "the consensus thread did not close the store in time; it goes on closing it"
            );
        }
    }
}

impl Drop for ConsensusThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Not joined: a drop must not block an async caller; the thread
        // closes the store and ends by itself.
    }
}

/// Starts the consensus loop for `node` on a thread of its own and returns
/// its handle. Must be called within a tokio runtime, on which the
/// transport's peer tasks are spawned.
pub fn spawn(
    mut node: Node<CoordinatorStateMachine>,
    outbox: Outbox,
    tick_interval: Duration,
) -> Result<(RaftHandle, ConsensusThread), std::io::Error> {
    let (input_tx, input_rx) = mpsc::channel(16 * 1024);
    let (status_tx, status_rx) = watch::channel(Status::default());
    let (events_tx, _) = broadcast::channel(16 * 1024);
    let (stop_tx, stop_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    let state = node.state_machine().shared();
    let applied_events = node.state_machine().applied_events();
    let handle = RaftHandle {
        input: input_tx,
        status: status_rx,
        state,
        events: events_tx.clone(),
    };
    let loop_handle = handle.clone();
    // The runtime is built on the thread (a runtime may not be dropped on an
    // async caller's thread, as it would be if the spawn failed), and the
    // caller waits for it to be built.
    let (started_tx, started_rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(format!("raft-{}", node.id()))
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(runtime) => {
                    let _ = started_tx.send(Ok(()));
                    runtime
                }
                Err(error) => {
                    let _ = started_tx.send(Err(error));
                    return;
                }
            };
            let result = runtime.block_on(run(
                &mut node,
                input_rx,
                stop_rx,
                outbox,
                tick_interval,
                &status_tx,
                &events_tx,
                &applied_events,
                &loop_handle,
            ));
            if let Err(error) = &result {
                tracing::error!(%error, "consensus loop stopped");
            }
            // Close the store before saying so: a replica restarted on the
            // same directory must find it closed.
            drop(node);
            drop(runtime);
            let _ = done_tx.send(result);
        })?;
    started_rx
        .recv()
        .map_err(|_| std::io::Error::other("the consensus thread ended before it started"))??;
    Ok((
        handle,
        ConsensusThread {
            stop: Some(stop_tx),
            done: Some(done_rx),
        },
    ))
}

#[allow(
    clippy::too_many_arguments,
    reason = "the loop's whole environment, wired once by spawn"
)]
async fn run(
    node: &mut Node<CoordinatorStateMachine>,
    mut inputs: mpsc::Receiver<Input>,
    mut stop: oneshot::Receiver<()>,
    outbox: Outbox,
    tick_interval: Duration,
    status: &watch::Sender<Status>,
    events: &broadcast::Sender<Event>,
    applied_events: &AppliedEvents,
    handle: &RaftHandle,
) -> Result<(), NodeError> {
    let id = node.id();
    let boot = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut seq = 0u64;
    let mut pending = Pending {
        proposals: HashMap::new(),
        reads: HashMap::new(),
        ready_reads: Vec::new(),
        conf_changes: HashMap::new(),
    };
    let mut ticker = tokio::time::interval(tick_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state_sync = tokio::time::interval(STATE_SYNC_INTERVAL);
    state_sync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The state file's fsync running on a blocking thread, if one is.
    let mut state_flush: Option<tokio::task::JoinHandle<std::io::Result<()>>> = None;
    let mut leader_id = 0;
    let mut leader_term = 0;
    let mut snapshots_installed = 0;
    // Registered once: a handle records without the registry look-up each call would make.
    let ready_seconds = metrics::histogram!("longhaul_ready_seconds");
    let commit_latency = metrics::histogram!("longhaul_commit_latency_seconds");
    let committed_total = metrics::counter!("longhaul_proposals_committed_total");
    let term_gauge = metrics::gauge!("longhaul_raft_term");
    let leader_gauge = metrics::gauge!("longhaul_raft_is_leader");
    let applied_gauge = metrics::gauge!("longhaul_raft_applied_index");
    let commit_gauge = metrics::gauge!("longhaul_raft_commit_index");
    loop {
        let mut batch = Vec::new();
        // What woke this pass, for the slow-pass event below.
        let mut woke = "input";
        let mut woke_at = None;
        tokio::select! {
            // Asked to stop, or the owner is gone.
            _ = &mut stop => return Ok(()),
            _ = ticker.tick() => {
                woke = "tick";
                woke_at = Some(Instant::now());
                node.tick();
                let expired = pending.expire_reads(Instant::now(), READ_TIMEOUT);
                if expired > 0 {
                    metrics::counter!("longhaul_reads_expired_total").increment(expired as u64);
                }
                let expired = pending.expire_proposals(Instant::now(), PROPOSAL_TIMEOUT);
                if expired > 0 {
                    metrics::counter!("longhaul_proposals_failed_total", "reason" => "timed_out").increment(expired as u64);
                }
            }
            _ = state_sync.tick(), if state_flush.is_none() => {
                woke = "state sync staged";
                woke_at = Some(Instant::now());
                if let Some(file) = node.stage_state_sync()? {
                    state_flush = Some(tokio::task::spawn_blocking(move || file.sync_data()));
                }
            }
            flushed = async {
                match state_flush.as_mut() {
                    Some(flush) => flush.await,
                    None => std::future::pending().await,
                }
            }, if state_flush.is_some() => {
                woke = "state sync";
                woke_at = Some(Instant::now());
                state_flush = None;
                if let Err(error) = flushed.map_err(std::io::Error::other).and_then(|r| r) {
                    // Nothing depended on it: the durable commit below fsyncs everything anyway.
                    tracing::warn!(%error, "flushing the state file ahead of its commit failed");
                }
                node.sync_state()?;
            }
            input = inputs.recv() => match input {
                Some(input) => batch.push(input),
                None => return Ok(()),
            },
        }
        let pass_started = woke_at.unwrap_or_else(Instant::now);
        while batch.len() < MAX_BATCH {
            match inputs.try_recv() {
                Ok(input) => batch.push(input),
                Err(_) => break,
            }
        }
        let batch_len = batch.len();
        for input in batch {
            match input {
                Input::Propose { command, reply } => {
                    if !node.is_leader() {
                        let error = if node.leader_id() == 0 {
                            ConsensusError::NoLeader
                        } else {
                            ConsensusError::NotLeader {
                                leader_id: node.leader_id(),
                            }
                        };
                        let _ = reply.send(Err(error));
                        continue;
                    }
                    seq += 1;
                    match node.propose(context(id, boot, seq), command) {
                        Ok(()) => {
                            pending.proposals.insert(seq, (Instant::now(), reply));
                        }
                        Err(error) => {
                            metrics::counter!("longhaul_proposals_failed_total", "reason" => "rejected").increment(1);
                            let _ = reply.send(Err(ConsensusError::Rejected(error.to_string())));
                        }
                    }
                }
                Input::ReadIndex { reply } => {
                    if node.leader_id() == 0 {
                        let _ = reply.send(Err(ConsensusError::NoLeader));
                        continue;
                    }
                    seq += 1;
                    pending.ask_read(node, seq, context(id, boot, seq), reply);
                }
                Input::ConfirmLeadership { reply } => {
                    // Checked here, in the loop, not from a published status: a hand-over that
                    // began in this pass already refuses.
                    if !node.is_leader() {
                        let error = match node.leader_id() {
                            0 => ConsensusError::NoLeader,
                            leader_id => ConsensusError::NotLeader { leader_id },
                        };
                        let _ = reply.send(Err(error));
                        continue;
                    }
                    if node.is_handing_over() {
                        let _ = reply.send(Err(ConsensusError::HandingOver));
                        continue;
                    }
                    seq += 1;
                    pending.ask_read(node, seq, context(id, boot, seq), reply);
                }
                Input::ConfChange { change, reply } => {
                    if !node.is_leader() {
                        let _ = reply.send(Err(ConsensusError::NotLeader {
                            leader_id: node.leader_id(),
                        }));
                        continue;
                    }
                    seq += 1;
                    match node.propose_conf_change(context(id, boot, seq), change) {
                        Ok(()) => {
                            pending.conf_changes.insert(seq, reply);
                        }
                        Err(error @ NodeError::ConfChangePending) => {
                            let _ = reply
                                .send(Err(ConsensusError::ConfChangePending(error.to_string())));
                        }
                        Err(error) => {
                            let _ = reply.send(Err(ConsensusError::Rejected(error.to_string())));
                        }
                    }
                }
                Input::TransferLeader { to } => node.transfer_leader(to),
                Input::Raft(message) => {
                    if let Err(error) = node.step(message) {
                        tracing::debug!(%error, "dropped a raft message");
                    }
                }
                Input::Unreachable(to) => node.report_unreachable(to),
                Input::SnapshotReport { to, ok } => node.report_snapshot(
                    to,
                    if ok {
                        SnapshotStatus::Finish
                    } else {
                        SnapshotStatus::Failure
                    },
                ),
            }
        }

        let inputs_handled = batch_len;
        let readies_started = Instant::now();
        while node.has_ready() {
            let started = Instant::now();
            let output =
                node.handle_ready_sending(&mut |messages| outbox.send(messages, handle))?;
            ready_seconds.record(started.elapsed().as_secs_f64());
            outbox.send(output.messages, handle);
            for event in output.events {
                match event {
                    NodeEvent::Applied {
                        context, response, ..
                    } => {
                        let Some(seq) = parse_context(&context, id, boot) else {
                            continue;
                        };
                        if let Some((proposed, reply)) = pending.proposals.remove(&seq) {
                            commit_latency.record(proposed.elapsed().as_secs_f64());
                            committed_total.increment(1);
                            let _ = reply.send(Ok(response));
                        }
                    }
                    NodeEvent::ReadIndexReady { context, index } => {
                        let Some(seq) = parse_context(&context, id, boot) else {
                            continue;
                        };
                        if let Some((_, reply)) = pending.reads.remove(&seq) {
                            pending.ready_reads.push((index, reply));
                        }
                    }
                    NodeEvent::LeaderChanged {
                        leader_id: new_leader,
                        term,
                    } => {
                        tracing::info!(leader = new_leader, term, "leader changed");
                        metrics::counter!("longhaul_leader_changes_total").increment(1);
                        // This replica's leadership ended, or went on in a later term (it
                        // stepped down and was elected again between two passes: what it
                        // proposed before may have been overwritten meanwhile).
                        if leader_id == id && (new_leader != id || term != leader_term) {
                            let lost = pending.abandon_proposals();
                            metrics::counter!("longhaul_proposals_failed_total", "reason" => "leader_changed").increment(lost);
                        }
                        leader_term = term;
                        if new_leader == 0 {
                            for (_, (_, reply)) in pending.reads.drain() {
                                let _ = reply.send(Err(ConsensusError::NoLeader));
                            }
                        }
                        leader_id = new_leader;
                    }
                    NodeEvent::ConfChanged {
                        context,
                        conf_state,
                        ..
                    } => {
                        // A snapshot's or the automatic leave-joint change carries no context
                        // of ours and answers nobody.
                        if let Some(reply) = parse_context(&context, id, boot)
                            .and_then(|seq| pending.conf_changes.remove(&seq))
                        {
                            let _ = reply.send(Ok(conf_state));
                        }
                    }
                    NodeEvent::SnapshotInstalled { index, term } => {
                        tracing::info!(index, term, "installed a snapshot from the leader");
                        metrics::counter!("longhaul_snapshots_installed_total").increment(1);
                        snapshots_installed += 1;
                    }
                }
            }
            for event in applied_events.take() {
                // No subscriber is not an error.
                let _ = events.send(event);
            }
        }

        let pass = pass_started.elapsed();
        if pass >= SLOW_PASS {
            tracing::debug!(
                woke,
                inputs = inputs_handled,
                pass_ms = pass.as_secs_f64() * 1e3,
                readies_ms = readies_started.elapsed().as_secs_f64() * 1e3,
                "a slow pass of the raft loop"
            );
        }
        let applied = node.applied_index();
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut pending.ready_reads)
            .into_iter()
            .partition(|(index, _)| *index <= applied);
        pending.ready_reads = waiting;
        for (_, reply) in done {
            let _ = reply.send(Ok(()));
        }

        let role = match node.role() {
            StateRole::Leader => Role::Leader,
            StateRole::Candidate | StateRole::PreCandidate => Role::Candidate,
            StateRole::Follower => Role::Follower,
        };
        let next = Status {
            id,
            leader_id: node.leader_id(),
            term: node.term(),
            role,
            commit_index: node.commit_index(),
            applied_index: applied,
            conf_state: node.conf_state().clone(),
            snapshots_installed,
            leader_ready: role == Role::Leader && node.applied_in_current_term(),
            handing_over: node.is_handing_over(),
        };
        term_gauge.set(next.term as f64);
        leader_gauge.set(if role == Role::Leader { 1.0 } else { 0.0 });
        applied_gauge.set(applied as f64);
        commit_gauge.set(next.commit_index as f64);
        status.send_if_modified(|current| {
            if *current == next {
                false
            } else {
                *current = next;
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_waiting_too_long_fail_and_abandoned_ones_are_forgotten() {
        let mut pending = Pending {
            proposals: HashMap::new(),
            reads: HashMap::new(),
            ready_reads: Vec::new(),
            conf_changes: HashMap::new(),
        };
        let now = Instant::now();
        let old = now.checked_sub(Duration::from_secs(11)).unwrap_or(now);
        let (stale_tx, mut stale_rx) = oneshot::channel();
        let (fresh_tx, mut fresh_rx) = oneshot::channel();
        let (gone_tx, gone_rx) = oneshot::channel();
        drop(gone_rx);
        pending.reads.insert(1, (old, stale_tx));
        pending.reads.insert(2, (now, fresh_tx));
        pending.reads.insert(3, (now, gone_tx));
        let (ready_tx, ready_rx) = oneshot::channel();
        drop(ready_rx);
        pending.ready_reads.push((5, ready_tx));

        assert_eq!(pending.expire_reads(now, READ_TIMEOUT), 2);
        assert!(matches!(
            stale_rx.try_recv(),
            Ok(Err(ConsensusError::ReadTimedOut(_)))
        ));
        assert!(
            fresh_rx.try_recv().is_err(),
            "a fresh read is still waiting"
        );
        assert_eq!(pending.reads.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert!(pending.ready_reads.is_empty());
    }

    #[test]
    fn proposals_waiting_too_long_are_answered_with_an_unknown_outcome() {
        let mut pending = Pending {
            proposals: HashMap::new(),
            reads: HashMap::new(),
            ready_reads: Vec::new(),
            conf_changes: HashMap::new(),
        };
        let now = Instant::now();
        let old = now.checked_sub(Duration::from_secs(11)).unwrap_or(now);
        let (stale_tx, mut stale_rx) = oneshot::channel();
        let (fresh_tx, mut fresh_rx) = oneshot::channel();
        pending.proposals.insert(1, (old, stale_tx));
        pending.proposals.insert(2, (now, fresh_tx));

        assert_eq!(pending.expire_proposals(now, PROPOSAL_TIMEOUT), 1);
        assert!(matches!(
            stale_rx.try_recv(),
            Ok(Err(ConsensusError::OutcomeUnknown))
        ));
        assert!(fresh_rx.try_recv().is_err(), "a fresh proposal still waits");
        assert_eq!(pending.abandon_proposals(), 1);
        assert!(matches!(
            fresh_rx.try_recv(),
            Ok(Err(ConsensusError::OutcomeUnknown))
        ));
        assert!(pending.proposals.is_empty());
    }
}
