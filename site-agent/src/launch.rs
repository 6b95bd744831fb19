//! What the agent does with an assignment: render it into files its local
//! scheduler understands (always), and submit the Slurm script (where a
//! Slurm is configured for submission).

use std::path::PathBuf;

use prost::Message;

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

impl RenderAndSubmit {
    /// Where the agent keeps what it submitted for `job_id`, beside the
    /// rendered files, so that a restarted agent knows it too: the Slurm
    /// job, a newline, then the encoded [`launch_part`] it was submitted
    /// for.
    fn marker(&self, job_id: &str) -> PathBuf {
        self.dir.join(format!("{job_id}.submitted"))
    }

    /// The Slurm job `job_id` became when it was submitted for `launch`,
    /// if it was.
    fn submitted_before(&self, job_id: &str, launch: &[u8]) -> Option<String> {
        let bytes = std::fs::read(self.marker(job_id)).ok()?;
        let split = bytes.iter().position(|&b| b == b'\n')?;
        (bytes[split + 1..] == *launch)
            .then(|| String::from_utf8_lossy(&bytes[..split]).into_owned())
    }

    fn record_submitted(
        &self,
        job_id: &str,
        slurm_job: &str,
        launch: &[u8],
    ) -> std::io::Result<()> {
        let path = self.marker(job_id);
        let temp = path.with_extension("submitted.tmp");
        let mut bytes = Vec::with_capacity(slurm_job.len() + 1 + launch.len());
        bytes.extend_from_slice(slurm_job.as_bytes());
        bytes.push(b'\n');
        bytes.extend_from_slice(launch);
        std::fs::write(&temp, bytes)?;
        std::fs::rename(temp, path)
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
        let launch = launch_part(message).encode_to_vec();
        if let Some(slurm_job) = self.submitted_before(&message.job_id, &launch) {
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
            if let Err(error) = self.record_submitted(&message.job_id, &slurm_job, &launch) {
                tracing::warn!(job = %assignment.job_id, %error, "cannot record the submission; a change of the sync schedule alone will submit the job again");
            }
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
        // Placed here again later, it is submitted again.
        let _ = std::fs::remove_file(self.marker(job_id));
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

    #[test]
    fn what_was_submitted_is_known_after_a_restart_and_forgotten_with_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let agent = || RenderAndSubmit {
            site_id: "north".into(),
            dir: dir.path().to_path_buf(),
            options: RenderOptions::default(),
            submit: None,
        };
        let launch = b"ranks 0-7 on n1".to_vec();
        assert_eq!(agent().submitted_before("chars", &launch), None);
        agent()
            .record_submitted("chars", "5813;north-a", &launch)
            .unwrap();
        // A restarted agent (a new handler on the same directory) knows it.
        let restarted = agent();
        assert_eq!(
            restarted.submitted_before("chars", &launch).as_deref(),
            Some("5813;north-a")
        );
        assert_eq!(
            restarted.submitted_before("chars", b"ranks 0-3 on n1"),
            None
        );
        assert_eq!(restarted.submitted_before("other", &launch), None);
        let mut restarted = restarted;
        restarted.remove("chars", &JobRecord::default());
        assert_eq!(agent().submitted_before("chars", &launch), None);
    }
}
