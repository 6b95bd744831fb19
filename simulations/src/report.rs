//! The simulator's report: one HTML page, SVG charts drawn with `plotters` and tables, that
//! opens offline (no script, no font, nothing fetched).
//!
//! Charts: compute utilisation against the swept value for every mode (with the viability
//! line), step time against the swept value, and at one chosen point a bar per mode split
//! into the step on a free WAN and the time exposed to this WAN. Tables: every mode at every
//! point, and the reasons of each mode's plan.

use std::fmt::Write as _;

use plotters::prelude::*;

use crate::analytic::{Comparison, Mode, Point};

/// One sweep point as the report shows it.
#[derive(Debug, Clone)]
pub struct ReportPoint {
    pub value: f64,
    /// The value as people read it, e.g. `1000 km`.
    pub label: String,
    pub point: Point,
}

/// What the report is of.
#[derive(Debug, Clone)]
pub struct ReportInput<'a> {
    pub comparison: &'a Comparison,
    /// The swept quantity with its unit, e.g. `distance (km)`.
    pub axis: String,
    /// Draw the swept value on a logarithmic axis (values spanning decades).
    pub log_axis: bool,
    pub points: Vec<ReportPoint>,
    /// The point of the breakdown chart, an index into `points`.
    pub breakdown_at: usize,
}

/// Why a report could not be drawn.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReportError {
    #[error("the report has no points")]
    NoPoints,
    #[error("`breakdown_at`: {0} is not a point of the sweep")]
    BreakdownAt(usize),
    #[error("drawing a chart failed: {0}")]
    Draw(String),
}

fn colour(mode: Mode) -> RGBColor {
    match mode {
        Mode::SyncDp => RGBColor(0xc0, 0x39, 0x2b),
        Mode::Pipeline => RGBColor(0x29, 0x80, 0xb9),
        Mode::Diloco => RGBColor(0x27, 0xae, 0x60),
    }
}

fn draw_error(e: impl std::fmt::Display) -> ReportError {
    ReportError::Draw(e.to_string())
}

const SIZE: (u32, u32) = (760, 420);

/// The x range of the sweep, widened a little so the end points are not on the frame.
fn x_range(points: &[ReportPoint], log: bool) -> (f64, f64) {
    let lo = points.iter().map(|p| p.value).fold(f64::INFINITY, f64::min);
    let hi = points
        .iter()
        .map(|p| p.value)
        .fold(f64::NEG_INFINITY, f64::max);
    if log {
        (lo / 1.2, hi * 1.2)
    } else if hi > lo {
        let pad = (hi - lo) * 0.03;
        (lo - pad, hi + pad)
    } else {
        (lo - 0.5, hi + 0.5)
    }
}

/// How one line chart looks.
struct LineChart<'a> {
    title: &'a str,
    y_label: &'a str,
    y_range: (f64, f64),
    log_y: bool,
    /// A horizontal line: the viability threshold.
    threshold: Option<f64>,
    legend: SeriesLabelPosition,
}

/// A line per mode of `figure` against the swept value.
fn line_chart(
    input: &ReportInput<'_>,
    look: LineChart<'_>,
    figure: impl Fn(&crate::analytic::ModeOutcome) -> f64,
) -> Result<String, ReportError> {
    let LineChart {
        title,
        y_label,
        y_range,
        log_y,
        threshold,
        legend,
    } = look;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let (x0, x1) = x_range(&input.points, input.log_axis);
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64);
        // The four combinations of linear and log axes are four chart types.
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart.map_err(draw_error)?;
                chart
                    .configure_mesh()
                    .x_desc(input.axis.as_str())
                    .y_desc(y_label)
                    .draw()
                    .map_err(draw_error)?;
                if let Some(t) = threshold {
                    chart
                        .draw_series(LineSeries::new(
                            [(x0, t), (x1, t)],
                            ShapeStyle::from(&BLACK.mix(0.4)).stroke_width(1),
                        ))
                        .map_err(draw_error)?
                        .label(format!("viable ≥ {:.0} %", t * 100.0))
                        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.4)));
                }
                for mode in Mode::ALL {
                    let series: Vec<(f64, f64)> = input
                        .points
                        .iter()
                        .filter_map(|p| p.point.outcome(mode).map(|o| (p.value, figure(o))))
                        .collect();
                    if series.is_empty() {
                        continue;
                    }
                    let c = colour(mode);
                    chart
                        .draw_series(LineSeries::new(
                            series.iter().copied(),
                            ShapeStyle::from(&c).stroke_width(3),
                        ))
                        .map_err(draw_error)?
                        .label(mode.name())
                        .legend(move |(x, y)| {
                            PathElement::new(
                                [(x, y), (x + 20, y)],
                                ShapeStyle::from(&c).stroke_width(3),
                            )
                        });
                    chart
                        .draw_series(
                            series
                                .iter()
                                .map(|&(x, y)| Circle::new((x, y), 4, c.filled())),
                        )
                        .map_err(draw_error)?;
                }
                chart
                    .configure_series_labels()
                    .position(legend.clone())
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(draw_error)?;
            }};
        }
        let (y0, y1) = y_range;
        match (input.log_axis, log_y) {
            (true, true) => {
                draw!(builder.build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale()))
            }
            (true, false) => draw!(builder.build_cartesian_2d((x0..x1).log_scale(), y0..y1)),
            (false, true) => draw!(builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale())),
            (false, false) => draw!(builder.build_cartesian_2d(x0..x1, y0..y1)),
        }
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

/// At one point: a bar per mode, the step on a free WAN below and the exposed time on top.
fn breakdown_chart(at: &ReportPoint) -> Result<String, ReportError> {
    let outcomes = &at.point.outcomes;
    let top = outcomes
        .iter()
        .map(|o| o.step_seconds)
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.1;
    let names: Vec<&str> = outcomes.iter().map(|o| o.mode.name()).collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let n = outcomes.len().max(1) as f64;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("One step at {}", at.label), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(-0.5..n - 0.5, 0.0..top)
            .map_err(draw_error)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(outcomes.len())
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    names
                        .get(i as usize)
                        .map_or(String::new(), |s| s.to_string())
                } else {
                    String::new()
                }
            })
            .y_desc("seconds per step")
            .draw()
            .map_err(draw_error)?;
        let ideal = RGBColor(0x7f, 0x8c, 0x8d);
        let exposed = RGBColor(0xe6, 0x7e, 0x22);
        chart
            .draw_series(outcomes.iter().enumerate().map(|(i, o)| {
                let x = i as f64;
                let base = o.step_seconds - o.exposed_communication_seconds;
                Rectangle::new([(x - 0.3, 0.0), (x + 0.3, base)], ideal.filled())
            }))
            .map_err(draw_error)?
            .label("step on a free WAN")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], ideal.filled()));
        chart
            .draw_series(outcomes.iter().enumerate().map(|(i, o)| {
                let x = i as f64;
                let base = o.step_seconds - o.exposed_communication_seconds;
                Rectangle::new(
                    [(x - 0.3, base), (x + 0.3, o.step_seconds)],
                    exposed.filled(),
                )
            }))
            .map_err(draw_error)?
            .label("exposed to this WAN")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], exposed.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(draw_error)?;
        root.present().map_err(draw_error)?;
    }
    Ok(svg)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

fn bytes(b: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// The whole page.
pub fn html(input: &ReportInput<'_>) -> Result<String, ReportError> {
    if input.points.is_empty() {
        return Err(ReportError::NoPoints);
    }
    let at = input
        .points
        .get(input.breakdown_at)
        .ok_or(ReportError::BreakdownAt(input.breakdown_at))?;
    let viable = input.comparison.viable_utilisation;
    let outcomes = || input.points.iter().flat_map(|p| &p.point.outcomes);
    let lowest = outcomes()
        .map(|o| o.compute_utilisation)
        .fold(1.0, f64::min);
    let utilisation = line_chart(
        input,
        LineChart {
            title: "Compute utilisation",
            y_label: "fraction of the step computing",
            y_range: ((lowest - 0.05).clamp(0.0, viable - 0.05), 1.02),
            log_y: false,
            threshold: Some(viable),
            legend: SeriesLabelPosition::LowerLeft,
        },
        |o| o.compute_utilisation,
    )?;
    let (fastest, slowest) = outcomes().fold((f64::INFINITY, 0.0f64), |(lo, hi), o| {
        (lo.min(o.step_seconds), hi.max(o.step_seconds))
    });
    let log_step = slowest > 20.0 * fastest;
    let step = line_chart(
        input,
        LineChart {
            title: "Step time",
            y_label: "seconds per step",
            y_range: if log_step {
                (fastest / 1.5, slowest * 1.5)
            } else {
                (0.0, slowest * 1.1)
            },
            log_y: log_step,
            threshold: None,
            legend: SeriesLabelPosition::UpperLeft,
        },
        |o| o.step_seconds,
    )?;
    let breakdown = breakdown_chart(at)?;

    let topology = input.comparison.topology();
    let job = input.comparison.job();
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>longhaul simulate: {job} on {topology}</title>\
         <style>body{{font-family:sans-serif;max-width:1600px;margin:2em auto;padding:0 1em;color:#222}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px}}\
         td.n{{text-align:right}}.charts{{display:flex;flex-wrap:wrap;gap:1em}}figure{{margin:0}}\
         .no{{color:#c0392b}}.yes{{color:#27ae60}}</style></head><body>\n\
         <h1>{job} on {topology}</h1>\n\
         <p>One training step in each cross-site mode, {axis} set on every WAN link. \
         Synchronous data parallelism sends the whole gradient at the training precision every \
         step; DiLoCo is configured by the sync planner at each point. A mode is viable when \
         its compute utilisation (the step on a free WAN over the step) is at least \
         {viable:.0} %. These are the cost model's predictions (the analytical tier), not \
         measurements.</p>\n<div class=\"charts\">\n",
        job = escape(&job.name),
        topology = escape(&topology.name),
        axis = escape(&input.axis),
        viable = viable * 100.0,
    );
    for svg in [&utilisation, &step, &breakdown] {
        page.push_str("<figure>");
        page.push_str(svg);
        page.push_str("</figure>\n");
    }
    page.push_str("</div>\n<h2>Every mode at every point</h2>\n<table><tr>");
    for h in [
        input.axis.as_str(),
        "RTT",
        "mode",
        "sites",
        "step",
        "compute",
        "exposed",
        "WAN bytes per step",
        "H",
        "bits",
        "viable",
    ] {
        let _ = write!(page, "<th>{}</th>", escape(h));
    }
    page.push_str("</tr>\n");
    for p in &input.points {
        let rtt = p.point.rtt_seconds.map_or("-".to_string(), seconds);
        for o in &p.point.outcomes {
            let _ = writeln!(
                page,
                "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"mode\">{}</td><td>{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{:.1} %</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"{v}\">{v}</td></tr>",
                escape(&p.label),
                rtt,
                o.mode.name(),
                escape(&o.sites.join(" → ")),
                seconds(o.step_seconds),
                o.compute_utilisation * 100.0,
                seconds(o.exposed_communication_seconds),
                bytes(o.wan_bytes_per_step),
                o.inner_steps.map_or("-".into(), |h| h.to_string()),
                o.bits.map_or("-".into(), |b| b.to_string()),
                v = if o.viable { "yes" } else { "no" },
            );
        }
        for u in &p.point.unavailable {
            let _ = writeln!(
                page,
                "<tr><td class=\"n\">{}</td><td></td><td>{}</td><td colspan=\"8\">no figure: {}</td></tr>",
                escape(&p.label),
                u.mode.name(),
                escape(&u.reason)
            );
        }
    }
    page.push_str("</table>\n<h2>The plans and their reasons</h2>\n");
    for mode in [Mode::Pipeline, Mode::Diloco, Mode::SyncDp] {
        let title = match mode {
            Mode::Pipeline => "Pipeline placement",
            Mode::Diloco => "DiLoCo placement",
            Mode::SyncDp => "Synchronous data-parallel placement",
        };
        let _ = writeln!(page, "<h3>{title}</h3>");
        match input.comparison.plan(mode) {
            Ok(plan) => {
                page.push_str("<table><tr><th>decision</th><th>choice</th><th>reason</th></tr>\n");
                let sync = plan.sync.iter().flat_map(|s| &s.reasons);
                for r in plan.reasons.iter().chain(sync) {
                    let _ = writeln!(
                        page,
                        "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                        escape(&r.decision),
                        escape(&r.choice),
                        escape(&r.reason)
                    );
                }
                page.push_str("</table>\n");
            }
            Err(reason) => {
                let _ = writeln!(page, "<p>No plan: {}</p>", escape(reason));
            }
        }
    }
    page.push_str("</body></html>\n");
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analytic::WanSetting;
    use longhaul_core::cost::CostParams;
    use longhaul_core::{JobSpec, Topology};

    fn report() -> String {
        let topology = Topology::from_toml(
            "t.toml",
            include_str!("../../deploy/examples/three-sites-two-continents.toml"),
        )
        .unwrap();
        let job = JobSpec::from_toml(
            "j.toml",
            include_str!("../../deploy/examples/dense-400b.job.toml"),
        )
        .unwrap();
        let comparison = Comparison::prepare(&topology, &job, &CostParams::default()).unwrap();
        let points = [10.0, 1000.0, 10_000.0]
            .into_iter()
            .map(|km| ReportPoint {
                value: km,
                label: format!("{km} km"),
                point: comparison
                    .at(&WanSetting {
                        distance_km: Some(km),
                        ..WanSetting::default()
                    })
                    .unwrap(),
            })
            .collect();
        html(&ReportInput {
            comparison: &comparison,
            axis: "distance (km)".into(),
            log_axis: true,
            points,
            breakdown_at: 2,
        })
        .unwrap()
    }

    #[test]
    fn the_report_draws_three_charts_with_a_line_per_mode_and_needs_nothing_from_the_network() {
        let page = report();
        if let Ok(path) = std::env::var("LONGHAUL_REPORT_OUT") {
            std::fs::write(path, &page).unwrap();
        }
        assert_eq!(page.matches("<svg").count(), 3);
        // A polyline per mode in each line chart (plus the viability line).
        assert!(page.matches("<polyline").count() >= 7, "{page}");
        assert!(page.contains("sync-dp") && page.contains("diloco") && page.contains("pipeline"));
        assert!(page.contains("One step at 10000 km"));
        assert!(!page.contains("<script") && !page.contains("src=") && !page.contains("href="));
        // Every mode at every point is in the table.
        assert_eq!(page.matches("<td class=\"mode\">diloco</td>").count(), 3);
    }
}
