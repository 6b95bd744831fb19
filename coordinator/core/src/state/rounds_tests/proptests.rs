//! Property tests of the rounds: random interleavings of reports,
//! deadlines, site downs and returns, re-placements, cancels and
//! resubmits, and commands proposed again by a later leader.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// One step of a random run.
#[derive(Debug, Clone)]
enum Op {
    /// The leader opens the next round when none is open.
    Open {
        fragments: u32,
    },
    Contribute {
        site: usize,
        fragment: u32,
    },
    /// `wrong` reports a hash no one else does.
    Apply {
        site: usize,
        fragment: u32,
        wrong: bool,
    },
    /// The deadline passed: the leader excludes one site it waits for.
    Deadline {
        site: usize,
    },
    Down {
        site: usize,
    },
    Up {
        site: usize,
    },
    /// A later leader proposes again a command an earlier one proposed (its
    /// outcome unknown to it), or one a replica retried.
    Repeat {
        back: usize,
    },
    /// The site's next report in the open round, as a live agent would send
    /// it (so that rounds get somewhere).
    Progress {
        site: usize,
    },
    /// Any command at all, for the one-at-a-time refusal check.
    Stray {
        site: usize,
        fragment: u32,
        round_back: u64,
    },
    /// The leader gives up the open round.
    Abort,
    /// Re-planning: the job placed on the sites of the mask (bit i: site i),
    /// or pending for an empty mask.
    Replace {
        mask: u8,
    },
    Cancel,
    /// The job submitted again under its id (refused unless cancelled).
    Resubmit,
}

fn op_core() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (1u32..4).prop_map(|fragments| Op::Open { fragments }),
        4 => (0usize..3, 0u32..3).prop_map(|(site, fragment)| Op::Contribute { site, fragment }),
        4 => (0usize..3, 0u32..3, prop::bool::weighted(0.05))
            .prop_map(|(site, fragment, wrong)| Op::Apply { site, fragment, wrong }),
        1 => (0usize..3).prop_map(|site| Op::Deadline { site }),
        1 => (0usize..3).prop_map(|site| Op::Down { site }),
        1 => (0usize..3).prop_map(|site| Op::Up { site }),
        2 => (0usize..16).prop_map(|back| Op::Repeat { back }),
        8 => (0usize..3).prop_map(|site| Op::Progress { site }),
        1 => (0usize..4, 0u32..4, 0u64..3)
            .prop_map(|(site, fragment, round_back)| Op::Stray { site, fragment, round_back }),
        1 => Just(Op::Abort),
        1 => (0u8..8).prop_map(|mask| Op::Replace { mask }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        28 => op_core(),
        1 => prop_oneof![Just(Op::Cancel), Just(Op::Resubmit)],
    ]
}

/// For long runs: whole rounds that commit (every site's reports in
/// turn), rounds given up, runs of more given-up rounds than are kept, and
/// single steps of any kind between them.
fn ops_long() -> impl Strategy<Value = Vec<Op>> {
    let round = |commit: bool| {
        let mut ops = vec![Op::Open { fragments: 1 }];
        if commit {
            for _ in 0..2 {
                ops.extend((0..3).map(|site| Op::Progress { site }));
            }
        } else {
            ops.push(Op::Abort);
        }
        ops
    };
    let aborted_run: Vec<Op> = (0..=ROUNDS_KEPT_PER_JOB)
        .flat_map(|_| round(false))
        .collect();
    let block = prop_oneof![
        4 => Just(round(true)),
        3 => Just(round(false)),
        1 => Just(aborted_run),
        8 => op().prop_map(|op| vec![op]),
    ];
    prop::collection::vec(block, 20..60).prop_map(|blocks| blocks.concat())
}

fn placed_on(mask: u8) -> Placement {
    let sites = sites();
    let kept: Vec<String> = (0..sites.len())
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| sites[i].clone())
        .collect();
    if kept.is_empty() {
        return Placement::Pending;
    }
    let mut plan = placed().1.clone();
    plan.site_order = kept;
    Placement::Placed {
        plan: Box::new(plan),
    }
}

/// The command a leader (or an agent) would send for `op` in `state`.
fn command_for(
    op: &Op,
    state: &ClusterState,
    log: &[Request],
    now: u64,
    lease: &mut u64,
) -> Option<Request> {
    let sites = sites();
    let current = state.latest_round(JOB_ID);
    let round = current.map_or(1, |r| r.round);
    Some(match op {
        Op::Open { fragments } => {
            if state.open_round(JOB_ID).is_some() {
                return None;
            }
            let planned = state
                .job(JOB_ID)
                .and_then(|j| j.placement.plan())
                .map(|p| p.site_order.clone())
                .unwrap_or_default();
            let up: Vec<String> = planned
                .into_iter()
                .filter(|s| state.site(s).is_some_and(|r| r.liveness == Liveness::Up))
                .collect();
            if up.is_empty() {
                return None;
            }
            let catch_up = state.catch_up_for(JOB_ID, &up);
            open(
                current.map_or(1, |r| r.round + 1),
                &up,
                catch_up,
                *fragments,
                now,
            )
        }
        Op::Contribute { site, fragment } => contributed(round, &sites[*site], *fragment),
        Op::Apply {
            site,
            fragment,
            wrong,
        } => {
            let hash = if *wrong {
                format!("wrong-{site}")
            } else {
                format!("r{round}f{fragment}")
            };
            // A measured step that varies with the report.
            let inner_step_us = (now % 5) * 100_000 + u64::from(*fragment);
            applied_measured(round, &sites[*site], *fragment, &hash, now, inner_step_us)
        }
        Op::Deadline { site } => {
            let deadline = current?.deadline_unix_ms;
            exclude(
                round,
                &sites[*site],
                ExclusionReason::DeadlineMissed,
                now.max(deadline),
            )
        }
        Op::Down { site } => down(&sites[*site], now),
        Op::Up { site } => {
            *lease += 1;
            register(&sites[*site], *lease)
        }
        Op::Repeat { back } => log.iter().rev().nth(*back)?.clone(),
        Op::Progress { site } => {
            let record = state.open_round(JOB_ID)?;
            let p = record.participant(&sites[*site])?;
            let fragments = record.fragments.len() as u32;
            match (0..fragments).find(|f| !p.contributed.contains(f)) {
                Some(f) => contributed(round, &sites[*site], f),
                None => {
                    let f = (0..fragments).find(|f| p.applied_hash(*f).is_none())?;
                    applied(round, &sites[*site], f, &format!("r{round}f{f}"), now)
                }
            }
        }
        Op::Stray {
            site,
            fragment,
            round_back,
        } => {
            let site = sites
                .get(*site)
                .cloned()
                .unwrap_or_else(|| "elsewhere".into());
            contributed(round.saturating_sub(*round_back), &site, *fragment)
        }
        Op::Abort => {
            let record = state.open_round(JOB_ID)?;
            abort(record.round, now)
        }
        Op::Replace { mask } => Request::new(Command::SetPlacement {
            job_id: JOB_ID.into(),
            placement: placed_on(*mask),
            at_unix_ms: now,
            sites_as_of: None,
        }),
        Op::Cancel => Request::new(Command::CancelJob {
            job_id: JOB_ID.into(),
            at_unix_ms: now,
        }),
        Op::Resubmit => Request::new(Command::SubmitJob {
            job_id: JOB_ID.into(),
            spec: placed().0.clone(),
            placement: placed_on(0b111),
        }),
    })
}

/// What must hold of every round in every state.
fn check_rounds(state: &ClusterState) -> Result<(), TestCaseError> {
    for round in state.rounds(JOB_ID) {
        for (f, fragment) in round.fragments.iter().enumerate() {
            let key = f as u32;
            if let FragmentState::Committed { hash, .. } = fragment {
                // One hash, the one every counted participant applied.
                for p in round.counted() {
                    prop_assert_eq!(
                        p.applied_hash(key),
                        Some(hash.as_str()),
                        "round {} fragment {}",
                        round.round,
                        f
                    );
                }
            }
            if *fragment == FragmentState::Open && round.is_open() {
                // Not committable already: a round never sits waiting on
                // nobody, nor on an excluded site.
                let hashes: BTreeSet<_> = round
                    .counted()
                    .filter_map(|p| p.applied_hash(key))
                    .collect();
                let all = round.counted().all(|p| p.applied_hash(key).is_some());
                prop_assert!(hashes.len() <= 1, "two hashes on an open fragment");
                prop_assert!(
                    !(all && hashes.len() == 1),
                    "round {} fragment {} should have committed",
                    round.round,
                    f
                );
            }
        }
        match &round.outcome {
            RoundOutcome::Committed { .. } => {
                let all_committed = round
                    .fragments
                    .iter()
                    .all(|s| matches!(s, FragmentState::Committed { .. }));
                prop_assert!(
                    all_committed,
                    "a committed round with a fragment not committed"
                );
                prop_assert!(round.counted().next().is_some());
            }
            RoundOutcome::Open => {
                prop_assert!(
                    round.counted().next().is_some(),
                    "an open round with nobody to wait for"
                );
                // A re-placement applies to the open round at once: only a
                // job placed as DiLoCo replicas has one, and only its plan's
                // sites count in it.
                let job = state.job(JOB_ID).unwrap();
                let plan = job
                    .placement
                    .plan()
                    .filter(|_| job.state == JobState::Placed);
                prop_assert!(plan.is_some(), "an open round of a {:?} job", job.state);
                if let Some(plan) = plan {
                    for p in round.counted() {
                        prop_assert!(
                            plan.site_order.contains(&p.site),
                            "{} counts in round {} but left the plan",
                            p.site,
                            round.round
                        );
                    }
                }
                prop_assert!(!round.waiting_on().is_empty());
                for p in round.counted() {
                    let site = state.site(&p.site).unwrap();
                    prop_assert_eq!(site.liveness, Liveness::Up, "a down site still counts");
                }
            }
            RoundOutcome::Aborted { .. } => {}
        }
    }
    prop_assert!(state.rounds(JOB_ID).filter(|r| r.is_open()).count() <= 1);
    prop_assert!(state.rounds(JOB_ID).count() <= ROUNDS_KEPT_PER_JOB);
    Ok(())
}

/// A report's identity: the same one sent again is answered as the first.
type ReportKey = (u64, String, u32, Option<String>);

fn report_key(command: &Command) -> Option<ReportKey> {
    match command {
        Command::ReportContributed {
            round,
            site_id,
            fragment,
            ..
        } => Some((*round, site_id.clone(), *fragment, None)),
        Command::ReportApplied {
            round,
            site_id,
            fragment,
            hash,
            ..
        } => Some((*round, site_id.clone(), *fragment, Some(hash.clone()))),
        _ => None,
    }
}

/// What the coordinator's storage keeps of the applied events: each
/// change under its key, a removal taking the keys under it + `/` too (a
/// round's reports with the round).
fn store_events(stored: &mut BTreeMap<String, Change>, events: &[Event]) {
    for event in events {
        let Some(key) = event.change.key() else {
            continue;
        };
        if event.change.is_removal() {
            let under = format!("{key}/");
            stored.retain(|k, _| *k != key && !k.starts_with(&under));
        } else {
            stored.insert(key, event.change.clone());
        }
    }
}

/// What a watcher of the job's rounds holds after folding `events` in:
/// records replace, reports fold into the round, removals remove.
fn watch_rounds(watched: &mut BTreeMap<u64, RoundRecord>, events: &[Event]) {
    for event in events {
        match &event.change {
            Change::Round { record } if record.job_id == JOB_ID => {
                watched.insert(record.round, (**record).clone());
            }
            Change::RoundReport { report } if report.job_id == JOB_ID => {
                if let Some(record) = watched.get_mut(&report.round) {
                    record.apply_report(report);
                }
            }
            Change::RoundRemoved { job_id, round } if job_id == JOB_ID => {
                watched.remove(round);
            }
            _ => {}
        }
    }
}

/// Applies the commands of `ops` one by one, checking the round invariants
/// after each and the state rebuilt from its parts at the end.
fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut state = state();
    let mut log: Vec<Request> = Vec::new();
    let mut lease = 100;
    // Of the job as submitted last: per round, the round once committed;
    // the latest committed round; the reports stored.
    let mut commits: BTreeMap<u64, RoundRecord> = BTreeMap::new();
    let mut last_committed: Option<u64> = None;
    let mut stored: BTreeSet<ReportKey> = Default::default();
    // What storage holds (from the state before the run, then every
    // applied event), and what a watcher of the rounds holds.
    let mut storage: BTreeMap<String, Change> = BTreeMap::new();
    store_events(&mut storage, &state.events_after(0).unwrap());
    let mut watched: BTreeMap<u64, RoundRecord> = BTreeMap::new();
    for (step, op) in ops.iter().enumerate() {
        let now = 100 + step as u64 * 97;
        let Some(request) = command_for(op, &state, &log, now, &mut lease) else {
            continue;
        };
        let before = state.clone();
        let admitted = state.admit(&request);
        let key = report_key(&request.command);
        match state.apply(&request) {
            Ok(applied) => {
                prop_assert!(
                    admitted.is_ok(),
                    "admission refused what applies: {:?}",
                    admitted
                );
                prop_assert_eq!(applied.revision, before.revision() + 1);
                store_events(&mut storage, &applied.events);
                watch_rounds(&mut watched, &applied.events);
                for event in &applied.events {
                    if let Change::RoundReport { report } = &event.change {
                        // A report's change names what it is about, never
                        // the round's record (3 sites here: an abort's
                        // disagreement names them all and stays small).
                        let bytes = serde_json::to_vec(&event.change).unwrap().len();
                        prop_assert!(bytes < 1024, "{} bytes: {:?}", bytes, report);
                    }
                }
                if let Some(key) = key {
                    prop_assert!(stored.insert(key.clone()), "{:?} stored twice", key);
                }
                if matches!(request.command, Command::SubmitJob { .. }) {
                    // A new job under the old id: none of the old rounds.
                    prop_assert_eq!(state.rounds(JOB_ID).count(), 0);
                    commits.clear();
                    last_committed = None;
                    stored.clear();
                }
                log.push(request.clone());
            }
            Err(error) => {
                prop_assert_eq!(admitted.err(), Some(error.clone()));
                prop_assert_eq!(
                    &state,
                    &before,
                    "a refused {} changed the state",
                    request.command.name()
                );
                if let Some(key) = key
                    && stored.contains(&key)
                    && state.round(JOB_ID, key.0).is_some()
                {
                    prop_assert!(
                        matches!(error, ApplyError::AlreadyExists { .. }),
                        "{:?} again was not answered as the first: {}",
                        key,
                        error
                    );
                }
            }
        }
        check_rounds(&state)?;
        // A watcher folding the events holds exactly the state's rounds.
        let kept: BTreeMap<u64, RoundRecord> =
            state.rounds(JOB_ID).map(|r| (r.round, r.clone())).collect();
        prop_assert_eq!(&watched, &kept, "the rounds a watcher holds");
        for round in state.rounds(JOB_ID) {
            if let Some(earlier) = commits.get(&round.round) {
                // Committed once: it never changes again.
                prop_assert_eq!(earlier, round);
            } else if round.is_committed() {
                commits.insert(round.round, round.clone());
                last_committed = last_committed.max(Some(round.round));
            }
        }
        for (k, earlier) in &commits {
            if state.round(JOB_ID, *k).is_none() {
                // Only eviction removes a committed round, and it stays out.
                prop_assert!(state.rounds(JOB_ID).all(|r| r.round > earlier.round));
            }
        }
        // However many rounds went by, the latest committed one is kept.
        prop_assert_eq!(
            state.last_committed_round(JOB_ID).map(|r| r.round),
            last_committed
        );
    }
    let rebuilt = ClusterState::from_parts(
        state.revision(),
        state.entities(),
        state.events_after(0).unwrap(),
        DEFAULT_HISTORY_LIMIT,
    );
    prop_assert_eq!(&rebuilt, &state);
    // Loaded from what storage holds, rounds' records and their reports, in
    // the reverse of the keys' order: the same state.
    let loaded = ClusterState::from_parts(
        state.revision(),
        storage.into_values().rev(),
        state.events_after(0).unwrap(),
        DEFAULT_HISTORY_LIMIT,
    );
    prop_assert_eq!(&loaded, &state, "the state loaded from storage");
    if std::env::var_os("LONGHAUL_ROUNDS_STATS").is_some() {
        let rounds: Vec<_> = state.rounds(JOB_ID).collect();
        eprintln!(
            "last round {:?} kept {} committed {} aborted {}",
            state.latest_round(JOB_ID).map(|r| r.round),
            rounds.len(),
            rounds.iter().filter(|r| r.is_committed()).count(),
            rounds
                .iter()
                .filter(|r| matches!(r.outcome, RoundOutcome::Aborted { .. }))
                .count()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_interleavings_keep_the_round_invariants(ops in prop::collection::vec(op(), 1..120)) {
        run(&ops)?;
    }

    /// Every refused report, of any shape, changes nothing.
    #[test]
    fn a_refused_round_command_changes_nothing(
        ops in prop::collection::vec(op(), 1..60),
        probes in prop::collection::vec((0usize..4, 0u64..4, 0u32..4, 0usize..3), 1..20),
    ) {
        let mut state = state();
        let mut log = Vec::new();
        let mut lease = 100;
        for (step, op) in ops.iter().enumerate() {
            if let Some(request) = command_for(op, &state, &log, 100 + step as u64, &mut lease)
                && state.apply(&request).is_ok()
            {
                log.push(request);
            }
        }
        let names = ["paris", "frankfurt", "virginia", "elsewhere"];
        for (site, round, fragment, kind) in probes {
            let site = names[site];
            let request = match kind {
                0 => contributed(round, site, fragment),
                1 => applied(round, site, fragment, if fragment % 2 == 0 { "x" } else { "y" }, 5),
                _ => exclude(round, site, ExclusionReason::DeadlineMissed, 5_000_000),
            };
            let before = state.clone();
            if state.apply(&request).is_err() {
                prop_assert_eq!(&state, &before);
            }
            check_rounds(&state)?;
        }
    }
}

proptest! {
    // Fewer cases: each is a few hundred commands.
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// More rounds than are kept, with aborts, re-placements, cancels and
    /// resubmissions among them.
    #[test]
    fn long_runs_keep_the_round_invariants(ops in ops_long()) {
        run(&ops)?;
    }
}
