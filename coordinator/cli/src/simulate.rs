//! `longhaul simulate`: what one training step costs in each cross-site mode (synchronous
//! data parallelism across sites, a cross-site pipeline, DiLoCo as the sync planner would
//! configure it) at every point of a sweep over the WAN, from files, with no coordinator.
//! The figures are the simulator's analytical tier (`longhaul_simulations::analytic`).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use longhaul_core::cost::CostParams;
use longhaul_core::units::{human_bytes, human_seconds};
use longhaul_simulations::analytic::{Comparison, Mode, Point, WanSetting};
use longhaul_simulations::report::{ReportInput, ReportPoint, html};
use serde::Serialize;

use super::plan::load_inputs;
use super::table::Table;
use super::{Failure, Output, print_json};

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The topology file; the bundled two-campuses-80km example when omitted.
    #[arg(long)]
    pub topology: Option<PathBuf>,
    /// The job file; the bundled llama-70b example when omitted.
    #[arg(long)]
    pub job: Option<PathBuf>,
    /// The sweep: one axis and its values, set on every WAN link at each point.
    /// Axes: distance-km, link-rate-gbps, loss, parallel-links, inner-steps, bits
    /// (the last two fix DiLoCo's H and codec width).
    #[arg(long, value_parser = parse_sweep, default_value = "distance-km=1,10,100,1000,3000,10000")]
    pub sweep: Sweep,
    /// A setting kept at every point, as AXIS=VALUE (repeatable), e.g. `--set loss=0.001`.
    #[arg(long = "set", value_parser = parse_set)]
    pub set: Vec<(Axis, f64)>,
    /// The least compute utilisation (a fraction) at which a mode counts as viable.
    #[arg(long, default_value_t = 0.9, value_parser = parse_fraction)]
    pub viable: f64,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Also write an HTML report (SVG charts and tables, opens offline) to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The sweep value the report's step breakdown is drawn at; the last when omitted.
    #[arg(long, requires = "report")]
    pub breakdown_at: Option<f64>,
}

/// A sweep axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Axis {
    DistanceKm,
    LinkRateGbps,
    Loss,
    ParallelLinks,
    InnerSteps,
    Bits,
}

impl Axis {
    const ALL: [(Axis, &'static str); 6] = [
        (Axis::DistanceKm, "distance-km"),
        (Axis::LinkRateGbps, "link-rate-gbps"),
        (Axis::Loss, "loss"),
        (Axis::ParallelLinks, "parallel-links"),
        (Axis::InnerSteps, "inner-steps"),
        (Axis::Bits, "bits"),
    ];

    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(a, _)| *a == self)
            .map_or("", |(_, n)| n)
    }

    fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(a, _)| *a)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|(_, n)| *n).collect();
                format!(
                    "unknown axis {name:?}: expected one of {}",
                    names.join(", ")
                )
            })
    }

    /// `setting` with this axis at `value`, or why the value is not one this axis takes.
    fn set(self, setting: &mut WanSetting, value: f64) -> Result<(), String> {
        let whole = |what: &str| -> Result<u32, String> {
            if value >= 1.0 && value.fract() == 0.0 && value <= f64::from(u32::MAX) {
                Ok(value as u32)
            } else {
                Err(format!(
                    "{what} must be a whole number of at least 1, found {value}"
                ))
            }
        };
        match self {
            Axis::DistanceKm => setting.distance_km = Some(value),
            Axis::LinkRateGbps => {
                if !(value > 0.0 && value <= 1e6) {
                    return Err(format!(
                        "link-rate-gbps must be within (0, 1e6], found {value}"
                    ));
                }
                setting.link_rate_bits_per_second = Some((value * 1e9).round() as u64);
            }
            Axis::Loss => setting.loss = Some(value),
            Axis::ParallelLinks => setting.parallel_links = Some(whole("parallel-links")?),
            Axis::InnerSteps => setting.inner_steps = Some(whole("inner-steps")?),
            Axis::Bits => setting.bits = Some(whole("bits")?),
        }
        Ok(())
    }

    fn show(self, value: f64) -> String {
        match self {
            Axis::DistanceKm => format!("{value} km"),
            Axis::LinkRateGbps => format!("{value} Gbit/s"),
            Axis::Loss => format!("{} %", value * 100.0),
            Axis::ParallelLinks => format!("{value} links"),
            Axis::InnerSteps => format!("H {value}"),
            Axis::Bits => format!("{value} bits"),
        }
    }
}

/// One axis and its values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sweep {
    pub axis: Axis,
    pub values: Vec<f64>,
}

/// The most points one sweep may have.
const MAX_POINTS: usize = 1000;

fn parse_sweep(text: &str) -> Result<Sweep, String> {
    let (axis, values) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not AXIS=V1,V2,…"))?;
    let axis = Axis::parse(axis.trim())?;
    let values = values
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| format!("{v:?} is not a number"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if values.len() > MAX_POINTS {
        return Err(format!(
            "{} values, more than the {MAX_POINTS} allowed",
            values.len()
        ));
    }
    for &value in &values {
        let mut setting = WanSetting::default();
        axis.set(&mut setting, value)?;
        setting
            .check()
            .map_err(|e| format!("{}: {e}", axis.name()))?;
    }
    Ok(Sweep { axis, values })
}

fn parse_set(text: &str) -> Result<(Axis, f64), String> {
    let sweep = parse_sweep(text)?;
    match sweep.values.as_slice() {
        [value] => Ok((sweep.axis, *value)),
        _ => Err(format!(
            "{text:?}: --set takes one value; use --sweep for several"
        )),
    }
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{text:?} is not a fraction within [0, 1]")),
    }
}

/// The JSON document: the sweep, and every mode at every point.
#[derive(Serialize)]
struct Report<'a> {
    topology: &'a str,
    job: &'a str,
    sweep: &'a Sweep,
    viable_compute_utilisation: f64,
    points: Vec<SweepPoint>,
}

#[derive(Serialize)]
struct SweepPoint {
    value: f64,
    #[serde(flatten)]
    point: Point,
}

pub fn simulate(args: &SimulateArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let (topology, job) = load_inputs(args.topology.as_ref(), args.job.as_ref())?;
    let params = CostParams::default();
    let mut comparison = Comparison::prepare(&topology, &job, &params)
        .map_err(|e| anyhow::anyhow!("job {:?} on {:?}: {e}", job.name, topology.name))?;
    comparison.viable_utilisation = args.viable;
    let mut base = WanSetting::default();
    for (axis, value) in &args.set {
        axis.set(&mut base, *value).map_err(anyhow::Error::msg)?;
    }
    let mut points = Vec::with_capacity(args.sweep.values.len());
    for &value in &args.sweep.values {
        let mut setting = base;
        args.sweep
            .axis
            .set(&mut setting, value)
            .map_err(anyhow::Error::msg)?;
        let point = comparison
            .at(&setting)
            .map_err(|e| anyhow::anyhow!("at {}: {e}", args.sweep.axis.show(value)))?;
        points.push(SweepPoint { value, point });
    }
    if let Some(path) = &args.report {
        write_report(args, &comparison, &points, path)?;
    }
    match args.output {
        Output::Json => print_json(
            &Report {
                topology: &topology.name,
                job: &job.name,
                sweep: &args.sweep,
                viable_compute_utilisation: args.viable,
                points,
            },
            out,
        ),
        Output::Text => {
            write!(out, "{}", text(&topology.name, &job.name, args, &points))?;
            Ok(())
        }
    }
}

fn write_report(
    args: &SimulateArgs,
    comparison: &Comparison,
    points: &[SweepPoint],
    path: &std::path::Path,
) -> Result<(), Failure> {
    let axis = args.sweep.axis;
    let values = &args.sweep.values;
    let breakdown_at = match args.breakdown_at {
        None => values.len().saturating_sub(1),
        Some(at) => values.iter().position(|&v| v == at).ok_or_else(|| {
            anyhow::anyhow!(
                "--breakdown-at {at} is not a value of the sweep ({})",
                values
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?,
    };
    let (lo, hi) = values.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
        (lo.min(v), hi.max(v))
    });
    let input = ReportInput {
        comparison,
        axis: match axis {
            Axis::DistanceKm => "distance (km)",
            Axis::LinkRateGbps => "link rate (Gbit/s)",
            Axis::Loss => "random loss (fraction)",
            Axis::ParallelLinks => "parallel links per bundle",
            Axis::InnerSteps => "DiLoCo inner steps H",
            Axis::Bits => "bits per pseudo-gradient element",
        }
        .to_string(),
        log_axis: lo > 0.0 && hi / lo >= 100.0,
        points: points
            .iter()
            .map(|p| ReportPoint {
                value: p.value,
                label: axis.show(p.value),
                point: p.point.clone(),
            })
            .collect(),
        breakdown_at,
    };
    let page = html(&input).map_err(anyhow::Error::from)?;
    // Written whole to a temporary file beside it, then renamed: never half a report.
    let tmp = path.with_extension("html.tmp");
    std::fs::write(&tmp, page)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| anyhow::anyhow!("cannot write the report to {}: {e}", path.display()))?;
    Ok(())
}

fn text(topology: &str, job: &str, args: &SimulateArgs, points: &[SweepPoint]) -> String {
    let axis = args.sweep.axis;
    let mut s = format!(
        "job {job:?} on {topology:?}: one step in each cross-site mode, {} swept on every WAN link\n",
        axis.name()
    );
    let mut table = Table::new(&[
        (axis.name(), true),
        ("RTT", true),
        ("mode", false),
        ("sites", false),
        ("step", true),
        ("compute", true),
        ("exposed", true),
        ("WAN/step", true),
        ("H", true),
        ("bits", true),
        ("viable", false),
    ]);
    for p in points {
        let rtt = p.point.rtt_seconds.map_or("-".to_string(), human_seconds);
        for o in &p.point.outcomes {
            table.row(vec![
                axis.show(p.value),
                rtt.clone(),
                o.mode.name().to_string(),
                o.sites.join("→"),
                human_seconds(o.step_seconds),
                format!("{:.1} %", o.compute_utilisation * 100.0),
                human_seconds(o.exposed_communication_seconds),
                human_bytes(o.wan_bytes_per_step),
                o.inner_steps.map_or("-".into(), |h| h.to_string()),
                o.bits.map_or("-".into(), |b| b.to_string()),
                if o.viable { "yes" } else { "no" }.to_string(),
            ]);
        }
    }
    s.push_str(&table.render(2));
    let mut seen = std::collections::BTreeSet::new();
    for p in points {
        for u in &p.point.unavailable {
            if seen.insert((u.mode, u.reason.clone())) {
                s.push_str(&format!(
                    "  {} has no figure: {}\n",
                    u.mode.name(),
                    u.reason
                ));
            }
        }
    }
    s.push_str(&format!(
        "viable: compute utilisation at least {:.0} % (the step on a free WAN over the step)\n",
        args.viable * 100.0
    ));
    for mode in Mode::ALL {
        let viable: Vec<bool> = points
            .iter()
            .filter_map(|p| p.point.outcome(mode).map(|o| o.viable))
            .collect();
        if viable.is_empty() {
            continue;
        }
        let last = points
            .iter()
            .filter(|p| p.point.outcome(mode).is_some_and(|o| o.viable))
            .map(|p| axis.show(p.value))
            .next_back();
        let summary = match (viable.iter().all(|&v| v), viable.iter().any(|&v| v), last) {
            (true, _, _) => "viable at every point".to_string(),
            (false, true, Some(last)) => format!("viable up to {last}, not at every point after"),
            _ => "viable at no point".to_string(),
        };
        s.push_str(&format!("  {:<9} {summary}\n", mode.name()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_and_settings_are_parsed_or_refused_naming_the_problem() {
        let sweep = parse_sweep("distance-km=1,10,100").unwrap();
        assert_eq!(sweep.axis, Axis::DistanceKm);
        assert_eq!(sweep.values, vec![1.0, 10.0, 100.0]);
        assert!(
            parse_sweep("colour=1")
                .unwrap_err()
                .contains("unknown axis")
        );
        assert!(parse_sweep("loss=x").unwrap_err().contains("not a number"));
        assert!(parse_sweep("distance-km").unwrap_err().contains("AXIS=V1"));
        assert!(
            parse_sweep("bits=4.5")
                .unwrap_err()
                .contains("whole number")
        );
        assert!(parse_sweep("bits=3").unwrap_err().contains("16, 8 or 4"));
        assert!(parse_sweep("loss=0,1").unwrap_err().contains("[0, 1)"));
        assert!(
            parse_sweep("distance-km=-5")
                .unwrap_err()
                .contains("distance")
        );
        assert!(
            parse_sweep("link-rate-gbps=0")
                .unwrap_err()
                .contains("link-rate-gbps")
        );
        let many = format!("loss={}", vec!["0"; MAX_POINTS + 1].join(","));
        assert!(parse_sweep(&many).unwrap_err().contains("allowed"));
        assert_eq!(parse_set("loss=0.01").unwrap(), (Axis::Loss, 0.01));
        assert!(parse_set("loss=0.01,0.02").unwrap_err().contains("--sweep"));
        assert!(parse_fraction("1.5").is_err());
    }
}
