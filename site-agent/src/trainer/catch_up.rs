//! Catch-up through the trainer API (`PublishState`, `CatchUp`).
//!
//! A site that did not take part in the job's last committed round is
//! named by the next round as catching up after that round from a site
//! that did (`catch_up_from_round`, `catch_up_from_site`). The state is
//! what the trainers hold between rounds: the anchor, then the outer
//! optimizer's momentum, [`STATE_COPIES`] × the job's parameters f32
//! values; the agent moves it without reading it.
//!
//! - **At the site caught up from**: the hub lets the named site fetch the
//!   state after that round ([`StateStore::allow`], on each sight of the
//!   open round) and asks its trainers for it (`serve_after_round` in the
//!   schedule, until it is published); a trainer publishes it before its
//!   first submit of the round, when its anchor is still the one after
//!   the round caught up from (nothing of the open round is applied yet).
//! - **At the site catching up**: the round driver fetches the state from
//!   the other agent ([`crate::catchup::fetch`]) and records it here
//!   ([`TrainerHub::record_fetch`]); a trainer's `CatchUp` waits for it
//!   and gets it in shared memory, or the reason there is none. A trainer
//!   without it sits the round out: the coordinator excludes the site at
//!   the deadline, and the next round names it as catching up again.
//!
//! The hub keeps one fetched state per job (the latest catch-up's), and
//! the store one published state per job.

use std::sync::Arc;
use std::time::Duration;

use longhaul_proto::v1 as pb;

use super::{MAX_COLLECT_WAIT, TrainerError, TrainerHub, Waiting, lock, shm};

/// The state is this many times the job's parameters: the anchor, then
/// the outer optimizer's momentum.
pub const STATE_COPIES: u64 = 2;

/// The state fetched for a catch-up, or why there is none.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The round caught up after.
    round: u64,
    /// The open round the fetch was for: a failure answers only a catch-up
    /// of that round (or a later one's while none newer is known), never a
    /// later round's, which fetches again.
    in_round: u64,
    from_site: String,
    outcome: Result<Arc<Vec<f32>>, String>,
}

/// The round and site `site` catches up after and from in the open
/// `round`, if it does.
pub(crate) fn catching_up<'a>(round: &'a pb::OuterRound, site: &str) -> Option<(u64, &'a str)> {
    round
        .participant_states
        .iter()
        .find(|p| p.site_id == site && p.catch_up_from_round != 0)
        .map(|p| (p.catch_up_from_round, p.catch_up_from_site.as_str()))
}

/// The sites that catch up from `site` in `round`, with the round they
/// catch up after.
pub(crate) fn served_by<'a>(
    round: &'a pb::OuterRound,
    site: &'a str,
) -> impl Iterator<Item = (&'a str, u64)> + 'a {
    round
        .participant_states
        .iter()
        .filter(move |p| p.catch_up_from_round != 0 && p.catch_up_from_site == site)
        .map(|p| (p.site_id.as_str(), p.catch_up_from_round))
}

/// The round after which `site` serves a catch-up in `round`, if it does
/// (every catch-up of a round is after the same committed round).
pub(crate) fn serving(round: &pb::OuterRound, site: &str) -> Option<u64> {
    served_by(round, site).map(|(_, after)| after).next()
}

impl TrainerHub {
    /// The size of the job's state, if its schedule is known here.
    pub fn state_elements(&self, job: &str) -> Option<u64> {
        let state = lock(&self.state);
        let sync = state.jobs.get(job)?.sync.as_ref()?;
        let parameters: u64 = sync.schedule.iter().map(|f| f.parameters).sum();
        parameters.checked_mul(STATE_COPIES)
    }

    /// Whether the state for this site's catch-up after `round` of `job`
    /// was fetched already.
    pub fn fetched(&self, job: &str, round: u64) -> bool {
        lock(&self.state)
            .fetched
            .get(job)
            .is_some_and(|f| f.round == round && f.outcome.is_ok())
    }

    /// What the round driver's fetch, for the open round `in_round`, of the
    /// state after `round` of `job` from `from_site` came to; the trainers
    /// waiting in `CatchUp` get it.
    pub fn record_fetch(
        &self,
        job: &str,
        in_round: u64,
        round: u64,
        from_site: &str,
        outcome: Result<Vec<f32>, String>,
    ) {
        let mut state = lock(&self.state);
        if !state.jobs.contains_key(job) {
            return;
        }
        let fetched = Fetched {
            round,
            in_round,
            from_site: from_site.to_string(),
            outcome: outcome.map(Arc::new),
        };
        // A failure does not replace the state an earlier try fetched.
        let keep = state
            .fetched
            .get(job)
            .is_some_and(|f| f.round == round && f.outcome.is_ok() && fetched.outcome.is_err());
        if !keep {
            state.fetched.insert(job.to_string(), fetched);
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// The session's job, touched, and the size its state must have.
    fn state_job(&self, session: &str) -> Result<(String, u64), TrainerError> {
        let job = self.session_job(session)?;
        let elements = self
            .state_elements(&job)
            .ok_or_else(|| TrainerError::Invalid {
                field: "session",
                message: format!("{job} has no sync schedule here"),
            })?;
        Ok((job, elements))
    }

    /// A state is f32 (a bf16 copy of the anchor would not be the
    /// source's anchor) of exactly the job's state size.
    fn check_state_tensor(
        field: &'static str,
        tensor: &shm::TensorRef,
        elements: u64,
    ) -> Result<(), TrainerError> {
        let (dtype_field, elements_field) = match field {
            "tensor" => ("tensor.dtype", "tensor.elements"),
            _ => ("into.dtype", "into.elements"),
        };
        if tensor.dtype != shm::Dtype::F32 {
            return Err(TrainerError::Invalid {
                field: dtype_field,
                message: format!(
                    "is {:?}; a state is F32 (the anchor and the momentum exactly as the trainer holds them)",
                    tensor.dtype
                ),
            });
        }
        if tensor.elements == elements {
            return Ok(());
        }
        Err(TrainerError::Invalid {
            field: elements_field,
            message: format!(
                "is {}; a state is {elements} values ({STATE_COPIES} x the job's parameters: the anchor, then the outer momentum)",
                tensor.elements
            ),
        })
    }

    /// Reads the state after `request.round` from shared memory (a file of
    /// user `caller`) and keeps it for the site that catches up from this
    /// one; refused unless the job's open round asks for it.
    pub fn publish_state(
        &self,
        request: &pb::TrainerPublishStateRequest,
        caller: u32,
    ) -> Result<u64, TrainerError> {
        let tensor = shm::TensorRef::from_wire(request.tensor.as_ref(), "tensor")?;
        let (job, elements) = self.state_job(&request.session)?;
        Self::check_state_tensor("tensor", &tensor, elements)?;
        let (asked, applied) = {
            let state = lock(&self.state);
            let open = state
                .rounds
                .get(&job)
                .filter(|r| r.state == pb::RoundState::Open as i32);
            let applied = open.and_then(|r| {
                state
                    .results
                    .range((job.clone(), r.round_id, 0)..=(job.clone(), r.round_id, u32::MAX))
                    .find(|(_, result)| matches!(result, super::FragmentResult::Applied { .. }))
                    .map(|((_, round, fragment), _)| (*round, *fragment))
            });
            (open.and_then(|r| serving(r, &self.site)), applied)
        };
        if let (Some(after), Some((round, fragment))) = (asked, applied)
            && after == request.round
        {
            // A trainer may have applied it: its anchor is no longer the
            // one after the round asked for.
            return Err(TrainerError::Over {
                field: "round",
                message: format!(
                    "fragment {fragment} of round {round} of {job} is applied here already: the state after round {after} is no longer what the trainers hold"
                ),
            });
        }
        if asked != Some(request.round) {
            return Err(TrainerError::NotFound {
                field: "round",
                message: match asked {
                    Some(after) => format!(
                        "is {}; the open round of {job} asks this site for the state after round {after}",
                        request.round
                    ),
                    None => format!(
                        "no open round of {job} asks this site for its state (after round {})",
                        request.round
                    ),
                },
            });
        }
        let values = self.shm.read(&tensor, "tensor", caller)?;
        self.states.publish(&job, request.round, values);
        tracing::info!(
            job,
            round = request.round,
            elements,
            "trainer state published for a catch-up"
        );
        metrics::counter!("longhaul_trainer_states_published_total").increment(1);
        self.changed.notify_waiters();
        Ok(elements)
    }

    /// Waits up to the request's timeout for the state of this site's
    /// catch-up after `request.round` and writes it into the request's
    /// tensor (a file of user `caller`).
    pub async fn catch_up(
        &self,
        request: &pb::TrainerCatchUpRequest,
        caller: u32,
    ) -> Result<pb::TrainerCatchUpResponse, TrainerError> {
        let into = shm::TensorRef::from_wire(request.into.as_ref(), "into")?;
        let wait = Duration::from_millis(request.timeout_ms);
        if wait > MAX_COLLECT_WAIT {
            return Err(TrainerError::Invalid {
                field: "timeout_ms",
                message: format!(
                    "is {}; it must be at most {}",
                    request.timeout_ms,
                    MAX_COLLECT_WAIT.as_millis()
                ),
            });
        }
        let (job, elements) = self.state_job(&request.session)?;
        Self::check_state_tensor("into", &into, elements)?;
        {
            let state = lock(&self.state);
            let asked = state
                .rounds
                .get(&job)
                .filter(|r| r.state == pb::RoundState::Open as i32)
                .and_then(|r| catching_up(r, &self.site))
                .map(|(after, _)| after);
            let fetched = state.fetched.get(&job).map(|f| f.round);
            if asked != Some(request.round) && fetched != Some(request.round) {
                return Err(TrainerError::NotFound {
                    field: "round",
                    message: match asked {
                        Some(after) => format!(
                            "is {}; this site catches up after round {after} of {job}",
                            request.round
                        ),
                        None => format!(
                            "no round of {job} names this site as catching up after round {}",
                            request.round
                        ),
                    },
                });
            }
        }
        // Counted as waiting (not silent) until `_waiting` drops.
        if let Some(session) = lock(&self.state).sessions.get_mut(&request.session) {
            session.collecting += 1;
        }
        let _waiting = Waiting {
            hub: self,
            session: &request.session,
        };
        let give_up = tokio::time::Instant::now() + wait;
        let fetched = loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let found = {
                let state = lock(&self.state);
                let latest = state.rounds.get(&job).map_or(0, |r| r.round_id);
                state
                    .fetched
                    .get(&job)
                    .filter(|f| {
                        f.round == request.round && (f.outcome.is_ok() || f.in_round >= latest)
                    })
                    .cloned()
            };
            if let Some(fetched) = found {
                break fetched;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(give_up) => {
                    return Err(TrainerError::Timeout {
                        message: format!("the state after round {} of {job} is still being fetched", request.round),
                    });
                }
            }
        };
        match fetched.outcome {
            Ok(values) => {
                if values.len() as u64 != elements {
                    return Err(TrainerError::Invalid {
                        field: "into.elements",
                        message: format!(
                            "is {elements}; the state fetched holds {} values",
                            values.len()
                        ),
                    });
                }
                let shm = self.shm.clone();
                tokio::task::spawn_blocking(move || shm.write(&into, &values, "into", caller))
                    .await
                    .map_err(|error| TrainerError::Exhausted {
                        field: "into",
                        message: format!("the write of the state stopped: {error}"),
                    })??;
                Ok(pb::TrainerCatchUpResponse {
                    outcome: pb::CatchUpOutcome::Loaded as i32,
                    from_site: fetched.from_site,
                    reason: String::new(),
                })
            }
            Err(reason) => Ok(pb::TrainerCatchUpResponse {
                outcome: pb::CatchUpOutcome::Failed as i32,
                from_site: fetched.from_site,
                reason,
            }),
        }
    }
}
