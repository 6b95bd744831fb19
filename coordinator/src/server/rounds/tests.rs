//! The round driver, rounds in the state machine's table, deadlines.

#![allow(clippy::unwrap_used, reason = "tests fail loudly")]

use longhaul_core::state::{Command, Placement, Request};
use longhaul_core::{JobSpec, Topology};

use super::*;

const TOPOLOGY: &str = include_str!("../../../../deploy/examples/three-sites-two-continents.toml");
const JOB: &str = include_str!("../../../../deploy/examples/dense-400b.job.toml");

fn state() -> ClusterState {
    let topology = Topology::from_toml("t.toml", TOPOLOGY).unwrap();
    let mut state = ClusterState::default();
    for site in &topology.sites {
        state
            .apply(&Request::new(Command::RegisterSite {
                site: site.clone(),
                data_address: String::new(),
                at_unix_ms: 0,
                lease_id: 1,
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
    let plan = longhaul_core::placement::place(&topology, &spec).unwrap();
    state
        .apply(&Request::new(Command::SubmitJob {
            job_id: "dense".into(),
            spec,
            placement: Placement::placed(plan),
        }))
        .unwrap();
    state
}

fn apply(state: &mut ClusterState, commands: Vec<Command>) {
    for command in commands {
        state.apply(&Request::new(command)).unwrap();
    }
}

/// `site`'s contribution to fragment `fragment` of round 1 of `dense`,
/// then its apply with `hash`, measuring `inner_step_us`.
fn reports(site: &str, fragment: u32, hash: &str, inner_step_us: u64) -> Vec<Command> {
    vec![
        Command::ReportContributed {
            job_id: "dense".into(),
            round: 1,
            site_id: site.into(),
            fragment,
            at_unix_ms: 2_000,
        },
        Command::ReportApplied {
            job_id: "dense".into(),
            round: 1,
            site_id: site.into(),
            fragment,
            hash: hash.into(),
            at_unix_ms: 2_000,
            inner_step_us,
        },
    ]
}

#[test]
fn the_driver_opens_a_round_resumes_it_and_excludes_stragglers_at_the_deadline() {
    let mut state = state();
    let timing = RoundTiming {
        fixed: Some(Duration::from_secs(5)),
        ..RoundTiming::default()
    };
    let opened = round_actions(&state, 1_000, &timing);
    assert_eq!(opened.len(), 1, "{opened:?}");
    let Command::OpenRound {
        round,
        participants,
        deadline_unix_ms,
        fragments,
        ..
    } = &opened[0]
    else {
        panic!("{opened:?}");
    };
    assert_eq!((*round, *deadline_unix_ms), (1, 6_000));
    assert!(participants.len() >= 2, "{participants:?}");
    assert!(*fragments >= 1);
    let participants = participants.clone();
    apply(&mut state, opened);
    // A leader (this one, or the next) resumes the open round: nothing
    // to do before the deadline.
    assert!(round_actions(&state, 5_999, &timing).is_empty());
    let first = &participants[0];
    for f in 0..state.open_round("dense").unwrap().fragments.len() as u32 {
        apply(&mut state, reports(first, f, "h", 0));
    }
    let excluded = round_actions(&state, 6_000, &timing);
    assert_eq!(excluded.len(), participants.len() - 1, "{excluded:?}");
    assert!(excluded.iter().all(|c| matches!(
        c,
        Command::ExcludeParticipant { reason: ExclusionReason::DeadlineMissed, site_id, .. } if site_id != first
    )));
    apply(&mut state, excluded);
    assert!(state.round("dense", 1).unwrap().is_committed());
    // The next round opens at once, and the excluded sites, up, are in it
    // with a catch-up from the site that applied round 1.
    let next = round_actions(&state, 6_001, &timing);
    let Command::OpenRound {
        round, catch_up, ..
    } = &next[0]
    else {
        panic!("{next:?}");
    };
    assert_eq!(*round, 2);
    assert_eq!(catch_up.len(), participants.len() - 1);
    assert!(
        catch_up
            .iter()
            .all(|c| c.from_round == 1 && &c.from_site == first)
    );
}

/// Rounds applied through the coordinator's state machine come back the
/// same from its table after a restart, and from a snapshot installed
/// on another replica.
#[test]
fn rounds_survive_a_restart_and_a_snapshot() {
    use crate::consensus::StateMachine;
    use crate::server::state_machine::CoordinatorStateMachine;

    let mut reference = state();
    let timing = RoundTiming {
        fixed: Some(Duration::from_secs(5)),
        ..RoundTiming::default()
    };
    let mut commands: Vec<Command> = Vec::new();
    let mut scratch = reference.clone();
    let opened = round_actions(&scratch, 1_000, &timing);
    apply(&mut scratch, opened.clone());
    commands.extend(opened);
    let excluded = round_actions(&scratch, 9_000, &timing);
    apply(&mut scratch, excluded.clone());
    commands.extend(excluded);
    let reopened = round_actions(&scratch, 9_001, &timing);
    commands.extend(reopened);

    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("a.redb")).unwrap();
    let mut machine = CoordinatorStateMachine::load(&db.begin_read().unwrap()).unwrap();
    // Rebuild the reference through the machine: every command of the
    // setup and of the rounds applied in one transaction.
    let setup = {
        let topology = Topology::from_toml("t.toml", TOPOLOGY).unwrap();
        let mut out = Vec::new();
        for site in &topology.sites {
            out.push(Command::RegisterSite {
                site: site.clone(),
                data_address: String::new(),
                at_unix_ms: 0,
                lease_id: 1,
                lease_ttl_ms: 0,
            });
        }
        for link in &topology.links {
            out.push(Command::PutLink { link: link.clone() });
        }
        out.push(Command::SubmitJob {
            job_id: "dense".into(),
            spec: reference.job("dense").unwrap().spec.clone(),
            placement: reference.job("dense").unwrap().placement.clone(),
        });
        out
    };
    let txn = db.begin_write().unwrap();
    for (i, command) in setup.iter().chain(&commands).enumerate() {
        let data = serde_json::to_vec(&Request::new(command.clone())).unwrap();
        let response = machine.apply(&txn, i as u64 + 1, &data).unwrap();
        let response: ApplyResponse = serde_json::from_slice(&response).unwrap();
        assert!(
            matches!(response, ApplyResponse::Applied { .. }),
            "{} refused: {response:?}",
            command.name()
        );
    }
    txn.commit().unwrap();
    apply(&mut reference, commands);
    assert_eq!(*machine.shared().read(), reference);
    assert!(reference.round("dense", 2).is_some_and(|r| r.is_open()));

    let loaded = CoordinatorStateMachine::load(&db.begin_read().unwrap()).unwrap();
    assert_eq!(*loaded.shared().read(), reference, "after a restart");

    let snapshot = machine.snapshot(&db.begin_read().unwrap()).unwrap();
    let other = redb::Database::create(dir.path().join("b.redb")).unwrap();
    let mut installed = CoordinatorStateMachine::load(&other.begin_read().unwrap()).unwrap();
    let txn = other.begin_write().unwrap();
    installed.restore(&txn, &snapshot).unwrap();
    txn.commit().unwrap();
    assert_eq!(*installed.shared().read(), reference, "after a snapshot");
    let reloaded = CoordinatorStateMachine::load(&other.begin_read().unwrap()).unwrap();
    assert_eq!(
        *reloaded.shared().read(),
        reference,
        "a snapshot's state after a restart"
    );
}

/// Each report is stored alone under its round's key (the round's
/// record is not written again), loads back into the round after a
/// restart, and goes with the round when the round is removed.
#[test]
fn a_rounds_reports_are_stored_alone_load_back_and_go_with_the_round() {
    use redb::ReadableTable;

    use crate::consensus::StateMachine;
    use crate::consensus::storage::STATE_MACHINE;
    use crate::server::state_machine::CoordinatorStateMachine;

    let reference = state();
    let timing = RoundTiming {
        fixed: Some(Duration::from_secs(5)),
        ..RoundTiming::default()
    };
    let mut commands = round_actions(&reference, 1_000, &timing);
    let Command::OpenRound {
        participants,
        fragments,
        ..
    } = commands[0].clone()
    else {
        panic!("{commands:?}");
    };
    for site in &participants {
        for fragment in 0..fragments {
            commands.extend(reports(
                site,
                fragment,
                &format!("h{fragment}"),
                1_000 + u64::from(fragment),
            ));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("a.redb")).unwrap();
    let mut machine = CoordinatorStateMachine::load(&db.begin_read().unwrap()).unwrap();
    let live = machine.shared();
    let txn = db.begin_write().unwrap();
    let mut index = 0;
    let mut run = |txn: &redb::WriteTransaction, command: &Command| {
        index += 1;
        let data = serde_json::to_vec(&Request::new(command.clone())).unwrap();
        let response = machine.apply(txn, index, &data).unwrap();
        let response: ApplyResponse = serde_json::from_slice(&response).unwrap();
        assert!(
            matches!(response, ApplyResponse::Applied { .. }),
            "{response:?}"
        );
    };
    // The setup straight into the machine's state, then the round.
    for change in reference.entities() {
        let command = match change {
            Change::Site { record } => Command::RegisterSite {
                site: record.site,
                data_address: String::new(),
                at_unix_ms: 0,
                lease_id: 1,
                lease_ttl_ms: 0,
            },
            Change::Link { record } => Command::PutLink {
                link: record.configured,
            },
            Change::Job { record } => Command::SubmitJob {
                job_id: record.id,
                spec: record.spec,
                placement: record.placement,
            },
            _ => continue,
        };
        run(&txn, &command);
    }
    for command in &commands {
        run(&txn, command);
    }
    txn.commit().unwrap();
    assert!(live.read().round("dense", 1).unwrap().is_committed());
    let round_keys = |db: &redb::Database| -> Vec<(String, usize)> {
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(STATE_MACHINE).unwrap();
        table
            .iter()
            .unwrap()
            .map(|item| {
                let (key, value) = item.unwrap();
                (
                    String::from_utf8(key.value().to_vec()).unwrap(),
                    value.value().len(),
                )
            })
            .filter(|(key, _)| key.starts_with("entity/round/"))
            .collect()
    };
    let keys = round_keys(&db);
    // The record and one key per report.
    let reports = participants.len() * fragments as usize * 2;
    assert_eq!(keys.len(), 1 + reports, "{keys:?}");
    let record = keys[0].1;
    assert!(keys[1..].iter().all(|(_, bytes)| *bytes < 400), "{keys:?}");
    assert!(keys[0].0.ends_with("/00000000000000000001"), "{keys:?}");
    let loaded = CoordinatorStateMachine::load(&db.begin_read().unwrap()).unwrap();
    assert!(
        *loaded.shared().read() == *live.read(),
        "the state loaded after a restart differs from the one applied"
    );

    // Cancelled and submitted again: the round goes, its reports too.
    let job = reference.job("dense").unwrap().clone();
    let txn = db.begin_write().unwrap();
    for command in [
        Command::CancelJob {
            job_id: "dense".into(),
            at_unix_ms: 3_000,
        },
        Command::SubmitJob {
            job_id: "dense".into(),
            spec: job.spec,
            placement: job.placement,
        },
    ] {
        run(&txn, &command);
    }
    txn.commit().unwrap();
    assert_eq!(round_keys(&db), Vec::new(), "a record of {record} bytes");
}

#[test]
fn a_deadline_follows_the_prediction_with_slack_and_a_floor() {
    let timing = RoundTiming::default();
    assert_eq!(timing.deadline(Some(600.0), 0), Duration::from_secs(1200));
    assert_eq!(timing.deadline(Some(1.0), 0), Duration::from_secs(30));
    assert_eq!(timing.deadline(None, 0), Duration::from_secs(30));
    assert_eq!(timing.deadline(Some(f64::NAN), 0), Duration::from_secs(30));
    assert_eq!(
        timing.deadline(Some(1e30), 0),
        Duration::from_secs(365 * 24 * 3600)
    );
    // Doubled per round that ended blind at its deadline, at most 16 ×.
    assert_eq!(timing.deadline(Some(600.0), 1), Duration::from_secs(2400));
    assert_eq!(timing.deadline(None, 2), Duration::from_secs(120));
    assert_eq!(timing.deadline(None, 9), Duration::from_secs(480));
    // A fixed deadline is what it says.
    let fixed = RoundTiming {
        fixed: Some(Duration::from_secs(5)),
        ..RoundTiming::default()
    };
    assert_eq!(fixed.deadline(None, 3), Duration::from_secs(5));
}

/// Round 1 of `dense` opened at `at`, every participant applying every
/// fragment measuring `inner_step_us`, then the next round's opening.
fn next_round_after_measuring(inner_step_us: u64) -> (u64, Command) {
    let (_, predicted, next) = after_measuring(
        inner_step_us,
        &RoundTiming {
            replan_factor: None,
            ..RoundTiming::default()
        },
    );
    (predicted, next[0].clone())
}

/// As [`next_round_after_measuring`] with `timing`: the state after round
/// 1, its predicted deadline and every command the driver then proposes.
fn after_measuring(inner_step_us: u64, timing: &RoundTiming) -> (ClusterState, u64, Vec<Command>) {
    let mut state = state();
    let opened = round_actions(&state, 1_000, timing);
    let Command::OpenRound {
        participants,
        fragments,
        deadline_unix_ms,
        ..
    } = opened[0].clone()
    else {
        panic!("{opened:?}");
    };
    apply(&mut state, opened);
    for site in &participants {
        for fragment in 0..fragments {
            // One site measures it; the others nothing.
            let measured = if *site == participants[0] {
                inner_step_us
            } else {
                0
            };
            apply(
                &mut state,
                reports(site, fragment, &format!("h{fragment}"), measured),
            );
        }
    }
    assert!(state.round("dense", 1).unwrap().is_committed());
    let round = state.round("dense", 1).unwrap();
    assert_eq!(round.participants[0].inner_step_us, inner_step_us);
    let next = round_actions(&state, 3_000, timing);
    (state, deadline_unix_ms - 1_000, next)
}

#[test]
fn a_rounds_deadline_follows_the_inner_step_the_sites_measured() {
    let state = state();
    let job = state.job("dense").unwrap();
    let sync = schedule_of(
        job.placement.plan().unwrap(),
        &job.spec,
        &[],
        &CostParams::default(),
    )
    .unwrap();
    let h = f64::from(sync.inner_steps);
    // Ten times slower than the planner predicted: twice (the slack) the
    // H measured steps plus the exchange still exposed at that step.
    let slow_us = (sync.inner_step_seconds * 10.0 * 1e6).round() as u64;
    let t = slow_us as f64 / 1e6;
    let exposed = f64::from(sync.fragments)
        * (sync.fragment_transfer_seconds - f64::from(sync.overlap_steps) * t).max(0.0);
    let (predicted, next) = next_round_after_measuring(slow_us);
    let Command::OpenRound {
        deadline_unix_ms, ..
    } = next
    else {
        panic!("{next:?}");
    };
    let expected = 2.0 * (h * t + exposed);
    let got = (deadline_unix_ms - 3_000) as f64 / 1e3;
    assert!(
        (got - expected).abs() < 0.01,
        "{got} s, expected {expected} s"
    );
    assert!(
        got > predicted as f64 / 1e3,
        "{got} s, predicted {predicted} ms"
    );
    // Not measured: the prediction stands.
    let (predicted, next) = next_round_after_measuring(0);
    let Command::OpenRound {
        deadline_unix_ms, ..
    } = next
    else {
        panic!("{next:?}");
    };
    assert_eq!(deadline_unix_ms - 3_000, predicted);
}

/// The sync schedule `dense` was placed with.
fn placed_sync() -> longhaul_core::sync::SyncPlan {
    let state = state();
    let plan = state.job("dense").unwrap().placement.plan().unwrap();
    plan.sync.clone().unwrap()
}

/// Every participant of the open round of `dense` applies every fragment,
/// measuring `inner_step_us`.
fn finish_open_round(state: &mut ClusterState, inner_step_us: u64) {
    let open = state.open_round("dense").unwrap().clone();
    for p in &open.participants {
        for fragment in 0..open.fragments.len() as u32 {
            for mut command in reports(&p.site, fragment, "h", inner_step_us) {
                match &mut command {
                    Command::ReportContributed { round, .. }
                    | Command::ReportApplied { round, .. } => *round = open.round,
                    _ => unreachable!(),
                }
                state.apply(&Request::new(command)).unwrap();
            }
        }
    }
    assert!(state.round("dense", open.round).unwrap().is_committed());
}

#[test]
fn trainers_faster_than_planned_get_a_schedule_replanned_at_their_step_from_the_round_after_next() {
    let timing = RoundTiming::default();
    let before = placed_sync();
    // Twenty times faster than placement predicted: the WAN now needs a
    // longer H to hide behind.
    let fast_us = (before.inner_step_seconds / 20.0 * 1e6).round() as u64;
    let (mut state, _, commands) = after_measuring(fast_us, &timing);
    assert_eq!(commands.len(), 1, "{commands:?}");
    let Command::ReplanSync {
        after_round, sync, ..
    } = &commands[0]
    else {
        panic!("a re-plan first: {commands:?}");
    };
    assert_eq!(*after_round, 1);
    assert_eq!(sync.inner_step_seconds, fast_us as f64 / 1e6);
    assert!(
        sync.inner_steps > before.inner_steps,
        "H {} -> {}",
        before.inner_steps,
        sync.inner_steps
    );
    assert_eq!(sync.fragments, before.fragments);
    assert_eq!(sync.bits(), before.bits());
    let replanned = sync.replanned.clone().unwrap();
    assert_eq!(replanned.previous_inner_steps, before.inner_steps);
    assert!(sync.reason("replan").is_some());
    let new_h = sync.inner_steps;
    let sync_after = sync.clone();
    apply(&mut state, commands);
    let plan = state
        .job("dense")
        .unwrap()
        .placement
        .plan()
        .unwrap()
        .clone();
    assert_eq!(plan.mode, CrossSiteMode::Diloco { inner_steps: new_h });
    // Round 2: the trainers are in its inner steps on the old schedule.
    let opened = round_actions(&state, 3_001, &timing);
    let Command::OpenRound {
        round,
        deadline_unix_ms,
        ..
    } = &opened[0]
    else {
        panic!("{opened:?}");
    };
    assert_eq!(*round, 2);
    let t = fast_us as f64 / 1e6;
    let exposed = f64::from(before.fragments)
        * (before.fragment_transfer_seconds - f64::from(before.overlap_steps) * t).max(0.0);
    let expected = (2.0 * (f64::from(before.inner_steps) * t + exposed)).max(30.0);
    let got = (deadline_unix_ms - 3_001) as f64 / 1e3;
    assert!(
        (got - expected).abs() < 0.01,
        "{got} s, expected {expected} s"
    );
    apply(&mut state, opened);
    let two = state.round("dense", 2).unwrap();
    assert_eq!(
        (two.inner_steps, two.overlap_steps),
        (before.inner_steps, before.overlap_steps)
    );
    assert_eq!(
        (two.schedule_inner_steps, two.schedule_overlap_steps),
        (new_h, sync_after.overlap_steps)
    );
    assert_eq!(two.inner_steps_through, 2 * u64::from(before.inner_steps));
    finish_open_round(&mut state, fast_us);
    // Round 3 runs the new schedule, and the same measurement asks for no
    // second re-plan.
    let opened = round_actions(&state, 4_000, &timing);
    assert!(
        matches!(opened[..], [Command::OpenRound { round: 3, .. }]),
        "one re-plan only: {opened:?}"
    );
    apply(&mut state, opened);
    let three = state.round("dense", 3).unwrap();
    assert_eq!(three.inner_steps, new_h);
    assert_eq!(
        three.inner_steps_through,
        2 * u64::from(before.inner_steps) + u64::from(new_h)
    );
}

#[test]
fn a_measured_step_within_the_factor_or_with_replanning_off_keeps_the_schedule() {
    let before = placed_sync();
    let close_us = (before.inner_step_seconds * 1.5 * 1e6).round() as u64;
    let (_, _, commands) = after_measuring(close_us, &RoundTiming::default());
    assert!(
        matches!(commands[..], [Command::OpenRound { round: 2, .. }]),
        "{commands:?}"
    );
    let far_us = (before.inner_step_seconds * 10.0 * 1e6).round() as u64;
    let off = RoundTiming {
        replan_factor: None,
        ..RoundTiming::default()
    };
    let (_, _, commands) = after_measuring(far_us, &off);
    assert!(
        matches!(commands[..], [Command::OpenRound { round: 2, .. }]),
        "{commands:?}"
    );
}

#[test]
fn a_replan_is_refused_while_a_round_is_open_after_another_round_or_with_other_fragments() {
    let before = placed_sync();
    let fast_us = (before.inner_step_seconds / 20.0 * 1e6).round() as u64;
    let (mut state, _, commands) = after_measuring(fast_us, &RoundTiming::default());
    let Command::ReplanSync { sync, .. } = commands[0].clone() else {
        panic!("{commands:?}");
    };
    let replan = |after_round: u64, sync: &longhaul_core::sync::SyncPlan| {
        Request::new(Command::ReplanSync {
            job_id: "dense".into(),
            after_round,
            sync: sync.clone(),
            at_unix_ms: 3_000,
        })
    };
    let refused = |state: &mut ClusterState, request: Request, field: &str| {
        let at = state.revision();
        let error = state.apply(&request).unwrap_err();
        assert!(error.to_string().contains(field), "{error}");
        assert_eq!(state.revision(), at, "a refused re-plan changes nothing");
    };
    refused(&mut state, replan(0, &sync), "after_round");
    let mut other = sync.clone();
    other.schedule[0].parameters -= 1;
    refused(&mut state, replan(1, &other), "sync.schedule");
    let mut other = sync.clone();
    other.sites.reverse();
    refused(&mut state, replan(1, &other), "sync.sites");
    let mut other = sync.clone();
    other.overlap_steps = other.inner_steps + 1;
    refused(&mut state, replan(1, &other), "sync.overlap_steps");
    // With round 2 open, not even the right one applies.
    let opened = round_actions(
        &state,
        3_001,
        &RoundTiming {
            replan_factor: None,
            ..RoundTiming::default()
        },
    );
    apply(&mut state, opened);
    refused(&mut state, replan(1, &sync), "after_round");
}

#[test]
fn rounds_that_end_at_their_deadline_with_nothing_measured_double_the_next_deadline() {
    let mut state = state();
    let timing = RoundTiming::default();
    let deadline_of = |commands: &[Command], at: u64| match &commands[0] {
        Command::OpenRound {
            deadline_unix_ms, ..
        } => deadline_unix_ms - at,
        other => panic!("{other:?}"),
    };
    let opened = round_actions(&state, 1_000, &timing);
    let first = deadline_of(&opened, 1_000);
    apply(&mut state, opened);
    for doublings in 1..=MAX_DEADLINE_DOUBLINGS + 1 {
        // No one reports: every participant is excluded at the deadline.
        let now = state.open_round("dense").unwrap().deadline_unix_ms;
        let excluded = round_actions(&state, now, &timing);
        for command in excluded {
            // The last exclusion aborts the round; none is refused.
            state.apply(&Request::new(command)).unwrap();
        }
        assert!(state.open_round("dense").is_none());
        assert_eq!(
            deadline_doublings(&state, "dense"),
            doublings.min(MAX_DEADLINE_DOUBLINGS)
        );
        let opened = round_actions(&state, now, &timing);
        assert_eq!(
            deadline_of(&opened, now),
            first << doublings.min(MAX_DEADLINE_DOUBLINGS),
            "after {doublings} blind deadline(s)"
        );
        apply(&mut state, opened);
    }
    // A round that measures resets it.
    finish_open_round(&mut state, 1);
    assert_eq!(deadline_doublings(&state, "dense"), 0);
}

#[test]
fn a_second_replan_waits_rounds_and_each_round_runs_the_schedule_read_in_the_one_before() {
    let timing = RoundTiming::default();
    let before = placed_sync();
    let fast_us = (before.inner_step_seconds / 20.0 * 1e6).round() as u64;
    let (mut state, _, commands) = after_measuring(fast_us, &timing);
    apply(&mut state, commands);
    let first_h = state.next_round_steps("dense");
    assert_eq!(first_h.0, before.inner_steps, "round 2 runs the old H");
    // The trainers now measure 100 times slower still: no re-plan before
    // three rounds ran on the first.
    let slow_us = fast_us * 100;
    let mut now = 3_001;
    let mut replanned_after = None;
    for round in 2..=6 {
        let mut commands = round_actions(&state, now, &timing);
        if let [Command::ReplanSync { after_round, .. }] = &commands[..] {
            replanned_after = Some(*after_round);
            apply(&mut state, commands);
            commands = round_actions(&state, now, &timing);
        }
        assert!(
            matches!(&commands[..], [Command::OpenRound { round: r, .. }] if *r == round),
            "{commands:?}"
        );
        apply(&mut state, commands);
        finish_open_round(&mut state, slow_us);
        now += 1_000;
    }
    assert_eq!(
        replanned_after,
        Some(4),
        "three rounds after the first re-plan"
    );
    // Every round ran the schedule in force when the round before opened.
    for round in 2..=6 {
        let (ran, before) = (
            state.round("dense", round).unwrap(),
            state.round("dense", round - 1).unwrap(),
        );
        assert_eq!(
            (ran.inner_steps, ran.overlap_steps),
            (before.schedule_inner_steps, before.schedule_overlap_steps),
            "round {round}"
        );
    }
}
