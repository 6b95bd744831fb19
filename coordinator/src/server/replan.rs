//! Re-planning when a site goes down or comes back.
//!
//! Every replica watches applied events; only the leader acts. On a liveness
//! transition (and when it becomes leader, and to retry what it could not
//! store) it re-examines each live job against the sites that are up:
//! a placed job whose plan still holds (every site it uses is up and the
//! plan passes the hard-constraint checker) keeps its plan, so nothing moves
//! that need not, unless it is a DiLoCo plan that leaves out a site that is
//! up and allowed and placing it again takes that site in (a site back
//! after the job was re-placed without it rejoins the outer rounds); any
//! other job is placed again, and the new outcome (a plan, or why it is
//! infeasible) goes through raft as `SetPlacement`.

use longhaul_core::cost::CostParams;
use longhaul_core::placement::{Plan, place_measured, validate_plan};
use longhaul_core::state::{
    Change, ClusterState, Command, JobRecord, JobState, LinkRecord, Placement, Request,
};

use super::raft_loop::{RaftHandle, Role};
use super::state_machine::ApplyResponse;

/// Why a job's placement changes, for the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Replan {
    pub job_id: String,
    pub placement: Placement,
    pub reason: String,
}

/// The placements to change after a liveness transition (pure: the caller
/// proposes them).
pub fn replans(state: &ClusterState) -> Vec<Replan> {
    ReplanInputs::of(state).replans()
}

/// What re-planning reads of the state, copied out of it, so placement
/// (which can take seconds) runs without holding the state's lock: apply
/// waits for that lock, and a held read would stall the whole log.
#[derive(Debug, Clone)]
pub struct ReplanInputs {
    topology: longhaul_core::Topology,
    links: Vec<LinkRecord>,
    jobs: Vec<JobRecord>,
    /// The state's [`ClusterState::liveness_epoch`] when these were read:
    /// what a `SetPlacement` computed from them is conditional on.
    sites_as_of: u64,
}

impl ReplanInputs {
    /// The sites that are up, every link record and the jobs that may need
    /// placing (placed, infeasible or pending).
    pub fn of(state: &ClusterState) -> Self {
        Self {
            topology: state.live_topology("registered-sites"),
            links: state.links().cloned().collect(),
            jobs: state
                .jobs()
                .filter(|job| {
                    matches!(
                        job.state,
                        JobState::Placed | JobState::Infeasible | JobState::Pending
                    )
                })
                .cloned()
                .collect(),
            sites_as_of: state.liveness_epoch(),
        }
    }

    /// The placements to change.
    pub fn replans(&self) -> Vec<Replan> {
        self.jobs
            .iter()
            .filter_map(|job| replan(job, &self.topology, &self.links))
            .collect()
    }
}

/// Places `spec` on the sites that are up: its allowed sites that are down
/// are left out (and it is infeasible when all of them are). The sync
/// planner of DiLoCo candidates reads the links' latest probes from
/// `links` (the state's records).
pub fn place_live(
    topology: &longhaul_core::Topology,
    links: &[LinkRecord],
    spec: &longhaul_core::JobSpec,
) -> Result<Plan, String> {
    let spec = spec.restricted_to(topology)?;
    place_measured(topology, &spec, &CostParams::default(), links)
        .map_err(|error| error.to_string())
}

/// Whether a plan with replicas per site (DiLoCo, cross-site data
/// parallelism) leaves out a site that is up and that the job
/// allows: a site that came back after the job was re-placed without it.
/// Placing the job again tells whether it is worth using (placement is
/// deterministic, so a site left out by choice is left out again).
fn leaves_out_a_site_that_is_up(
    job: &JobRecord,
    plan: &Plan,
    topology: &longhaul_core::Topology,
) -> bool {
    let allowed = &job.spec.constraints.allowed_sites;
    plan.mode.replicas_per_site()
        && topology.sites.iter().any(|site| {
            (allowed.is_empty() || allowed.contains(&site.id))
                && !plan.site_order.contains(&site.id)
        })
}

fn replan(
    job: &JobRecord,
    topology: &longhaul_core::Topology,
    links: &[LinkRecord],
) -> Option<Replan> {
    if let Some(plan) = job.placement.plan()
        && let Ok(spec) = job.spec.restricted_to(topology)
        && validate_plan(topology, &spec, plan).is_ok()
    {
        if !leaves_out_a_site_that_is_up(job, plan, topology) {
            return None;
        }
        // A plan that still holds is replaced only by another plan, the one
        // placement picks with the site back (a site it takes in takes part
        // from the next outer round, after catching up).
        let grown = place_live(topology, links, &job.spec).ok()?;
        let placement = Placement::placed(grown);
        let reason = match placement.plan() {
            // Only a plan that takes in a site the current one leaves out:
            // a plan that differs otherwise (the schedule re-planned from
            // newer link probes, say) is no reason to move a running job.
            Some(grown)
                if grown
                    .site_order
                    .iter()
                    .any(|site| !plan.site_order.contains(site)) =>
            {
                format!(
                    "a site came back: placed on {}",
                    grown.site_order.join(", ")
                )
            }
            _ => return None,
        };
        return Some(Replan {
            job_id: job.id.clone(),
            placement,
            reason,
        });
    }
    let (placement, reason) = match place_live(topology, links, &job.spec) {
        Ok(plan) => {
            let placement = Placement::placed(plan);
            let reason = match &placement {
                Placement::Placed { plan } => format!("placed on {}", plan.site_order.join(", ")),
                Placement::Infeasible { reason } => reason.clone(),
                Placement::Pending => String::new(),
            };
            (placement, reason)
        }
        Err(error) => (
            Placement::Infeasible {
                reason: error.clone(),
            },
            error,
        ),
    };
    (placement != job.placement).then(|| Replan {
        job_id: job.id.clone(),
        placement,
        reason,
    })
}

/// Starts the watcher on this replica. A pass runs on the leader after
/// every site liveness transition, when this replica becomes leader (a
/// transition the previous leader saw may not have been acted on), and
/// again a second later when a pass could not store all its changes.
pub fn spawn(raft: RaftHandle) {
    let mut events = raft.subscribe();
    let mut status = raft.watch_status();
    tokio::spawn(async move {
        let mut was_leader = false;
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            let retry = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let why = tokio::select! {
                event = events.recv() => match event {
                    Ok(event) => {
                        let Change::Site { record } = &event.change else {
                            continue;
                        };
                        if record.liveness_revision != event.revision {
                            continue;
                        }
                        format!("site {} went {:?}", record.site.id, record.liveness)
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        "missed events".to_string()
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                changed = status.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let leader = status.borrow_and_update().role == Role::Leader;
                    let became = leader && !was_leader;
                    was_leader = leader;
                    if !became {
                        continue;
                    }
                    "this replica became leader".to_string()
                }
                () = retry => {
                    retry_at = None;
                    "retrying changes not stored".to_string()
                }
            };
            if raft.status().role != Role::Leader {
                continue;
            }
            let inputs = ReplanInputs::of(&raft.state().read());
            let sites_as_of = inputs.sites_as_of;
            let changes = match tokio::task::spawn_blocking(move || inputs.replans()).await {
                Ok(changes) => changes,
                Err(error) => {
                    tracing::error!(%error, "re-planning task failed");
                    continue;
                }
            };
            for change in changes {
                tracing::info!(job = %change.job_id, reason = %change.reason, trigger = %why, "re-planning");
                let command = Command::SetPlacement {
                    job_id: change.job_id.clone(),
                    placement: change.placement,
                    at_unix_ms: super::service::now_unix_ms(),
                    sites_as_of: Some(sites_as_of),
                };
                match raft.propose(Request::new(command)).await {
                    Ok(ApplyResponse::Applied { .. }) => {
                        metrics::counter!("longhaul_replans_total", "outcome" => "applied")
                            .increment(1);
                    }
                    // A site changed liveness while this pass placed: that
                    // change's own pass places again from the newer sites.
                    Ok(ApplyResponse::Refused { error }) => {
                        metrics::counter!("longhaul_replans_total", "outcome" => "refused")
                            .increment(1);
                        tracing::info!(job = %change.job_id, %error, "re-plan refused");
                    }
                    Err(error) => {
                        metrics::counter!("longhaul_replans_total", "outcome" => "failed")
                            .increment(1);
                        tracing::warn!(job = %change.job_id, %error, "re-plan not stored; retrying in a second");
                        retry_at =
                            Some(tokio::time::Instant::now() + std::time::Duration::from_secs(1));
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use longhaul_core::state::{Command, Liveness, Placement, Request};
    use longhaul_core::{JobSpec, Topology};

    use super::replans;

    const TOPOLOGY: &str = include_str!("../../../deploy/examples/three-sites-two-continents.toml");
    const JOB: &str = include_str!("../../../deploy/examples/dense-400b.job.toml");

    /// The three sites up, links configured, the 400B job (which lists all
    /// three as allowed) submitted unplaced.
    fn state() -> longhaul_core::state::ClusterState {
        let topology = Topology::from_toml("t.toml", TOPOLOGY).unwrap();
        let mut state = longhaul_core::state::ClusterState::default();
        for site in &topology.sites {
            state
                .apply(&Request::new(Command::RegisterSite {
                    site: site.clone(),
                    data_address: String::new(),
                    at_unix_ms: 0,
                    lease_id: 0,
                    lease_ttl_ms: 0,
                }))
                .unwrap();
        }
        for link in &topology.links {
            state
                .apply(&Request::new(Command::PutLink { link: link.clone() }))
                .unwrap();
        }
        let spec = JobSpec::from_toml("j.toml", JOB).unwrap();
        assert_eq!(spec.constraints.allowed_sites.len(), 3);
        state
            .apply(&Request::new(Command::SubmitJob {
                job_id: spec.name.clone(),
                spec,
                placement: Placement::Pending,
            }))
            .unwrap();
        state
    }

    fn down(state: &mut longhaul_core::state::ClusterState, site: &str) {
        state
            .apply(&Request::new(Command::MarkSiteDown {
                site_id: site.into(),
                reason: "test".into(),
                at_unix_ms: 0,
                lease_id: None,
            }))
            .unwrap();
    }

    #[test]
    fn an_allowed_site_that_is_down_is_left_out_not_fatal() {
        let mut state = state();
        down(&mut state, "virginia");
        assert_eq!(state.site("virginia").unwrap().liveness, Liveness::Down);
        let changes = replans(&state);
        assert_eq!(changes.len(), 1);
        let Some(plan) = changes[0].placement.plan() else {
            panic!(
                "the job is placeable on paris and frankfurt: {:?}",
                changes[0]
            );
        };
        assert!(
            plan.site_order.iter().all(|s| s != "virginia"),
            "{:?}",
            plan.site_order
        );
    }

    /// Three sites an ocean apart (the outer-round tests' fixture), where
    /// the 400B job trains DiLoCo replicas on all three or any two.
    fn three_continents() -> longhaul_core::state::ClusterState {
        let topology = Topology::from_toml(
            "three-continents.toml",
            include_str!("../../tests/cluster/fixtures/three-continents.toml"),
        )
        .unwrap();
        let mut state = longhaul_core::state::ClusterState::default();
        for site in &topology.sites {
            state.apply(&register(site.clone())).unwrap();
        }
        for link in &topology.links {
            state
                .apply(&Request::new(Command::PutLink { link: link.clone() }))
                .unwrap();
        }
        let mut spec = JobSpec::from_toml("j.toml", JOB).unwrap();
        spec.constraints.allowed_sites = topology.sites.iter().map(|s| s.id.clone()).collect();
        state
            .apply(&Request::new(Command::SubmitJob {
                job_id: spec.name.clone(),
                spec,
                placement: Placement::Pending,
            }))
            .unwrap();
        state
    }

    fn register(site: longhaul_core::topology::Site) -> Request {
        Request::new(Command::RegisterSite {
            site,
            data_address: String::new(),
            at_unix_ms: 0,
            lease_id: 0,
            lease_ttl_ms: 0,
        })
    }

    #[test]
    fn a_diloco_job_re_placed_without_a_site_takes_it_back_when_it_returns() {
        let mut state = three_continents();
        let apply = |state: &mut longhaul_core::state::ClusterState, change: super::Replan| {
            state
                .apply(&Request::new(Command::SetPlacement {
                    job_id: change.job_id,
                    placement: change.placement,
                    at_unix_ms: 0,
                    sites_as_of: None,
                }))
                .unwrap();
        };
        let first = replans(&state).remove(0);
        let sites = first.placement.plan().unwrap().site_order.clone();
        assert_eq!(sites.len(), 3, "{sites:?}");
        apply(&mut state, first);
        let victim = sites[0].clone();
        down(&mut state, &victim);
        let without = replans(&state).remove(0);
        let plan = without.placement.plan().unwrap();
        assert!(!plan.site_order.contains(&victim), "{:?}", plan.site_order);
        assert!(
            matches!(
                plan.mode,
                longhaul_core::placement::CrossSiteMode::Diloco { .. }
            ),
            "{:?}",
            plan.mode
        );
        apply(&mut state, without);
        assert!(
            replans(&state).is_empty(),
            "the plan holds while the site is down"
        );
        let site = state.site(&victim).unwrap().site.clone();
        state.apply(&register(site)).unwrap();
        let back = replans(&state);
        assert_eq!(back.len(), 1, "{back:?}");
        assert_eq!(back[0].placement.plan().unwrap().site_order, sites);
        assert!(
            back[0].reason.contains("a site came back"),
            "{}",
            back[0].reason
        );
        apply(&mut state, back.into_iter().next().unwrap());
        assert!(
            replans(&state).is_empty(),
            "placed as before: nothing more to do"
        );
    }

    /// A pass that places while a site comes back (placement takes a while,
    /// off the state's lock) must not undo the return: its `SetPlacement`
    /// is conditional on the sites it read, refused once one has changed,
    /// and the return's own pass places the job with the site.
    #[test]
    fn a_placement_computed_before_a_site_came_back_is_refused_and_changes_nothing() {
        let mut state = three_continents();
        let set = |change: &super::Replan, sites_as_of: u64| {
            Request::new(Command::SetPlacement {
                job_id: change.job_id.clone(),
                placement: change.placement.clone(),
                at_unix_ms: 0,
                sites_as_of: Some(sites_as_of),
            })
        };
        let inputs = super::ReplanInputs::of(&state);
        let first = inputs.replans().remove(0);
        state.apply(&set(&first, inputs.sites_as_of)).unwrap();
        let sites = first.placement.plan().unwrap().site_order.clone();
        let victim = sites[0].clone();
        down(&mut state, &victim);
        // The pass for the site going down reads the sites ...
        let stale = super::ReplanInputs::of(&state);
        let without = stale.replans().remove(0);
        assert!(
            !without
                .placement
                .plan()
                .unwrap()
                .site_order
                .contains(&victim)
        );
        // ... and the site is back before its placement is proposed.
        let site = state.site(&victim).unwrap().site.clone();
        state.apply(&register(site)).unwrap();
        let before = state.job(&first.job_id).unwrap().clone();
        let error = state.apply(&set(&without, stale.sites_as_of)).unwrap_err();
        assert!(error.to_string().contains("sites_as_of"), "{error}");
        assert_eq!(
            state.job(&first.job_id).unwrap(),
            &before,
            "nothing changed"
        );
        assert!(
            super::ReplanInputs::of(&state).replans().is_empty(),
            "the plan that holds the site still stands"
        );
    }

    #[test]
    fn a_job_whose_allowed_sites_are_all_down_is_infeasible_and_says_why() {
        let mut state = state();
        for site in ["paris", "frankfurt", "virginia"] {
            down(&mut state, site);
        }
        let changes = replans(&state);
        assert_eq!(changes.len(), 1);
        match &changes[0].placement {
            Placement::Infeasible { reason } => {
                assert!(
                    reason.contains("none of the job's allowed sites"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
