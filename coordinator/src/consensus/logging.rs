//! Routes raft-rs's slog records into `tracing`, the logging facade of the workspace, so that
//! elections, conf changes and snapshot transfers show up in the coordinator's own logs.

use std::fmt::Write as _;

/// A slog drain that emits every record as a `tracing` event with target `raft`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingDrain;

/// Collects slog key-values as ` key=value` pairs.
struct Fields(String);

impl slog::Serializer for Fields {
    fn emit_arguments(&mut self, key: slog::Key, value: &std::fmt::Arguments<'_>) -> slog::Result {
        // Writing to a String cannot fail.
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(
        &self,
        record: &slog::Record<'_>,
        values: &slog::OwnedKVList,
    ) -> Result<Self::Ok, Self::Err> {
        let mut fields = Fields(String::new());
        // A value that fails to serialize is left out rather than losing the whole record.
        let _ = slog::KV::serialize(&record.kv(), record, &mut fields);
        let _ = slog::KV::serialize(values, record, &mut fields);
        let message = record.msg();
        let fields = fields.0;
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "raft", "{message}{fields}")
            }
            slog::Level::Warning => tracing::warn!(target: "raft", "{message}{fields}"),
            slog::Level::Info => tracing::info!(target: "raft", "{message}{fields}"),
            slog::Level::Debug => tracing::debug!(target: "raft", "{message}{fields}"),
            slog::Level::Trace => tracing::trace!(target: "raft", "{message}{fields}"),
        }
        Ok(())
    }
}

/// The logger handed to raft-rs for replica `id`.
pub fn raft_logger(id: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!("raft_id" => id))
}
