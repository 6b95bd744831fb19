//! What the agent does with an assignment: render it into files its local
//! scheduler understands (always), and submit the Slurm script (where a
//! Slurm is configured for submission).

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
        if let Some(options) = &self.submit
            && let Some(script) = files
                .iter()
                .find(|f| f.extension().is_some_and(|e| e == "sbatch"))
        {
            let job = submit(script, options).map_err(|e| e.to_string())?;
            tracing::info!(job = %assignment.job_id, slurm_job = job.job_id, "submitted to Slurm");
            submitted_as = Some(match job.cluster {
                Some(cluster) => format!("{};{cluster}", job.job_id),
                None => job.job_id.to_string(),
            });
        }
        Ok(JobRecord {
            revision: assignment.revision,
            ranks: assignment.ranks.len() as u64,
            rendered_files: files,
            submitted_as,
        })
    }

    fn remove(&mut self, job_id: &str, record: &JobRecord) {
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
