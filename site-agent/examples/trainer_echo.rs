//! The trainer API's hand-off cost, without a coordinator or peers: an
//! agent's trainer service on a Unix socket for a job of one fragment of
//! `--elements` parameters, whose rounds "average" a submission into
//! itself (the fragment's result is what was submitted, published at once,
//! and the next round opens). What a trainer measures against it is the
//! local API alone: the copy into shared memory, the RPC, the agent's read
//! (`Submit`), and the agent's write and the copy out (`Collect`);
//! `site-agent/python/benchmarks/handoff.py` drives it.
//!
//! ```text
//! cargo run --release -p longhaul-site-agent --example trainer_echo -- \
//!     --socket /tmp/lh-echo.sock --elements 268435456
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use longhaul_proto::v1 as pb;
use longhaul_site_agent::trainer::service::TrainerService;
use longhaul_site_agent::trainer::{FragmentResult, TrainerHub};

#[derive(Debug, Parser)]
struct Args {
    /// The Unix socket to serve on (replaced if it exists).
    #[arg(long)]
    socket: PathBuf,
    /// Parameters of the job's one fragment (default 2^28: 1 GiB of f32).
    #[arg(long, default_value_t = 1 << 28)]
    elements: u64,
    #[arg(long, default_value = "/dev/shm")]
    shm_dir: PathBuf,
    /// The job's H, as the schedule says it.
    #[arg(long, default_value_t = 1000)]
    inner_steps: u32,
}

const JOB: &str = "echo";
const SITE: &str = "local";

fn round(id: u64) -> pb::OuterRound {
    pb::OuterRound {
        round_id: id,
        job_id: JOB.into(),
        participants: vec![SITE.into()],
        state: pb::RoundState::Open as i32,
        fragments: 1,
        revision: id,
        participant_states: vec![pb::RoundParticipant {
            site_id: SITE.into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let hub = Arc::new(TrainerHub::new(
        SITE,
        Duration::from_secs(600),
        &args.shm_dir,
    ));
    hub.assign(&pb::Assignment {
        job_id: JOB.into(),
        mode: "diloco".into(),
        ranks: vec![pb::RankBinding {
            rank: 0,
            ..Default::default()
        }],
        sync: Some(pb::SyncSchedule {
            job_id: JOB.into(),
            inner_steps: args.inner_steps,
            fragments: 1,
            codec_bits: 4,
            schedule: vec![pb::FragmentSchedule {
                fragment: 0,
                first_parameter: 0,
                parameters: args.elements,
                sync_at_inner_step: 0,
                apply_at_inner_step: 0,
            }],
            ..Default::default()
        }),
        ..Default::default()
    });
    hub.observe_round(&round(1));
    let echo = Arc::clone(&hub);
    tokio::spawn(async move {
        for id in 1.. {
            let values = echo.submission(JOB, id, 0).await;
            echo.publish(
                JOB,
                id,
                0,
                FragmentResult::Applied {
                    values,
                    hash: format!("round-{id}"),
                    live: vec![SITE.into()],
                },
            );
            echo.observe_round(&round(id + 1));
        }
    });
    let _ = std::fs::remove_file(&args.socket);
    let listener = tokio::net::UnixListener::bind(&args.socket)
        .with_context(|| format!("cannot listen on {}", args.socket.display()))?;
    eprintln!(
        "serving the trainer API on {} ({} parameters)",
        args.socket.display(),
        args.elements
    );
    tonic::transport::Server::builder()
        .add_service(TrainerService::new(hub).server())
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
        .await?;
    Ok(())
}
