//! A returning site's catch-up in its round: the state after the round it
//! missed, fetched from the agent of a site that applied it, and, when
//! that fails for good, the round left at once (`LeaveRound`) so the
//! others need not wait for its deadline.

use std::time::Duration;

use longhaul_proto::v1 as pb;
use tokio::sync::watch;

use super::{MIN_EXCHANGE_TIME, RETRY_PAUSE, Shared, now_unix_ms, takes_part};
use crate::agent::backoff::Backoff;
use crate::catchup;
use crate::coordinator::{Coordinators, is_transient};
use crate::trainer::TrainerHub;

/// A catch-up that failed: why, and whether the site should leave the
/// round (it is still open and the site still in it).
pub(super) struct Failed {
    pub(super) why: String,
    pub(super) leave: bool,
}

/// Failed attempts at a catch-up stop once this long, or half the round's
/// time from opening to deadline if less, has passed since the first
/// began (an attempt under way is never cut short: a large state may take
/// longer to move): the site then sits the round out and says so
/// ([`leave_round`]), so the others need not wait for its deadline.
const CATCH_UP_PATIENCE: Duration = Duration::from_secs(60);

/// Fetches this site's catch-up state (after round `after`, from the agent
/// of `from`) for the round `rx` follows, trying again while the round is
/// open, this site not excluded from it and [`CATCH_UP_PATIENCE`] not
/// spent, and records what came of it for the trainers.
pub(super) async fn fetch_state(
    shared: &Shared,
    mut rx: watch::Receiver<pb::OuterRound>,
    hub: &TrainerHub,
    after: u64,
    from: &str,
) -> Result<(), Failed> {
    let site = shared.settings.site_id.as_str();
    let (job, round_id) = {
        let round = rx.borrow();
        (round.job_id.clone(), round.round_id)
    };
    let fail = |why: String, leave: bool| {
        tracing::warn!(job, round = round_id, from_site = from, after_round = after, reason = %why, "catch-up failed: the trainers sit this round out");
        metrics::counter!("longhaul_agent_catch_ups_failed_total").increment(1);
        hub.record_fetch(&job, round_id, after, from, Err(why.clone()));
        Err(Failed { why, leave })
    };
    let Some(client) = &shared.settings.catch_up else {
        return fail("this agent fetches no states".to_string(), true);
    };
    // The assignment comes on a stream of its own and may follow the
    // round: not a reason to leave (the round's deadline stands).
    let Some(elements) = hub.state_elements(&job) else {
        return fail(format!("{job}'s sync schedule is not known here"), false);
    };
    let first = std::time::Instant::now();
    let patience = {
        let round = rx.borrow();
        let span = round
            .deadline_unix_ms
            .saturating_sub(round.opened_at_unix_ms);
        CATCH_UP_PATIENCE.min(Duration::from_millis(span / 2))
    };
    let request = longhaul_exchange::catchup::CatchUpRequest {
        job: job.clone(),
        site: site.to_string(),
        round: after,
        elements,
    };
    let mut attempts = 0u32;
    let mut last = String::new();
    loop {
        let round = rx.borrow_and_update().clone();
        let why = if round.state != pb::RoundState::Open as i32 {
            Some("the round ended before the state came")
        } else if !takes_part(&round, site) {
            Some("this site was excluded from the round")
        } else {
            None
        };
        if let Some(why) = why {
            return fail(
                if attempts == 0 {
                    why.to_string()
                } else {
                    format!("{why}; {attempts} tries, the last: {last}")
                },
                false,
            );
        }
        if attempts > 0 && first.elapsed() >= patience {
            return fail(
                format!(
                    "no state from {from} after {attempts} tries in {} s, the last: {last}",
                    first.elapsed().as_secs()
                ),
                true,
            );
        }
        let addr = shared.peers.borrow().get(from).copied();
        let left = Duration::from_millis(round.deadline_unix_ms.saturating_sub(now_unix_ms()));
        let started = std::time::Instant::now();
        let outcome = match addr {
            Some(addr) => catchup::fetch(
                &client.endpoint,
                &client.tls,
                from,
                addr,
                &request,
                left.max(MIN_EXCHANGE_TIME),
            )
            .await
            .map_err(|error| error.to_string()),
            None => {
                shared.refresh_peers.notify_one();
                Err(format!("no address of site {from:?} is known yet"))
            }
        };
        attempts += 1;
        match outcome {
            Ok(values) => {
                tracing::info!(
                    job,
                    round = round_id,
                    from_site = from,
                    after_round = after,
                    elements,
                    ms = started.elapsed().as_millis() as u64,
                    "catch-up state fetched"
                );
                metrics::counter!("longhaul_agent_catch_ups_total").increment(1);
                hub.record_fetch(&job, round_id, after, from, Ok(values));
                return Ok(());
            }
            Err(why) => {
                tracing::debug!(job, round = round_id, from_site = from, attempt = attempts, reason = %why, "catch-up fetch failed; trying again while the round is open");
                last = why;
            }
        }
        if let Ok(Err(_)) = tokio::time::timeout(RETRY_PAUSE, rx.changed()).await {
            return fail("the round driver stopped".to_string(), false);
        }
    }
}

/// Tells the coordinator this site sits the round `rx` follows out
/// (`LeaveRound`), so the others go on without it now rather than at the
/// deadline; tried again on a transient error for at most a minute, and
/// not at all once the round is over or this site out of it.
pub(super) async fn leave_round(
    shared: &Shared,
    rx: &watch::Receiver<pb::OuterRound>,
    mut coordinators: Coordinators,
    why: &str,
) {
    let site = shared.settings.site_id.as_str();
    let (job, round_id) = {
        let round = rx.borrow();
        (round.job_id.clone(), round.round_id)
    };
    let request = pb::LeaveRoundRequest {
        site_id: site.to_string(),
        job_id: job.clone(),
        round: round_id,
        // Within the coordinator's bound on the reason (1 KiB).
        reason: format!("its catch-up failed: {why}")
            .chars()
            .take(250)
            .collect(),
    };
    let mut backoff = Backoff::new();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        {
            let round = rx.borrow();
            if round.state != pb::RoundState::Open as i32 || !takes_part(&round, site) {
                return;
            }
        }
        let mut call = tonic::Request::new(request.clone());
        call.set_timeout(shared.settings.call_timeout);
        match coordinators.client().leave_round(call).await {
            Ok(_) => {
                tracing::info!(
                    job,
                    round = round_id,
                    "sat the round out: the others go on without this site"
                );
                metrics::counter!("longhaul_agent_rounds_sat_out_total").increment(1);
                return;
            }
            Err(status) if is_transient(&status) && tokio::time::Instant::now() < give_up => {
                coordinators.rotate();
                tokio::time::sleep(backoff.next_pause()).await;
            }
            Err(status) => {
                tracing::warn!(job, round = round_id, code = ?status.code(), message = status.message(), "leaving the round refused");
                return;
            }
        }
    }
}
