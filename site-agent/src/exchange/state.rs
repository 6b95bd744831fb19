//! One fragment's exchange at one node: the collective's state machines,
//! the receiver's ledger and the outboxes to every peer, behind one lock
//! that is never held across an await. Both the server side (data from
//! peers) and the pool (data to peers) go through it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use longhaul_exchange::wire::{self, ChunkId, Header, Kind};
use longhaul_exchange::{
    Accepted, AckLedger, Assembler, CollectivePlan, Outbox, Phase, ShardReducer,
};
use tokio::sync::watch;

use super::PeerReport;

/// Which fragment of which round of which job, under which plan (a
/// re-planned fragment, after an exclusion, is a new exchange).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FragmentKey {
    pub job: String,
    pub round: u64,
    pub fragment: u32,
    pub plan: u32,
}

#[derive(Debug)]
pub(crate) struct Peer {
    pub outbox: Outbox,
    pub report: PeerReport,
    /// The incarnation whose acks the outbox holds.
    pub incarnation: Option<u64>,
    /// Connections welcomed and not yet lost.
    pub connected: u32,
    /// The last time the peer showed it was alive: a welcome, an ack, data.
    pub alive_at: Instant,
    /// Bytes handed to the pool for pacing, since `paced_since`.
    pub paced_bytes: u64,
    pub paced_since: Instant,
    /// The first chunk the peer refused, and why. A receiver refuses what
    /// it cannot take (a frame its reducer or assembler will not hold), and
    /// would refuse the same bytes again: the exchange ends on it rather
    /// than waiting out its deadline.
    pub refused: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub reducer: ShardReducer,
    pub assembler: Assembler,
    pub ledger: AckLedger,
    pub peers: BTreeMap<String, Peer>,
    pub timeline: Timeline,
}

/// When the fragment's exchange passed its milestones at this node (the
/// first time it did, over every attempt): what a round's time is made of.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Timeline {
    /// Its contributions encoded and queued.
    pub encoded: Option<Instant>,
    /// The first data message from a peer taken.
    pub first_data: Option<Instant>,
    /// This node's shard reduced from every live site's contribution (the
    /// reduce-scatter done here).
    pub reduced: Option<Instant>,
    /// Every shard's average held (the result, before the last acks).
    pub assembled: Option<Instant>,
}

/// The state of one fragment's exchange (see the module docs).
#[derive(Debug)]
pub(crate) struct FragmentState {
    pub key: FragmentKey,
    pub me: String,
    pub plan: CollectivePlan,
    inner: Mutex<Inner>,
    /// Bumped at every change that may let a task go on.
    changed: watch::Sender<u64>,
    /// Whether an exchange of this node runs on it now (a second call for
    /// the fragment is refused; a later one resumes it).
    pub active: AtomicBool,
    /// Whether an exchange returned its result (the caller's residuals
    /// moved with it).
    pub delivered: AtomicBool,
}

/// What the server does with a data message.
#[derive(Debug)]
pub(crate) enum Taken {
    /// Held (now or before): acknowledge it.
    Ack,
    /// Refused: answer with the reason.
    Refused(String),
}

impl FragmentState {
    pub fn new(
        key: FragmentKey,
        me: &str,
        plan: CollectivePlan,
        reducer: ShardReducer,
        peers: &[String],
    ) -> FragmentState {
        let now = Instant::now();
        let peers = peers
            .iter()
            .map(|site| {
                let peer = Peer {
                    outbox: Outbox::new(),
                    report: PeerReport::default(),
                    incarnation: None,
                    connected: 0,
                    alive_at: now,
                    paced_bytes: 0,
                    paced_since: now,
                    refused: None,
                };
                (site.clone(), peer)
            })
            .collect();
        let assembler = Assembler::new(&plan);
        FragmentState {
            key,
            me: me.to_string(),
            plan,
            inner: Mutex::new(Inner {
                reducer,
                assembler,
                ledger: AckLedger::new(),
                peers,
                timeline: Timeline::default(),
            }),
            changed: watch::channel(0).0,
            active: AtomicBool::new(false),
            delivered: AtomicBool::new(false),
        }
    }

    /// Starts another attempt on this state (no task of the last one runs
    /// any more): nothing is connected, chunks that were in flight are
    /// uncertain until a peer's welcome says what it holds, and every peer
    /// is given a new [`super::ExchangeOptions::peer_timeout`] from now.
    pub fn resume(&self) {
        let now = Instant::now();
        for peer in self.lock().peers.values_mut() {
            peer.connected = 0;
            peer.outbox.all_lost();
            peer.alive_at = now;
        }
        self.notify();
    }

    /// The lock; a panic while holding it (a bug) does not stop others.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn notify(&self) {
        self.changed.send_modify(|version| *version += 1);
    }

    /// The header of a message about `chunk`.
    pub fn header(&self, kind: Kind, chunk: ChunkId) -> Header {
        Header {
            kind,
            job: self.key.job.clone(),
            round: self.key.round,
            plan: self.plan.digest(),
            chunk,
        }
    }

    /// Queues a data message of `frame` for `to`.
    pub fn queue(
        &self,
        inner: &mut Inner,
        to: &str,
        chunk: ChunkId,
        frame: &[u8],
    ) -> Result<(), wire::EncodeMessageError> {
        let message = wire::encode_to_vec(&self.header(Kind::Data, chunk), frame)?;
        if let Some(peer) = inner.peers.get_mut(to) {
            peer.outbox.push(chunk, message);
        }
        Ok(())
    }

    /// A chunk of this node's shard was reduced: its average goes to every
    /// peer and into this node's own result.
    pub fn gathered(&self, inner: &mut Inner, chunk: usize) -> Result<(), String> {
        let shard = inner.reducer.shard().index;
        let Some((offset, length, frame)) = inner.reducer.gathered(chunk) else {
            return Ok(());
        };
        let frame = frame.to_vec();
        let id = ChunkId {
            phase: Phase::AllGather,
            fragment: self.key.fragment,
            shard,
            offset,
            length,
        };
        let peers: Vec<String> = inner.peers.keys().cloned().collect();
        for peer in peers {
            self.queue(inner, &peer, id, &frame)
                .map_err(|error| error.to_string())?;
        }
        inner
            .assembler
            .accept(&self.me, shard, offset, length, &frame)
            .map_err(|error| error.to_string())?;
        Ok(())
    }

    /// A data message from `from`: checked against the plan, then by the
    /// reducer (a contribution to this node's shard) or the assembler (an
    /// average), which check the codec frame whole before they keep it.
    pub fn take(&self, from: &str, plan: u32, chunk: &ChunkId, frame: &[u8]) -> Taken {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let bytes = frame.len() as u64;
        let Some(peer) = inner.peers.get_mut(from) else {
            return Taken::Refused(format!("site {from:?} is not a peer of this fragment"));
        };
        peer.alive_at = Instant::now();
        if plan != self.key.plan || chunk.fragment != self.key.fragment {
            peer.report.refused += 1;
            return Taken::Refused(format!(
                "plan {plan:#010x} fragment {}: this node exchanges fragment {} under plan {:#010x}",
                chunk.fragment,
                self.key.fragment,
                self.plan.digest()
            ));
        }
        if inner.ledger.holds(from, chunk) {
            peer.report.duplicate_bytes += bytes;
            return Taken::Ack;
        }
        let accepted = match chunk.phase {
            Phase::ReduceScatter => inner.reducer.accept(
                from,
                chunk.shard,
                chunk.offset,
                chunk.length,
                frame.to_vec(),
            ),
            Phase::AllGather => {
                inner
                    .assembler
                    .accept(from, chunk.shard, chunk.offset, chunk.length, frame)
            }
        };
        let Some(peer) = inner.peers.get_mut(from) else {
            return Taken::Refused(format!("site {from:?} is not a peer of this fragment"));
        };
        match accepted {
            Ok(accepted) => {
                inner.timeline.first_data.get_or_insert_with(Instant::now);
                inner.ledger.record(from, chunk);
                if accepted == Accepted::Duplicate {
                    peer.report.duplicate_bytes += bytes;
                } else {
                    peer.report.received_bytes += bytes;
                }
                if let (Phase::ReduceScatter, Accepted::Completed { chunk }) =
                    (chunk.phase, accepted)
                    && let Err(error) = self.gathered(inner, chunk)
                {
                    tracing::error!(%error, "cannot send a reduced chunk");
                }
                Self::milestones(inner);
                drop(guard);
                self.notify();
                Taken::Ack
            }
            Err(error) => {
                peer.report.refused += 1;
                Taken::Refused(error.to_string())
            }
        }
    }

    /// Notes the reduce-scatter's and the result's completion, the first
    /// time either is seen.
    pub fn milestones(inner: &mut Inner) {
        let now = Instant::now();
        if inner.timeline.reduced.is_none() && inner.reducer.is_complete() {
            inner.timeline.reduced = Some(now);
        }
        if inner.timeline.assembled.is_none() && inner.assembler.is_complete() {
            inner.timeline.assembled = Some(now);
        }
    }

    /// Whether this node has its result and every peer acknowledged
    /// everything sent to it.
    pub fn is_complete(inner: &Inner) -> bool {
        inner.assembler.is_complete() && inner.peers.values().all(|p| p.outbox.is_done())
    }
}

/// The fragments a node is exchanging (and has exchanged: their ledgers
/// keep answering peers whose acks were lost, until the round is
/// forgotten).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    fragments: Mutex<HashMap<FragmentKey, Arc<FragmentState>>>,
    registered: watch::Sender<u64>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            fragments: Mutex::new(HashMap::new()),
            registered: watch::channel(0).0,
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<FragmentKey, Arc<FragmentState>>> {
        self.fragments
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds `state`; false when the fragment is being exchanged already.
    pub fn insert(&self, state: Arc<FragmentState>) -> bool {
        let mut map = self.map();
        if map.contains_key(&state.key) {
            return false;
        }
        map.insert(state.key.clone(), state);
        drop(map);
        self.registered.send_modify(|v| *v += 1);
        true
    }

    pub fn get(&self, key: &FragmentKey) -> Option<Arc<FragmentState>> {
        self.map().get(key).cloned()
    }

    /// Waits up to `wait` for `key` to be registered (a peer may start a
    /// fragment a little before this node does).
    pub async fn wait_for(
        &self,
        key: &FragmentKey,
        wait: std::time::Duration,
    ) -> Option<Arc<FragmentState>> {
        let mut changes = self.registered.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(state) = self.get(key) {
                return Some(state);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return self.get(key),
            }
        }
    }

    /// Drops every fragment of `job`'s `round`.
    pub fn forget(&self, job: &str, round: u64) {
        self.map()
            .retain(|key, _| !(key.job == job && key.round == round));
    }
}
