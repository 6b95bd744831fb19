//! Outer rounds on the wire as a watcher holds them: a report's change
//! (`RoundReport`) comes alone, not with the round, and is folded into the
//! round sent before it.

use crate::v1 as pb;

/// Folds `report` into `round`, as the coordinator folds it into its
/// record: the site's contribution or applied hash (once), the fragment's
/// state and the round's state if the report settled them and they were
/// still open, the revision if later, and what the round waits on. A
/// report about another round, or a site that is not a participant,
/// changes nothing.
pub fn apply_round_report(round: &mut pb::OuterRound, report: &pb::RoundReport) {
    if report.job_id != round.job_id || report.round_id != round.round_id {
        return;
    }
    let Some(p) = round
        .participant_states
        .iter_mut()
        .find(|p| p.site_id == report.site_id)
    else {
        return;
    };
    p.inner_step_us = p.inner_step_us.max(report.inner_step_us);
    if report.applied {
        if let Err(at) = p
            .applied
            .binary_search_by_key(&report.fragment, |a| a.fragment)
        {
            p.applied.insert(
                at,
                pb::FragmentHash {
                    fragment: report.fragment,
                    hash: report.hash.clone(),
                },
            );
        }
    } else if let Err(at) = p.contributed.binary_search(&report.fragment) {
        p.contributed.insert(at, report.fragment);
    }
    if let Some(state) = &report.fragment_state
        && let Some(slot) = round.fragment_states.get_mut(report.fragment as usize)
        && slot.state == "open"
    {
        *slot = state.clone();
    }
    let open = pb::RoundState::Open as i32;
    if round.state == open && report.state != open && report.state != 0 {
        round.state = report.state;
        round.reason = report.reason.clone();
        round.ended_at_unix_ms = report.ended_at_unix_ms;
    }
    round.revision = round.revision.max(report.revision);
    round.waiting_on = if round.state == open {
        let open_fragments: Vec<u32> = round
            .fragment_states
            .iter()
            .filter(|f| f.state == "open")
            .map(|f| f.fragment)
            .collect();
        round
            .participant_states
            .iter()
            .filter(|p| !p.excluded)
            .filter(|p| {
                open_fragments
                    .iter()
                    .any(|f| !p.applied.iter().any(|a| a.fragment == *f))
            })
            .map(|p| p.site_id.clone())
            .collect()
    } else {
        Vec::new()
    };
}
