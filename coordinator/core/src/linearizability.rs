//! A linearizability checker for histories of a key-value store of registers.
//!
//! Clients record a [`History`]: each operation's invocation and its completion, `Ok` with a
//! result, `Fail` (it definitely did not take effect) or `Unknown` (a timeout or a lost
//! connection: it may or may not have taken effect). [`History::check`] then decides whether
//! some total order of the operations explains every result and respects real time.
//!
//! The search is Wing & Gong's, with Lowe's memoization as in porcupine: operations are a
//! doubly linked list of call and return entries sorted by time; the search linearizes any
//! call that comes before the first remaining return and whose result the register model
//! accepts, backtracks at a return it could not reach, and never revisits a (set of linearized
//! operations, register state) pair it has already explored. Keys are independent registers,
//! so each key's sub-history is checked on its own (linearizability is compositional), which
//! keeps the sets small.
//!
//! Time is any number that grows with real time. An operation precedes another only if it
//! completed strictly before the other was invoked; equal times count as concurrent.
//! A `Fail`ed operation is dropped. An `Unknown` operation's response never arrives: it may be
//! linearized anywhere after its invocation, including after everything else, which is the
//! same as leaving it out. An `Unknown` read constrains nothing and is dropped.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::hash::Hash;

/// An operation on one register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<K, V> {
    /// Sets `key` to `value`.
    Write { key: K, value: V },
    /// Sets `key` to `new` if it holds `expected` (`None`: the key is absent).
    Cas { key: K, expected: Option<V>, new: V },
    /// Reads `key`.
    Read { key: K },
}

impl<K, V> Op<K, V> {
    pub fn key(&self) -> &K {
        match self {
            Op::Write { key, .. } | Op::Cas { key, .. } | Op::Read { key } => key,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Op::Write { .. } => "write",
            Op::Cas { .. } => "compare-and-set",
            Op::Read { .. } => "read",
        }
    }
}

/// What a completed operation returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult<V> {
    Written,
    Cas { swapped: bool },
    Read(Option<V>),
}

impl<V> OpResult<V> {
    fn kind(&self) -> &'static str {
        match self {
            OpResult::Written => "write",
            OpResult::Cas { .. } => "compare-and-set",
            OpResult::Read(_) => "read",
        }
    }
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<V> {
    Ok(OpResult<V>),
    /// The operation definitely did not take effect (e.g. refused by a replica that is not
    /// the leader).
    Fail,
    /// The operation may or may not have taken effect (e.g. a timeout).
    Unknown,
}

/// One operation of a history with its interval. `completed_at` is `None` for operations that
/// never completed or ended `Unknown`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation<K, V> {
    pub process: u64,
    pub op: Op<K, V>,
    pub invoked_at: u64,
    pub completed_at: Option<u64>,
    pub outcome: Outcome<V>,
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Display for Operation<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process {} ", self.process)?;
        match &self.op {
            Op::Write { key, value } => write!(f, "write {key:?} = {value:?}")?,
            Op::Cas { key, expected, new } => write!(f, "cas {key:?} {expected:?} -> {new:?}")?,
            Op::Read { key } => write!(f, "read {key:?}")?,
        }
        match &self.outcome {
            Outcome::Ok(OpResult::Written) => write!(f, ": ok")?,
            Outcome::Ok(OpResult::Cas { swapped }) => write!(f, ": swapped={swapped}")?,
            Outcome::Ok(OpResult::Read(value)) => write!(f, ": {value:?}")?,
            Outcome::Fail => write!(f, ": fail")?,
            Outcome::Unknown => write!(f, ": unknown")?,
        }
        match self.completed_at {
            Some(at) => write!(f, " [{}, {at}]", self.invoked_at),
            None => write!(f, " [{}, ∞)", self.invoked_at),
        }
    }
}

/// A history that does not make sense as a record of clients, found while recording it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    #[error(
        "process {process} invoked an operation at {at} while its operation invoked at {open_since} is still open"
    )]
    ProcessBusy {
        process: u64,
        at: u64,
        open_since: u64,
    },
    #[error("process {process} completed an operation at {at} but has none open")]
    NothingOpen { process: u64, at: u64 },
    #[error("process {process} answered its {op} with a {result} result")]
    WrongResult {
        process: u64,
        op: &'static str,
        result: &'static str,
    },
    #[error("process {process} completed at {completed_at} an operation invoked at {invoked_at}")]
    CompletedBeforeInvoked {
        process: u64,
        invoked_at: u64,
        completed_at: u64,
    },
}

/// No order of one key's operations explains their results.
///
/// `operations` is the shortest failing prefix of that key's history found by bisection: the
/// operations invoked by `until`, where those still running at `until` count as `Unknown`.
/// `culprit` is the operation whose completion at `until` made the prefix impossible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation<K, V> {
    pub key: K,
    pub until: u64,
    pub culprit: Operation<K, V>,
    pub operations: Vec<Operation<K, V>>,
}

/// How many of a violation's operations [`Violation`]'s `Display` prints: the most recent ones,
/// which are the ones that conflict.
const SHOWN_OPERATIONS: usize = 40;

impl<K: fmt::Debug, V: fmt::Debug> fmt::Display for Violation<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "key {:?} is not linearizable: no order of its {} operations invoked by {} explains \
             every result; the first completion that cannot be explained is\n  {}",
            self.key,
            self.operations.len(),
            self.until,
            self.culprit
        )?;
        let skipped = self.operations.len().saturating_sub(SHOWN_OPERATIONS);
        if skipped > 0 {
            writeln!(f, "  ... {skipped} earlier operations")?;
        }
        for operation in &self.operations[skipped..] {
            writeln!(f, "  {operation}")?;
        }
        Ok(())
    }
}

impl<K: fmt::Debug, V: fmt::Debug> std::error::Error for Violation<K, V> {}

/// A history being recorded: at most one open operation per process.
#[derive(Debug, Clone)]
pub struct History<K, V> {
    operations: Vec<Operation<K, V>>,
    open: BTreeMap<u64, usize>,
}

impl<K, V> Default for History<K, V> {
    fn default() -> Self {
        Self {
            operations: Vec::new(),
            open: BTreeMap::new(),
        }
    }
}

impl<K, V> History<K, V>
where
    K: Ord + Clone + fmt::Debug,
    V: Clone + Eq + Hash + fmt::Debug,
{
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `process` invoked `op` at `at`.
    pub fn invoke(&mut self, process: u64, op: Op<K, V>, at: u64) -> Result<(), HistoryError> {
        if let Some(&open) = self.open.get(&process) {
            return Err(HistoryError::ProcessBusy {
                process,
                at,
                open_since: self.operations[open].invoked_at,
            });
        }
        self.open.insert(process, self.operations.len());
        self.operations.push(Operation {
            process,
            op,
            invoked_at: at,
            completed_at: None,
            outcome: Outcome::Unknown,
        });
        Ok(())
    }

    /// Records that `process`'s open operation returned `result` at `at`.
    pub fn ok(&mut self, process: u64, result: OpResult<V>, at: u64) -> Result<(), HistoryError> {
        self.complete(process, Outcome::Ok(result), Some(at), at)
    }

    /// Records that `process`'s open operation definitely did not take effect.
    pub fn fail(&mut self, process: u64, at: u64) -> Result<(), HistoryError> {
        self.complete(process, Outcome::Fail, Some(at), at)
    }

    /// Records that `process` gave up at `at` on its open operation without learning whether
    /// it took effect. Its interval stays open: it may still take effect later.
    pub fn unknown(&mut self, process: u64, at: u64) -> Result<(), HistoryError> {
        self.complete(process, Outcome::Unknown, None, at)
    }

    fn complete(
        &mut self,
        process: u64,
        outcome: Outcome<V>,
        completed_at: Option<u64>,
        at: u64,
    ) -> Result<(), HistoryError> {
        let Some(&index) = self.open.get(&process) else {
            return Err(HistoryError::NothingOpen { process, at });
        };
        let operation = &mut self.operations[index];
        if at < operation.invoked_at {
            return Err(HistoryError::CompletedBeforeInvoked {
                process,
                invoked_at: operation.invoked_at,
                completed_at: at,
            });
        }
        if let Outcome::Ok(result) = &outcome {
            let matches = matches!(
                (&operation.op, result),
                (Op::Write { .. }, OpResult::Written)
                    | (Op::Cas { .. }, OpResult::Cas { .. })
                    | (Op::Read { .. }, OpResult::Read(_))
            );
            if !matches {
                return Err(HistoryError::WrongResult {
                    process,
                    op: operation.op.kind(),
                    result: result.kind(),
                });
            }
        }
        operation.outcome = outcome;
        operation.completed_at = completed_at;
        self.open.remove(&process);
        Ok(())
    }

    pub fn operations(&self) -> &[Operation<K, V>] {
        &self.operations
    }

    /// Checks the history; operations still open count as `Unknown`.
    pub fn check(&self) -> Result<(), Violation<K, V>> {
        check(&self.operations)
    }
}

/// Checks a history given as operations (in any order). Results must match their operations'
/// kinds (as [`History`] ensures); a mismatched result can never be linearized.
pub fn check<K, V>(operations: &[Operation<K, V>]) -> Result<(), Violation<K, V>>
where
    K: Ord + Clone + fmt::Debug,
    V: Clone + Eq + Hash + fmt::Debug,
{
    let mut by_key: BTreeMap<&K, Vec<&Operation<K, V>>> = BTreeMap::new();
    for operation in operations {
        let constrains = !matches!(
            (&operation.op, &operation.outcome),
            (_, Outcome::Fail) | (Op::Read { .. }, Outcome::Unknown)
        );
        if constrains {
            by_key
                .entry(operation.op.key())
                .or_default()
                .push(operation);
        }
    }
    for (key, ops) in by_key {
        if !is_linearizable(&ops, u64::MAX) {
            return Err(shortest_failing_prefix(key, &ops));
        }
    }
    Ok(())
}

/// Bisects on completion times for the first one after which the key's history cannot be
/// linearized. Failure is monotone in the cut: a linearization of a longer prefix, minus the
/// operations invoked after the cut, linearizes the shorter one (those operations come after
/// every operation completed by the cut, and only the results of operations still running at
/// the cut, which are free, can depend on them).
fn shortest_failing_prefix<K, V>(key: &K, ops: &[&Operation<K, V>]) -> Violation<K, V>
where
    K: Clone + fmt::Debug,
    V: Clone + Eq + Hash + fmt::Debug,
{
    let mut cuts: Vec<u64> = ops.iter().filter_map(|o| o.completed_at).collect();
    cuts.sort_unstable();
    cuts.dedup();
    // Invariant: the cut at `cuts[high]` fails (the full history does, and its last finite
    // completion is the last cut: after it only unknown operations remain, which cannot fail).
    let (mut low, mut high) = (0, cuts.len().saturating_sub(1));
    while low < high {
        let middle = low + (high - low) / 2;
        if is_linearizable(ops, cuts[middle]) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    let until = cuts.get(high).copied().unwrap_or(u64::MAX);
    let mut operations: Vec<Operation<K, V>> = ops
        .iter()
        .filter(|o| o.invoked_at <= until)
        .map(|o| cut(o, until))
        .collect();
    operations.sort_by_key(|o| (o.invoked_at, o.completed_at));
    let culprit = operations
        .iter()
        .find(|o| o.completed_at == Some(until))
        .or(operations.last())
        .cloned()
        .unwrap_or_else(|| cut(ops[0], until));
    Violation {
        key: key.clone(),
        until,
        culprit,
        operations,
    }
}

/// The operation as seen at time `until`: one still running then has an unknown outcome.
fn cut<K: Clone, V: Clone>(operation: &Operation<K, V>, until: u64) -> Operation<K, V> {
    let mut operation = operation.clone();
    if operation.completed_at.is_some_and(|at| at > until) {
        operation.completed_at = None;
        operation.outcome = Outcome::Unknown;
    }
    operation
}

/// The register model: the state after applying `op` with `outcome` to `state`, or `None` if
/// the outcome is impossible from `state`.
fn step<K, V: Clone + Eq>(
    state: &Option<V>,
    op: &Op<K, V>,
    outcome: &Outcome<V>,
) -> Option<Option<V>> {
    match (op, outcome) {
        (Op::Write { value, .. }, Outcome::Ok(OpResult::Written) | Outcome::Unknown) => {
            Some(Some(value.clone()))
        }
        (Op::Cas { expected, new, .. }, Outcome::Ok(OpResult::Cas { .. }) | Outcome::Unknown) => {
            let swaps = state == expected;
            if let Outcome::Ok(OpResult::Cas { swapped }) = outcome
                && *swapped != swaps
            {
                return None;
            }
            Some(if swaps {
                Some(new.clone())
            } else {
                state.clone()
            })
        }
        (Op::Read { .. }, Outcome::Ok(OpResult::Read(value))) => {
            (value == state).then(|| state.clone())
        }
        _ => None,
    }
}

/// A call or return entry of the search list.
#[derive(Debug, Clone, Copy)]
struct Entry {
    op: usize,
    time: u64,
    is_call: bool,
}

/// The set of linearized operations, hashed together with the state in the memo.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bitset(Vec<u64>);

impl Bitset {
    fn new(len: usize) -> Self {
        Self(vec![0; len.div_ceil(64)])
    }

    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }

    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

/// An operation as the search sees it: op, outcome, invocation and completion.
type Interval<'a, K, V> = (&'a Op<K, V>, Outcome<V>, u64, u64);

/// Whether one key's operations (`Fail`s and unknown reads already dropped), cut at `until`,
/// have a linearization.
fn is_linearizable<K, V: Clone + Eq + Hash>(ops: &[&Operation<K, V>], until: u64) -> bool {
    const NEVER: u64 = u64::MAX;
    let ops: Vec<Interval<'_, K, V>> = ops
        .iter()
        .filter(|o| o.invoked_at <= until)
        .map(|o| match o.completed_at {
            Some(at) if at <= until => (&o.op, o.outcome.clone(), o.invoked_at, at),
            _ => (&o.op, Outcome::Unknown, o.invoked_at, NEVER),
        })
        .filter(|(op, outcome, ..)| !matches!((op, outcome), (Op::Read { .. }, Outcome::Unknown)))
        .collect();
    let mut entries: Vec<Entry> = Vec::with_capacity(2 * ops.len());
    for (i, (_, _, invoked_at, completed_at)) in ops.iter().enumerate() {
        entries.push(Entry {
            op: i,
            time: *invoked_at,
            is_call: true,
        });
        entries.push(Entry {
            op: i,
            time: *completed_at,
            is_call: false,
        });
    }
    // Calls sort before returns at equal times: operations touching in time are concurrent.
    entries.sort_by_key(|e| (e.time, !e.is_call));
    let n = entries.len();
    let (head, end) = (n, n + 1);
    let mut next = vec![end; n + 2];
    let mut prev = vec![head; n + 2];
    let order: Vec<usize> = std::iter::once(head).chain(0..n).chain([end]).collect();
    for pair in order.windows(2) {
        next[pair[0]] = pair[1];
        prev[pair[1]] = pair[0];
    }
    let mut return_of = vec![0; ops.len()];
    for (index, entry) in entries.iter().enumerate() {
        if !entry.is_call {
            return_of[entry.op] = index;
        }
    }

    let mut linearized = Bitset::new(ops.len());
    let mut seen: HashSet<(Bitset, Option<V>)> = HashSet::new();
    let mut stack: Vec<(usize, Option<V>)> = Vec::new();
    let mut state: Option<V> = None;
    let mut at = next[head];
    loop {
        if at == end {
            return true;
        }
        let entry = entries[at];
        if entry.is_call {
            let (op, outcome, ..) = &ops[entry.op];
            if let Some(new_state) = step(&state, op, outcome) {
                linearized.set(entry.op);
                if seen.insert((linearized.clone(), new_state.clone())) {
                    stack.push((at, std::mem::replace(&mut state, new_state)));
                    for e in [at, return_of[entry.op]] {
                        next[prev[e]] = next[e];
                        prev[next[e]] = prev[e];
                    }
                    at = next[head];
                    continue;
                }
                linearized.clear(entry.op);
            }
            at = next[at];
        } else {
            // The first remaining return is the earliest: if it never comes, every remaining
            // operation is unknown and can go last, in any order.
            if entry.time == NEVER {
                return true;
            }
            let Some((call, before)) = stack.pop() else {
                return false;
            };
            state = before;
            let op = entries[call].op;
            linearized.clear(op);
            for e in [return_of[op], call] {
                next[prev[e]] = e;
                prev[next[e]] = e;
            }
            at = next[call];
        }
    }
}

#[cfg(test)]
#[path = "linearizability_tests.rs"]
mod tests;
