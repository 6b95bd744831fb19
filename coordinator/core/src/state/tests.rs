use super::*;
use crate::job::JobSpec;
use crate::topology::{Site, WanLink};

const TOPOLOGY: &str = include_str!("../../../../deploy/examples/two-campuses-80km.toml");
const JOB: &str = include_str!("../../../../deploy/examples/llama-70b.job.toml");

fn topology() -> Topology {
    Topology::from_toml("two-campuses-80km.toml", TOPOLOGY).unwrap()
}

fn site(id: &str) -> Site {
    topology().sites.into_iter().find(|s| s.id == id).unwrap()
}

fn link() -> WanLink {
    topology().links[0].clone()
}

fn register(id: &str, at: u64) -> Request {
    Request::new(Command::RegisterSite {
        site: site(id),
        data_address: format!("{id}.example:7000"),
        at_unix_ms: at,
        lease_id: 100 + at,
        lease_ttl_ms: 3_000,
    })
}

fn submit(id: &str) -> Request {
    Request::new(Command::SubmitJob {
        job_id: id.to_string(),
        spec: JobSpec::from_toml("job.toml", JOB).unwrap(),
        placement: Placement::Pending,
    })
}

fn registered() -> ClusterState {
    let mut state = ClusterState::default();
    state.apply(&register("north", 1)).unwrap();
    state.apply(&register("south", 2)).unwrap();
    state
        .apply(&Request::new(Command::PutLink { link: link() }))
        .unwrap();
    state
}

#[test]
fn every_applied_command_bumps_the_revision_by_one() {
    let state = registered();
    assert_eq!(state.revision(), 3);
    assert_eq!(state.sites().count(), 2);
    assert_eq!(state.links().count(), 1);
    let events = state.events_after(0).unwrap();
    let revisions: Vec<u64> = events.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, vec![1, 2, 3]);
}

#[test]
fn a_refused_command_changes_nothing() {
    let mut state = registered();
    let before = state.clone();
    let errors = [
        state.apply(&Request::new(Command::MarkSiteDown {
            site_id: "west".into(),
            reason: "lease".into(),
            at_unix_ms: 5,
            lease_id: None,
        })),
        state.apply(&Request::expecting(
            Command::Noop {
                payload: String::new(),
            },
            2,
        )),
        state.apply(&Request::new(Command::CancelJob {
            job_id: "nope".into(),
            at_unix_ms: 0,
        })),
        state.apply(&Request::new(Command::PutMember {
            member: Member {
                id: 0,
                name: "x".into(),
                peer_url: "p".into(),
                client_url: "c".into(),
            },
        })),
    ];
    assert!(matches!(&errors[0], Err(ApplyError::NotFound { field, .. }) if field == "site_id"));
    assert!(
        matches!(&errors[1], Err(ApplyError::FailedPrecondition { field, message }) if field == "expected_revision" && message.contains("store is at 3"))
    );
    assert!(matches!(&errors[2], Err(ApplyError::NotFound { field, .. }) if field == "job_id"));
    assert!(
        matches!(&errors[3], Err(ApplyError::InvalidArgument { field, .. }) if field == "member.id")
    );
    assert_eq!(state, before);
}

#[test]
fn compare_and_set_applies_only_at_the_expected_revision() {
    let mut state = registered();
    let applied = state
        .apply(&Request::expecting(
            Command::Noop {
                payload: String::new(),
            },
            3,
        ))
        .unwrap();
    assert_eq!(applied.revision, 4);
    assert!(
        state
            .apply(&Request::expecting(
                Command::Noop {
                    payload: String::new()
                },
                3
            ))
            .is_err()
    );
    assert_eq!(state.revision(), 4);
}

#[test]
fn liveness_transitions_record_their_revision() {
    let mut state = registered();
    let down = Command::MarkSiteDown {
        site_id: "south".into(),
        reason: "lease expired".into(),
        at_unix_ms: 10,
        lease_id: None,
    };
    let applied = state.apply(&Request::new(down.clone())).unwrap();
    let record = state.site("south").unwrap();
    assert_eq!(
        (record.liveness, record.liveness_revision),
        (Liveness::Down, applied.revision)
    );
    // Marking it down twice is refused: only transitions are recorded.
    assert!(matches!(
        state.apply(&Request::new(down)),
        Err(ApplyError::FailedPrecondition { .. })
    ));
    // A down site is left out of the live topology, and so is its link.
    let live = state.live_topology("live");
    assert_eq!(live.sites.len(), 1);
    assert!(live.links.is_empty());
    let back = state.apply(&register("south", 20)).unwrap();
    let record = state.site("south").unwrap();
    assert_eq!(
        (record.liveness, record.liveness_revision),
        (Liveness::Up, back.revision)
    );
    // Re-registering a site that is up keeps its transition revision.
    state.apply(&register("south", 30)).unwrap();
    assert_eq!(
        state.site("south").unwrap().liveness_revision,
        back.revision
    );
}

#[test]
fn bad_inventory_is_refused_with_the_field_named() {
    let mut state = ClusterState::default();
    let mut bad = site("north");
    bad.buildings[0].domains[0].gpu = "h900".into();
    let error = state
        .apply(&Request::new(Command::RegisterSite {
            site: bad,
            data_address: String::new(),
            at_unix_ms: 0,
            lease_id: 0,
            lease_ttl_ms: 0,
        }))
        .unwrap_err();
    assert_eq!(
        error,
        ApplyError::invalid(
            "site.buildings[0].domains[0].gpu",
            "unknown GPU type \"h900\": expected one of a100, b200, gb200, gb300, h100, h200, mi300x or a type declared in `gpu_types`"
        )
    );
    assert_eq!(state.revision(), 0);
}

#[test]
fn links_need_registered_sites_and_keep_measurements() {
    let mut state = ClusterState::default();
    state.apply(&register("north", 1)).unwrap();
    let error = state
        .apply(&Request::new(Command::PutLink { link: link() }))
        .unwrap_err();
    assert!(
        matches!(error, ApplyError::NotFound { ref field, .. } if field == "link.between[1]"),
        "{error}"
    );
    state.apply(&register("south", 1)).unwrap();
    state
        .apply(&Request::new(Command::PutLink { link: link() }))
        .unwrap();
    let measurement = LinkMeasurement {
        rtt_ns: 900_000,
        loss_rate: 0.0,
        throughput_bps: 9_000_000_000,
        measured_at_unix_ms: 7,
    };
    state
        .apply(&Request::new(Command::RecordLinkMeasurement {
            site_a: "south".into(),
            site_b: "north".into(),
            measurement,
        }))
        .unwrap();
    // Reconfiguring the link keeps the latest measurement beside it.
    let mut faster = link();
    faster.parallel_links = 32;
    state
        .apply(&Request::new(Command::PutLink { link: faster }))
        .unwrap();
    let record = state.links().next().unwrap();
    assert_eq!(
        (record.configured.parallel_links, record.measured),
        (32, Some(measurement))
    );
}

#[test]
fn jobs_are_submitted_once_and_cancelled_once() {
    let mut state = registered();
    state.apply(&submit("llama")).unwrap();
    assert!(matches!(
        state.apply(&submit("llama")),
        Err(ApplyError::AlreadyExists { .. })
    ));
    state
        .apply(&Request::new(Command::CancelJob {
            job_id: "llama".into(),
            at_unix_ms: 0,
        }))
        .unwrap();
    assert!(matches!(
        state.apply(&Request::new(Command::CancelJob {
            job_id: "llama".into(),
            at_unix_ms: 0,
        })),
        Err(ApplyError::FailedPrecondition { .. })
    ));
    // A cancelled job's id may be reused.
    state.apply(&submit("llama")).unwrap();
    assert_eq!(state.job("llama").unwrap().state, JobState::Pending);
    let error = state.apply(&submit("Bad Id")).unwrap_err();
    assert!(
        matches!(error, ApplyError::InvalidArgument { ref field, .. } if field == "job_id"),
        "{error}"
    );
}

#[test]
fn watches_resume_from_any_retained_revision_and_report_compaction() {
    let mut state = ClusterState::new(4);
    for _ in 0..10 {
        state
            .apply(&Request::new(Command::Noop {
                payload: String::new(),
            }))
            .unwrap();
    }
    // Revisions 7..=10 are retained: resuming after 6 works, after 5 does not.
    let resumed: Vec<u64> = state
        .events_after(6)
        .unwrap()
        .iter()
        .map(|e| e.revision)
        .collect();
    assert_eq!(resumed, vec![7, 8, 9, 10]);
    assert_eq!(
        state.events_after(5),
        Err(Compacted {
            requested: 5,
            oldest: 6
        })
    );
    assert_eq!(state.events_after(10).unwrap(), vec![]);
}

#[test]
fn a_state_rebuilt_from_its_parts_is_the_same_state() {
    let mut state = registered();
    state.apply(&submit("llama")).unwrap();
    state
        .apply(&Request::new(Command::MarkSiteDown {
            site_id: "north".into(),
            reason: "lease".into(),
            at_unix_ms: 9,
            lease_id: None,
        }))
        .unwrap();
    let rebuilt = ClusterState::from_parts(
        state.revision(),
        state.entities(),
        state.events_after(0).unwrap(),
        DEFAULT_HISTORY_LIMIT,
    );
    assert_eq!(rebuilt, state);
}

#[test]
fn an_expiry_decided_under_an_old_lease_cannot_mark_a_re_registered_site_down() {
    let mut state = registered();
    // south registered at t=2 with lease 102; it re-registers with lease 107.
    state.apply(&register("south", 7)).unwrap();
    assert_eq!(state.site("south").unwrap().lease_id, 107);
    let before = state.clone();
    let stale = state.apply(&Request::new(Command::MarkSiteDown {
        site_id: "south".into(),
        reason: "lease expired".into(),
        at_unix_ms: 8,
        lease_id: Some(102),
    }));
    assert!(
        matches!(&stale, Err(ApplyError::FailedPrecondition { field, .. }) if field == "lease_id"),
        "{stale:?}"
    );
    assert_eq!(state, before);
    state
        .apply(&Request::new(Command::MarkSiteDown {
            site_id: "south".into(),
            reason: "lease expired".into(),
            at_unix_ms: 9,
            lease_id: Some(107),
        }))
        .unwrap();
    assert_eq!(state.site("south").unwrap().liveness, Liveness::Down);
}

#[test]
fn inventory_deltas_move_domains_between_groups_and_are_validated() {
    let mut state = registered();
    let site = state.site("north").unwrap().site.clone();
    let building = site.buildings[0].clone();
    let group = building.domains[0].clone();
    let gpus_before = site.gpus();
    let mut smaller = group.clone();
    smaller.count -= 1;
    let mut drained = group.clone();
    drained.id = format!("{}-drained", group.id);
    drained.count = 1;
    drained.nodes_per_domain = group.nodes_per_domain.max(2) - 1;
    let update = |changes, lease_id| {
        Request::new(Command::UpdateInventory {
            site_id: "north".into(),
            lease_id,
            changes,
            at_unix_ms: 20,
        })
    };
    let changes = vec![
        InventoryChange::PutGroup {
            building: building.id.clone(),
            group: smaller,
        },
        InventoryChange::PutGroup {
            building: building.id.clone(),
            group: drained.clone(),
        },
    ];
    // Under the wrong lease: refused, nothing changes.
    let before = state.clone();
    let refused = state.apply(&update(changes.clone(), 999));
    assert!(
        matches!(refused, Err(ApplyError::FailedPrecondition { .. })),
        "{refused:?}"
    );
    assert_eq!(state, before);
    let applied = state.apply(&update(changes, 101)).unwrap();
    assert_eq!(applied.events.len(), 1);
    let after = &state.site("north").unwrap().site;
    let lost = group.gpus_per_domain() - drained.gpus_per_domain();
    assert_eq!(after.gpus(), gpus_before - lost);
    // Liveness is not a transition: the revision of the last one stays.
    assert_eq!(state.site("north").unwrap().liveness_revision, 1);

    // A group in an unknown building, a removal of an unknown group, and a
    // group the topology rules refuse: each names its field.
    let before = state.clone();
    let unknown_building = state.apply(&update(
        vec![InventoryChange::RemoveGroup {
            building: "annex".into(),
            group_id: group.id.clone(),
        }],
        101,
    ));
    assert!(
        matches!(&unknown_building, Err(ApplyError::NotFound { field, .. }) if field == "changes[0].building"),
        "{unknown_building:?}"
    );
    let unknown_group = state.apply(&update(
        vec![InventoryChange::RemoveGroup {
            building: building.id.clone(),
            group_id: "nope".into(),
        }],
        101,
    ));
    assert!(
        matches!(&unknown_group, Err(ApplyError::NotFound { field, .. }) if field == "changes[0].group_id"),
        "{unknown_group:?}"
    );
    let mut bad = drained;
    bad.gpu = "tpu9".into();
    let invalid = state.apply(&update(
        vec![InventoryChange::PutGroup {
            building: building.id.clone(),
            group: bad,
        }],
        101,
    ));
    assert!(
        matches!(&invalid, Err(ApplyError::InvalidArgument { field, .. }) if field.starts_with("site.buildings[0].domains")),
        "{invalid:?}"
    );
    assert_eq!(state, before);
}

/// A placed submission of the bundled 70B job on the two campuses.
fn placed_submission() -> (Request, crate::placement::Plan) {
    let spec = JobSpec::from_toml("job.toml", JOB).unwrap();
    let plan = crate::placement::place(&topology(), &spec).unwrap();
    let request = Request::new(Command::SubmitJob {
        job_id: "llama".into(),
        spec,
        placement: Placement::Placed {
            plan: Box::new(plan.clone()),
        },
    });
    (request, plan)
}

/// `value` with every typed placement rewritten the way older releases
/// wrote it: the plan's JSON as a string in `plan_json`.
fn as_legacy(value: &mut serde_json::Value) -> usize {
    let mut rewritten = 0;
    match value {
        serde_json::Value::Object(map) => {
            if map.get("outcome").and_then(|o| o.as_str()) == Some("placed")
                && let Some(plan) = map.remove("plan")
            {
                map.insert("plan_json".into(), plan.to_string().into());
                rewritten += 1;
            }
            for child in map.values_mut() {
                rewritten += as_legacy(child);
            }
        }
        serde_json::Value::Array(items) => {
            for child in items {
                rewritten += as_legacy(child);
            }
        }
        _ => {}
    }
    rewritten
}

#[test]
fn a_placement_stored_as_a_json_string_reads_as_the_same_typed_plan() {
    let (request, plan) = placed_submission();
    // A command in an old log entry.
    let mut old = serde_json::to_value(&request).unwrap();
    assert_eq!(as_legacy(&mut old), 1);
    let read: Request = serde_json::from_value(old).unwrap();
    assert_eq!(read, request);
    // A record in an old state file or snapshot, and the watch event.
    let mut state = ClusterState::default();
    state.apply(&request).unwrap();
    let job = state.job("llama").unwrap().clone();
    assert_eq!(job.placement.plan(), Some(&plan));
    let change = Change::Job { record: job };
    let mut old = serde_json::to_value(&change).unwrap();
    assert_eq!(as_legacy(&mut old), 1);
    let read: Change = serde_json::from_value(old).unwrap();
    assert_eq!(read, change);
    // Written back typed: no string inside the JSON.
    let typed = serde_json::to_string(&read).unwrap();
    assert!(!typed.contains("plan_json") && typed.contains("\"plan\":{"));
}

#[test]
fn a_typed_plan_replays_bit_exactly() {
    let (request, plan) = placed_submission();
    let text = serde_json::to_string(&request).unwrap();
    let read: Request = serde_json::from_str(&text).unwrap();
    assert_eq!(read, request);
    assert_eq!(serde_json::to_string(&read).unwrap(), text);
    let Command::SubmitJob { placement, .. } = read.command else {
        panic!("a submission");
    };
    assert_eq!(placement.plan(), Some(&plan));
}

#[test]
fn a_placement_without_a_plan_is_refused_and_an_unreadable_old_one_says_why() {
    // An older record whose plan does not read: it loads (a store must open),
    // the same on every replica, as a placement that says why.
    let broken = r#"{"outcome":"placed","plan_json":"{\"not\": \"a plan\"}"}"#;
    let read = serde_json::from_str::<Placement>(broken).unwrap();
    let Placement::Infeasible { reason } = read else {
        panic!("{read:?}");
    };
    assert!(
        reason.contains("stored plan (`plan_json`) could not be read"),
        "{reason}"
    );
    // A typed plan that does not read is refused.
    let typed = r#"{"outcome":"placed","plan":{"not":"a plan"}}"#;
    assert!(serde_json::from_str::<Placement>(typed).is_err());
    let empty = r#"{"outcome":"placed"}"#;
    let error = serde_json::from_str::<Placement>(empty).unwrap_err();
    assert!(error.to_string().contains("needs field `plan`"), "{error}");
    let pending: Placement = serde_json::from_str(r#"{"outcome":"pending"}"#).unwrap();
    assert_eq!(pending, Placement::Pending);
}

#[test]
fn a_plan_that_does_not_replay_from_json_is_not_stored_as_placed() {
    let (_, plan) = placed_submission();
    assert!(matches!(
        Placement::placed(plan.clone()),
        Placement::Placed { .. }
    ));
    let mut broken = plan;
    broken.min_memory_slack_bytes = f64::INFINITY;
    let Placement::Infeasible { reason } = Placement::placed(broken) else {
        panic!("a non-finite plan was stored");
    };
    assert!(reason.contains("non-finite"), "{reason}");
}

/// Admission refuses exactly what apply would refuse against the same
/// state, with the same error, and changes nothing; what it admits applies.
#[test]
fn admission_refuses_what_apply_would_refuse_with_the_same_error() {
    let state = registered();
    let mut bad_site = site("north");
    bad_site.buildings[0].id = "Not An Id".into();
    let requests = [
        register("north", 9),
        submit("llama"),
        Request::new(Command::CancelJob {
            job_id: "nope".into(),
            at_unix_ms: 0,
        }),
        Request::expecting(
            Command::Noop {
                payload: String::new(),
            },
            1,
        ),
        Request::expecting(
            Command::Noop {
                payload: String::new(),
            },
            3,
        ),
        Request::new(Command::RegisterSite {
            site: bad_site,
            data_address: String::new(),
            at_unix_ms: 1,
            lease_id: 1,
            lease_ttl_ms: 1,
        }),
        Request::new(Command::MarkSiteDown {
            site_id: "west".into(),
            reason: "gone".into(),
            at_unix_ms: 1,
            lease_id: None,
        }),
        Request::new(Command::RemoveMember { member_id: 7 }),
    ];
    for request in &requests {
        let admitted = state.admit(request);
        let mut applied_to = state.clone();
        let applied = applied_to.apply(request).map(|_| ());
        assert_eq!(admitted, applied, "{}", request.command.name());
    }
    // Refusals among them, so the comparison is not of successes only.
    assert!(requests.iter().filter(|r| state.admit(r).is_err()).count() >= 5);
}

/// Admission refuses `command` as an invalid argument naming `field`; the
/// message.
fn refused_field(state: &ClusterState, command: Command, field: &str) -> String {
    let error = state.admit(&Request::new(command)).unwrap_err();
    let ApplyError::InvalidArgument {
        field: got,
        message,
    } = error
    else {
        panic!("{error}");
    };
    assert_eq!(got, field, "{message}");
    message
}

#[test]
fn admission_bounds_every_string_and_list_and_quotes_a_short_prefix() {
    let state = registered();
    let huge = "a".repeat(4 << 20);
    let mut spec = JobSpec::from_toml("job.toml", JOB).unwrap();
    spec.name = huge.clone();
    let mut many_sites = JobSpec::from_toml("job.toml", JOB).unwrap();
    many_sites.constraints.allowed_sites = (0..=crate::limits::MAX_SITES)
        .map(|i| format!("s{i}"))
        .collect();
    let mut long_name = site("north");
    long_name.name = Some(huge.clone());
    let member = |peer_url: &str| Command::PutMember {
        member: Member {
            id: 4,
            name: "r4".into(),
            peer_url: peer_url.into(),
            client_url: "http://10.0.0.4:2379".into(),
        },
    };
    let cases = [
        (
            Command::SubmitJob {
                job_id: huge.clone(),
                spec: JobSpec::from_toml("job.toml", JOB).unwrap(),
                placement: Placement::Pending,
            },
            "job_id",
        ),
        (
            Command::SubmitJob {
                job_id: "j".into(),
                spec,
                placement: Placement::Pending,
            },
            "spec.name",
        ),
        (
            Command::SubmitJob {
                job_id: "j".into(),
                spec: many_sites,
                placement: Placement::Pending,
            },
            "spec.constraints.allowed_sites",
        ),
        (
            Command::RegisterSite {
                site: long_name,
                data_address: "n:1".into(),
                at_unix_ms: 1,
                lease_id: 1,
                lease_ttl_ms: 1,
            },
            "site.name",
        ),
        (
            Command::CancelJob {
                job_id: huge.clone(),
                at_unix_ms: 0,
            },
            "job_id",
        ),
        (member("ftp://10.0.0.4:2380"), "member.peer_url"),
        (member("http://10.0.0.4:99999"), "member.peer_url"),
        (
            Command::Noop {
                payload: "p".repeat(crate::limits::MAX_NOOP_PAYLOAD + 1),
            },
            "payload",
        ),
    ];
    for (command, field) in cases {
        let message = refused_field(&state, command, field);
        assert!(message.len() < 200, "{field}: {} bytes", message.len());
    }
    assert!(
        state
            .admit(&Request::new(member("http://10.0.0.4:2380")))
            .is_ok()
    );
}

/// Bounds on sizes are admission's: a job, a link and the site an
/// inventory update leaves are held to them before anything is proposed.
#[test]
fn admission_bounds_sizes_of_jobs_links_and_the_site_an_update_leaves() {
    let state = registered();
    let mut huge_model = JobSpec::from_toml("job.toml", JOB).unwrap();
    huge_model.model.parameters = crate::limits::MAX_PARAMETERS + 1;
    let mut huge_batch = JobSpec::from_toml("job.toml", JOB).unwrap();
    huge_batch.batch.global_batch = crate::limits::MAX_GLOBAL_BATCH + 2;
    let mut many_links = link();
    many_links.parallel_links = crate::limits::MAX_PARALLEL_LINKS + 1;
    let mut far = link();
    far.distance = crate::units::Distance::from_km(1e300).unwrap();
    // Each group is within its own bounds and holds just over half of the
    // 10^7 GPUs a site may have: one is admitted, two are not.
    let north = state.site("north").unwrap().site.clone();
    let building = north.buildings[0].id.clone();
    let big = |id: &str| {
        let mut group = north.buildings[0].domains[0].clone();
        group.id = id.to_string();
        group.count = (crate::limits::MAX_GPUS / group.gpus_per_domain() / 2 + 1) as u32;
        InventoryChange::PutGroup {
            building: building.clone(),
            group,
        }
    };
    let update = |changes| Command::UpdateInventory {
        site_id: "north".into(),
        lease_id: 101,
        changes,
        at_unix_ms: 20,
    };
    let cases = [
        (
            Command::SubmitJob {
                job_id: "j".into(),
                spec: huge_model,
                placement: Placement::Pending,
            },
            "spec.model.parameters",
        ),
        (
            Command::SubmitJob {
                job_id: "j".into(),
                spec: huge_batch,
                placement: Placement::Pending,
            },
            "spec.batch.global_batch",
        ),
        (Command::PutLink { link: many_links }, "link.parallel_links"),
        (Command::PutLink { link: far }, "link.distance"),
        (update(vec![big("big-1"), big("big-2")]), "changes"),
    ];
    for (command, field) in cases {
        refused_field(&state, command, field);
    }
    // One such group alone is admitted: the bound is on the sum.
    state
        .admit(&Request::new(update(vec![big("big-1")])))
        .unwrap();
}

/// A state holding a link serialises (snapshots are the state as JSON),
/// and a state written with an empty link map still reads.
#[test]
fn a_state_with_links_round_trips_through_json() {
    let state = registered();
    assert_eq!(state.links().count(), 1);
    let json = serde_json::to_string(&state).unwrap();
    assert_eq!(serde_json::from_str::<ClusterState>(&json).unwrap(), state);
    let empty = serde_json::to_value(ClusterState::default()).unwrap();
    let mut old = empty.clone();
    old["links"] = serde_json::json!({});
    assert_eq!(
        serde_json::from_value::<ClusterState>(old).unwrap(),
        ClusterState::default()
    );
}

#[test]
fn a_removed_members_id_is_remembered_and_never_admitted_again() {
    let member = |id: u64| Command::PutMember {
        member: Member {
            id,
            name: format!("r{id}"),
            peer_url: format!("http://10.0.0.{id}:2380"),
            client_url: format!("http://10.0.0.{id}:2379"),
        },
    };
    let mut state = ClusterState::default();
    for id in [1, 2, 3, 4] {
        state.apply(&Request::new(member(id))).unwrap();
    }
    state
        .apply(&Request::new(Command::RemoveMember { member_id: 4 }))
        .unwrap();
    assert_eq!(state.members().count(), 3);
    // The highest id ever used, not the highest in use: a new member takes 5.
    assert_eq!(state.highest_member_id(), 4);
    let error = state.admit(&Request::new(member(4))).unwrap_err();
    assert!(error.to_string().contains("member.id"), "{error}");
    assert!(error.to_string().contains("never reused"), "{error}");
    state.admit(&Request::new(member(5))).unwrap();
    // Kept across a restart (the entities) and a snapshot (the state as JSON).
    let rebuilt = ClusterState::from_parts(
        state.revision(),
        state.entities(),
        state.events_after(0).unwrap(),
        DEFAULT_HISTORY_LIMIT,
    );
    assert_eq!(rebuilt, state);
    assert_eq!(rebuilt.highest_member_id(), 4);
    let json = serde_json::to_vec(&state).unwrap();
    let restored: ClusterState = serde_json::from_slice(&json).unwrap();
    assert!(restored.is_retired_member(4));
    // A removal is stored under the member's key, not deleted.
    assert!(!Change::MemberRemoved { member_id: 4 }.is_removal());
}
