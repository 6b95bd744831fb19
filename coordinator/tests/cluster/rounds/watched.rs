//! Against in-process replicas: the API's validation of round reports and
//! the round watch.

use super::*;

/// The API refuses bad reports naming the field and storing nothing,
/// answers a repeated report as the first, and agents learn of the round's
/// opening and commit from the round watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_reports_are_validated_and_rounds_commit_and_are_watched() {
    let dir = tempfile::tempdir().unwrap();
    let mut configs = replica_configs(dir.path(), 3);
    for config in &mut configs {
        // Long enough that the checks below run in one round.
        config.round_timing.fixed = Some(Duration::from_secs(30));
    }
    let mut replicas = Vec::new();
    for config in &configs {
        replicas.push(Some(Replica::start(config.clone()).await.unwrap()));
    }
    leader_of(&replicas).await;
    let addrs: Vec<SocketAddr> = configs.iter().map(|c| c.listen).collect();
    let ttl = configs[0].lease_ttl;
    let stand_ins: Vec<StandIn> = SITES
        .iter()
        .map(|site| StandIn::spawn(site, addrs.clone(), ttl, false))
        .collect();
    place_job(&addrs).await;

    let mut watch = RoundWatch::start(addrs[1], "paris").await;
    let mut opened = watch.next_round().await;
    while opened.round_id == 0 {
        opened = watch.next_round().await;
    }
    assert_eq!(opened.round_id, 1);
    assert_eq!(opened.state(), pb::RoundState::Open);
    assert_eq!(opened.participants.len(), 3, "{opened:?}");
    assert!(opened.fragments >= 1);

    let revision = || async {
        client(addrs[0])
            .await
            .list_rounds(pb::ListRoundsRequest {
                job_id: JOB_ID.into(),
                allow_stale: false,
            })
            .await
            .unwrap()
            .into_inner()
            .header
            .unwrap()
            .revision
    };
    let before = revision().await;
    let leave = |job: &str, reason: String| pb::LeaveRoundRequest {
        site_id: "tokyo".into(),
        job_id: job.into(),
        round: 1,
        reason,
    };
    let contributed =
        |job: &str, round: u64, site: &str, fragment: u32| pb::ReportContributedRequest {
            site_id: site.into(),
            job_id: job.into(),
            round,
            fragment,
        };
    let applied = |site: &str, fragment: u32, hash: &str| pb::ReportAppliedRequest {
        site_id: site.into(),
        job_id: JOB_ID.into(),
        round: 1,
        fragment,
        hash: hash.into(),
        inner_step_us: 0,
    };
    let refused = |status: tonic::Status, code: Code, field: &str| {
        assert_eq!(status.code(), code, "{status:?}");
        assert!(
            status.message().contains(&format!("field `{field}`")),
            "{status:?}"
        );
    };
    // Through a follower and the leader alike.
    for addr in &addrs {
        let mut c = agent(*addr);
        refused(
            c.report_contributed(contributed("nope", 1, "paris", 0))
                .await
                .unwrap_err(),
            Code::NotFound,
            "job_id",
        );
        refused(
            c.report_contributed(contributed(JOB_ID, 9, "paris", 0))
                .await
                .unwrap_err(),
            Code::NotFound,
            "round",
        );
        refused(
            c.report_contributed(contributed(JOB_ID, 1, "paris", opened.fragments))
                .await
                .unwrap_err(),
            Code::NotFound,
            "fragment",
        );
        refused(
            c.report_contributed(contributed(JOB_ID, 1, "atlantis", 0))
                .await
                .unwrap_err(),
            Code::FailedPrecondition,
            "site_id",
        );
        refused(
            c.report_applied(applied("paris", 0, &hash(1, 0)))
                .await
                .unwrap_err(),
            Code::FailedPrecondition,
            "fragment",
        );
        refused(
            c.report_applied(applied("paris", 0, "")).await.unwrap_err(),
            Code::InvalidArgument,
            "hash",
        );
        for (job, reason, code, field) in [
            (JOB_ID, String::new(), Code::InvalidArgument, "reason"),
            (JOB_ID, "x".repeat(1025), Code::InvalidArgument, "reason"),
            (
                JOB_ID,
                "no\u{1b}[2J state".into(),
                Code::InvalidArgument,
                "reason",
            ),
            (
                "nope",
                "its catch-up failed".to_string(),
                Code::NotFound,
                "job_id",
            ),
        ] {
            refused(
                c.leave_round(leave(job, reason)).await.unwrap_err(),
                code,
                field,
            );
        }
    }
    assert_eq!(revision().await, before, "a refused report stored nothing");

    let mut c = agent(addrs[2]);
    c.report_contributed(contributed(JOB_ID, 1, "paris", 0))
        .await
        .unwrap();
    let first = c
        .report_applied(applied("paris", 0, &hash(1, 0)))
        .await
        .unwrap()
        .into_inner();
    let me = participant(first.round.as_ref().unwrap(), "paris")
        .unwrap()
        .clone();
    assert_eq!(me.applied.len(), 1);
    let stored = revision().await;
    // The same report again is answered as the first; another hash is refused.
    let again = c
        .report_applied(applied("paris", 0, &hash(1, 0)))
        .await
        .unwrap();
    assert_eq!(again.into_inner().round, first.round);
    refused(
        c.report_applied(applied("paris", 0, "another"))
            .await
            .unwrap_err(),
        Code::FailedPrecondition,
        "hash",
    );
    assert_eq!(revision().await, stored, "a second report stored nothing");

    // Tokyo sits the round out (its catch-up failed, say): it is excluded
    // at once, and the round no longer waits for it.
    let left = c
        .leave_round(leave(JOB_ID, "its catch-up failed: no state".into()))
        .await
        .unwrap()
        .into_inner();
    let tokyo = participant(left.round.as_ref().unwrap(), "tokyo").unwrap();
    assert!(tokyo.excluded, "{tokyo:?}");
    assert_eq!(tokyo.exclusion_reason, "sat_out");
    assert!(tokyo.exclusion_message.contains("no state"), "{tokyo:?}");
    assert!(
        !left
            .round
            .as_ref()
            .unwrap()
            .waiting_on
            .contains(&"tokyo".to_string())
    );
    let stored = revision().await;
    refused(
        c.leave_round(leave(JOB_ID, "again".into()))
            .await
            .unwrap_err(),
        Code::FailedPrecondition,
        "site_id",
    );
    assert_eq!(revision().await, stored, "leaving twice stored nothing");

    // The stand-ins report the rest: the round commits, and the watch says so.
    for stand_in in &stand_ins {
        stand_in.reporting.store(true, Ordering::SeqCst);
    }
    let committed = loop {
        let round = watch.next_round().await;
        if round.round_id == 1 && round.state() == pb::RoundState::Committed {
            break round;
        }
        assert!(round.round_id == 1 || round.round_id == 0, "{round:?}");
    };
    assert!(committed.waiting_on.is_empty());
    assert!(
        committed
            .fragment_states
            .iter()
            .enumerate()
            .all(|(f, s)| s.state == "committed" && s.hash == hash(1, f as u32))
    );
    // The next one opens; the sync schedule names the current round.
    let schedule = eventually(
        Duration::from_secs(30),
        "round 2 in the sync schedule",
        || async {
            let schedule = client(addrs[0])
                .await
                .get_sync_schedule(pb::GetSyncScheduleRequest {
                    job_id: JOB_ID.into(),
                    allow_stale: false,
                })
                .await
                .ok()?
                .into_inner()
                .schedule?;
            schedule
                .current_round
                .as_ref()
                .is_some_and(|r| r.round_id >= 2)
                .then_some(schedule)
        },
    )
    .await;
    assert_eq!(schedule.job_id, JOB_ID);
    // The round carries the schedule's codec of every link, its width the
    // widest.
    let round = schedule.current_round.as_ref().unwrap();
    let carried: Vec<_> = round
        .links
        .iter()
        .map(|l| {
            (
                &l.site_a,
                &l.site_b,
                l.bits,
                l.block_size,
                l.error_feedback,
                l.zstd,
            )
        })
        .collect();
    let planned: Vec<_> = schedule
        .links
        .iter()
        .map(|l| {
            (
                &l.site_a,
                &l.site_b,
                l.bits,
                l.block_size,
                l.error_feedback,
                l.zstd,
            )
        })
        .collect();
    assert!(!carried.is_empty());
    assert_eq!(carried, planned);
    assert_eq!(
        Some(round.codec_bits),
        round.links.iter().map(|l| l.bits).max()
    );
    drop(stand_ins);
    for replica in replicas.into_iter().flatten() {
        replica.stop().await;
    }
}
