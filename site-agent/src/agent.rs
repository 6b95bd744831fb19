//! The running agent: registration and lease, inventory deltas, and the
//! assignment watch, each a task on the tokio runtime.
//!
//! Lease: the agent registers its inventory (the coordinator commits it
//! through Raft and grants a lease), then renews every third of the TTL.
//! A renewal that fails because a replica is unreachable or has no leader
//! moves to the next replica at once, so a leader change costs one or two
//! short timeouts, well inside the TTL. A renewal refused because the lease
//! is gone (the site was marked down) registers again.
//!
//! Assignments: the watch resumes after the last revision the agent
//! handled (persisted in its state directory), so after a reconnect or a
//! restart nothing is missed and nothing is handled twice.

pub mod backoff;
pub mod lease;
pub mod watch;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_core::topology::Site;
use longhaul_proto::convert::{domain_group_to_wire, site_to_wire};
use longhaul_proto::v1 as pb;
use tonic::Code;

use crate::coordinator::{Coordinators, is_transient};
use crate::inventory::Inventory;
use crate::status::{SharedStatus, lock};
use crate::store::{AgentState, JobRecord, Store};

/// Where the inventory comes from; called at start and on every rescan.
pub trait Discover: Send + Sync + 'static {
    /// A one-line description for logs and status ("slurm via scontrol").
    fn describe(&self) -> String;
    fn discover(&self) -> Result<Inventory, String>;
}

/// What the agent does with an assignment (render files, submit).
pub trait Handle: Send + 'static {
    /// Handles a new or changed assignment; returns what was done.
    fn assign(
        &mut self,
        assignment: &pb::Assignment,
        inventory: &Inventory,
    ) -> Result<JobRecord, String>;
    /// The job no longer runs here.
    fn remove(&mut self, job_id: &str, record: &JobRecord);
}

/// Settings of the running agent.
#[derive(Debug, Clone)]
pub struct Settings {
    pub site_id: String,
    /// Where other agents reach this one (QUIC), as registered.
    pub data_address: String,
    /// Time between inventory rescans; a change is reported as a delta.
    pub rescan_interval: Duration,
    /// Bound on one call to the coordinator.
    pub call_timeout: Duration,
}

/// The changes that turn `old` into `new` at domain-group granularity, or
/// `None` when only a new registration can express them (buildings added or
/// removed, a fabric or site-level figure changed).
pub fn inventory_delta(old: &Site, new: &Site) -> Option<Vec<pb::DomainGroupChange>> {
    use pb::domain_group_change::Change;
    let same_shape = old.id == new.id
        && old.name == new.name
        && old.location == new.location
        && old.campus_interconnect == new.campus_interconnect
        && old.buildings.len() == new.buildings.len()
        && old
            .buildings
            .iter()
            .zip(&new.buildings)
            .all(|(a, b)| a.id == b.id && a.fabric == b.fabric);
    if !same_shape {
        return None;
    }
    let mut changes = Vec::new();
    for (before, after) in old.buildings.iter().zip(&new.buildings) {
        for group in &after.domains {
            if before.domains.iter().find(|g| g.id == group.id) != Some(group) {
                changes.push(pb::DomainGroupChange {
                    building_id: after.id.clone(),
                    change: Some(Change::Put(domain_group_to_wire(group))),
                });
            }
        }
        for group in &before.domains {
            if !after.domains.iter().any(|g| g.id == group.id) {
                changes.push(pb::DomainGroupChange {
                    building_id: before.id.clone(),
                    change: Some(Change::RemoveGroupId(group.id.clone())),
                });
            }
        }
    }
    Some(changes)
}

/// Everything the running agent is made of.
pub struct Agent {
    pub settings: Settings,
    pub coordinators: Coordinators,
    pub discover: Arc<dyn Discover>,
    /// The inventory discovered at start.
    pub inventory: Inventory,
    pub handler: Box<dyn Handle>,
    pub store: Store,
    /// The state loaded from the store.
    pub state: AgentState,
    pub status: SharedStatus,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Starts the lease and watch tasks. They run until the runtime stops.
pub fn spawn(agent: Agent) -> Vec<tokio::task::JoinHandle<()>> {
    let Agent {
        settings,
        coordinators,
        discover,
        inventory,
        handler,
        store,
        state,
        status,
    } = agent;
    {
        let mut board = lock(&status);
        board.inventory = Some(inventory.clone());
        board.inventory_source = discover.describe();
        board.last_revision = state.last_revision;
        board.jobs = state.jobs.clone();
        board.endpoint = coordinators.url().to_string();
    }
    let inventory = Arc::new(Mutex::new(inventory));
    let (lease_tx, lease_rx) = tokio::sync::watch::channel(None);
    let reregister = Arc::new(tokio::sync::Notify::new());
    let lease = tokio::spawn(lease_task(
        settings.clone(),
        coordinators.clone(),
        inventory.clone(),
        status.clone(),
        lease_tx,
        reregister.clone(),
    ));
    let rescan = tokio::spawn(rescan_task(
        settings.clone(),
        coordinators.clone(),
        discover,
        inventory.clone(),
        status.clone(),
        lease_rx,
        reregister,
    ));
    let watch = tokio::spawn(watch_task(
        settings,
        coordinators,
        inventory,
        handler,
        store,
        state,
        status,
    ));
    vec![lease, rescan, watch]
}

fn current(inventory: &Mutex<Inventory>) -> Inventory {
    inventory
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Registers, then renews; re-registers when the lease is lost or the
/// rescan task asks for it. Publishes the lease held (`None` while
/// registering). Nothing else runs in this loop, so a slow call elsewhere
/// never delays a renewal.
async fn lease_task(
    settings: Settings,
    mut coordinators: Coordinators,
    inventory: Arc<Mutex<Inventory>>,
    status: SharedStatus,
    lease: tokio::sync::watch::Sender<Option<u64>>,
    reregister: Arc<tokio::sync::Notify>,
) {
    let mut backoff = Backoff::new();
    loop {
        lease.send_replace(None);
        // Register (any replica; followers forward to the leader).
        let site = current(&inventory).site;
        let request = pb::RegisterRequest {
            site_id: settings.site_id.clone(),
            inventory: Some(site_to_wire(&site)),
            data_address: settings.data_address.clone(),
        };
        let mut call = tonic::Request::new(request);
        call.set_timeout(settings.call_timeout);
        let (lease_id, ttl) = match coordinators.client().register(call).await {
            Ok(response) => {
                let response = response.into_inner();
                backoff.reset();
                (
                    response.lease_id,
                    Duration::from_millis(response.lease_ttl_ms.max(1)),
                )
            }
            Err(error) => {
                let transient = is_transient(&error);
                tracing::warn!(
                    endpoint = coordinators.url(),
                    code = ?error.code(),
                    message = error.message(),
                    "registration failed"
                );
                if transient {
                    switch(&mut coordinators, &status);
                }
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
        };
        {
            let mut board = lock(&status);
            board.registered = true;
            board.lease_id = lease_id;
            board.lease_ttl = ttl;
            board.last_renewal = Some(Instant::now());
        }
        lease.send_replace(Some(lease_id));
        metrics::counter!("longhaul_agent_registrations_total").increment(1);
        tracing::info!(site = %settings.site_id, lease_id, ttl_ms = ttl.as_millis() as u64, endpoint = coordinators.url(), "registered");

        // Renew every third of the TTL; a failed renewal retries at once
        // elsewhere, with the call bounded so a dead replica costs little.
        let period = ttl / 3;
        let call_timeout = (ttl / 6).clamp(Duration::from_millis(100), settings.call_timeout);
        let mut next_renewal = Instant::now() + period;
        let lost = loop {
            tokio::select! {
                () = tokio::time::sleep_until(next_renewal.into()) => {}
                () = reregister.notified() => break "the inventory changed shape".to_string(),
            }
            let mut call = tonic::Request::new(pb::KeepAliveRequest {
                site_id: settings.site_id.clone(),
                lease_id,
            });
            call.set_timeout(call_timeout);
            match coordinators.client().keep_alive(call).await {
                Ok(response) => {
                    let response = response.into_inner();
                    {
                        let mut board = lock(&status);
                        board.last_renewal = Some(Instant::now());
                        board.renewals += 1;
                        board.leader_id = response.leader_id;
                    }
                    metrics::counter!("longhaul_agent_lease_renewals_total").increment(1);
                    coordinators.prefer(&response.leader_url);
                    lock(&status).endpoint = coordinators.url().to_string();
                    next_renewal = Instant::now() + period;
                }
                Err(error) if matches!(error.code(), Code::NotFound | Code::FailedPrecondition) => {
                    break error.message().to_string();
                }
                Err(error) => {
                    tracing::debug!(endpoint = coordinators.url(), code = ?error.code(), message = error.message(), "renewal failed; trying the next replica");
                    switch(&mut coordinators, &status);
                    // Retry soon, not at once: a cluster without a leader
                    // should not be hammered.
                    next_renewal = Instant::now() + Duration::from_millis(50).min(period);
                    continue;
                }
            }
        };
        lock(&status).registered = false;
        tracing::warn!(site = %settings.site_id, reason = %lost, "lease lost; registering again");
    }
}

/// Rescans the inventory every `rescan_interval` (off the async threads: a
/// scheduler command may take seconds) and reports what changed under the
/// lease held.
async fn rescan_task(
    settings: Settings,
    mut coordinators: Coordinators,
    discover: Arc<dyn Discover>,
    inventory: Arc<Mutex<Inventory>>,
    status: SharedStatus,
    lease: tokio::sync::watch::Receiver<Option<u64>>,
    reregister: Arc<tokio::sync::Notify>,
) {
    loop {
        tokio::time::sleep(settings.rescan_interval).await;
        let Some(lease_id) = *lease.borrow() else {
            continue;
        };
        let source = discover.clone();
        let fresh = match tokio::task::spawn_blocking(move || source.discover()).await {
            Ok(Ok(fresh)) => fresh,
            Ok(Err(error)) => {
                // Keep the registered inventory: a scheduler that does not
                // answer is not evidence that GPUs are gone.
                tracing::warn!(%error, "inventory rescan failed; keeping the last inventory");
                continue;
            }
            Err(error) => {
                tracing::error!(%error, "inventory rescan task failed");
                continue;
            }
        };
        match rescan(
            &settings,
            &mut coordinators,
            fresh,
            &inventory,
            &status,
            lease_id,
        )
        .await
        {
            Rescan::Unchanged | Rescan::Reported => {}
            Rescan::NeedsRegistration => reregister.notify_one(),
        }
    }
}

enum Rescan {
    Unchanged,
    Reported,
    NeedsRegistration,
}

async fn rescan(
    settings: &Settings,
    coordinators: &mut Coordinators,
    fresh: Inventory,
    inventory: &Mutex<Inventory>,
    status: &SharedStatus,
    lease_id: u64,
) -> Rescan {
    let old = current(inventory);
    if fresh.site == old.site {
        if fresh != old {
            *inventory
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh.clone();
            lock(status).inventory = Some(fresh);
        }
        return Rescan::Unchanged;
    }
    let Some(changes) = inventory_delta(&old.site, &fresh.site) else {
        *inventory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh.clone();
        lock(status).inventory = Some(fresh);
        return Rescan::NeedsRegistration;
    };
    let mut call = tonic::Request::new(pb::InventoryDeltaRequest {
        site_id: settings.site_id.clone(),
        lease_id,
        changes,
    });
    call.set_timeout(settings.call_timeout);
    match coordinators.client().report_inventory_delta(call).await {
        Ok(_) => {
            tracing::info!(gpus = fresh.site.gpus(), "inventory change reported");
            metrics::counter!("longhaul_agent_inventory_deltas_total").increment(1);
            *inventory
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh.clone();
            lock(status).inventory = Some(fresh);
            Rescan::Reported
        }
        // Not answered: the next rescan computes the delta again (a put is
        // idempotent; a removal already applied comes back NOT_FOUND and
        // leads to a registration, which is always right).
        Err(error) if is_transient(&error) => {
            tracing::warn!(code = ?error.code(), message = error.message(), "inventory delta not answered; retrying at the next rescan");
            switch(coordinators, status);
            Rescan::Unchanged
        }
        // The lease is gone, or the coordinator's record no longer matches
        // what the delta assumed: a full registration settles it.
        Err(error) if matches!(error.code(), Code::FailedPrecondition | Code::NotFound) => {
            tracing::warn!(code = ?error.code(), message = error.message(), "inventory delta refused; registering again");
            *inventory
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh.clone();
            lock(status).inventory = Some(fresh);
            Rescan::NeedsRegistration
        }
        // Refused as invalid: registering it would be refused too. Keep the
        // registered inventory and say why, at every rescan.
        Err(error) => {
            tracing::error!(code = ?error.code(), message = error.message(), "the coordinator refuses the changed inventory; keeping the registered one");
            Rescan::Unchanged
        }
    }
}

fn switch(coordinators: &mut Coordinators, status: &SharedStatus) {
    coordinators.rotate();
    let mut board = lock(status);
    board.reconnects += 1;
    board.endpoint = coordinators.url().to_string();
    metrics::counter!("longhaul_agent_reconnects_total").increment(1);
}

/// Watches the site's assignments from the last handled revision on.
async fn watch_task(
    settings: Settings,
    mut coordinators: Coordinators,
    inventory: Arc<Mutex<Inventory>>,
    handler: Box<dyn Handle>,
    store: Store,
    mut state: AgentState,
    status: SharedStatus,
) {
    let handler: SharedHandler = Arc::new(Mutex::new(handler));
    let mut backoff = Backoff::new();
    loop {
        let after = state.last_revision;
        let request = pb::WatchAssignmentsRequest {
            site_id: settings.site_id.clone(),
            after_revision: after,
        };
        let mut stream = match coordinators.client().watch_assignments(request).await {
            Ok(response) => response.into_inner(),
            Err(error) => {
                if error.code() == Code::OutOfRange {
                    tracing::warn!(after, "assignment history compacted; listing from scratch");
                    state.last_revision = 0;
                    continue;
                }
                tracing::debug!(code = ?error.code(), message = error.message(), "assignment watch failed; trying the next replica");
                switch(&mut coordinators, &status);
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
        };
        // Jobs listed by a full listing; the sync point drops the others.
        let mut listed: Option<std::collections::BTreeSet<String>> =
            (after == 0).then(Default::default);
        loop {
            let message = match stream.message().await {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(code = ?error.code(), message = error.message(), "assignment stream ended");
                    break;
                }
            };
            backoff.reset();
            let mut changed = false;
            if message.sync_point {
                if let Some(listed) = listed.take() {
                    let gone: Vec<String> = state
                        .jobs
                        .keys()
                        .filter(|j| !listed.contains(*j))
                        .cloned()
                        .collect();
                    for job in gone {
                        if let Some(record) = state.jobs.remove(&job) {
                            lock_handler(&handler).remove(&job, &record);
                        }
                    }
                }
                if message.revision > state.last_revision {
                    state.last_revision = message.revision;
                    changed = true;
                }
            } else {
                if let Some(listed) = listed.as_mut() {
                    listed.insert(message.job_id.clone());
                }
                match handle(&mut state, &handler, &message, &inventory).await {
                    Outcome::Nothing => {}
                    Outcome::Progress => changed = true,
                    Outcome::Handled => {
                        changed = true;
                        lock(&status).record_handled(message.revision);
                    }
                }
            }
            if changed {
                if let Err(error) = store.save(&state) {
                    tracing::error!(%error, "cannot persist the agent state; the next start may handle assignments again");
                }
                let mut board = lock(&status);
                board.last_revision = state.last_revision;
                board.jobs = state.jobs.clone();
                metrics::gauge!("longhaul_agent_last_revision").set(state.last_revision as f64);
            }
        }
        switch(&mut coordinators, &status);
        tokio::time::sleep(backoff.next()).await;
    }
}

/// What one assignment message did.
enum Outcome {
    /// Already handled (a repeat in a full listing).
    Nothing,
    /// Only the last revision moved.
    Progress,
    /// Rendered, submitted or removed.
    Handled,
}

type SharedHandler = Arc<Mutex<Box<dyn Handle>>>;

fn lock_handler(handler: &SharedHandler) -> std::sync::MutexGuard<'_, Box<dyn Handle>> {
    handler
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Applies one assignment message. Rendering and submitting run off the
/// async threads (a 100k-rank table, an `sbatch` that takes seconds).
async fn handle(
    state: &mut AgentState,
    handler: &SharedHandler,
    message: &pb::Assignment,
    inventory: &Mutex<Inventory>,
) -> Outcome {
    let known = state.jobs.get(&message.job_id);
    // A full listing repeats jobs already handled; a removal of a job this
    // site never had is only progress.
    let nothing_to_do = known.is_some_and(|r| r.revision >= message.revision)
        || (known.is_none() && message.removed);
    if nothing_to_do {
        if message.revision > state.last_revision {
            state.last_revision = message.revision;
            return Outcome::Progress;
        }
        return Outcome::Nothing;
    }
    if message.removed {
        if let Some(record) = state.jobs.remove(&message.job_id) {
            tracing::info!(job = %message.job_id, revision = message.revision, "job no longer runs on this site");
            lock_handler(handler).remove(&message.job_id, &record);
        }
    } else {
        let inventory = current(inventory);
        let worker = handler.clone();
        let owned = message.clone();
        let outcome =
            tokio::task::spawn_blocking(move || lock_handler(&worker).assign(&owned, &inventory))
                .await
                .unwrap_or_else(|e| Err(format!("the rendering task failed: {e}")));
        match outcome {
            Ok(record) => {
                tracing::info!(job = %message.job_id, revision = message.revision, ranks = message.ranks.len(), "assignment handled");
                state.jobs.insert(message.job_id.clone(), record);
            }
            Err(error) => {
                // Recorded as handled: retrying cannot fix a rendering
                // error; the next assignment for the job tries again.
                tracing::error!(job = %message.job_id, revision = message.revision, %error, "assignment could not be handled");
                metrics::counter!("longhaul_agent_assignment_errors_total").increment(1);
                state.jobs.insert(
                    message.job_id.clone(),
                    JobRecord {
                        revision: message.revision,
                        ranks: message.ranks.len() as u64,
                        ..JobRecord::default()
                    },
                );
            }
        }
    }
    state.last_revision = state.last_revision.max(message.revision);
    Outcome::Handled
}

/// Exponential backoff between 100 ms and 2 s.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self {
            next: Duration::from_millis(100),
        }
    }
    fn reset(&mut self) {
        self.next = Duration::from_millis(100);
    }
    fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(Duration::from_secs(2));
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_core::Topology;

    fn site() -> Site {
        Topology::from_toml(
            "t.toml",
            include_str!("../../deploy/examples/two-campuses-80km.toml"),
        )
        .unwrap()
        .sites
        .remove(0)
    }

    #[test]
    fn a_changed_group_is_a_put_a_vanished_one_a_removal() {
        use pb::domain_group_change::Change;
        let old = site();
        assert_eq!(inventory_delta(&old, &old), Some(vec![]));
        let mut new = old.clone();
        new.buildings[0].domains[0].count -= 1;
        let mut extra = new.buildings[0].domains[0].clone();
        extra.id = "drained".into();
        extra.count = 1;
        new.buildings[0].domains.push(extra);
        let changes = inventory_delta(&old, &new).unwrap();
        let puts: Vec<&str> = changes
            .iter()
            .filter_map(|c| match &c.change {
                Some(Change::Put(g)) => Some(g.id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            puts,
            vec![old.buildings[0].domains[0].id.as_str(), "drained"]
        );
        let mut fewer = old.clone();
        let gone = fewer.buildings[0].domains.remove(0).id;
        if fewer.buildings[0].domains.is_empty() {
            // A building needs a group; add an unrelated one.
            let mut g = old.buildings[0].domains[0].clone();
            g.id = "other".into();
            fewer.buildings[0].domains.push(g);
        }
        let changes = inventory_delta(&old, &fewer).unwrap();
        assert!(
            changes
                .iter()
                .any(|c| c.change == Some(Change::RemoveGroupId(gone.clone())))
        );
        // A new building, or a changed fabric, needs a registration.
        let mut moved = old.clone();
        moved.buildings[0].fabric.oversubscription = 3.0;
        assert_eq!(inventory_delta(&old, &moved), None);
        let mut renamed = old.clone();
        renamed.buildings[0].id = "annex".into();
        assert_eq!(inventory_delta(&old, &renamed), None);
    }
}
