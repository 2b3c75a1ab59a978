//! The report's plots, drawn with `plotters` as SVG: axis titles with
//! units, stream counts on a log axis, the legend outside the plotting area,
//! one colour and one marker per system.
//!
//! - [`throughput`]: closed-loop pulses/s against streams, one model;
//! - [`latency_cdf`]: each real-time system's latencies at its capacity,
//!   on a log time axis;
//! - [`p99_against_load`]: a panel per real-time system, p50 and p99
//!   against streams with the budget drawn in: where each system breaks.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{RealTime, Report};

/// Distinct colours, one per system of a plot (12: as many systems as the
/// closed loop has).
const PALETTE: [RGBColor; 12] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x00, 0x00, 0x00),
    RGBColor(0x39, 0x3b, 0x79),
];

/// The `i`th system's colour and marker: every pair differs.
fn look(i: usize) -> (RGBColor, Marker) {
    (PALETTE[i % PALETTE.len()], MARKERS[i % MARKERS.len()])
}

#[derive(Clone, Copy)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Cross,
}

const MARKERS: [Marker; 4] = [Marker::Circle, Marker::Triangle, Marker::Square, Marker::Cross];

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Result<T> = std::result::Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Draws `points` as a line with the system's markers on `chart`.
fn series<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    points: &[(X::ValueType, Y::ValueType)],
    (color, marker): (RGBColor, Marker),
) -> Result<()>
where
    X: Ranged,
    Y: Ranged,
    X::ValueType: Clone + 'static,
    Y::ValueType: Clone + 'static,
{
    chart
        .draw_series(LineSeries::new(points.iter().cloned(), color.stroke_width(2)))
        .map_err(err)?;
    let style = color.filled();
    let at = points.iter().cloned();
    match marker {
        Marker::Circle => chart.draw_series(at.map(|p| Circle::new(p, 4, style))).map(|_| ()),
        Marker::Triangle => chart
            .draw_series(at.map(|p| TriangleMarker::new(p, 5, style)))
            .map(|_| ()),
        Marker::Square => chart
            .draw_series(at.map(|p| EmptyElement::at(p) + Rectangle::new([(-4, -4), (4, 4)], style)))
            .map(|_| ()),
        Marker::Cross => chart
            .draw_series(at.map(|p| Cross::new(p, 5, color.stroke_width(2))))
            .map(|_| ()),
    }
    .map_err(err)
}

/// The legend, below the plot: one row per system, its line, its marker,
/// its name.
fn legend(area: &Area<'_>, labels: &[String]) -> Result<()> {
    for (i, label) in labels.iter().enumerate() {
        let (color, marker) = look(i);
        let y = 12 + 20 * i as i32;
        area.draw(&PathElement::new(vec![(20, y), (60, y)], color.stroke_width(2)))
            .map_err(err)?;
        let style = color.filled();
        match marker {
            Marker::Circle => area.draw(&Circle::new((40, y), 4, style)),
            Marker::Triangle => area.draw(&TriangleMarker::new((40, y), 5, style)),
            Marker::Square => area.draw(&Rectangle::new([(36, y - 4), (44, y + 4)], style)),
            Marker::Cross => area.draw(&Cross::new((40, y), 5, color.stroke_width(2))),
        }
        .map_err(err)?;
        area.draw(&Text::new(label.clone(), (70, y - 7), ("sans-serif", 14).into_font()))
            .map_err(err)?;
    }
    Ok(())
}

const WIDTH: u32 = 900;
const PLOT_HEIGHT: u32 = 460;

fn legend_height(rows: usize) -> u32 {
    20 * rows as u32 + 16
}

/// Closed-loop throughput of `model`: pulses/s against streams (log), a
/// line per system.
pub fn throughput(report: &Report, model: &str) -> Result<String> {
    let rows: Vec<_> = report.closed_loop.iter().filter(|c| c.model == model).collect();
    let mut systems: Vec<(&str, &str)> = vec![];
    for r in &rows {
        if !systems.iter().any(|(s, _)| *s == r.system) {
            systems.push((&r.system, &r.label));
        }
    }
    let max_n = rows.iter().map(|r| r.streams).max().unwrap_or(2).max(2) as f64;
    let max_y = rows.iter().map(|r| r.max).fold(1.0, f64::max) * 1.1;
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, PLOT_HEIGHT + legend_height(systems.len()))).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (top, bottom) = root.split_vertically(PLOT_HEIGHT);
        let mut chart = ChartBuilder::on(&top)
            .caption(
                format!("{model}: throughput against streams (closed loop)"),
                ("sans-serif", 20),
            )
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d((1f64..max_n * 1.2).log_scale(), 0f64..max_y)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("streams (log scale)")
            .y_desc("pulses per second (median of the repeats)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
            .draw()
            .map_err(err)?;
        for (i, (system, _)) in systems.iter().enumerate() {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.system == *system)
                .map(|r| (r.streams as f64, r.median))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            series(&mut chart, &points, look(i))?;
        }
        let labels: Vec<String> = systems.iter().map(|(_, l)| l.to_string()).collect();
        legend(&bottom, &labels)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Each real-time system's latency CDF at its capacity, on a log time axis
/// (the tail is what a budget is about).
pub fn latency_cdf(report: &Report) -> Result<String> {
    let rt = &report.real_time;
    let lo = 0.01f64;
    let hi = rt
        .iter()
        .flat_map(|r| r.cdf_at_capacity_us.last().copied())
        .max()
        .unwrap_or(1000) as f64
        / 1000.0
        * 1.5;
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, PLOT_HEIGHT + legend_height(rt.len()))).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (top, bottom) = root.split_vertically(PLOT_HEIGHT);
        let title = match rt.first() {
            Some(r) => format!(
                "{}: latency at each system's capacity (a pulse every {:.0} ms, p99 budget {:.0} ms)",
                r.model, r.period_ms, r.budget_ms
            ),
            None => "latency at capacity: no real-time run".into(),
        };
        let mut chart = ChartBuilder::on(&top)
            .caption(title, ("sans-serif", 18))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d((lo..hi.max(lo * 10.0)).log_scale(), 0f64..1f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("latency, ms (log scale)")
            .y_desc("fraction of pulses answered within")
            .x_label_formatter(&|x| format!("{x}"))
            .draw()
            .map_err(err)?;
        for (i, r) in rt.iter().enumerate() {
            let n = r.cdf_at_capacity_us.len().max(1) as f64;
            let points: Vec<(f64, f64)> = r
                .cdf_at_capacity_us
                .iter()
                .enumerate()
                .map(|(k, us)| ((*us as f64 / 1000.0).max(lo), (k + 1) as f64 / n))
                .collect();
            let (color, _) = look(i);
            chart
                .draw_series(LineSeries::new(points.iter().cloned(), color.stroke_width(2)))
                .map_err(err)?;
            // One marker at the p99 point, so the line is known by it too.
            if let Some(p) = points.get(((n * 0.99) as usize).min(points.len().saturating_sub(1))) {
                series(&mut chart, &[*p], look(i))?;
            }
        }
        if let Some(r) = rt.first() {
            let budget = r.budget_ms;
            chart
                .draw_series(LineSeries::new(
                    [(budget, 0.0), (budget, 1.0)],
                    BLACK.mix(0.5).stroke_width(1),
                ))
                .map_err(err)?;
        }
        let labels: Vec<String> = rt
            .iter()
            .map(|r| format!("{} ({} streams)", r.system, r.capacity))
            .collect();
        legend(&bottom, &labels)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// A panel per real-time system: p50 and p99 latency of every probe
/// against the streams probed (both log), the budget as a dashed line.
/// Where the p99 crosses the budget is where the system breaks; a p99
/// near the budget at low load is a policy that spends its budget
/// waiting.
pub fn p99_against_load(report: &Report) -> Result<String> {
    let rt = &report.real_time;
    let cols = 2usize;
    let rows = rt.len().div_ceil(cols).max(1);
    let (pw, ph) = (560u32, 300u32);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (pw * cols as u32, ph * rows as u32 + 60)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (head, body) = root.split_vertically(60);
        let title = match rt.first() {
            Some(r) => format!(
                "{}: p99 (line) and p50 (dots) latency against streams; dashed: the {:.0} ms budget",
                r.model, r.budget_ms
            ),
            None => "no real-time run".into(),
        };
        head.draw(&Text::new(title, (16, 20), ("sans-serif", 18).into_font()))
            .map_err(err)?;
        let panels = body.split_evenly((rows, cols));
        let max_n = rt
            .iter()
            .flat_map(|r| r.probes.iter().map(|p| p.streams))
            .max()
            .unwrap_or(16)
            .max(16) as f64;
        let max_ms = rt
            .iter()
            .flat_map(|r| r.probes.iter().map(|p| p.p99_us))
            .max()
            .unwrap_or(1000) as f64
            / 1000.0;
        let budget = rt.first().map(|r| r.budget_ms).unwrap_or(1.0);
        let hi = max_ms.max(budget) * 2.0;
        for (i, (r, panel)) in rt.iter().zip(panels.iter()).enumerate() {
            panel_for(panel, r, i, max_n, (0.01, hi))?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn panel_for(panel: &Area<'_>, r: &RealTime, i: usize, max_n: f64, (lo, hi): (f64, f64)) -> Result<()> {
    let caption = if r.system.len() > 70 {
        format!(
            "{}…",
            &r.system[..r.system.char_indices().nth(69).map(|c| c.0).unwrap_or(r.system.len())]
        )
    } else {
        r.system.clone()
    };
    let mut chart = ChartBuilder::on(panel)
        .caption(format!("{caption} [{}]", r.short), ("sans-serif", 12))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d((4f64..max_n * 1.3).log_scale(), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("streams (log)")
        .y_desc("latency, ms (log)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()
        .map_err(err)?;
    let mut probes = r.probes.clone();
    probes.sort_by_key(|p| p.streams);
    // Several probes at one count (a repeated probe, another search): the
    // line runs through the median p99 of each count; every probe is a dot.
    let mut counts: Vec<usize> = probes.iter().map(|p| p.streams).collect();
    counts.dedup();
    let line: Vec<(f64, f64)> = counts
        .iter()
        .map(|n| {
            let mut p99: Vec<u64> = probes.iter().filter(|p| p.streams == *n).map(|p| p.p99_us).collect();
            p99.sort_unstable();
            (*n as f64, (p99[p99.len() / 2] as f64 / 1000.0).max(lo))
        })
        .collect();
    series(&mut chart, &line, look(i))?;
    let (color, _) = look(i);
    chart
        .draw_series(probes.iter().map(|p| {
            Circle::new(
                (p.streams as f64, (p.p50_us as f64 / 1000.0).max(lo)),
                2,
                color.filled(),
            )
        }))
        .map_err(err)?;
    chart
        .draw_series(DashedLineSeries::new(
            [(4.0, r.budget_ms), (max_n * 1.3, r.budget_ms)],
            6,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
    chart
        .draw_series(std::iter::once(Text::new(
            format!("capacity {}", r.capacity),
            (5.0, hi / 2.0),
            ("sans-serif", 12).into_font(),
        )))
        .map_err(err)?;
    Ok(())
}

/// The file a model's throughput plot goes to: `throughput-light.svg` for
/// "light TDNN".
pub fn throughput_file(model: &str) -> String {
    format!("throughput-{}.svg", model.split_whitespace().next().unwrap_or("model"))
}
