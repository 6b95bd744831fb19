//! `longhaul rounds`: a job's outer rounds in a running coordinator.

use std::io::Write;

use clap::Subcommand;
use longhaul_proto::v1 as pb;

use super::remote::{Remote, call, json, runtime};
use super::table::Table;
use super::{Failure, Output};

#[derive(Debug, Subcommand)]
pub enum RoundsCommand {
    /// The job's rounds still kept (the last 16), oldest first: state,
    /// participants, exclusions and what an open round waits for.
    List {
        /// The job's id.
        job: String,
        #[command(flatten)]
        remote: Remote,
    },
}

fn state_name(round: &pb::OuterRound) -> &'static str {
    match pb::RoundState::try_from(round.state) {
        Ok(pb::RoundState::Open) => "open",
        Ok(pb::RoundState::Committed) => "committed",
        Ok(pb::RoundState::Aborted) => "aborted",
        _ => "unknown",
    }
}

/// "site (reason)" for each excluded participant.
fn exclusions(round: &pb::OuterRound) -> Vec<String> {
    round
        .participant_states
        .iter()
        .filter(|p| p.excluded)
        .map(|p| format!("{} ({})", p.site_id, p.exclusion_reason))
        .collect()
}

fn duration(round: &pb::OuterRound) -> String {
    if round.ended_at_unix_ms < round.opened_at_unix_ms || round.ended_at_unix_ms == 0 {
        return "-".into();
    }
    format!(
        "{:.3} s",
        (round.ended_at_unix_ms - round.opened_at_unix_ms) as f64 / 1000.0
    )
}

/// The slowest inner step the participants' trainers measured, if any.
fn measured_step_ms(round: &pb::OuterRound) -> Option<f64> {
    round
        .participant_states
        .iter()
        .map(|p| p.inner_step_us)
        .max()
        .filter(|us| *us > 0)
        .map(|us| us as f64 / 1000.0)
}

/// Opening to deadline.
fn deadline(round: &pb::OuterRound) -> String {
    format!(
        "{:.1} s",
        round
            .deadline_unix_ms
            .saturating_sub(round.opened_at_unix_ms) as f64
            / 1000.0
    )
}

pub fn rounds(command: RoundsCommand, out: &mut dyn Write) -> Result<(), Failure> {
    let RoundsCommand::List { job, remote } = command;
    runtime()?.block_on(async {
        let allow_stale = remote.stale;
        let response = call(&remote, |mut c| {
            let request = pb::ListRoundsRequest {
                job_id: job.clone(),
                allow_stale,
            };
            async move { c.list_rounds(request).await }
        })
        .await?;
        let revision = response.header.unwrap_or_default().revision;
        if remote.output == Output::Json {
            let rounds: Vec<_> = response
                .rounds
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "round": r.round_id,
                        "state": state_name(r),
                        "reason": r.reason,
                        "participants": r.participants,
                        "excluded": r.participant_states.iter().filter(|p| p.excluded).map(|p| serde_json::json!({
                            "site": p.site_id,
                            "reason": p.exclusion_reason,
                            "message": p.exclusion_message,
                            "revision": p.excluded_at_revision,
                        })).collect::<Vec<_>>(),
                        "catch_up": r.participant_states.iter().filter(|p| p.catch_up_from_round != 0).map(|p| serde_json::json!({
                            "site": p.site_id,
                            "from_round": p.catch_up_from_round,
                            "from_site": p.catch_up_from_site,
                        })).collect::<Vec<_>>(),
                        "waiting_on": r.waiting_on,
                        "fragments": r.fragments,
                        "codec_bits": r.codec_bits,
                        "inner_steps": r.inner_steps,
                        "overlap_steps": r.overlap_steps,
                        "inner_steps_through": r.inner_steps_through,
                        "opened_at_unix_ms": r.opened_at_unix_ms,
                        "deadline_unix_ms": r.deadline_unix_ms,
                        "measured_inner_step_ms": measured_step_ms(r),
                        "inner_step_us": r.participant_states.iter().map(|p| serde_json::json!({
                            "site": p.site_id,
                            "us": p.inner_step_us,
                        })).collect::<Vec<_>>(),
                        "ended_at_unix_ms": r.ended_at_unix_ms,
                        "opened_revision": r.opened_revision,
                        "revision": r.revision,
                    })
                })
                .collect();
            return json(
                &serde_json::json!({ "job": job, "revision": revision, "rounds": rounds }),
                out,
            );
        }
        writeln!(
            out,
            "{} rounds of job {job:?} at revision {revision}",
            response.rounds.len()
        )?;
        let mut table = Table::new(&[
            ("round", true),
            ("state", false),
            ("participants", false),
            ("excluded", false),
            ("waiting on", false),
            ("fragments", true),
            ("bits", true),
            ("H, τ", true),
            ("duration", true),
            ("deadline", true),
            ("inner step", true),
        ]);
        for r in &response.rounds {
            let excluded = exclusions(r);
            table.row(vec![
                r.round_id.to_string(),
                state_name(r).into(),
                r.participants.join(", "),
                if excluded.is_empty() { "-".into() } else { excluded.join(", ") },
                if r.waiting_on.is_empty() { "-".into() } else { r.waiting_on.join(", ") },
                r.fragments.to_string(),
                r.codec_bits.to_string(),
                if r.inner_steps == 0 {
                    "-".into()
                } else {
                    format!("{}, {}", r.inner_steps, r.overlap_steps)
                },
                duration(r),
                deadline(r),
                measured_step_ms(r).map_or_else(|| "-".into(), |ms| format!("{ms:.1} ms")),
            ]);
        }
        write!(out, "{}", table.render(0))?;
        for r in response.rounds.iter().filter(|r| !r.reason.is_empty()) {
            writeln!(out, "round {}: {}", r.round_id, r.reason)?;
        }
        Ok(())
    })
}
