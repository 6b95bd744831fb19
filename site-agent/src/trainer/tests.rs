use super::shm::own_uid;
use super::*;

const SITE: &str = "north";

fn assignment(job: &str, mode: &str, ranks: &[u64], fragments: &[u64]) -> pb::Assignment {
    let mut first = 0;
    let schedule = fragments
        .iter()
        .enumerate()
        .map(|(i, &parameters)| {
            let f = pb::FragmentSchedule {
                fragment: i as u32,
                first_parameter: first,
                parameters,
                sync_at_inner_step: 9,
                apply_at_inner_step: 10,
            };
            first += parameters;
            f
        })
        .collect();
    pb::Assignment {
        job_id: job.into(),
        mode: mode.into(),
        ranks: ranks
            .iter()
            .map(|&rank| pb::RankBinding {
                rank,
                ..Default::default()
            })
            .collect(),
        replicas: vec![0],
        sync: Some(pb::SyncSchedule {
            job_id: job.into(),
            inner_steps: 10,
            fragments: fragments.len() as u32,
            codec_bits: 4,
            schedule,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn round(job: &str, id: u64, fragments: u32, state: pb::RoundState) -> pb::OuterRound {
    pb::OuterRound {
        round_id: id,
        job_id: job.into(),
        participants: vec![SITE.into(), "south".into()],
        state: state as i32,
        fragments,
        revision: id * 10,
        participant_states: [SITE, "south"]
            .iter()
            .map(|s| pb::RoundParticipant {
                site_id: s.to_string(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

struct Fixture {
    hub: Arc<TrainerHub>,
    dir: tempfile::TempDir,
}

fn fixture(ttl: Duration) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let hub = Arc::new(TrainerHub::new(SITE, ttl, dir.path()));
    hub.assign(&assignment("job", "diloco", &[4, 5], &[6, 4]));
    hub.assign(&assignment("pipe", "pipeline", &[0], &[10]));
    hub.observe_round(&round("job", 7, 2, pb::RoundState::Open));
    Fixture { hub, dir }
}

fn join(hub: &TrainerHub, job: &str, rank: u64, parameters: u64) -> Result<String, TrainerError> {
    hub.join(&pb::TrainerJoinRequest {
        job_id: job.into(),
        rank,
        parameters,
        pid: 42,
    })
    .map(|r| r.session)
}

fn field(error: &TrainerError) -> &'static str {
    match error {
        TrainerError::Invalid { field, .. }
        | TrainerError::NotFound { field, .. }
        | TrainerError::NotOwned { field, .. }
        | TrainerError::AlreadyExists { field, .. }
        | TrainerError::Over { field, .. } => field,
        TrainerError::Timeout { .. } => "timeout_ms",
        TrainerError::Exhausted { field, .. } => field,
    }
}

impl Fixture {
    fn tensor(&self, name: &str, values: &[f32]) -> pb::SharedTensor {
        std::fs::write(self.dir.path().join(name), bytemuck::cast_slice(values)).unwrap();
        pb::SharedTensor {
            name: name.into(),
            offset: 0,
            dtype: pb::TensorDtype::F32 as i32,
            elements: values.len() as u64,
        }
    }

    fn submit(
        &self,
        session: &str,
        round: u64,
        fragment: u32,
        values: &[f32],
    ) -> Result<u64, TrainerError> {
        let tensor = self.tensor(&format!("in-{round}-{fragment}"), values);
        self.hub.submit(
            &pb::TrainerSubmitRequest {
                session: session.into(),
                round,
                fragment,
                tensor: Some(tensor),
            },
            own_uid(),
        )
    }
}

#[test]
fn a_join_is_checked_against_the_sites_assignment_and_names_the_field() {
    let f = fixture(Duration::from_secs(30));
    let hub = &f.hub;
    for (job, rank, parameters, expected) in [
        ("nope", 4, 10, "job_id"),
        ("pipe", 0, 10, "job_id"),
        ("job", 3, 10, "rank"),
        ("job", 4, 11, "parameters"),
    ] {
        let error = join(hub, job, rank, parameters).unwrap_err();
        assert_eq!(field(&error), expected, "{error}");
        assert!(error.to_string().starts_with(expected), "{error}");
    }
    assert!(matches!(
        join(hub, "job", 3, 10),
        Err(TrainerError::NotOwned { .. })
    ));
    let session = join(hub, "job", 4, 10).unwrap();
    let error = join(hub, "job", 4, 10).unwrap_err();
    assert!(
        matches!(error, TrainerError::AlreadyExists { field: "rank", .. }),
        "{error}"
    );
    assert!(error.to_string().contains("process 42"), "{error}");
    // Another rank of the same site may join.
    join(hub, "job", 5, 10).unwrap();
    hub.leave(&session).unwrap();
    assert!(hub.leave(&session).is_err());
    join(hub, "job", 4, 10).unwrap();
    let schedule = hub.describe();
    assert_eq!(schedule.jobs.len(), 2);
    assert_eq!(schedule.jobs[0].ranks, vec![4, 5]);
}

#[test]
fn a_silent_trainer_releases_its_rank_after_the_ttl() {
    let f = fixture(Duration::from_millis(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let again = join(&f.hub, "job", 4, 10).unwrap();
    assert_ne!(session, again);
    let error = f.hub.schedule(&session).unwrap_err();
    assert!(
        matches!(
            error,
            TrainerError::NotFound {
                field: "session",
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn a_first_round_seen_before_its_jobs_assignment_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TrainerHub::new(SITE, Duration::from_secs(30), dir.path());
    // The rounds' stream is ahead of the assignments' one.
    hub.observe_round(&round("late", 1, 2, pb::RoundState::Open));
    hub.assign(&assignment("late", "diloco", &[4, 5], &[6, 4]));
    let session = join(&hub, "late", 4, 10).unwrap();
    assert_eq!(hub.schedule(&session).unwrap().round, 1);
}

#[test]
fn a_round_opened_on_a_replanned_schedule_the_assignment_lacks_sets_h_and_tau() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    // The round (its own stream) names H = 20, τ = 1 in force, before
    // the assignment with the re-planned schedule arrives.
    let mut replanned = round("job", 8, 2, pb::RoundState::Open);
    replanned.schedule_inner_steps = 20;
    replanned.schedule_overlap_steps = 1;
    replanned.inner_steps = 10;
    replanned.inner_steps_through = 80;
    f.hub.observe_round(&replanned);
    let schedule = f.hub.schedule(&session).unwrap();
    assert_eq!((schedule.inner_steps, schedule.overlap_steps), (20, 1));
    let staggered: Vec<_> = schedule
        .fragments
        .iter()
        .map(|f| {
            (
                f.first_parameter,
                f.parameters,
                f.sync_at_inner_step,
                f.apply_at_inner_step,
            )
        })
        .collect();
    assert_eq!(staggered, vec![(0, 6, 0, 1), (6, 4, 10, 11)]);
    assert_eq!(
        (
            schedule.round_inner_steps,
            schedule.round_inner_steps_through
        ),
        (10, 80)
    );
    // Once the assignment has it, the assignment's schedule is served.
    let mut assigned = assignment("job", "diloco", &[4, 5], &[6, 4]);
    let sync = assigned.sync.as_mut().unwrap();
    sync.inner_steps = 20;
    sync.overlap_steps = 1;
    f.hub.assign(&assigned);
    let schedule = f.hub.schedule(&session).unwrap();
    assert_eq!((schedule.inner_steps, schedule.overlap_steps), (20, 1));
    assert_eq!(
        schedule.fragments[1].sync_at_inner_step, 9,
        "the assignment's own"
    );
}

#[test]
fn the_schedule_has_the_fragments_and_the_open_round() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    let schedule = f.hub.schedule(&session).unwrap();
    assert_eq!(schedule.inner_steps, 10);
    assert_eq!(schedule.parameters, 10);
    assert_eq!(schedule.round, 7);
    assert_eq!(schedule.fragments[1].first_parameter, 6);
    assert!(!schedule.excluded);
    let mut over = round("job", 7, 2, pb::RoundState::Committed);
    over.revision += 1;
    f.hub.observe_round(&over);
    let schedule = f.hub.schedule(&session).unwrap();
    assert_eq!((schedule.round, schedule.last_round_over), (0, 7));
    // An older state of a round changes nothing.
    f.hub
        .observe_round(&round("job", 7, 2, pb::RoundState::Open));
    assert_eq!(f.hub.schedule(&session).unwrap().round, 0);
    let progress = f.hub.progress(&pb::TrainerProgressRequest {
        session: session.clone(),
        inner_step: 3,
        step_seconds: f64::NAN,
    });
    assert!(matches!(
        progress,
        Err(TrainerError::Invalid {
            field: "step_seconds",
            ..
        })
    ));
    // The refused report measured nothing.
    assert_eq!(f.hub.inner_step_us("job"), 0);
}

#[test]
fn the_measured_inner_step_is_the_slowest_ranks_latest() {
    let f = fixture(Duration::from_secs(30));
    let a = join(&f.hub, "job", 4, 10).unwrap();
    let b = join(&f.hub, "job", 5, 10).unwrap();
    let report = |session: &str, step_seconds: f64| {
        f.hub
            .progress(&pb::TrainerProgressRequest {
                session: session.into(),
                inner_step: 1,
                step_seconds,
            })
            .unwrap();
    };
    report(&a, 0.25);
    report(&b, 0.5);
    assert_eq!(f.hub.inner_step_us("job"), 500_000);
    report(&b, 0.125);
    assert_eq!(f.hub.inner_step_us("job"), 250_000);
    assert_eq!(f.hub.inner_step_us("other"), 0);
}

#[test]
fn a_bad_submission_is_refused_naming_its_field_and_stores_nothing() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    for (round, fragment, values, expected) in [
        (8, 0, vec![0.5; 6], "round"),
        (7, 2, vec![0.5; 6], "fragment"),
        (7, 0, vec![0.5; 5], "tensor.elements"),
        (7, 0, vec![0.5, f32::NAN, 0.0, 0.0, 0.0, 0.0], "tensor"),
    ] {
        let error = f.submit(&session, round, fragment, &values).unwrap_err();
        assert_eq!(field(&error), expected, "{error}");
    }
    assert!(matches!(
        f.submit(&session, 8, 0, &[0.5; 6]),
        Err(TrainerError::NotFound { field: "round", .. })
    ));
    assert!(matches!(
        f.submit("nobody", 7, 0, &[0.5; 6]),
        Err(TrainerError::NotFound {
            field: "session",
            ..
        })
    ));
    assert!(lock(&f.hub.state).submissions.is_empty());
    assert_eq!(f.submit(&session, 7, 0, &[0.5; 6]).unwrap(), 6);
    let twice = f.submit(&session, 7, 0, &[0.25; 6]).unwrap_err();
    assert!(
        matches!(
            twice,
            TrainerError::AlreadyExists {
                field: "fragment",
                ..
            }
        ),
        "{twice}"
    );
    // Once per site, whichever rank sends it.
    let other = join(&f.hub, "job", 5, 10).unwrap();
    assert!(f.submit(&other, 7, 0, &[0.25; 6]).is_err());
    let held = lock(&f.hub.state)
        .submissions
        .values()
        .next()
        .cloned()
        .unwrap();
    assert_eq!(*held, vec![0.5; 6]);
    // A round that is over, and one this site was excluded from.
    let mut next = round("job", 8, 2, pb::RoundState::Open);
    f.hub.observe_round(&next);
    let error = f.submit(&session, 7, 1, &[0.5; 4]).unwrap_err();
    assert!(
        matches!(error, TrainerError::Over { field: "round", .. }),
        "{error}"
    );
    next.participant_states[0].excluded = true;
    next.participant_states[0].exclusion_reason = "deadline_missed".into();
    next.revision += 1;
    f.hub.observe_round(&next);
    let error = f.submit(&session, 8, 0, &[0.5; 6]).unwrap_err();
    assert!(error.to_string().contains("excluded"), "{error}");
}

#[tokio::test]
async fn a_collector_waits_for_the_average_and_gets_it_in_shared_memory() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    let waiting = {
        let hub = Arc::clone(&f.hub);
        tokio::spawn(async move { hub.submission("job", 7, 1).await })
    };
    f.submit(&session, 7, 1, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let submitted = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*submitted, vec![1.0, 2.0, 3.0, 4.0]);
    let into = f.tensor("out", &[0.0; 4]);
    let request = pb::TrainerCollectRequest {
        session: session.clone(),
        round: 7,
        fragment: 1,
        into: Some(into.clone()),
        timeout_ms: 30,
    };
    let early = f.hub.collect(&request, own_uid()).await.unwrap_err();
    assert!(matches!(early, TrainerError::Timeout { .. }), "{early}");
    let collector = {
        let hub = Arc::clone(&f.hub);
        let request = pb::TrainerCollectRequest {
            timeout_ms: 5_000,
            ..request.clone()
        };
        tokio::spawn(async move { hub.collect(&request, own_uid()).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    f.hub.publish(
        "job",
        7,
        1,
        FragmentResult::Applied {
            values: Arc::new(vec![0.5, 1.5, 2.5, 3.5]),
            hash: "h".into(),
            live: vec![SITE.into(), "south".into()],
        },
    );
    let response = collector.await.unwrap().unwrap();
    assert_eq!(response.outcome, pb::CollectOutcome::Applied as i32);
    assert_eq!(response.hash, "h");
    let bytes = std::fs::read(f.dir.path().join("out")).unwrap();
    assert_eq!(
        bytemuck::cast_slice::<u8, f32>(&bytes),
        &[0.5, 1.5, 2.5, 3.5]
    );
    // The wrong size is refused before anything is written.
    let wrong = pb::TrainerCollectRequest {
        into: Some(pb::SharedTensor {
            elements: 3,
            ..into
        }),
        ..request.clone()
    };
    let error = f.hub.collect(&wrong, own_uid()).await.unwrap_err();
    assert_eq!(field(&error), "into.elements", "{error}");
    // A round not yet open, and a fragment out of range.
    let error = f
        .hub
        .collect(
            &pb::TrainerCollectRequest {
                round: 9,
                ..request.clone()
            },
            own_uid(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, TrainerError::NotFound { field: "round", .. }),
        "{error}"
    );
}

#[tokio::test]
async fn an_excluded_site_or_an_aborted_round_answers_its_collectors_at_once() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    let into = f.tensor("out", &[9.0; 6]);
    let collect = |round: u64| pb::TrainerCollectRequest {
        session: session.clone(),
        round,
        fragment: 0,
        into: Some(into.clone()),
        timeout_ms: 5_000,
    };
    let collector = {
        let hub = Arc::clone(&f.hub);
        let request = collect(7);
        tokio::spawn(async move { hub.collect(&request, own_uid()).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut excluded = round("job", 7, 2, pb::RoundState::Open);
    excluded.revision += 1;
    excluded.participant_states[0].excluded = true;
    excluded.participant_states[0].exclusion_reason = "site_down".into();
    f.hub.observe_round(&excluded);
    let response = tokio::time::timeout(Duration::from_secs(5), collector)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(response.outcome, pb::CollectOutcome::Excluded as i32);
    assert!(response.reason.contains("site_down"), "{}", response.reason);
    let mut aborted = round("job", 8, 2, pb::RoundState::Aborted);
    aborted.reason = "fragment 0 disagreed".into();
    f.hub.observe_round(&aborted);
    let response = f.hub.collect(&collect(8), own_uid()).await.unwrap();
    assert_eq!(response.outcome, pb::CollectOutcome::RoundOver as i32);
    assert!(response.reason.contains("disagreed"));
    // Nothing was written for either.
    let bytes = std::fs::read(f.dir.path().join("out")).unwrap();
    assert_eq!(bytemuck::cast_slice::<u8, f32>(&bytes), &[9.0; 6]);
    // Rounds far behind the latest are dropped.
    for id in 9..=12 {
        f.hub
            .observe_round(&round("job", id, 2, pb::RoundState::Open));
    }
    let error = f.hub.collect(&collect(8), own_uid()).await.unwrap_err();
    assert!(
        matches!(error, TrainerError::Over { field: "round", .. }),
        "{error}"
    );
    assert!(lock(&f.hub.state).results.keys().all(|k| k.1 >= 10));
    // A round older than the latest that this hub never saw end (the
    // agent restarted) is over for its collectors, at once.
    let response = f.hub.collect(&collect(11), own_uid()).await.unwrap();
    assert_eq!(response.outcome, pb::CollectOutcome::RoundOver as i32);
    assert!(
        response.reason.contains("before this agent saw it"),
        "{}",
        response.reason
    );
}

#[tokio::test]
async fn a_collect_waiting_longer_than_the_ttl_keeps_its_session() {
    let f = fixture(Duration::from_millis(100));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    let into = f.tensor("out", &[0.0; 6]);
    let collector = {
        let hub = Arc::clone(&f.hub);
        let request = pb::TrainerCollectRequest {
            session: session.clone(),
            round: 7,
            fragment: 0,
            into: Some(into),
            timeout_ms: 5_000,
        };
        tokio::spawn(async move { hub.collect(&request, own_uid()).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Another rank's join reaps silent sessions: not the waiting one.
    join(&f.hub, "job", 5, 10).unwrap();
    f.hub.publish(
        "job",
        7,
        0,
        FragmentResult::Applied {
            values: Arc::new(vec![1.0; 6]),
            hash: "h".into(),
            live: vec![SITE.into()],
        },
    );
    let response = collector.await.unwrap().unwrap();
    assert_eq!(response.outcome, pb::CollectOutcome::Applied as i32);
    // And it counts as heard from when the wait ended.
    f.hub.schedule(&session).unwrap();
}

#[tokio::test]
async fn a_collect_of_round_0_or_of_a_fragment_the_schedule_lacks_is_refused_at_once() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    let into = f.tensor("out", &[0.0; 6]);
    for (round, fragment, expected) in [(0, 0, "round"), (6, 2, "fragment"), (7, 9, "fragment")] {
        let request = pb::TrainerCollectRequest {
            session: session.clone(),
            round,
            fragment,
            into: Some(into.clone()),
            timeout_ms: 60_000,
        };
        let error =
            tokio::time::timeout(Duration::from_secs(5), f.hub.collect(&request, own_uid()))
                .await
                .expect("refused at once, not waited out")
                .unwrap_err();
        assert_eq!(field(&error), expected, "{error}");
    }
    assert_eq!(lock(&f.hub.state).sessions[&session].collecting, 0);
}

#[test]
fn a_job_removed_from_the_site_leaves_nothing_behind() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    f.submit(&session, 7, 0, &[0.5; 6]).unwrap();
    f.hub.publish(
        "job",
        7,
        1,
        FragmentResult::RoundOver { reason: "x".into() },
    );
    f.hub.remove("job");
    let state = lock(&f.hub.state);
    assert!(state.submissions.is_empty() && state.results.is_empty());
    assert!(!state.rounds.contains_key("job") && state.sessions.is_empty());
}

/// Round 8 of "job", open, naming `site` as catching up after round 7
/// from `from`.
fn catch_up_round(site: &str, from: &str) -> pb::OuterRound {
    let mut open = round("job", 8, 2, pb::RoundState::Open);
    for p in &mut open.participant_states {
        if p.site_id == site {
            p.catch_up_from_round = 7;
            p.catch_up_from_site = from.into();
        }
    }
    open
}

fn state(values: usize) -> Vec<f32> {
    (0..values).map(|i| i as f32 * 0.5).collect()
}

#[test]
fn a_site_caught_up_from_publishes_only_the_state_the_open_round_asks_for() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    f.hub.observe_round(&catch_up_round("south", SITE));
    let schedule = f.hub.schedule(&session).unwrap();
    assert_eq!(schedule.serve_after_round, 7);
    assert_eq!(schedule.catch_up_after_round, 0);
    // The round lets south fetch the state after round 7 (once it is here).
    let missing = f.hub.states().lookup("job", 7, "south").unwrap_err();
    assert!(missing.contains("no state"), "{missing}");
    let publish = |round: u64, name: &str, values: &[f32]| {
        f.hub.publish_state(
            &pb::TrainerPublishStateRequest {
                session: session.clone(),
                round,
                tensor: Some(f.tensor(name, values)),
            },
            own_uid(),
        )
    };
    // The wrong round, the wrong size (the parameters, not twice them), a
    // value that is not finite: refused, naming the field; nothing kept.
    let error = publish(6, "s-6", &state(20)).unwrap_err();
    assert_eq!(field(&error), "round", "{error}");
    assert!(error.to_string().contains("after round 7"), "{error}");
    let error = publish(7, "s-small", &state(10)).unwrap_err();
    assert_eq!(field(&error), "tensor.elements", "{error}");
    let mut bad = state(20);
    bad[13] = f32::NAN;
    let error = publish(7, "s-nan", &bad).unwrap_err();
    assert_eq!(field(&error), "tensor", "{error}");
    // A bf16 copy is not the anchor the trainers hold.
    let error = f
        .hub
        .publish_state(
            &pb::TrainerPublishStateRequest {
                session: session.clone(),
                round: 7,
                tensor: Some(pb::SharedTensor {
                    dtype: pb::TensorDtype::Bf16 as i32,
                    ..f.tensor("s-bf16", &state(20))
                }),
            },
            own_uid(),
        )
        .unwrap_err();
    assert_eq!(field(&error), "tensor.dtype", "{error}");
    assert!(!f.hub.states().has("job", 7));
    assert_eq!(publish(7, "s-ok", &state(20)).unwrap(), 20);
    assert!(f.hub.states().has("job", 7));
    assert_eq!(
        *f.hub.states().lookup("job", 7, "south").unwrap(),
        state(20)
    );
    // Another site may not fetch it; published, it is asked for no more.
    assert!(f.hub.states().lookup("job", 7, "east").is_err());
    assert_eq!(f.hub.schedule(&session).unwrap().serve_after_round, 0);
    // Once the round is over, no state is asked for.
    f.hub
        .observe_round(&round("job", 8, 2, pb::RoundState::Committed));
    let error = publish(7, "s-late", &state(20)).unwrap_err();
    assert_eq!(field(&error), "round", "{error}");
}

#[tokio::test]
async fn a_catching_up_site_gets_the_state_fetched_or_why_there_is_none() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    f.hub.observe_round(&catch_up_round(SITE, "south"));
    let schedule = f.hub.schedule(&session).unwrap();
    assert_eq!(
        (
            schedule.catch_up_after_round,
            schedule.catch_up_from_site.as_str()
        ),
        (7, "south")
    );
    assert_eq!(schedule.serve_after_round, 0);
    assert!(!f.hub.fetched("job", 7));
    let into = f.tensor("state", &[0.0; 20]);
    let request = pb::TrainerCatchUpRequest {
        session: session.clone(),
        round: 7,
        into: Some(into.clone()),
        timeout_ms: 30,
    };
    // Refused: a round this site does not catch up after, a wait too
    // long, the wrong size.
    for (bad, named) in [
        (
            pb::TrainerCatchUpRequest {
                round: 6,
                ..request.clone()
            },
            "round",
        ),
        (
            pb::TrainerCatchUpRequest {
                timeout_ms: 3_600_000,
                ..request.clone()
            },
            "timeout_ms",
        ),
        (
            pb::TrainerCatchUpRequest {
                into: Some(pb::SharedTensor {
                    elements: 10,
                    ..into.clone()
                }),
                ..request.clone()
            },
            "into.elements",
        ),
        (
            pb::TrainerCatchUpRequest {
                into: Some(pb::SharedTensor {
                    dtype: pb::TensorDtype::Bf16 as i32,
                    ..into.clone()
                }),
                ..request.clone()
            },
            "into.dtype",
        ),
    ] {
        let error = f.hub.catch_up(&bad, own_uid()).await.unwrap_err();
        assert_eq!(field(&error), named, "{error}");
    }
    // Not fetched yet: the wait ends.
    let error = f.hub.catch_up(&request, own_uid()).await.unwrap_err();
    assert!(matches!(error, TrainerError::Timeout { .. }), "{error}");
    let waiting = {
        let hub = Arc::clone(&f.hub);
        let request = pb::TrainerCatchUpRequest {
            timeout_ms: 5_000,
            ..request.clone()
        };
        tokio::spawn(async move { hub.catch_up(&request, own_uid()).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    f.hub.record_fetch("job", 8, 7, "south", Ok(state(20)));
    let response = waiting.await.unwrap().unwrap();
    assert_eq!(response.outcome, pb::CatchUpOutcome::Loaded as i32);
    assert_eq!(response.from_site, "south");
    let bytes = std::fs::read(f.dir.path().join("state")).unwrap();
    assert_eq!(
        bytemuck::cast_slice::<u8, f32>(&bytes),
        state(20).as_slice()
    );
    assert!(f.hub.fetched("job", 7));
    // A later failed try does not replace the state fetched.
    f.hub
        .record_fetch("job", 8, 7, "south", Err("timed out".into()));
    let again = f.hub.catch_up(&request, own_uid()).await.unwrap();
    assert_eq!(again.outcome, pb::CatchUpOutcome::Loaded as i32);
    // The round over, the state fetched is still given.
    f.hub
        .observe_round(&round("job", 8, 2, pb::RoundState::Aborted));
    let late = f.hub.catch_up(&request, own_uid()).await.unwrap();
    assert_eq!(late.outcome, pb::CatchUpOutcome::Loaded as i32);
    // The job leaving the site forgets it.
    f.hub.remove("job");
    assert!(!f.hub.fetched("job", 7));
}

#[tokio::test]
async fn a_failed_fetch_answers_the_catch_up_with_its_reason_and_writes_nothing() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    f.hub.observe_round(&catch_up_round(SITE, "south"));
    f.hub.record_fetch(
        "job",
        8,
        7,
        "south",
        Err("site south refused: no state".into()),
    );
    assert!(!f.hub.fetched("job", 7));
    let request = pb::TrainerCatchUpRequest {
        session,
        round: 7,
        into: Some(f.tensor("state", &[9.0; 20])),
        timeout_ms: 1_000,
    };
    let response = f.hub.catch_up(&request, own_uid()).await.unwrap();
    assert_eq!(response.outcome, pb::CatchUpOutcome::Failed as i32);
    assert!(response.reason.contains("no state"), "{}", response.reason);
    let bytes = std::fs::read(f.dir.path().join("state")).unwrap();
    assert_eq!(bytemuck::cast_slice::<u8, f32>(&bytes), &[9.0; 20]);
}

#[test]
fn no_state_is_published_once_a_fragment_of_the_open_round_is_applied_here() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    f.hub.observe_round(&catch_up_round("south", SITE));
    f.hub.publish(
        "job",
        8,
        1,
        FragmentResult::Applied {
            values: Arc::new(vec![0.0; 10]),
            hash: "h".into(),
            live: vec![SITE.into(), "south".into()],
        },
    );
    let error = f
        .hub
        .publish_state(
            &pb::TrainerPublishStateRequest {
                session,
                round: 7,
                tensor: Some(f.tensor("s", &state(20))),
            },
            own_uid(),
        )
        .unwrap_err();
    assert!(
        matches!(error, TrainerError::Over { field: "round", .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("fragment 1 of round 8"),
        "{error}"
    );
    assert!(!f.hub.states().has("job", 7));
}

#[test]
fn the_state_store_never_goes_back_to_an_earlier_round() {
    let f = fixture(Duration::from_secs(30));
    f.hub.states().publish("job", 9, state(20));
    f.hub.states().publish("job", 7, state(4));
    assert!(f.hub.states().has("job", 9));
    assert!(!f.hub.states().has("job", 7));
}

#[tokio::test]
async fn a_failed_fetch_of_an_earlier_round_does_not_answer_a_later_rounds_catch_up() {
    let f = fixture(Duration::from_secs(30));
    let session = join(&f.hub, "job", 4, 10).unwrap();
    f.hub.observe_round(&catch_up_round(SITE, "south"));
    f.hub
        .record_fetch("job", 8, 7, "south", Err("round 8 ended first".into()));
    // Round 8 aborts; round 9 names this site as catching up after 7 again.
    f.hub
        .observe_round(&round("job", 8, 2, pb::RoundState::Aborted));
    let mut nine = catch_up_round(SITE, "south");
    nine.round_id = 9;
    nine.revision = 90;
    f.hub.observe_round(&nine);
    assert!(!f.hub.fetched("job", 7));
    let request = pb::TrainerCatchUpRequest {
        session,
        round: 7,
        into: Some(f.tensor("state", &[0.0; 20])),
        timeout_ms: 30,
    };
    // Round 8's failure is not round 9's: the catch-up waits for its fetch.
    let error = f.hub.catch_up(&request, own_uid()).await.unwrap_err();
    assert!(matches!(error, TrainerError::Timeout { .. }), "{error}");
    f.hub
        .record_fetch("job", 9, 7, "south", Err("site south refused".into()));
    let failed = f.hub.catch_up(&request, own_uid()).await.unwrap();
    assert_eq!(failed.outcome, pb::CatchUpOutcome::Failed as i32);
    assert!(failed.reason.contains("refused"), "{}", failed.reason);
}
