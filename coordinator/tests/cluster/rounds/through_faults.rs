//! Against real `coordinator` processes: a site killed mid-round and
//! back, the leader killed mid-round.

use super::*;

/// Waits (20 s at most) until the replica's `/metrics` at `addr` shows
/// every one of `wanted`.
async fn metrics_show(addr: SocketAddr, wanted: &[&str]) {
    let mut last = String::new();
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(body) = http_get(addr, "/metrics").await {
                if wanted.iter().all(|w| body.contains(w)) {
                    return;
                }
                last = body;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "{addr}/metrics lacks some of {wanted:?}:\n{last}"
    );
}

/// Real replica processes and three stand-ins: rounds commit; a site that
/// dies mid-round is excluded and the round commits without it within its
/// deadline plus one lease TTL; the site comes back and takes part in a
/// later round after catching up; the leader killed mid-round, the round
/// still commits, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_commit_through_a_site_loss_its_return_and_a_leader_kill() {
    const DEADLINE: Duration = Duration::from_secs(6);
    const TTL: Duration = Duration::from_secs(3);
    let dir = tempfile::tempdir().unwrap();
    let mut processes = cluster(dir.path(), 3);
    let metrics: Vec<SocketAddr> = processes.iter().map(|_| free_addr()).collect();
    for (p, metrics) in processes.iter_mut().zip(&metrics) {
        p.extra_args = vec![
            "--round-deadline".into(),
            "6s".into(),
            "--lease-ttl".into(),
            "3s".into(),
            "--metrics-listen".into(),
            metrics.to_string(),
        ];
        p.start();
    }
    leader(&processes).await;
    let addrs: Vec<SocketAddr> = processes.iter().map(|p| p.addr).collect();
    let stand_ins: Vec<StandIn> = SITES
        .iter()
        .map(|site| StandIn::spawn(site, addrs.clone(), TTL, true))
        .collect();
    place_job(&addrs).await;

    // Rounds open and commit.
    eventually(Duration::from_secs(60), "two committed rounds", || async {
        let rounds = any_rounds(&addrs).await?;
        (rounds
            .iter()
            .filter(|r| r.state() == pb::RoundState::Committed)
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    // Every replica counts the rounds it applied; the leader, which opened
    // them, also shows the bytes the schedule plans per outer step.
    let leading = leader(&processes).await as usize - 1;
    for (i, addr) in metrics.iter().enumerate() {
        let mut wanted = vec![
            "longhaul_rounds_opened_total",
            "longhaul_rounds_ended_total{outcome=\"committed\"}",
            "longhaul_round_duration_seconds",
        ];
        if i == leading {
            wanted.push("longhaul_sync_planned_bytes{link=");
        }
        metrics_show(*addr, &wanted).await;
    }

    // paris stops reporting; once a round waits only on paris, it dies.
    let victim = &stand_ins[0];
    victim.reporting.store(false, Ordering::SeqCst);
    // A report already on its way would still count: wait until none is.
    eventually(
        Duration::from_secs(20),
        "paris's last reports to land",
        || async { (!victim.busy.load(Ordering::SeqCst)).then_some(()) },
    )
    .await;
    let stuck = eventually(
        Duration::from_secs(60),
        "a round waiting on paris alone",
        || async {
            let rounds = any_rounds(&addrs).await?;
            let open = rounds
                .last()
                .filter(|r| r.state() == pb::RoundState::Open)?;
            (open.waiting_on == vec![victim.site.to_string()]).then(|| open.clone())
        },
    )
    .await;
    victim.die();
    let ended = eventually(
        DEADLINE + TTL + Duration::from_secs(20),
        "the round to commit without paris",
        || async {
            let rounds = any_rounds(&addrs).await?;
            rounds
                .into_iter()
                .find(|r| r.round_id == stuck.round_id && r.state() != pb::RoundState::Open)
        },
    )
    .await;
    assert_eq!(ended.state(), pb::RoundState::Committed, "{ended:?}");
    let excluded = participant(&ended, victim.site).unwrap();
    assert!(excluded.excluded, "{ended:?}");
    eprintln!(
        "round {} committed {} ms after opening without paris ({}; deadline {} ms, lease TTL {} ms)",
        ended.round_id,
        ended.ended_at_unix_ms - ended.opened_at_unix_ms,
        excluded.exclusion_reason,
        DEADLINE.as_millis(),
        TTL.as_millis()
    );
    assert!(
        ended.ended_at_unix_ms <= ended.deadline_unix_ms + TTL.as_millis() as u64,
        "committed at {} ms, after its deadline {} + one TTL",
        ended.ended_at_unix_ms,
        ended.deadline_unix_ms
    );
    for p in ended
        .participant_states
        .iter()
        .filter(|p| p.site_id != victim.site)
    {
        assert!(!p.excluded, "{p:?}");
    }
    // The exclusion is counted, by its reason, on every replica.
    let exclusion = format!(
        "longhaul_round_exclusions_total{{reason=\"{}\"}}",
        excluded.exclusion_reason
    );
    for addr in &metrics {
        metrics_show(*addr, &[exclusion.as_str()]).await;
    }

    // paris comes back: the job is placed on it again, and it takes part in a
    // later round, told to catch up from a committed round at a site that
    // applied it.
    victim.revive();
    let rejoined = eventually(
        Duration::from_secs(90),
        "a round committed with paris back",
        || async {
            let rounds = any_rounds(&addrs).await?;
            rounds.into_iter().find(|r| {
                r.round_id > ended.round_id
                    && r.state() == pb::RoundState::Committed
                    && participant(r, victim.site).is_some_and(|p| !p.excluded)
            })
        },
    )
    .await;
    let catch_up = participant(&rejoined, victim.site).unwrap();
    assert!(
        catch_up.catch_up_from_round >= ended.round_id,
        "{rejoined:?}"
    );
    assert_ne!(catch_up.catch_up_from_site, victim.site);

    // The commit latency of a round as its last reporter sees it (3
    // replicas on loopback, on whatever load the machine has): printed,
    // not asserted.
    let mut latencies: Vec<Duration> = stand_ins
        .iter()
        .flat_map(|s| s.commit_latencies.lock().unwrap().clone())
        .collect();
    latencies.sort();
    if !latencies.is_empty() {
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
        eprintln!(
            "round commit latency (the committing report's round trip), {} rounds: p50 {:.1} ms, p99 {:.1} ms",
            latencies.len(),
            at(0.5).as_secs_f64() * 1e3,
            at(0.99).as_secs_f64() * 1e3
        );
    }

    // The leader dies mid-round (tokyo holds the round open); the round
    // still commits, exactly once.
    let holder = &stand_ins[2];
    holder.reporting.store(false, Ordering::SeqCst);
    let open = eventually(
        Duration::from_secs(60),
        "a round waiting on tokyo",
        || async {
            let rounds = any_rounds(&addrs).await?;
            let open = rounds
                .last()
                .filter(|r| r.state() == pb::RoundState::Open)?;
            open.waiting_on
                .contains(&holder.site.to_string())
                .then(|| open.clone())
        },
    )
    .await;
    let old = leader(&processes).await;
    processes[old as usize - 1].kill();
    holder.reporting.store(true, Ordering::SeqCst);
    let survivors: Vec<SocketAddr> = processes
        .iter()
        .filter(|p| p.child.is_some())
        .map(|p| p.addr)
        .collect();
    // Over once it shows as over, or once a later round exists (one is
    // open at a time): the reporters commit rounds back to back, so by the
    // time a loaded machine looks, it may have left the 16 rounds kept.
    // Whether it committed, once and with nobody excluded, the history
    // below says.
    let ended = eventually(
        Duration::from_secs(60),
        "the round to end after the leader kill",
        || async {
            let rounds = any_rounds(&survivors).await?;
            match rounds.iter().find(|r| r.round_id == open.round_id) {
                Some(r) if r.state() != pb::RoundState::Open => Some(Some(r.clone())),
                Some(_) => None,
                None => rounds
                    .iter()
                    .any(|r| r.round_id > open.round_id)
                    .then_some(None),
            }
        },
    )
    .await;
    if let Some(committed) = &ended {
        assert_eq!(
            committed.state(),
            pb::RoundState::Committed,
            "{committed:?}"
        );
        assert!(
            committed.participant_states.iter().all(|p| !p.excluded),
            "{committed:?}"
        );
    }
    // Once: one transition to committed in the whole history, and round
    // numbers without a gap or a repeat.
    let revision = client(survivors[0])
        .await
        .get_cluster(pb::GetClusterRequest { allow_stale: false })
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    let mut watch = client(survivors[0])
        .await
        .watch(pb::WatchRequest {
            after_revision: 0,
            kinds: vec!["round".into()],
        })
        .await
        .unwrap()
        .into_inner();
    let mut commits = 0;
    let mut opened = Vec::new();
    let mut last = 0;
    while last < revision {
        let Ok(Ok(Some(event))) =
            tokio::time::timeout(Duration::from_secs(2), watch.message()).await
        else {
            break;
        };
        last = event.revision;
        // A round commits with a report (or an exclusion, whose event
        // carries the whole round): counted on the event that committed it.
        let (round_id, committed) = match event.event {
            Some(pb::watch_event::Event::Round(round)) => {
                if round.opened_revision == event.revision {
                    opened.push(round.round_id);
                }
                if round.round_id == open.round_id {
                    assert!(
                        round.participant_states.iter().all(|p| !p.excluded),
                        "round {} excluded a participant: {round:?}",
                        open.round_id
                    );
                }
                let committed =
                    round.state() == pb::RoundState::Committed && round.revision == event.revision;
                (round.round_id, committed)
            }
            Some(pb::watch_event::Event::RoundReport(report)) => {
                (report.round_id, report.state() == pb::RoundState::Committed)
            }
            _ => continue,
        };
        if round_id == open.round_id && committed {
            commits += 1;
        }
    }
    assert_eq!(
        commits, 1,
        "round {} committed {commits} times",
        open.round_id
    );
    assert_eq!(
        opened,
        (1..=opened.len() as u64).collect::<Vec<_>>(),
        "rounds opened once each, in order"
    );

    // The killed replica restarts from its store with the same rounds.
    processes[old as usize - 1].start();
    let restarted = processes[old as usize - 1].addr;
    let seen = std::sync::Mutex::new(String::new());
    eventually(
        Duration::from_secs(30),
        "the restarted replica to have the rounds",
        || async {
            let rounds = rounds(restarted, true).await;
            let now = format!(
                "{:?}",
                rounds.as_ref().map(|r| r
                    .iter()
                    .map(|r| (r.round_id, r.state()))
                    .collect::<Vec<_>>())
            );
            let mut seen = seen.lock().unwrap();
            if *seen != now {
                eprintln!("the restarted replica has rounds {now}");
                *seen = now;
            }
            // Caught up to the held round or past it (the reporters go on
            // committing rounds, which may take it out of the 16 kept),
            // and every round it keeps before the last is committed.
            let rounds = rounds?;
            let (last, before) = rounds.split_last()?;
            (last.round_id >= open.round_id
                && before
                    .iter()
                    .all(|r| r.state() == pb::RoundState::Committed)
                && (last.round_id != open.round_id || last.state() == pb::RoundState::Committed))
                .then_some(())
        },
    )
    .await;
    drop(stand_ins);
}
