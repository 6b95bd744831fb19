//! The outer-round protocol: unit tests, and property tests over random
//! interleavings of reports, deadlines, site downs and returns, and
//! commands proposed again by a later leader.

use std::sync::OnceLock;

use super::*;
use crate::job::JobSpec;
use crate::limits;

const TOPOLOGY: &str = include_str!("../../../../deploy/examples/three-sites-two-continents.toml");
const JOB: &str = include_str!("../../../../deploy/examples/dense-400b.job.toml");
const JOB_ID: &str = "dense";

fn topology() -> Topology {
    Topology::from_toml("three-sites-two-continents.toml", TOPOLOGY).unwrap()
}

/// The bundled 400B job placed as DiLoCo replicas (placed once: the
/// solver takes a while in a debug build). The solver uses two of the three
/// sites; the plan is widened to all three, since the round protocol reads
/// only a plan's mode and replica sites, and three sites make more
/// interleavings than two.
fn placed() -> &'static (JobSpec, crate::placement::Plan) {
    static PLACED: OnceLock<(JobSpec, crate::placement::Plan)> = OnceLock::new();
    PLACED.get_or_init(|| {
        let spec = JobSpec::from_toml("job.toml", JOB).unwrap();
        let mut plan = crate::placement::place(&topology(), &spec).unwrap();
        assert!(
            matches!(plan.mode, crate::placement::CrossSiteMode::Diloco { .. }),
            "{:?}",
            plan.mode
        );
        plan.site_order = topology().sites.iter().map(|s| s.id.clone()).collect();
        (spec, plan)
    })
}

fn sites() -> Vec<String> {
    placed().1.site_order.clone()
}

fn register(site: &str, lease_id: u64) -> Request {
    let site = topology().sites.into_iter().find(|s| s.id == site).unwrap();
    Request::new(Command::RegisterSite {
        site,
        data_address: String::new(),
        at_unix_ms: 0,
        lease_id,
        lease_ttl_ms: 1_000,
    })
}

fn down(site: &str, at: u64) -> Request {
    Request::new(Command::MarkSiteDown {
        site_id: site.into(),
        reason: "lease expired".into(),
        at_unix_ms: at,
        lease_id: None,
    })
}

/// The three sites up and the job placed on them.
fn state() -> ClusterState {
    let mut state = ClusterState::default();
    for (i, site) in topology().sites.iter().enumerate() {
        state.apply(&register(&site.id, i as u64 + 1)).unwrap();
    }
    let (spec, plan) = placed().clone();
    state
        .apply(&Request::new(Command::SubmitJob {
            job_id: JOB_ID.into(),
            spec,
            placement: Placement::Placed {
                plan: Box::new(plan),
            },
        }))
        .unwrap();
    state
}

fn open(
    round: u64,
    participants: &[String],
    catch_up: Vec<CatchUp>,
    fragments: u32,
    at: u64,
) -> Request {
    Request::new(Command::OpenRound {
        job_id: JOB_ID.into(),
        round,
        participants: participants.to_vec(),
        catch_up,
        fragments,
        codec_bits: 4,
        links: Vec::new(),
        inner_steps: 0,
        overlap_steps: 0,
        schedule_inner_steps: 0,
        schedule_overlap_steps: 0,
        deadline_unix_ms: at + 1_000,
        at_unix_ms: at,
    })
}

fn contributed(round: u64, site: &str, fragment: u32) -> Request {
    Request::new(Command::ReportContributed {
        job_id: JOB_ID.into(),
        round,
        site_id: site.into(),
        fragment,
        at_unix_ms: 10,
    })
}

fn applied(round: u64, site: &str, fragment: u32, hash: &str, at: u64) -> Request {
    applied_measured(round, site, fragment, hash, at, 0)
}

fn applied_measured(
    round: u64,
    site: &str,
    fragment: u32,
    hash: &str,
    at: u64,
    inner_step_us: u64,
) -> Request {
    Request::new(Command::ReportApplied {
        job_id: JOB_ID.into(),
        round,
        site_id: site.into(),
        fragment,
        hash: hash.into(),
        at_unix_ms: at,
        inner_step_us,
    })
}

fn exclude(round: u64, site: &str, reason: ExclusionReason, at: u64) -> Request {
    Request::new(Command::ExcludeParticipant {
        job_id: JOB_ID.into(),
        round,
        site_id: site.into(),
        reason,
        message: "test".into(),
        at_unix_ms: at,
    })
}

/// Applies `request`, which must be refused with `field` named; checks that
/// nothing changed.
fn refused(state: &mut ClusterState, request: &Request, field: &str) -> ApplyError {
    let before = state.clone();
    let admitted = state.admit(request);
    let error = state.apply(request).unwrap_err();
    assert_eq!(admitted.unwrap_err(), error, "admission and apply agree");
    assert_eq!(
        *state,
        before,
        "a refused {} changed the state",
        request.command.name()
    );
    let named = match &error {
        ApplyError::InvalidArgument { field, .. }
        | ApplyError::NotFound { field, .. }
        | ApplyError::FailedPrecondition { field, .. }
        | ApplyError::AlreadyExists { field, .. } => field.clone(),
    };
    assert_eq!(named, field, "{error}");
    error
}

#[test]
fn a_round_commits_once_every_participant_applied_the_same_hash() {
    let mut state = state();
    let sites = sites();
    assert_eq!(sites.len(), 3, "{sites:?}");
    state.apply(&open(1, &sites, Vec::new(), 2, 0)).unwrap();
    for site in &sites {
        for f in 0..2 {
            state.apply(&contributed(1, site, f)).unwrap();
        }
    }
    for (i, site) in sites.iter().enumerate() {
        state
            .apply(&applied(1, site, 0, "h0", 20 + i as u64))
            .unwrap();
    }
    let round = state.round(JOB_ID, 1).unwrap();
    assert!(matches!(&round.fragments[0], FragmentState::Committed { hash, .. } if hash == "h0"));
    assert!(round.is_open(), "fragment 1 is still out");
    assert_eq!(
        round.waiting_on(),
        sites.iter().map(String::as_str).collect::<Vec<_>>()
    );
    for site in &sites {
        state.apply(&applied(1, site, 1, "h1", 40)).unwrap();
    }
    let round = state.round(JOB_ID, 1).unwrap();
    let RoundOutcome::Committed {
        at_unix_ms,
        revision,
    } = round.outcome
    else {
        panic!("{:?}", round.outcome);
    };
    assert_eq!((at_unix_ms, revision), (40, state.revision()));
    // Over: nothing new is accepted (the same report again is answered as
    // the first, see below), and the round cannot open again.
    let error = refused(&mut state, &applied(1, &sites[0], 1, "h2", 50), "round");
    assert!(
        error.to_string().contains("committed at revision"),
        "{error}"
    );
    refused(&mut state, &open(1, &sites, Vec::new(), 2, 60), "round");
    state.apply(&open(2, &sites, Vec::new(), 2, 60)).unwrap();
}

#[test]
fn a_hash_disagreement_aborts_the_fragment_and_the_round_naming_who_said_what() {
    let mut state = state();
    let sites = sites();
    state.apply(&open(1, &sites, Vec::new(), 1, 0)).unwrap();
    for site in &sites {
        state.apply(&contributed(1, site, 0)).unwrap();
    }
    state.apply(&applied(1, &sites[0], 0, "aaa", 5)).unwrap();
    state.apply(&applied(1, &sites[1], 0, "bbb", 6)).unwrap();
    let round = state.round(JOB_ID, 1).unwrap();
    let FragmentState::Aborted { disagreement, .. } = &round.fragments[0] else {
        panic!("{:?}", round.fragments);
    };
    assert_eq!(
        disagreement,
        &vec![
            HashGroup {
                hash: "aaa".into(),
                sites: vec![sites[0].clone()]
            },
            HashGroup {
                hash: "bbb".into(),
                sites: vec![sites[1].clone()]
            },
        ]
    );
    let RoundOutcome::Aborted { reason, .. } = &round.outcome else {
        panic!("{:?}", round.outcome);
    };
    assert!(
        reason.contains(&format!("{} reported \"aaa\"", sites[0])),
        "{reason}"
    );
    // The third site's agreeing report cannot revive it.
    refused(&mut state, &applied(1, &sites[2], 0, "aaa", 7), "round");
}

#[test]
fn bad_reports_are_refused_naming_the_field_and_change_nothing() {
    let mut state = state();
    let sites = sites();
    state
        .apply(&open(1, &sites[..2], Vec::new(), 2, 0))
        .unwrap();
    state.apply(&contributed(1, &sites[0], 0)).unwrap();
    state.apply(&applied(1, &sites[0], 0, "h", 1)).unwrap();

    let mut unknown_job = contributed(1, &sites[0], 1);
    if let Command::ReportContributed { job_id, .. } = &mut unknown_job.command {
        *job_id = "nope".into();
    }
    refused(&mut state, &unknown_job, "job_id");
    refused(&mut state, &contributed(7, &sites[0], 1), "round");
    refused(&mut state, &contributed(1, &sites[0], 2), "fragment");
    refused(&mut state, &contributed(1, &sites[2], 0), "site_id");
    refused(&mut state, &contributed(1, &sites[0], 0), "fragment");
    refused(&mut state, &applied(1, &sites[0], 1, "h", 2), "fragment");
    let error = refused(&mut state, &applied(1, &sites[0], 0, "other", 2), "hash");
    assert!(error.to_string().contains("with hash \"h\";"), "{error}");
    refused(&mut state, &applied(1, &sites[0], 0, "h", 2), "hash");
    refused(&mut state, &applied(1, &sites[1], 0, "", 2), "hash");
    // A hash is printable ASCII (admission's bound; it is quoted in errors).
    for hash in ["h\u{7}", "two words", "é"] {
        let error = state.admit(&applied(1, &sites[1], 0, hash, 2)).unwrap_err();
        assert!(
            matches!(&error, ApplyError::InvalidArgument { field, .. } if field == "hash"),
            "{error}"
        );
    }
    // A deadline exclusion before the deadline, or of a site that applied
    // everything open, is refused too.
    refused(
        &mut state,
        &exclude(1, &sites[1], ExclusionReason::DeadlineMissed, 999),
        "reason",
    );
    // Opening: a second open round, a site without replicas, a down site.
    refused(&mut state, &open(2, &sites, Vec::new(), 1, 5), "round");
    let mut fresh = self::state();
    let stranger = vec![sites[0].clone(), "atlantis".to_string()];
    refused(
        &mut fresh,
        &open(1, &stranger, Vec::new(), 1, 0),
        "participants[1]",
    );
    refused(&mut fresh, &open(2, &sites, Vec::new(), 1, 0), "round");
    refused(&mut fresh, &open(1, &sites, Vec::new(), 0, 0), "fragments");
    fresh.apply(&down(&sites[2], 1)).unwrap();
    refused(
        &mut fresh,
        &open(1, &sites, Vec::new(), 1, 2),
        "participants[2]",
    );
    // The bound on fragments is admission's, and apply's too (before it
    // allocates a state per fragment), with the same answer.
    let too_many = open(
        1,
        &sites[..1],
        Vec::new(),
        limits::MAX_ROUND_FRAGMENTS + 1,
        0,
    );
    refused(&mut fresh, &too_many, "fragments");
    let mut early = open(1, &sites[..1], Vec::new(), 1, 0);
    if let Command::OpenRound {
        deadline_unix_ms, ..
    } = &mut early.command
    {
        *deadline_unix_ms = 0;
    }
    refused(&mut fresh, &early, "deadline_unix_ms");
}

#[test]
fn a_site_marked_down_is_excluded_at_once_and_the_round_commits_without_it() {
    let mut state = state();
    let sites = sites();
    state.apply(&open(1, &sites, Vec::new(), 1, 0)).unwrap();
    for site in &sites[..2] {
        state.apply(&contributed(1, site, 0)).unwrap();
        state.apply(&applied(1, site, 0, "h", 5)).unwrap();
    }
    assert_eq!(
        state.round(JOB_ID, 1).unwrap().waiting_on(),
        vec![sites[2].as_str()]
    );
    let applied_down = state.apply(&down(&sites[2], 9)).unwrap();
    // The site change and the round's exclusion and commit, in one revision.
    assert_eq!(
        applied_down
            .events
            .iter()
            .map(|e| e.change.kind())
            .collect::<Vec<_>>(),
        vec!["site", "round"]
    );
    let round = state.round(JOB_ID, 1).unwrap();
    assert!(round.is_committed(), "{:?}", round.outcome);
    let excluded = round
        .participant(&sites[2])
        .unwrap()
        .excluded
        .as_ref()
        .unwrap();
    assert_eq!(
        (excluded.reason, excluded.at_unix_ms),
        (ExclusionReason::SiteDown, 9)
    );
    refused(&mut state, &contributed(1, &sites[2], 0), "round");
}

#[test]
fn a_participant_past_the_deadline_is_excluded_and_the_others_commit() {
    let mut state = state();
    let sites = sites();
    state.apply(&open(1, &sites, Vec::new(), 1, 0)).unwrap();
    for site in &sites[1..] {
        state.apply(&contributed(1, site, 0)).unwrap();
        state.apply(&applied(1, site, 0, "h", 5)).unwrap();
    }
    state
        .apply(&exclude(
            1,
            &sites[0],
            ExclusionReason::DeadlineMissed,
            1_000,
        ))
        .unwrap();
    assert!(state.round(JOB_ID, 1).unwrap().is_committed());
    // Its later report is refused; an excluded site is never waited for.
    refused(&mut state, &contributed(1, &sites[0], 0), "round");
}

#[test]
fn a_returning_site_catches_up_from_a_site_that_applied_the_last_committed_round() {
    let mut state = state();
    let sites = sites();
    state.apply(&down(&sites[0], 1)).unwrap();
    assert!(
        state.catch_up_for(JOB_ID, &sites).is_empty(),
        "nothing committed yet"
    );
    state
        .apply(&open(1, &sites[1..], Vec::new(), 1, 2))
        .unwrap();
    for site in &sites[1..] {
        state.apply(&contributed(1, site, 0)).unwrap();
        state.apply(&applied(1, site, 0, "h", 5)).unwrap();
    }
    state.apply(&register(&sites[0], 77)).unwrap();
    let catch_up = state.catch_up_for(JOB_ID, &sites);
    assert_eq!(
        catch_up,
        vec![CatchUp {
            site: sites[0].clone(),
            from_round: 1,
            from_site: sites[1].clone(),
        }]
    );
    let bad = |from_round, from_site: &str| {
        vec![CatchUp {
            site: sites[0].clone(),
            from_round,
            from_site: from_site.into(),
        }]
    };
    let mut s = state.clone();
    refused(
        &mut s,
        &open(2, &sites, bad(5, &sites[1]), 1, 6),
        "catch_up[0].from_round",
    );
    refused(
        &mut s,
        &open(2, &sites, bad(1, &sites[0]), 1, 6),
        "catch_up[0].from_site",
    );
    state.apply(&open(2, &sites, catch_up, 1, 6)).unwrap();
    let round = state.round(JOB_ID, 2).unwrap();
    assert_eq!(
        round
            .participant(&sites[0])
            .unwrap()
            .catch_up
            .as_ref()
            .unwrap()
            .from_round,
        1
    );
}

#[test]
fn only_the_last_rounds_are_kept_and_a_cancel_aborts_the_open_one() {
    let mut state = state();
    let sites = sites();
    let total = ROUNDS_KEPT_PER_JOB as u64 + 3;
    for k in 1..=total {
        state
            .apply(&open(k, &sites[..1], Vec::new(), 1, k * 10))
            .unwrap();
        state.apply(&contributed(k, &sites[0], 0)).unwrap();
        let done = state
            .apply(&applied(k, &sites[0], 0, "h", k * 10 + 1))
            .unwrap();
        assert_eq!(done.events.len(), 1);
    }
    let kept: Vec<u64> = state.rounds(JOB_ID).map(|r| r.round).collect();
    assert_eq!(kept, (4..=total).collect::<Vec<_>>());
    state
        .apply(&open(total + 1, &sites[..1], Vec::new(), 1, 999))
        .unwrap();
    state
        .apply(&Request::new(Command::CancelJob {
            job_id: JOB_ID.into(),
            at_unix_ms: 1_000,
        }))
        .unwrap();
    let last = state.latest_round(JOB_ID).unwrap();
    assert!(
        matches!(&last.outcome, RoundOutcome::Aborted { reason, .. } if reason.contains("cancelled"))
    );
    // The state, rebuilt from its persisted parts or its snapshot, is the same.
    let rebuilt = ClusterState::from_parts(
        state.revision(),
        state.entities(),
        state.events_after(0).unwrap(),
        DEFAULT_HISTORY_LIMIT,
    );
    assert_eq!(rebuilt, state);
    let json = serde_json::to_vec(&state).unwrap();
    assert_eq!(
        serde_json::from_slice::<ClusterState>(&json).unwrap(),
        state
    );
}

fn abort(round: u64, at: u64) -> Request {
    Request::new(Command::AbortRound {
        job_id: JOB_ID.into(),
        round,
        reason: "test".into(),
        at_unix_ms: at,
    })
}

/// The bundled job placed on `sites` only, or not placed.
fn set_placement(sites: Option<&[String]>, at_unix_ms: u64) -> Request {
    let placement = match sites {
        Some(sites) => {
            let mut plan = placed().1.clone();
            plan.site_order = sites.to_vec();
            Placement::Placed {
                plan: Box::new(plan),
            }
        }
        None => Placement::Pending,
    };
    Request::new(Command::SetPlacement {
        job_id: JOB_ID.into(),
        placement,
        at_unix_ms,
        sites_as_of: None,
    })
}

fn already_exists(state: &mut ClusterState, request: &Request, field: &str) {
    let error = refused(state, request, field);
    assert!(
        matches!(error, ApplyError::AlreadyExists { .. }),
        "the same report again must be answered as the first: {error}"
    );
}

#[test]
fn a_report_sent_again_after_it_ended_the_round_is_answered_as_the_first() {
    let mut state = state();
    let sites = sites();
    state
        .apply(&open(1, &sites[..2], Vec::new(), 1, 0))
        .unwrap();
    for (i, site) in sites[..2].iter().enumerate() {
        state.apply(&contributed(1, site, 0)).unwrap();
        state
            .apply(&applied(1, site, 0, "h", 5 + i as u64))
            .unwrap();
    }
    assert!(state.round(JOB_ID, 1).unwrap().is_committed());
    // The committing report's reply was lost; the site sends it again.
    already_exists(&mut state, &applied(1, &sites[1], 0, "h", 9), "hash");
    already_exists(&mut state, &contributed(1, &sites[1], 0), "fragment");
    // Another hash is still refused, and stores nothing.
    let error = refused(&mut state, &applied(1, &sites[1], 0, "other", 9), "round");
    assert!(
        matches!(error, ApplyError::FailedPrecondition { .. }),
        "{error}"
    );

    // A site excluded after it reported: its reports again, the same answer.
    state
        .apply(&open(2, &sites[..2], Vec::new(), 2, 20))
        .unwrap();
    state.apply(&contributed(2, &sites[0], 0)).unwrap();
    state.apply(&applied(2, &sites[0], 0, "h", 21)).unwrap();
    state.apply(&down(&sites[0], 22)).unwrap();
    already_exists(&mut state, &applied(2, &sites[0], 0, "h", 23), "hash");
    already_exists(&mut state, &contributed(2, &sites[0], 0), "fragment");
    refused(&mut state, &contributed(2, &sites[0], 1), "site_id");
    refused(
        &mut state,
        &applied(2, &sites[0], 0, "other", 23),
        "site_id",
    );
}

#[test]
fn the_last_committed_round_stays_kept_for_catch_up_however_many_rounds_abort_after_it() {
    let mut state = state();
    let sites = sites();
    state
        .apply(&open(1, &sites[..2], Vec::new(), 1, 0))
        .unwrap();
    for site in &sites[..2] {
        state.apply(&contributed(1, site, 0)).unwrap();
        state.apply(&applied(1, site, 0, "h", 5)).unwrap();
    }
    let last = 1 + ROUNDS_KEPT_PER_JOB as u64;
    for k in 2..=last {
        state
            .apply(&open(k, &sites[..2], Vec::new(), 1, k * 10))
            .unwrap();
        state.apply(&abort(k, k * 10 + 1)).unwrap();
    }
    assert!(state.rounds(JOB_ID).count() <= ROUNDS_KEPT_PER_JOB);
    let catch_up = state.catch_up_for(JOB_ID, &sites);
    assert_eq!(
        catch_up,
        vec![CatchUp {
            site: sites[2].clone(),
            from_round: 1,
            from_site: sites[0].clone(),
        }]
    );
    state
        .apply(&open(last + 1, &sites, catch_up, 1, 999))
        .unwrap();
    assert!(state.round(JOB_ID, 1).is_some(), "round 1 is still kept");
    assert_eq!(state.rounds(JOB_ID).count(), ROUNDS_KEPT_PER_JOB);
}

#[test]
fn a_job_submitted_again_after_its_cancel_does_not_inherit_its_rounds() {
    let mut state = state();
    let sites = sites();
    state
        .apply(&open(1, &sites[..1], Vec::new(), 1, 0))
        .unwrap();
    state.apply(&contributed(1, &sites[0], 0)).unwrap();
    state.apply(&applied(1, &sites[0], 0, "h", 5)).unwrap();
    state
        .apply(&open(2, &sites[..1], Vec::new(), 1, 50))
        .unwrap();
    state
        .apply(&Request::new(Command::CancelJob {
            job_id: JOB_ID.into(),
            at_unix_ms: 0,
        }))
        .unwrap();
    // Aborted by a cancel logged before commands carried a time: it ended
    // at its opening (0 would read as still open).
    assert_eq!(state.round(JOB_ID, 2).unwrap().ended_at_unix_ms(), Some(50));
    let (spec, plan) = placed().clone();
    let resubmitted = state
        .apply(&Request::new(Command::SubmitJob {
            job_id: JOB_ID.into(),
            spec,
            placement: Placement::Placed {
                plan: Box::new(plan),
            },
        }))
        .unwrap();
    let removed: Vec<u64> = resubmitted
        .events
        .iter()
        .filter_map(|e| match &e.change {
            Change::RoundRemoved { round, .. } => Some(*round),
            _ => None,
        })
        .collect();
    assert_eq!(removed, vec![1, 2]);
    assert_eq!(state.rounds(JOB_ID).count(), 0);
    assert!(state.catch_up_for(JOB_ID, &sites).is_empty());
    state.apply(&open(1, &sites, Vec::new(), 1, 60)).unwrap();
    let rebuilt = ClusterState::from_parts(
        state.revision(),
        state.entities(),
        state.events_after(0).unwrap(),
        DEFAULT_HISTORY_LIMIT,
    );
    assert_eq!(rebuilt, state);
}

#[test]
fn a_re_placement_applies_to_the_open_round_in_the_same_revision() {
    let mut state = state();
    let sites = sites();
    state.apply(&open(1, &sites, Vec::new(), 1, 0)).unwrap();
    for site in &sites[..2] {
        state.apply(&contributed(1, site, 0)).unwrap();
        state.apply(&applied(1, site, 0, "h", 5)).unwrap();
    }
    state.apply(&contributed(1, &sites[2], 0)).unwrap();
    // Re-placed without the third site: it no longer counts, at once, and
    // the round commits on the other two.
    let replaced = state.apply(&set_placement(Some(&sites[..2]), 30)).unwrap();
    assert_eq!(
        replaced
            .events
            .iter()
            .map(|e| e.change.kind())
            .collect::<Vec<_>>(),
        vec!["job", "round"]
    );
    let round = state.round(JOB_ID, 1).unwrap();
    assert!(round.is_committed(), "{:?}", round.outcome);
    let excluded = round.participant(&sites[2]).unwrap().excluded.clone();
    // At the command's time, not the round's opening.
    assert_eq!(
        excluded.map(|e| (e.reason, e.at_unix_ms)),
        Some((ExclusionReason::LeftPlan, 30))
    );
    assert_eq!(round.ended_at_unix_ms(), Some(30));
    refused(&mut state, &applied(1, &sites[2], 0, "h", 9), "round");

    // No longer placed: the open round is aborted in the same revision and
    // cannot commit.
    state
        .apply(&open(2, &sites[..2], Vec::new(), 1, 20))
        .unwrap();
    for site in &sites[..2] {
        state.apply(&contributed(2, site, 0)).unwrap();
    }
    state.apply(&applied(2, &sites[0], 0, "h", 21)).unwrap();
    state.apply(&set_placement(None, 40)).unwrap();
    let round = state.round(JOB_ID, 2).unwrap();
    assert_eq!(round.ended_at_unix_ms(), Some(40));
    assert!(
        matches!(&round.outcome, RoundOutcome::Aborted { reason, .. } if reason.contains("DiLoCo")),
        "{:?}",
        round.outcome
    );
    refused(&mut state, &applied(2, &sites[1], 0, "h", 22), "round");
}

/// `SetPlacement` and `CancelJob` carry their proposer's time, which is
/// what the rounds they end record (never before the round opened); a
/// command logged before they carried one (0) ends the round at its
/// opening.
#[test]
fn a_cancel_or_re_placement_ends_the_open_round_at_the_commands_time() {
    let sites = sites();
    let cancel = |at_unix_ms| {
        Request::new(Command::CancelJob {
            job_id: JOB_ID.into(),
            at_unix_ms,
        })
    };
    for (at, ended) in [(700, 700), (0, 100), (50, 100)] {
        let mut state = state();
        state.apply(&open(1, &sites, Vec::new(), 1, 100)).unwrap();
        state.apply(&cancel(at)).unwrap();
        let round = state.round(JOB_ID, 1).unwrap();
        assert_eq!(round.ended_at_unix_ms(), Some(ended), "cancel at {at}");

        let mut state = self::state();
        state.apply(&open(1, &sites, Vec::new(), 1, 100)).unwrap();
        state.apply(&set_placement(Some(&sites[..2]), at)).unwrap();
        let round = state.round(JOB_ID, 1).unwrap();
        let exclusion = round.participant(&sites[2]).unwrap().excluded.clone();
        assert_eq!(
            exclusion.map(|e| e.at_unix_ms),
            Some(ended),
            "placed at {at}"
        );
    }
}

/// A report's change is O(1) in participants × fragments: with 4096
/// fragments it is as small as with one, where the round's record is tens
/// of kilobytes (before, every report carried the record).
#[test]
fn a_reports_change_does_not_grow_with_the_rounds_fragments() {
    let sites = sites();
    let mut largest = Vec::new();
    for fragments in [1, limits::MAX_ROUND_FRAGMENTS] {
        let mut state = state();
        state
            .apply(&open(1, &sites, Vec::new(), fragments, 0))
            .unwrap();
        let mut bytes = 0;
        for site in &sites {
            let mut ends = vec![0, fragments - 1];
            ends.dedup();
            for f in ends {
                for request in [contributed(1, site, f), applied(1, site, f, "h", 5)] {
                    for event in state.apply(&request).unwrap().events {
                        assert!(matches!(event.change, Change::RoundReport { .. }));
                        bytes = bytes.max(serde_json::to_vec(&event.change).unwrap().len());
                    }
                }
            }
        }
        let record = serde_json::to_vec(state.round(JOB_ID, 1).unwrap()).unwrap();
        largest.push((bytes, record.len()));
    }
    let [(small, _), (large, record)] = largest[..] else {
        unreachable!()
    };
    assert!(record > 50_000, "{record}");
    // The fragment's number has more digits; nothing else grows.
    assert!(large <= small + 8, "{small} -> {large} bytes per report");
    assert!(large < 400, "{large}");
}

/// A round carries the codec of each link as the job's sync schedule has
/// it, its width their widest; anything else is refused, naming the field.
#[test]
fn a_round_carries_the_schedules_codec_per_link_checked() {
    let sites = sites();
    let sync = placed().1.sync.as_ref().unwrap();
    let links = LinkCodec::of_schedule(sync);
    assert!(!links.is_empty());
    let widest = sync.bits();
    let with = |links: Vec<LinkCodec>, bits: u32| {
        let mut request = open(1, &sites, Vec::new(), 1, 0);
        if let Command::OpenRound {
            links: l,
            codec_bits,
            ..
        } = &mut request.command
        {
            *l = links;
            *codec_bits = bits;
        }
        request
    };
    let mut state = state();
    state.apply(&with(links.clone(), widest)).unwrap();
    assert_eq!(state.round(JOB_ID, 1).unwrap().links, links);

    let changed = |f: &dyn Fn(&mut LinkCodec)| {
        let mut links = links.clone();
        f(&mut links[0]);
        links
    };
    let mut twice = links.clone();
    twice.push(links[0].clone());
    let cases = [
        (links.clone(), widest + 1, "codec_bits"),
        (twice, widest, &*format!("links[{}].between", links.len())),
        (
            changed(&|l| l.between[1] = "atlantis".into()),
            widest,
            "links[0].between",
        ),
        (
            changed(&|l| l.between[1] = l.between[0].clone()),
            widest,
            "links[0].between",
        ),
        (changed(&|l| l.bits = 33), widest, "links[0].bits"),
        (
            changed(&|l| l.block_size = 0),
            widest,
            "links[0].block_size",
        ),
        (changed(&|l| l.zstd = !l.zstd), widest, "links"),
    ];
    for (links, bits, field) in cases {
        refused(&mut self::state(), &with(links, bits), field);
    }
}

mod proptests;

#[test]
fn a_sites_measured_inner_step_is_the_slowest_it_reported_and_is_bounded() {
    let mut state = state();
    let sites = sites();
    state.apply(&open(1, &sites, Vec::new(), 2, 0)).unwrap();
    for f in 0..2 {
        state.apply(&contributed(1, &sites[0], f)).unwrap();
    }
    // A bound is admission's (see `admission`): never proposed.
    let error = state
        .admit(&applied_measured(
            1,
            &sites[0],
            0,
            "h0",
            10,
            limits::MAX_INNER_STEP_US + 1,
        ))
        .unwrap_err();
    assert!(
        matches!(&error, ApplyError::InvalidArgument { field, .. } if field == "inner_step_us"),
        "{error}"
    );
    state
        .apply(&applied_measured(1, &sites[0], 0, "h0", 10, 250_000))
        .unwrap();
    state
        .apply(&applied_measured(1, &sites[0], 1, "h1", 11, 200_000))
        .unwrap();
    let round = state.round(JOB_ID, 1).unwrap();
    let measured: Vec<u64> = round.participants.iter().map(|p| p.inner_step_us).collect();
    assert_eq!(measured, vec![250_000, 0, 0]);
    // Folding the reports in another order gives the same record.
    let report = |fragment: u32, inner_step_us: u64| RoundReport {
        job_id: JOB_ID.into(),
        round: 1,
        site: sites[0].clone(),
        fragment,
        applied_hash: Some(format!("h{fragment}")),
        inner_step_us,
        fragment_state: None,
        outcome: None,
        revision: 0,
    };
    let reports = [report(1, 200_000), report(0, 250_000)];
    let mut folded = round.clone();
    folded.participants[0].inner_step_us = 0;
    for report in reports.iter().rev() {
        folded.apply_report(report);
    }
    assert_eq!(folded.participants[0].inner_step_us, 250_000);
    // A participant stored before the field existed loads as not measured.
    let old: Participant = serde_json::from_str(r#"{"site":"north"}"#).unwrap();
    assert_eq!(old.inner_step_us, 0);
    assert!(
        !serde_json::to_string(&old)
            .unwrap()
            .contains("inner_step_us")
    );
}
