//! The agent's side of the outer rounds: it watches the rounds its site
//! takes part in (`WatchRounds`), and for each open round in which the
//! site is a live participant it exchanges every fragment with the other
//! live sites ([`ExchangeNode::exchange`]), then reports the fragment
//! contributed and applied with the reduced fragment's hash
//! (`ReportContributed`, `ReportApplied`), which is what the coordinator
//! commits a round on.
//!
//! What the agent contributes ([`Values`]) is either what its **trainers**
//! submit through the local trainer API ([`crate::trainer`]): the driver
//! waits for a fragment's submission (until the round changes), exchanges
//! it and publishes the average (or why there is none) for the trainers to
//! collect; or **synthetic**: [`synthetic_values`] of
//! `exchange.synthetic_elements` f32 values per fragment, seeded from the
//! configured seed, the job, the round, the fragment and the site, so a
//! rehearsal moves a stated, replayable load through the links. With
//! neither the driver does not run (the exchange node still serves peers).
//!
//! - **Plan**: the round's participants less those it excluded, the
//!   round's per-link codecs ([`LinkCodecs::from_round`]), chunks of
//!   [`longhaul_exchange::DEFAULT_CHUNK_ELEMENTS`]; peers at the addresses
//!   the prober keeps ([`crate::prober::Prober::peers`]).
//! - **Fragments** run [`FRAGMENTS_AT_ONCE`] at a time; each keeps its
//!   error-feedback residuals across rounds (per job and fragment).
//! - **Failures**: an exchange that ends without a result (a peer dead,
//!   the deadline, a refusal) is tried again with the round as it is then:
//!   once the coordinator excluded the dead site at the round's deadline,
//!   the plan without it. A site this round excluded, a round that is no
//!   longer open and a fragment already settled or applied end the
//!   fragment's work. Nothing here excludes a peer: the coordinator does,
//!   at the deadline, from what it did not hear.
//! - **Weak**: a round aborted while one of its fragments is being
//!   exchanged keeps that fragment's residuals until the exchange ends
//!   (its deadline at most); the next round's exchange of the fragment,
//!   if it starts meanwhile, begins with none (error feedback restarts
//!   for it).
//! - **Catch-up**: a round that names this site as catching up (it did
//!   not take part in the job's last committed round) has the driver fetch
//!   the trainers' state after that round from the agent of the site
//!   named ([`crate::catchup::fetch`], through the data endpoint), again
//!   while the round is open and this site not excluded, and hand it (or
//!   why there is none) to the trainers ([`TrainerHub::record_fetch`]).
//!   In synthetic mode there is no state: it is only logged.
//! - **Watch**: from revision 0 (every open round, then a sync point),
//!   then every change after the last revision seen whole (a revision may
//!   carry several changes; one seen twice changes nothing); a compacted history
//!   (OUT_OF_RANGE) lists again from 0; a failed stream moves to the next
//!   replica after a backoff. Rounds that ended are forgotten by the node
//!   once their work stopped.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use longhaul_core::rng::{self, SeedRng};
use longhaul_core::state::LinkCodec;
use longhaul_exchange::{CollectivePlan, Contributor, DEFAULT_CHUNK_ELEMENTS, LinkCodecs};
use longhaul_proto::rounds::apply_round_report;
use longhaul_proto::v1 as pb;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tonic::Code;

use crate::agent::backoff::Backoff;
use crate::catchup::CatchUpClient;
use crate::coordinator::{Coordinators, is_transient};
use crate::exchange::{ExchangeError, ExchangeNode, FragmentRequest};
use crate::status::SharedStatus;
use crate::trainer::{FragmentResult, TrainerHub};

mod catch_up;

use catch_up::{Failed, fetch_state, leave_round};

/// Fragments of one round exchanged at once.
pub const FRAGMENTS_AT_ONCE: usize = 4;
/// Largest synthetic fragment (1 GiB of f32).
pub const MAX_SYNTHETIC_ELEMENTS: u64 = longhaul_core::scenario::MAX_EXCHANGE_ELEMENTS;
/// Pause before trying a failed fragment again when the round did not
/// change meanwhile.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// The least time an exchange is given, even past the round's deadline
/// (the coordinator decides when the round is over, not this clock).
const MIN_EXCHANGE_TIME: Duration = Duration::from_secs(2);

/// Where the pseudo-gradients the site contributes come from.
#[derive(Debug, Clone)]
pub enum Values {
    /// [`synthetic_values`]: `elements` per fragment
    /// (1..=[`MAX_SYNTHETIC_ELEMENTS`]), seeded from `seed`.
    Synthetic { elements: u64, seed: u64 },
    /// What the site's trainers submit; the averages go back to them.
    Trainers(Arc<TrainerHub>),
}

/// What the round driver needs.
#[derive(Debug, Clone)]
pub struct RoundSettings {
    pub site_id: String,
    pub values: Values,
    /// Bound on one report to the coordinator.
    pub call_timeout: Duration,
    /// How a catch-up state is fetched from another agent (`None`: it is
    /// not, and a catch-up asked fails).
    pub catch_up: Option<CatchUpClient>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The seeded pseudo-gradient a site contributes to a fragment in
/// synthetic mode: uniform in ±2⁻¹⁰, a function of the seed, the job, the
/// round, the fragment and the site only.
pub fn synthetic_values(
    seed: u64,
    job: &str,
    round: u64,
    fragment: u32,
    site: &str,
    elements: u64,
) -> Vec<f32> {
    let name = format!("{job}/{site}/{fragment}");
    let mut rng = SeedRng::new(rng::derive(seed, &name, round));
    let scale = 2.0 / 1024.0;
    (0..elements)
        .map(|_| ((rng.unit() - 0.5) * scale) as f32)
        .collect()
}

/// What the driver's tasks share.
struct Shared {
    settings: RoundSettings,
    node: Arc<ExchangeNode>,
    peers: watch::Receiver<BTreeMap<String, SocketAddr>>,
    refresh_peers: Arc<Notify>,
    /// Error-feedback state per (job, fragment), carried across rounds;
    /// taken out while its fragment is exchanged.
    contributors: Mutex<HashMap<(String, u32), Contributor>>,
    status: SharedStatus,
}

/// Starts the driver; it runs until the task is aborted. Every fragment
/// applied is logged, counted and shown in the status (`exchanges`).
pub fn spawn(
    settings: RoundSettings,
    coordinators: Coordinators,
    node: Arc<ExchangeNode>,
    peers: watch::Receiver<BTreeMap<String, SocketAddr>>,
    refresh_peers: Arc<Notify>,
    status: SharedStatus,
) -> JoinHandle<()> {
    let shared = Arc::new(Shared {
        settings,
        node,
        peers,
        refresh_peers,
        contributors: Mutex::new(HashMap::new()),
        status,
    });
    tokio::spawn(watch_rounds(shared, coordinators))
}

/// A round the driver holds: its latest state, and the task working on it
/// with when it was started. A task runs until no fragment needs this
/// site; one that stopped while the round still does (a report that gave
/// up while no replica could take it) is started again on a later change,
/// at most every [`RESTART_PAUSE`]: a fragment exchanged before returns
/// its result again at once, so only its reports are sent again.
struct Held {
    round: watch::Sender<pb::OuterRound>,
    task: Option<JoinHandle<()>>,
    started: Option<std::time::Instant>,
}

/// Least time between two starts of a round's work.
const RESTART_PAUSE: Duration = Duration::from_secs(5);

type Key = (String, u64);

async fn watch_rounds(shared: Arc<Shared>, mut coordinators: Coordinators) {
    let site = shared.settings.site_id.clone();
    // Every change up to `after` was seen; `seen` is the latest revision
    // seen, whose changes (one revision may carry several) may not all
    // have come before a stream broke: a new stream resumes after `after`,
    // and a change seen twice changes nothing the second time.
    let mut after = 0u64;
    let mut seen = 0u64;
    let mut held: BTreeMap<Key, Held> = BTreeMap::new();
    let mut backoff = Backoff::new();
    loop {
        let request = pb::WatchRoundsRequest {
            site_id: site.clone(),
            after_revision: after,
        };
        let mut stream = match coordinators.client().watch_rounds(request).await {
            Ok(response) => response.into_inner(),
            Err(status) if status.code() == Code::OutOfRange => {
                tracing::warn!(
                    after,
                    "round history compacted; listing the open rounds again"
                );
                after = 0;
                seen = 0;
                continue;
            }
            Err(status) => {
                tracing::debug!(code = ?status.code(), message = status.message(), "round watch failed; trying the next replica");
                coordinators.rotate();
                tokio::time::sleep(backoff.next_pause()).await;
                continue;
            }
        };
        // A listing from 0 names every open round before its sync point;
        // a held round it does not name is over.
        let mut listed: Option<Vec<Key>> = (after == 0).then(Vec::new);
        loop {
            let event = match stream.message().await {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(code = ?status.code(), message = status.message(), "round stream ended");
                    break;
                }
            };
            backoff.reset();
            if event.sync_point {
                if let Some(listed) = listed.take() {
                    for (key, entry) in held.iter_mut() {
                        if !listed.contains(key) {
                            entry.round.send_modify(|r| {
                                if r.state == pb::RoundState::Open as i32 {
                                    r.state = pb::RoundState::Aborted as i32;
                                    r.reason = "no longer listed as open".to_string();
                                }
                            });
                        }
                    }
                }
            } else if let Some(round) = event.round {
                let key = (round.job_id.clone(), round.round_id);
                if let Some(listed) = listed.as_mut() {
                    listed.push(key.clone());
                }
                match held.get(&key) {
                    Some(entry) => {
                        entry.round.send_replace(round);
                    }
                    None => {
                        held.insert(
                            key,
                            Held {
                                round: watch::channel(round).0,
                                task: None,
                                started: None,
                            },
                        );
                    }
                }
            } else if let Some(report) = event.report
                && let Some(entry) = held.get(&(report.job_id.clone(), report.round_id))
            {
                entry
                    .round
                    .send_modify(|round| apply_round_report(round, &report));
            }
            // A listing's rounds come with their own revisions, in no
            // order: only its sync point says what was seen whole. A sync
            // point of a replica behind what was seen moves nothing back.
            if event.sync_point {
                if event.revision >= seen {
                    seen = event.revision;
                    after = event.revision;
                } else {
                    after = after.max(event.revision);
                }
            } else if listed.is_none() && event.revision > seen {
                after = seen;
                seen = event.revision;
            }
            tend(&shared, &coordinators, &mut held);
        }
        coordinators.rotate();
        tokio::time::sleep(backoff.next_pause()).await;
    }
}

/// Starts the work of rounds that need it and forgets the rounds that
/// ended once their work stopped.
fn tend(shared: &Arc<Shared>, coordinators: &Coordinators, held: &mut BTreeMap<Key, Held>) {
    let site = shared.settings.site_id.as_str();
    held.retain(|(job, round_id), entry| {
        let round = entry.round.borrow().clone();
        if let Values::Trainers(hub) = &shared.settings.values {
            hub.observe_round(&round);
        }
        let open = round.state == pb::RoundState::Open as i32;
        if entry.task.as_ref().is_some_and(JoinHandle::is_finished) {
            entry.task = None;
        }
        if !open && entry.task.is_none() {
            shared.node.forget(job, *round_id);
            tracing::debug!(job, round = round_id, "round over; forgotten");
            return false;
        }
        let due = entry.started.is_none_or(|at| at.elapsed() >= RESTART_PAUSE);
        if open
            && entry.task.is_none()
            && due
            && takes_part(&round, site)
            && !all_applied(&round, site)
        {
            entry.started = Some(std::time::Instant::now());
            entry.task = Some(tokio::spawn(run_round(
                Arc::clone(shared),
                entry.round.subscribe(),
                coordinators.clone(),
            )));
        }
        true
    });
}

fn participant<'a>(round: &'a pb::OuterRound, site: &str) -> Option<&'a pb::RoundParticipant> {
    round.participant_states.iter().find(|p| p.site_id == site)
}

/// Whether `site` is a participant the round did not exclude.
fn takes_part(round: &pb::OuterRound, site: &str) -> bool {
    participant(round, site).is_some_and(|p| !p.excluded)
}

fn all_applied(round: &pb::OuterRound, site: &str) -> bool {
    participant(round, site).is_some_and(|p| p.applied.len() as u32 >= round.fragments)
}

/// Why a fragment needs no more work, or `None` while it does.
fn settled(round: &pb::OuterRound, site: &str, fragment: u32) -> Option<&'static str> {
    if round.state != pb::RoundState::Open as i32 {
        return Some("the round is over");
    }
    let Some(me) = participant(round, site) else {
        return Some("this site is not a participant");
    };
    if me.excluded {
        return Some("this site was excluded");
    }
    if me.applied.iter().any(|a| a.fragment == fragment) {
        return Some("already applied");
    }
    if round
        .fragment_states
        .get(fragment as usize)
        .is_some_and(|f| f.state != "open")
    {
        return Some("the fragment is settled");
    }
    None
}

async fn run_round(
    shared: Arc<Shared>,
    rx: watch::Receiver<pb::OuterRound>,
    coordinators: Coordinators,
) {
    let round = rx.borrow().clone();
    let site = shared.settings.site_id.as_str();
    let mut fragments = JoinSet::new();
    if let Some(me) = participant(&round, site)
        && me.catch_up_from_round != 0
    {
        let (after, from) = (me.catch_up_from_round, me.catch_up_from_site.clone());
        match &shared.settings.values {
            Values::Trainers(hub) if !hub.fetched(&round.job_id, after) => {
                tracing::info!(job = %round.job_id, round = round.round_id, from_site = %from, after_round = after, "catch-up asked: fetching the state");
                let (shared, rx, hub) = (Arc::clone(&shared), rx.clone(), Arc::clone(hub));
                let coordinators = coordinators.clone();
                fragments.spawn(async move {
                    let fetched = fetch_state(&shared, rx.clone(), &hub, after, &from).await;
                    if let Err(Failed { why, leave: true }) = fetched {
                        leave_round(&shared, &rx, coordinators, &why).await;
                    }
                });
            }
            Values::Trainers(_) => {}
            Values::Synthetic { .. } => {
                tracing::info!(job = %round.job_id, round = round.round_id, from_site = %from, after_round = after, "catch-up asked: synthetic values have no state to fetch");
            }
        }
    }
    tracing::info!(job = %round.job_id, round = round.round_id, fragments = round.fragments, participants = ?round.participants, "round open: exchanging");
    let permits = Arc::new(Semaphore::new(FRAGMENTS_AT_ONCE));
    for fragment in 0..round.fragments {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        let (shared, rx, coordinators) = (Arc::clone(&shared), rx.clone(), coordinators.clone());
        fragments.spawn(async move {
            run_fragment(&shared, rx, coordinators, fragment).await;
            drop(permit);
        });
    }
    while fragments.join_next().await.is_some() {}
}

/// The round's per-link codecs as the core holds them.
fn link_codecs(round: &pb::OuterRound) -> Vec<LinkCodec> {
    round
        .links
        .iter()
        .map(|l| LinkCodec {
            between: [l.site_a.clone(), l.site_b.clone()],
            bits: l.bits,
            block_size: l.block_size,
            error_feedback: l.error_feedback,
            zstd: l.zstd,
        })
        .collect()
}

/// The plan of one fragment of `elements` values in `round`: its
/// participants less those it excluded, in chunks of
/// [`DEFAULT_CHUNK_ELEMENTS`].
fn fragment_plan(
    round: &pb::OuterRound,
    elements: u64,
) -> Result<CollectivePlan, longhaul_exchange::PlanError> {
    let excluded: Vec<String> = round
        .participant_states
        .iter()
        .filter(|p| p.excluded)
        .map(|p| p.site_id.clone())
        .collect();
    CollectivePlan::new(
        &round.participants,
        &excluded,
        elements,
        DEFAULT_CHUNK_ELEMENTS,
    )
}

/// How long this machine takes to encode `site`'s synthetic contribution
/// to one fragment of `elements` values in `round`, as the driver does
/// before the exchange sends anything (error feedback, every shard at its
/// link's codec, the residuals checkpointed first): the median of `runs`
/// (at least one) by one contributor, as a site's is kept across rounds.
/// The values are synthetic (seed 0): only their shape is the round's,
/// which is all encoding's time depends on without zstd. `None` when the
/// round cannot be planned, its codecs are unusable or `site` is not live
/// in it. What the simulator beside a rehearsal charges for encoding.
pub fn time_encoding(
    round: &pb::OuterRound,
    site: &str,
    elements: u64,
    runs: u32,
) -> Option<Duration> {
    let plan = fragment_plan(round, elements).ok()?;
    let codecs = LinkCodecs::from_round(&link_codecs(round)).ok()?;
    let values = synthetic_values(0, &round.job_id, round.round_id, 0, site, elements);
    let mut contributor = Contributor::new(elements);
    let mut times = Vec::new();
    for _ in 0..runs.max(1) {
        let started = std::time::Instant::now();
        let checkpoint = contributor.checkpoint();
        contributor
            .contributions_from(&checkpoint, &plan, &codecs, site, &values)
            .ok()?;
        times.push(started.elapsed());
    }
    times.sort_unstable();
    Some(times[times.len() / 2])
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn run_fragment(
    shared: &Shared,
    mut rx: watch::Receiver<pb::OuterRound>,
    mut coordinators: Coordinators,
    fragment: u32,
) {
    let settings = &shared.settings;
    let site = settings.site_id.as_str();
    let (job, round_id) = {
        let round = rx.borrow();
        (round.job_id.clone(), round.round_id)
    };
    let Some(values) = contribution(shared, &mut rx, &job, round_id, fragment).await else {
        return;
    };
    let elements = values.len() as u64;
    let contributor_key = (job.clone(), fragment);
    let mut contributor = lock(&shared.contributors)
        .remove(&contributor_key)
        .filter(|c| c.elements() == elements)
        .unwrap_or_else(|| Contributor::new(elements));
    let values = &values[..];
    let mut failed = 0u32;
    loop {
        let round = rx.borrow_and_update().clone();
        if let Some(why) = settled(&round, site, fragment) {
            tracing::debug!(
                job,
                round = round_id,
                fragment,
                why,
                "fragment needs no exchange"
            );
            break;
        }
        let plan = match fragment_plan(&round, elements) {
            Ok(plan) => plan,
            Err(error) => {
                tracing::warn!(job, round = round_id, fragment, %error, "cannot plan the fragment; waiting for the round to change");
                if rx.changed().await.is_err() {
                    break;
                }
                continue;
            }
        };
        let codecs = match LinkCodecs::from_round(&link_codecs(&round)) {
            Ok(codecs) => codecs,
            Err(error) => {
                tracing::warn!(job, round = round_id, fragment, %error, "the round's codecs are unusable; waiting for the round to change");
                if rx.changed().await.is_err() {
                    break;
                }
                continue;
            }
        };
        let peers = shared.peers.borrow().clone();
        let started_at = now_unix_ms();
        let left = Duration::from_millis(round.deadline_unix_ms.saturating_sub(started_at));
        let request = FragmentRequest {
            job: &job,
            round: round_id,
            fragment,
            plan: &plan,
            codecs: &codecs,
            contributor: &mut contributor,
            values,
            peers: &peers,
            deadline: left.max(MIN_EXCHANGE_TIME),
        };
        let why = match shared.node.exchange(request).await {
            Ok(outcome) if outcome.reason.is_none() => {
                let Some(hash) = outcome.hash.clone() else {
                    break;
                };
                // Back before the reports: the next round may open (and
                // want this fragment's residuals) as soon as they land.
                lock(&shared.contributors).insert(contributor_key, contributor);
                // The trainers may apply the average at once: every live
                // site reduced the same bytes, whatever the reports do.
                if let (Values::Trainers(hub), Some(result)) =
                    (&settings.values, outcome.result.clone())
                {
                    hub.publish(
                        &job,
                        round_id,
                        fragment,
                        FragmentResult::Applied {
                            values: Arc::new(result),
                            hash: hash.clone(),
                            live: plan.live().to_vec(),
                        },
                    );
                }
                if report(
                    shared,
                    &mut coordinators,
                    &job,
                    round_id,
                    fragment,
                    &hash,
                    &round,
                )
                .await
                {
                    let exchange = pb::FragmentExchange {
                        job_id: job.clone(),
                        round: round_id,
                        fragment,
                        live_sites: plan.live().to_vec(),
                        hash: hash.clone(),
                        started_at_unix_ms: started_at,
                        ended_at_unix_ms: started_at + outcome.elapsed.as_millis() as u64,
                        peers: outcome
                            .peers
                            .iter()
                            .map(|(site, p)| pb::PeerTraffic {
                                site_id: site.clone(),
                                sent_bytes: p.sent_bytes,
                                received_bytes: p.received_bytes,
                                resent_bytes: p.resent_bytes,
                            })
                            .collect(),
                        attempts_failed: failed,
                        encoded_us: micros(outcome.phases.encoded),
                        first_data_us: micros(outcome.phases.first_data),
                        reduced_us: micros(outcome.phases.reduced),
                        assembled_us: micros(outcome.phases.assembled),
                    };
                    record(shared, exchange, outcome.elapsed);
                }
                return;
            }
            Ok(outcome) => format!(
                "{} (dead: {:?}, unfinished: {:?})",
                outcome.reason.unwrap_or_default(),
                outcome.dead,
                outcome.unfinished
            ),
            Err(error) => {
                if matches!(error, ExchangeError::NoAddress { .. }) {
                    // A site that just came up: read the peer list again.
                    shared.refresh_peers.notify_one();
                }
                error.to_string()
            }
        };
        failed += 1;
        tracing::warn!(job, round = round_id, fragment, live = ?plan.live(), attempt = failed, reason = %why, "fragment exchange ended without a result; trying again as the round stands");
        metrics::counter!("longhaul_agent_fragments_failed_total").increment(1);
        // Again once the round changed (an exclusion), or after a pause;
        // not at all once the driver is gone.
        if let Ok(Err(_)) = tokio::time::timeout(RETRY_PAUSE, rx.changed()).await {
            break;
        }
    }
    lock(&shared.contributors).insert(contributor_key, contributor);
}

/// A milestone's time for [`pb::FragmentExchange`] (0: not reached).
fn micros(at: Option<Duration>) -> u64 {
    at.map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The site's pseudo-gradient of the fragment: the synthetic one, or the
/// one a trainer submits, waited for while the fragment still needs this
/// site (`None` once it does not).
async fn contribution(
    shared: &Shared,
    rx: &mut watch::Receiver<pb::OuterRound>,
    job: &str,
    round_id: u64,
    fragment: u32,
) -> Option<Arc<Vec<f32>>> {
    let site = shared.settings.site_id.as_str();
    match &shared.settings.values {
        Values::Synthetic { elements, seed } => Some(Arc::new(synthetic_values(
            *seed, job, round_id, fragment, site, *elements,
        ))),
        Values::Trainers(hub) => loop {
            if let Some(why) = settled(&rx.borrow_and_update(), site, fragment) {
                tracing::debug!(
                    job,
                    round = round_id,
                    fragment,
                    why,
                    "fragment needs no contribution"
                );
                return None;
            }
            tokio::select! {
                values = hub.submission(job, round_id, fragment) => return Some(values),
                changed = rx.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
            }
        },
    }
}

fn record(shared: &Shared, exchange: pb::FragmentExchange, elapsed: Duration) {
    let sent: u64 = exchange.peers.iter().map(|p| p.sent_bytes).sum();
    let received: u64 = exchange.peers.iter().map(|p| p.received_bytes).sum();
    let resent: u64 = exchange.peers.iter().map(|p| p.resent_bytes).sum();
    tracing::info!(
        job = %exchange.job_id,
        round = exchange.round,
        fragment = exchange.fragment,
        live = ?exchange.live_sites,
        hash = %exchange.hash.chars().take(23).collect::<String>(),
        ms = elapsed.as_millis() as u64,
        sent_bytes = sent,
        received_bytes = received,
        resent_bytes = resent,
        "fragment applied"
    );
    metrics::counter!("longhaul_agent_fragments_applied_total").increment(1);
    metrics::histogram!("longhaul_agent_fragment_exchange_seconds").record(elapsed.as_secs_f64());
    crate::status::lock(&shared.status).record_exchange(exchange);
}

/// Reports the fragment contributed, then applied with `hash`, retrying
/// at the next replica on a transient failure while the round is open;
/// whether the apply was accepted.
async fn report(
    shared: &Shared,
    coordinators: &mut Coordinators,
    job: &str,
    round_id: u64,
    fragment: u32,
    hash: &str,
    round: &pb::OuterRound,
) -> bool {
    let site = &shared.settings.site_id;
    let contributed = pb::ReportContributedRequest {
        site_id: site.clone(),
        job_id: job.to_string(),
        round: round_id,
        fragment,
    };
    let applied = pb::ReportAppliedRequest {
        site_id: site.clone(),
        job_id: job.to_string(),
        round: round_id,
        fragment,
        hash: hash.to_string(),
        inner_step_us: match &shared.settings.values {
            Values::Trainers(hub) => hub.inner_step_us(job),
            Values::Synthetic { .. } => 0,
        },
    };
    let already = participant(round, site).is_some_and(|p| p.contributed.contains(&fragment));
    let timeout = shared.settings.call_timeout;
    let mut backoff = Backoff::new();
    // Long enough for a leader change, bounded so nothing waits forever.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut contributed_done = already;
    loop {
        let result = if contributed_done {
            let mut request = tonic::Request::new(applied.clone());
            request.set_timeout(timeout);
            coordinators.client().report_applied(request).await
        } else {
            let mut request = tonic::Request::new(contributed.clone());
            request.set_timeout(timeout);
            coordinators.client().report_contributed(request).await
        };
        match result {
            Ok(_) if contributed_done => return true,
            Ok(_) => contributed_done = true,
            Err(status) if is_transient(&status) && tokio::time::Instant::now() < give_up => {
                tracing::debug!(job, round = round_id, fragment, code = ?status.code(), message = status.message(), "round report failed; trying the next replica");
                coordinators.rotate();
                tokio::time::sleep(backoff.next_pause()).await;
            }
            Err(status) => {
                tracing::warn!(job, round = round_id, fragment, code = ?status.code(), message = status.message(), "round report refused");
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(fragments: u32) -> pb::OuterRound {
        pb::OuterRound {
            round_id: 3,
            job_id: "job".into(),
            participants: vec!["a".into(), "b".into()],
            state: pb::RoundState::Open as i32,
            fragments,
            participant_states: ["a", "b"]
                .iter()
                .map(|s| pb::RoundParticipant {
                    site_id: s.to_string(),
                    ..Default::default()
                })
                .collect(),
            fragment_states: (0..fragments)
                .map(|f| pb::RoundFragment {
                    fragment: f,
                    state: "open".into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn synthetic_values_are_a_function_of_their_names_only() {
        let a = synthetic_values(7, "job", 3, 1, "north", 1000);
        assert_eq!(a, synthetic_values(7, "job", 3, 1, "north", 1000));
        for other in [
            synthetic_values(8, "job", 3, 1, "north", 1000),
            synthetic_values(7, "job", 4, 1, "north", 1000),
            synthetic_values(7, "job", 3, 2, "north", 1000),
            synthetic_values(7, "job", 3, 1, "south", 1000),
        ] {
            assert_ne!(a, other);
        }
        assert!(a.iter().all(|v| v.abs() <= 1.0 / 1024.0));
        assert!(a.iter().any(|v| *v > 0.0) && a.iter().any(|v| *v < 0.0));
    }

    #[test]
    fn a_fragment_needs_work_only_while_open_unapplied_and_the_site_is_live() {
        let mut r = round(2);
        assert_eq!(settled(&r, "a", 0), None);
        assert_eq!(settled(&r, "c", 0), Some("this site is not a participant"));
        r.participant_states[0].applied.push(pb::FragmentHash {
            fragment: 0,
            hash: "h".into(),
        });
        assert_eq!(settled(&r, "a", 0), Some("already applied"));
        assert_eq!(settled(&r, "a", 1), None);
        assert!(!all_applied(&r, "a"));
        r.fragment_states[1].state = "committed".into();
        assert_eq!(settled(&r, "a", 1), Some("the fragment is settled"));
        r.participant_states[1].excluded = true;
        assert!(!takes_part(&r, "b"));
        assert_eq!(settled(&r, "b", 1), Some("this site was excluded"));
        r.state = pb::RoundState::Committed as i32;
        assert_eq!(settled(&r, "a", 1), Some("the round is over"));
    }
}
