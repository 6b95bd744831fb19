//! The schedule a trainer gets (`GetSchedule`): its job's sync schedule,
//! as the assignment has it or as the open round names it, and the round.

use longhaul_proto::v1 as pb;

use super::{HubState, catch_up, excluded};
use crate::catchup::StateStore;

impl HubState {
    /// The schedule a trainer of `job_id` at `site` gets: the sync
    /// schedule of its assignment, the job's open round, and what that
    /// round asks of this site (a catch-up, a state to serve).
    pub(super) fn schedule(
        &self,
        job_id: &str,
        site: &str,
        states: &StateStore,
    ) -> pb::TrainerSchedule {
        let mut out = pb::TrainerSchedule {
            job_id: job_id.to_string(),
            ..Default::default()
        };
        if let Some(sync) = self.jobs.get(job_id).and_then(|j| j.sync.as_ref()) {
            out.inner_steps = sync.inner_steps;
            out.overlap_steps = sync.overlap_steps;
            out.codec_bits = sync.codec_bits;
            out.fragments = sync
                .schedule
                .iter()
                .map(|f| pb::TrainerFragment {
                    fragment: f.fragment,
                    first_parameter: f.first_parameter,
                    parameters: f.parameters,
                    sync_at_inner_step: f.sync_at_inner_step,
                    apply_at_inner_step: f.apply_at_inner_step,
                })
                .collect();
            out.parameters = sync.schedule.iter().map(|f| f.parameters).sum();
            // The round names the schedule in force when it opened. When
            // that is not the assignment's, the assignment (a stream of its
            // own) has not caught up with a re-plan yet: H and τ are the
            // round's, the fragments (which a re-plan keeps) staggered
            // for them.
            if let Some(round) = self.rounds.get(job_id)
                && round.state == pb::RoundState::Open as i32
                && round.schedule_inner_steps != 0
                && (round.schedule_inner_steps, round.schedule_overlap_steps)
                    != (sync.inner_steps, sync.overlap_steps)
            {
                let (h, tau) = (round.schedule_inner_steps, round.schedule_overlap_steps);
                let p = out.fragments.len() as u32;
                out.inner_steps = h;
                out.overlap_steps = tau;
                for f in &mut out.fragments {
                    (f.sync_at_inner_step, f.apply_at_inner_step) =
                        longhaul_core::sync::stagger(f.fragment, p, h, tau);
                }
            }
        }
        if let Some(round) = self.rounds.get(job_id) {
            if round.state == pb::RoundState::Open as i32 {
                out.round = round.round_id;
                out.participants = round.participants.clone();
                out.excluded = excluded(round, site).is_some();
                out.deadline_unix_ms = round.deadline_unix_ms;
                out.round_inner_steps = round.inner_steps;
                out.round_inner_steps_through = round.inner_steps_through;
                out.last_round_over = round.round_id.saturating_sub(1);
                if let Some((after, from)) = catch_up::catching_up(round, site) {
                    out.catch_up_after_round = after;
                    out.catch_up_from_site = from.to_string();
                }
                out.serve_after_round = catch_up::serving(round, site)
                    .filter(|after| !states.has(job_id, *after))
                    .unwrap_or(0);
            } else {
                out.last_round_over = round.round_id;
            }
        }
        out
    }
}
