//! Where each system spends a write: its members' Prometheus counters,
//! scraped before and after a phase. For longhaul: log fsyncs, deferred and
//! fsynced state commits, Ready passes, snapshots and compactions; for etcd:
//! WAL fsyncs and backend commits. Per committed entry, so the two compare.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cluster::System;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A scrape can never hold up the benchmark for long.
const SCRAPE_LIMIT: Duration = Duration::from_secs(2);

/// One member's samples: the text exposition's `name{labels}` → value.
#[derive(Debug, Clone, Default)]
pub struct Samples(HashMap<String, f64>);

impl Samples {
    fn parse(text: &str) -> Self {
        let mut samples = HashMap::new();
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            if let Some((name, value)) = line.rsplit_once(' ')
                && let Ok(value) = value.trim().parse::<f64>()
            {
                samples.insert(name.trim().to_string(), value);
            }
        }
        Self(samples)
    }

    fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }
}

/// `GET /metrics` over plain HTTP/1.0 from `host:port`.
pub async fn scrape(address: &str) -> Result<Samples, BoxError> {
    let fetch = async {
        let mut stream = TcpStream::connect(address).await?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let text = String::from_utf8_lossy(&response);
        let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        Ok::<_, BoxError>(Samples::parse(body))
    };
    tokio::time::timeout(SCRAPE_LIMIT, fetch)
        .await
        .map_err(|_| format!("scraping {address} took over {SCRAPE_LIMIT:?}"))?
}

/// The change of a counter, or of a summary's or histogram's `_count` and
/// `_sum`, between two scrapes.
struct Delta<'a> {
    before: &'a Samples,
    after: &'a Samples,
}

impl Delta<'_> {
    fn counter(&self, name: &str) -> f64 {
        (self.after.get(name) - self.before.get(name)).max(0.0)
    }

    /// (count, mean in ms).
    fn timing(&self, name: &str) -> (f64, f64) {
        let count = self.counter(&format!("{name}_count"));
        let sum = self.counter(&format!("{name}_sum"));
        let mean_ms = if count > 0.0 {
            sum / count * 1000.0
        } else {
            f64::NAN
        };
        (count, mean_ms)
    }
}

/// One line describing what a member did per committed entry in a phase.
pub fn describe(system: System, role: &str, before: &Samples, after: &Samples) -> String {
    let delta = Delta { before, after };
    match system {
        System::Longhaul => {
            // The applied index's gauge rather than a counter: older builds export it too.
            let applied = delta.counter("longhaul_raft_applied_index");
            let appended = delta.counter("longhaul_raft_entries_appended_total");
            let (fsyncs, fsync_ms) = delta.timing("longhaul_fsync_seconds");
            let (deferred, deferred_ms) = delta.timing("longhaul_deferred_commit_seconds");
            let (state_syncs, state_sync_ms) = delta.timing("longhaul_state_sync_seconds");
            let (readies, ready_ms) = delta.timing("longhaul_ready_seconds");
            let (_, apply_ms) = delta.timing("longhaul_apply_seconds");
            let (snapshots, snapshot_ms) = delta.timing("longhaul_snapshot_serialize_seconds");
            let (compactions, compaction_ms) = delta.timing("longhaul_log_compaction_seconds");
            let per = |n: f64| if applied > 0.0 { n / applied } else { f64::NAN };
            format!(
                "{role:<8} per entry: {:.2} fsyncs (mean {fsync_ms:.2} ms), {:.2} deferred commits (mean {deferred_ms:.2} ms), {:.3} state fsyncs (mean {state_sync_ms:.2} ms), {:.2} Ready passes (mean {ready_ms:.2} ms), apply {apply_ms:.3} ms; {:.1} entries per fsync; {snapshots} snapshots (mean {snapshot_ms:.0} ms), {compactions} compactions (mean {compaction_ms:.0} ms)",
                per(fsyncs),
                per(deferred),
                per(state_syncs),
                per(readies),
                if fsyncs > 0.0 {
                    appended / fsyncs
                } else {
                    f64::NAN
                },
            )
        }
        System::Etcd => {
            let applied = delta.counter("etcd_server_proposals_applied_total");
            let (fsyncs, fsync_ms) = delta.timing("etcd_disk_wal_fsync_duration_seconds");
            let (commits, commit_ms) = delta.timing("etcd_disk_backend_commit_duration_seconds");
            let per = |n: f64| if applied > 0.0 { n / applied } else { f64::NAN };
            format!(
                "{role:<8} per entry: {:.2} WAL fsyncs (mean {fsync_ms:.2} ms), {:.3} backend commits (mean {commit_ms:.2} ms)",
                per(fsyncs),
                per(commits),
            )
        }
    }
}
