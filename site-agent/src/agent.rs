//! The running agent: registration and lease, inventory deltas, and the
//! assignment watch, each a task on the tokio runtime.
//!
//! The lease's and the watch's decisions are made in sans-IO machines,
//! [`lease::Lease`] and [`watch::Watch`], where the rules are written down
//! and tested with no clock and no network. The tasks here only drive
//! them: they make the calls the machines ask for, sleep until they are
//! due, feed the results back, and carry out what the machines decided
//! (switch replicas, publish the lease, hand assignments to the handler,
//! persist the state, keep the status board, count and log).

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
use lease::{Lease, LeaseCall, LeaseEvent, RenewalFailure};
use watch::{OpenFailure, Removal, Watch, WatchEvent};

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

/// Keeps the lease as [`Lease`] decides: makes its calls, sleeps until it
/// is due, and publishes the lease held (`None` while registering).
/// Nothing else runs in this loop, so a slow call elsewhere never delays a
/// renewal.
async fn lease_task(
    settings: Settings,
    mut coordinators: Coordinators,
    inventory: Arc<Mutex<Inventory>>,
    status: SharedStatus,
    lease: tokio::sync::watch::Sender<Option<u64>>,
    reregister: Arc<tokio::sync::Notify>,
) {
    let mut machine = Lease::new(Instant::now(), settings.call_timeout);
    loop {
        while let Some(event) = machine.poll_event() {
            match event {
                LeaseEvent::SwitchReplica => switch(&mut coordinators, &status),
                LeaseEvent::Registered { lease_id, ttl } => {
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
                }
                LeaseEvent::Renewed {
                    leader_id,
                    leader_url,
                } => {
                    {
                        let mut board = lock(&status);
                        board.last_renewal = Some(Instant::now());
                        board.renewals += 1;
                        board.leader_id = leader_id;
                    }
                    metrics::counter!("longhaul_agent_lease_renewals_total").increment(1);
                    coordinators.prefer(&leader_url);
                    lock(&status).endpoint = coordinators.url().to_string();
                }
                LeaseEvent::Lost { reason } => {
                    lock(&status).registered = false;
                    tracing::warn!(site = %settings.site_id, %reason, "lease lost; registering again");
                    lease.send_replace(None);
                }
            }
        }
        match machine.poll_call(Instant::now()) {
            Some(LeaseCall::Register { timeout }) => {
                // Any replica; followers forward to the leader.
                let site = current(&inventory).site;
                let mut call = tonic::Request::new(pb::RegisterRequest {
                    site_id: settings.site_id.clone(),
                    inventory: Some(site_to_wire(&site)),
                    data_address: settings.data_address.clone(),
                });
                call.set_timeout(timeout);
                match coordinators.client().register(call).await {
                    Ok(response) => {
                        let response = response.into_inner();
                        machine.handle_registered(
                            Instant::now(),
                            response.lease_id,
                            response.lease_ttl_ms,
                        );
                    }
                    Err(error) => {
                        tracing::warn!(
                            endpoint = coordinators.url(),
                            code = ?error.code(),
                            message = error.message(),
                            "registration failed"
                        );
                        machine.handle_register_failed(Instant::now(), error.code());
                    }
                }
            }
            Some(LeaseCall::KeepAlive { lease_id, timeout }) => {
                let mut call = tonic::Request::new(pb::KeepAliveRequest {
                    site_id: settings.site_id.clone(),
                    lease_id,
                });
                call.set_timeout(timeout);
                match coordinators.client().keep_alive(call).await {
                    Ok(response) => {
                        let response = response.into_inner();
                        machine.handle_renewed(
                            Instant::now(),
                            response.leader_id,
                            response.leader_url,
                        );
                    }
                    Err(error) => {
                        let failure = machine.handle_renewal_failed(
                            Instant::now(),
                            error.code(),
                            error.message(),
                        );
                        if failure == RenewalFailure::NextReplica {
                            tracing::debug!(endpoint = coordinators.url(), code = ?error.code(), message = error.message(), "renewal failed; trying the next replica");
                        }
                    }
                }
            }
            None => {
                let Some(due) = machine.poll_timeout() else {
                    continue;
                };
                tokio::select! {
                    () = tokio::time::sleep_until(due.into()) => {}
                    () = reregister.notified() => machine.handle_inventory_reshaped(Instant::now()),
                }
            }
        }
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
    // A change too large for one delta (the coordinator takes at most
    // `MAX_INVENTORY_CHANGES`) is a new registration, as one the delta cannot express is.
    let Some(changes) = inventory_delta(&old.site, &fresh.site)
        .filter(|changes| changes.len() <= longhaul_core::limits::MAX_INVENTORY_CHANGES)
    else {
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

/// Watches the site's assignments as [`Watch`] decides: opens the stream,
/// feeds it the messages, and carries out what it asks for.
async fn watch_task(
    settings: Settings,
    mut coordinators: Coordinators,
    inventory: Arc<Mutex<Inventory>>,
    handler: Box<dyn Handle>,
    store: Store,
    state: AgentState,
    status: SharedStatus,
) {
    let handler: SharedHandler = Arc::new(Mutex::new(handler));
    let mut machine = Watch::new(state, Instant::now());
    loop {
        carry_out(
            &mut machine,
            &mut coordinators,
            &handler,
            &inventory,
            &store,
            &status,
        )
        .await;
        let Some(after) = machine.poll_open(Instant::now()) else {
            if let Some(due) = machine.poll_timeout() {
                tokio::time::sleep_until(due.into()).await;
            }
            continue;
        };
        let request = pb::WatchAssignmentsRequest {
            site_id: settings.site_id.clone(),
            after_revision: after,
        };
        let mut stream = match coordinators.client().watch_assignments(request).await {
            Ok(response) => response.into_inner(),
            Err(error) => {
                match machine.handle_open_failed(Instant::now(), error.code()) {
                    OpenFailure::Compacted { after } => {
                        tracing::warn!(after, "assignment history compacted; listing from scratch");
                    }
                    OpenFailure::NextReplica => {
                        tracing::debug!(code = ?error.code(), message = error.message(), "assignment watch failed; trying the next replica");
                    }
                }
                continue;
            }
        };
        machine.handle_opened();
        loop {
            match stream.message().await {
                Ok(Some(message)) => {
                    machine.handle_message(message);
                    carry_out(
                        &mut machine,
                        &mut coordinators,
                        &handler,
                        &inventory,
                        &store,
                        &status,
                    )
                    .await;
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(code = ?error.code(), message = error.message(), "assignment stream ended");
                    break;
                }
            }
        }
        machine.handle_stream_ended(Instant::now());
    }
}

/// Carries out what the watch asks for, until it asks for nothing more.
/// Rendering and submitting run off the async threads (a 100k-rank table,
/// an `sbatch` that takes seconds).
async fn carry_out(
    machine: &mut Watch,
    coordinators: &mut Coordinators,
    handler: &SharedHandler,
    inventory: &Mutex<Inventory>,
    store: &Store,
    status: &SharedStatus,
) {
    while let Some(event) = machine.poll_event() {
        match event {
            WatchEvent::SwitchReplica => switch(coordinators, status),
            WatchEvent::Assign(message) => {
                let inventory = current(inventory);
                let worker = handler.clone();
                let owned = message.clone();
                let outcome = tokio::task::spawn_blocking(move || {
                    lock_handler(&worker).assign(&owned, &inventory)
                })
                .await
                .unwrap_or_else(|e| Err(format!("the rendering task failed: {e}")));
                match &outcome {
                    Ok(_) => {
                        tracing::info!(job = %message.job_id, revision = message.revision, ranks = message.ranks.len(), "assignment handled");
                    }
                    Err(error) => {
                        // Recorded as handled all the same (see `watch`).
                        tracing::error!(job = %message.job_id, revision = message.revision, %error, "assignment could not be handled");
                        metrics::counter!("longhaul_agent_assignment_errors_total").increment(1);
                    }
                }
                machine.handle_assigned(outcome);
            }
            WatchEvent::Remove {
                job_id,
                record,
                why,
            } => {
                if let Removal::Removed { revision } = why {
                    tracing::info!(job = %job_id, revision, "job no longer runs on this site");
                }
                lock_handler(handler).remove(&job_id, &record);
            }
            WatchEvent::Handled { revision } => lock(status).record_handled(revision),
            WatchEvent::Persist => {
                let state = machine.state();
                if let Err(error) = store.save(state) {
                    tracing::error!(%error, "cannot persist the agent state; the next start may handle assignments again");
                }
                let mut board = lock(status);
                board.last_revision = state.last_revision;
                board.jobs = state.jobs.clone();
                metrics::gauge!("longhaul_agent_last_revision").set(state.last_revision as f64);
            }
        }
    }
}

type SharedHandler = Arc<Mutex<Box<dyn Handle>>>;

fn lock_handler(handler: &SharedHandler) -> std::sync::MutexGuard<'_, Box<dyn Handle>> {
    handler
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
