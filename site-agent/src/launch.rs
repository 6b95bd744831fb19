//! What the agent does with an assignment: render it into files its local
//! scheduler understands (always), and submit the Slurm script (where a
//! Slurm is configured for submission).

use std::collections::HashMap;
use std::path::PathBuf;

use longhaul_proto::v1 as pb;

use crate::agent::Handle;
use crate::assignment::SiteAssignment;
use crate::inventory::Inventory;
use crate::render::slurm::{SlurmSubmitOptions, submit};
use crate::render::{RenderOptions, write_dry_run};
use crate::store::JobRecord;

/// Renders every assignment into `dir`; submits when `submit` is set.
#[derive(Debug, Clone)]
pub struct RenderAndSubmit {
    pub site_id: String,
    pub dir: PathBuf,
    pub options: RenderOptions,
    pub submit: Option<SlurmSubmitOptions>,
    /// What was submitted per job: the assignment without its sync
    /// schedule and revision, and the Slurm job it became.
    pub submitted: HashMap<String, (pb::Assignment, String)>,
}

/// The part of an assignment that decides what runs: a change of the sync
/// schedule alone (the coordinator re-planned H and τ from the trainers'
/// measured step) reaches the running trainers through the agent, and is
/// not a reason to submit the job again.
fn launch_part(message: &pb::Assignment) -> pb::Assignment {
    pb::Assignment {
        sync: None,
        revision: 0,
        sync_point: false,
        ..message.clone()
    }
}

impl Handle for RenderAndSubmit {
    fn assign(
        &mut self,
        message: &pb::Assignment,
        inventory: &Inventory,
    ) -> Result<JobRecord, String> {
        let assignment =
            SiteAssignment::from_wire(message, &self.site_id).map_err(|e| e.to_string())?;
        let files = write_dry_run(&self.dir, &assignment, inventory, &self.options)
            .map_err(|e| e.to_string())?;
        let mut submitted_as = None;
        let launch = launch_part(message);
        if let Some((before, slurm_job)) = self.submitted.get(&message.job_id)
            && *before == launch
        {
            tracing::info!(job = %assignment.job_id, slurm_job, "only the sync schedule changed: not submitted again");
            submitted_as = Some(slurm_job.clone());
        } else if let Some(options) = &self.submit
            && let Some(script) = files
                .iter()
                .find(|f| f.extension().is_some_and(|e| e == "sbatch"))
        {
            let job = submit(script, options).map_err(|e| e.to_string())?;
            tracing::info!(job = %assignment.job_id, slurm_job = job.job_id, "submitted to Slurm");
            let slurm_job = match job.cluster {
                Some(cluster) => format!("{};{cluster}", job.job_id),
                None => job.job_id.to_string(),
            };
            self.submitted
                .insert(message.job_id.clone(), (launch, slurm_job.clone()));
            submitted_as = Some(slurm_job);
        }
        Ok(JobRecord {
            revision: assignment.revision,
            ranks: assignment.ranks.len() as u64,
            rendered_files: files,
            submitted_as,
        })
    }

    fn remove(&mut self, job_id: &str, record: &JobRecord) {
        self.submitted.remove(job_id);
        // The rendered files stay for the operator; a submitted job is
        // reported, not cancelled: stopping a training job is a decision
        // the site makes (scancel), not one an agent takes on its own.
        tracing::warn!(
            job = job_id,
            submitted_as = record.submitted_as.as_deref().unwrap_or("-"),
            "job removed from this site; its rendered files stay"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_of_the_sync_schedule_alone_is_not_a_new_launch() {
        let placed = pb::Assignment {
            job_id: "chars".into(),
            revision: 7,
            mode: "diloco".into(),
            ranks: vec![pb::RankBinding {
                rank: 0,
                ..Default::default()
            }],
            sync: Some(pb::SyncSchedule {
                inner_steps: 200,
                overlap_steps: 5,
                ..Default::default()
            }),
            ..Default::default()
        };
        let replanned = pb::Assignment {
            revision: 9,
            sync: Some(pb::SyncSchedule {
                inner_steps: 20,
                overlap_steps: 0,
                ..Default::default()
            }),
            ..placed.clone()
        };
        assert_eq!(launch_part(&placed), launch_part(&replanned));
        let moved = pb::Assignment {
            ranks: vec![pb::RankBinding {
                rank: 1,
                ..Default::default()
            }],
            ..replanned.clone()
        };
        assert_ne!(launch_part(&placed), launch_part(&moved));
    }
}
