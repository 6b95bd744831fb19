//! The reports of participants (contributed, applied with a hash), the
//! leader's exclusions and aborts: each checked against the round, then
//! the round's change.

use super::{
    Exclusion, ExclusionReason, Report, RoundOutcome, RoundRecord, RoundReport, round_change,
};
use crate::state::{ApplyError, Change, ClusterState};

impl ClusterState {
    /// The round and the participant a report is about, whatever the
    /// round's outcome and the participant's exclusion: a report stored
    /// already is answered as the first was, even once the round is over.
    fn reported_participant(
        &self,
        report: &Report<'_>,
    ) -> Result<(&RoundRecord, usize), ApplyError> {
        if !self.jobs.contains_key(report.job_id) {
            return Err(ApplyError::not_found(
                "job_id",
                format!("unknown job {:?}", report.job_id),
            ));
        }
        let record = self.round(report.job_id, report.round).ok_or_else(|| {
            ApplyError::not_found(
                "round",
                format!(
                    "job {:?} has no round {} (kept: {:?})",
                    report.job_id,
                    report.round,
                    self.rounds(report.job_id)
                        .map(|r| r.round)
                        .collect::<Vec<_>>()
                ),
            )
        })?;
        let index = record
            .participants
            .iter()
            .position(|p| p.site == report.site_id)
            .ok_or_else(|| {
                ApplyError::precondition(
                    "site_id",
                    format!(
                        "site {:?} is not a participant of round {} of job {:?}",
                        report.site_id, report.round, report.job_id
                    ),
                )
            })?;
        Ok((record, index))
    }

    /// Refuses a new report in `record` from its participant `index`: the
    /// round is over, the participant excluded, or the fragment out of range.
    fn check_counts(
        record: &RoundRecord,
        index: usize,
        report: &Report<'_>,
    ) -> Result<(), ApplyError> {
        match &record.outcome {
            RoundOutcome::Open => {}
            RoundOutcome::Committed { revision, .. } => {
                return Err(ApplyError::precondition(
                    "round",
                    format!(
                        "round {} of job {:?} committed at revision {revision}",
                        report.round, report.job_id
                    ),
                ));
            }
            RoundOutcome::Aborted { reason, .. } => {
                return Err(ApplyError::precondition(
                    "round",
                    format!(
                        "round {} of job {:?} was aborted: {reason}",
                        report.round, report.job_id
                    ),
                ));
            }
        }
        if let Some(exclusion) = &record.participants[index].excluded {
            return Err(ApplyError::precondition(
                "site_id",
                format!(
                    "site {:?} was excluded from round {} at revision {} ({}: {})",
                    report.site_id,
                    report.round,
                    exclusion.revision,
                    exclusion.reason.as_str(),
                    exclusion.message
                ),
            ));
        }
        if report.fragment as usize >= record.fragments.len() {
            return Err(ApplyError::not_found(
                "fragment",
                format!(
                    "round {} has fragments 0 to {}, not {}",
                    report.round,
                    record.fragments.len() - 1,
                    report.fragment
                ),
            ));
        }
        Ok(())
    }

    /// The open round and the counted participant a report is about.
    fn reported(&self, report: &Report<'_>) -> Result<(&RoundRecord, usize), ApplyError> {
        let (record, index) = self.reported_participant(report)?;
        Self::check_counts(record, index, report)?;
        Ok((record, index))
    }

    pub(in crate::state) fn check_contributed(
        &self,
        report: &Report<'_>,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        let (record, index) = self.reported_participant(report)?;
        let participant = &record.participants[index];
        // Before the round's state: the same report again, sent after an
        // unknown outcome, gets the first answer even once the round is over.
        if participant.contributed.contains(&report.fragment) {
            return Err(ApplyError::AlreadyExists {
                field: "fragment".into(),
                message: format!(
                    "site {:?} already reported contributing fragment {} to round {}",
                    report.site_id, report.fragment, report.round
                ),
            });
        }
        Self::check_counts(record, index, report)?;
        // A contribution settles nothing: only applied hashes count.
        Ok(vec![Change::RoundReport {
            report: RoundReport {
                job_id: record.job_id.clone(),
                round: record.round,
                site: report.site_id.to_string(),
                fragment: report.fragment,
                applied_hash: None,
                inner_step_us: 0,
                fragment_state: None,
                outcome: None,
                revision,
            },
        }])
    }

    pub(in crate::state) fn check_applied(
        &self,
        report: &Report<'_>,
        hash: &str,
        inner_step_us: u64,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        if hash.is_empty() {
            return Err(ApplyError::invalid("hash", "is required"));
        }
        let (record, index) = self.reported_participant(report)?;
        let participant = &record.participants[index];
        let earlier = participant.applied_hash(report.fragment);
        let message = |earlier: &str| {
            format!(
                "site {:?} already reported applying fragment {} of round {} with hash {}",
                report.site_id,
                report.fragment,
                report.round,
                crate::limits::quote(earlier)
            )
        };
        // As for a contribution: the same report again, whatever the round's
        // outcome or the site's exclusion since.
        if let Some(earlier) = earlier
            && earlier == hash
        {
            return Err(ApplyError::AlreadyExists {
                field: "hash".into(),
                message: message(earlier),
            });
        }
        Self::check_counts(record, index, report)?;
        if let Some(earlier) = earlier {
            return Err(ApplyError::precondition(
                "hash",
                format!(
                    "{}; a second report with another hash ({}) is refused",
                    message(earlier),
                    crate::limits::quote(hash)
                ),
            ));
        }
        if !participant.contributed.contains(&report.fragment) {
            return Err(ApplyError::precondition(
                "fragment",
                format!(
                    "site {:?} has not reported contributing fragment {} to round {}",
                    report.site_id, report.fragment, report.round
                ),
            ));
        }
        let mut delta = RoundReport {
            job_id: record.job_id.clone(),
            round: record.round,
            site: report.site_id.to_string(),
            fragment: report.fragment,
            applied_hash: Some(hash.to_string()),
            inner_step_us,
            fragment_state: None,
            outcome: None,
            revision,
        };
        // Settled on a copy, to learn what the report settles; only that goes
        // into the change, not the copy.
        let mut after = record.clone();
        after.apply_report(&delta);
        let f = report.fragment as usize;
        after.settle_reported(f, revision, report.at_unix_ms);
        delta.fragment_state =
            (after.fragments[f] != record.fragments[f]).then(|| after.fragments[f].clone());
        delta.outcome = (after.outcome != record.outcome).then(|| after.outcome.clone());
        Ok(vec![Change::RoundReport { report: delta }])
    }

    pub(in crate::state) fn check_exclude(
        &self,
        report: &Report<'_>,
        reason: ExclusionReason,
        message: &str,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        // The fragment is not part of an exclusion; 0 is always in range.
        let (record, _) = self.reported(&Report {
            fragment: 0,
            ..*report
        })?;
        if reason == ExclusionReason::DeadlineMissed {
            if report.at_unix_ms < record.deadline_unix_ms {
                return Err(ApplyError::precondition(
                    "reason",
                    format!(
                        "the deadline of round {} is {}, after {}",
                        report.round, record.deadline_unix_ms, report.at_unix_ms
                    ),
                ));
            }
            if !record.waiting_on().contains(&report.site_id) {
                return Err(ApplyError::precondition(
                    "site_id",
                    format!(
                        "site {:?} applied every open fragment of round {}: the round does not wait for it",
                        report.site_id, report.round
                    ),
                ));
            }
        }
        let mut record = record.clone();
        record.exclude(
            report.site_id,
            Exclusion {
                reason,
                message: message.to_string(),
                at_unix_ms: report.at_unix_ms,
                revision,
            },
        );
        Ok(vec![round_change(record)])
    }

    pub(in crate::state) fn check_abort_round(
        &self,
        job_id: &str,
        round: u64,
        reason: &str,
        at_unix_ms: u64,
        revision: u64,
    ) -> Result<Vec<Change>, ApplyError> {
        let record = self.round(job_id, round).ok_or_else(|| {
            ApplyError::not_found("round", format!("job {job_id:?} has no round {round}"))
        })?;
        if !record.is_open() {
            return Err(ApplyError::precondition(
                "round",
                format!("round {round} of job {job_id:?} is over already"),
            ));
        }
        let mut record = record.clone();
        record.outcome = RoundOutcome::Aborted {
            reason: reason.to_string(),
            at_unix_ms,
            revision,
        };
        record.revision = revision;
        Ok(vec![round_change(record)])
    }
}
