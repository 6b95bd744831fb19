//! The metrics a process exports, as data: name, kind, unit and help text,
//! one table per process ([`Metric`]). The table is what describes them to
//! the Prometheus exporter (with the `describe` feature: [`describe`]), what
//! the documentation lists, and what the tests and the Grafana dashboard are
//! checked against; a metric recorded but missing from its table has no help
//! text, which `promtool check metrics` reports.
//!
//! Conventions (Prometheus'): base units in the name (`_seconds`, `_bytes`,
//! `_bytes_per_second`, `_ratio`), `_total` on counters and only there, and
//! label values from a bounded set: sites, links, peers, outcomes, reasons;
//! never a job id, a revision or a round.

/// A metric's kind, as Prometheus types it (histograms are exported as
/// summaries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// The base unit of a metric's values, when it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseUnit {
    Seconds,
    Bytes,
    BytesPerSecond,
}

/// One exported metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<BaseUnit>,
    pub help: &'static str,
    /// Label sets registered at zero from the start: one empty set for an
    /// unlabelled metric ([`Metric::plain`]), the fixed sets of a labelled
    /// one; labels whose values come from the deployment (`peer`, `link`,
    /// `site`) appear when first recorded.
    pub initial: &'static [&'static [(&'static str, &'static str)]],
}

impl Metric {
    /// An unlabelled metric, exported (at zero) from the start.
    pub const fn plain(
        name: &'static str,
        kind: Kind,
        unit: Option<BaseUnit>,
        help: &'static str,
    ) -> Self {
        Self::labelled(name, kind, unit, help, &[&[]])
    }

    /// A labelled metric, exported from the start with the `initial` label
    /// sets (none: from its first recording).
    pub const fn labelled(
        name: &'static str,
        kind: Kind,
        unit: Option<BaseUnit>,
        help: &'static str,
        initial: &'static [&'static [(&'static str, &'static str)]],
    ) -> Self {
        Self {
            name,
            kind,
            unit,
            help,
            initial,
        }
    }

    /// The names Prometheus exposes for it: a counter's own name, a gauge's,
    /// or a summary's name with `_sum` and `_count`.
    pub fn exposed_names(&self) -> Vec<String> {
        match self.kind {
            Kind::Counter | Kind::Gauge => vec![self.name.to_string()],
            Kind::Histogram => vec![
                self.name.to_string(),
                format!("{}_sum", self.name),
                format!("{}_count", self.name),
            ],
        }
    }

    /// Whether the name follows the conventions above (checked by tests of
    /// every table).
    pub fn follows_conventions(&self) -> Result<(), String> {
        let name = self.name;
        if !name.starts_with("longhaul_")
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(format!("{name}: not longhaul_ and snake case"));
        }
        let total = name.ends_with("_total");
        if total != (self.kind == Kind::Counter) {
            return Err(format!(
                "{name}: `_total` is for counters, and every counter has it"
            ));
        }
        let base = name.strip_suffix("_total").unwrap_or(name);
        let suffix = match self.unit {
            Some(BaseUnit::Seconds) => Some("_seconds"),
            Some(BaseUnit::Bytes) => Some("_bytes"),
            Some(BaseUnit::BytesPerSecond) => Some("_bytes_per_second"),
            None => None,
        };
        if let Some(suffix) = suffix
            && !base.ends_with(suffix)
        {
            return Err(format!(
                "{name}: its unit asks for a name ending in {suffix}"
            ));
        }
        for unit in [
            "_milliseconds",
            "_ms",
            "_bps",
            "_bits",
            "_kb",
            "_mb",
            "_percent",
        ] {
            if base.ends_with(unit) || base.contains(&format!("{unit}_")) {
                return Err(format!("{name}: {unit} is not a base unit"));
            }
        }
        if self.help.is_empty() {
            return Err(format!("{name}: no help text"));
        }
        Ok(())
    }
}

/// Describes every metric of `table` to the installed recorder and
/// registers at zero those that exist from the start; call once, right after
/// installing the exporter.
#[cfg(feature = "describe")]
pub fn describe(table: &[Metric]) {
    use metrics::Unit;
    for metric in table {
        // `metrics` has no unit for bytes per second; the name carries it.
        let unit = metric.unit.and_then(|unit| match unit {
            BaseUnit::Seconds => Some(Unit::Seconds),
            BaseUnit::Bytes => Some(Unit::Bytes),
            BaseUnit::BytesPerSecond => None,
        });
        let (name, help) = (metric.name, metric.help);
        match (metric.kind, unit) {
            (Kind::Counter, Some(unit)) => metrics::describe_counter!(name, unit, help),
            (Kind::Counter, None) => metrics::describe_counter!(name, help),
            (Kind::Gauge, Some(unit)) => metrics::describe_gauge!(name, unit, help),
            (Kind::Gauge, None) => metrics::describe_gauge!(name, help),
            (Kind::Histogram, Some(unit)) => metrics::describe_histogram!(name, unit, help),
            (Kind::Histogram, None) => metrics::describe_histogram!(name, help),
        }
        for labels in metric.initial {
            let labels: Vec<metrics::Label> = labels
                .iter()
                .map(|&(key, value)| metrics::Label::new(key, value))
                .collect();
            match metric.kind {
                Kind::Counter => metrics::counter!(name, labels).increment(0),
                // Registered: a gauge reads 0, a summary has no samples.
                Kind::Gauge => drop(metrics::gauge!(name, labels)),
                Kind::Histogram => drop(metrics::histogram!(name, labels)),
            }
        }
    }
}

/// Checks a table: conventions, and every name once.
pub fn check_table(table: &[Metric]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for metric in table {
        metric.follows_conventions()?;
        if !seen.insert(metric.name) {
            return Err(format!("{}: described twice", metric.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_against_the_conventions() {
        let ok = Metric::plain(
            "longhaul_fsync_seconds",
            Kind::Histogram,
            Some(BaseUnit::Seconds),
            "x",
        );
        assert_eq!(ok.follows_conventions(), Ok(()));
        for (name, kind, unit) in [
            ("longhaul_fsync", Kind::Histogram, Some(BaseUnit::Seconds)),
            ("longhaul_things", Kind::Counter, None),
            ("longhaul_things_total", Kind::Gauge, None),
            ("longhaul_goodput_bps", Kind::Gauge, None),
            ("longhaul_goodput_bits_per_second", Kind::Gauge, None),
            ("longhaul_Mixed_total", Kind::Counter, None),
            ("other_total", Kind::Counter, None),
        ] {
            let metric = Metric::plain(name, kind, unit, "x");
            assert!(metric.follows_conventions().is_err(), "{name} passed");
        }
        let twice = [ok, ok];
        assert!(check_table(&twice).unwrap_err().contains("twice"));
    }
}
