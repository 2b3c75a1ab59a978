//! The report's plots, drawn with `plotters` as SVG, laid out to be read
//! at a page's width (960 px wide, text of 13 px or more): axis titles
//! with units, stream counts on a log axis, one colour and one marker per
//! system.
//!
//! - [`throughput`]: closed-loop pulses/s against streams, one model; the
//!   spread of the repeats as a bar at each point, and each line named
//!   beside its end, top to bottom in the order the lines end;
//! - [`latency_cdf`]: each real-time system's latencies at its capacity,
//!   on a log time axis, the fraction answered on a tail scale (0, 90, 99,
//!   99.9 %: a decade each) so the tail is not squeezed into the top 1 %,
//!   the budget drawn; the legend in the order of the lines' p99;
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

/// Where labels wanted at the heights `wanted` go so that no two are
/// closer than `gap`, each as near its wanted height as that allows and
/// in the same order, within `lo..=hi` where there is room.
fn spread(wanted: &[i32], gap: i32, lo: i32, hi: i32) -> Vec<i32> {
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_by_key(|&i| wanted[i]);
    let mut at: Vec<i32> = order.iter().map(|&i| wanted[i].max(lo)).collect();
    for k in 1..at.len() {
        at[k] = at[k].max(at[k - 1] + gap);
    }
    if let Some(last) = at.last_mut() {
        *last = (*last).min(hi);
    }
    for k in (0..at.len().saturating_sub(1)).rev() {
        at[k] = at[k].min(at[k + 1] - gap);
    }
    let mut placed = vec![0; wanted.len()];
    for (k, &i) in order.iter().enumerate() {
        placed[i] = at[k];
    }
    placed
}

/// The system's marker, centred on `(x, y)` in `area`'s pixels.
fn marker_at(area: &Area<'_>, (x, y): (i32, i32), (color, marker): (RGBColor, Marker)) -> Result<()> {
    let style = color.filled();
    match marker {
        Marker::Circle => area.draw(&Circle::new((x, y), 4, style)),
        Marker::Triangle => area.draw(&TriangleMarker::new((x, y), 5, style)),
        Marker::Square => area.draw(&Rectangle::new([(x - 4, y - 4), (x + 4, y + 4)], style)),
        Marker::Cross => area.draw(&Cross::new((x, y), 5, color.stroke_width(2))),
    }
    .map_err(err)
}

/// A legend row: the system's line and marker, then its name, centred on
/// the height `y`.
fn legend_row(area: &Area<'_>, (x, y): (i32, i32), i: usize, label: &str) -> Result<()> {
    let (color, _) = look(i);
    area.draw(&PathElement::new(vec![(x, y), (x + 28, y)], color.stroke_width(2)))
        .map_err(err)?;
    marker_at(area, (x + 14, y), look(i))?;
    area.draw(&Text::new(label.to_string(), (x + 36, y - 8), font(TEXT)))
        .map_err(err)
}

/// The plots' width: a page's, so that text keeps its size.
pub const WIDTH: u32 = 960;
/// The throughput plot's plotting area ends here; the lines' names stand
/// to its right.
pub const THROUGHPUT_CHART_WIDTH: u32 = 590;
const PLOT_HEIGHT: u32 = 520;
/// Text size of legends, captions and axis labels, px.
const TEXT: u32 = 14;

fn font(size: u32) -> FontDesc<'static> {
    ("sans-serif", size).into_font()
}

/// Closed-loop throughput of `model`: pulses/s (the median of the
/// repeats) against streams (log), a line per system, the repeats' range
/// as a bar at each point, and each line's name beside its end.
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
        let root = SVGBackend::with_string(&mut svg, (WIDTH, PLOT_HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (left, _) = root.split_horizontally(THROUGHPUT_CHART_WIDTH);
        let mut chart = ChartBuilder::on(&left)
            .caption(format!("{model}: throughput against streams (closed loop)"), font(18))
            .margin(16)
            .x_label_area_size(52)
            .y_label_area_size(76)
            .build_cartesian_2d((1f64..max_n * 1.2).log_scale(), 0f64..max_y)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("streams (log scale)")
            .y_desc("pulses per second (median; bar: range of the repeats)")
            .label_style(font(TEXT))
            .axis_desc_style(font(TEXT))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
            .draw()
            .map_err(err)?;
        // (label, system index, the line's end in pixels, its value)
        let mut ends: Vec<(&str, usize, (i32, i32), f64)> = vec![];
        for (i, (system, label)) in systems.iter().enumerate() {
            let mut points: Vec<&&crate::report::ClosedLoop> = rows.iter().filter(|r| r.system == *system).collect();
            points.sort_by_key(|r| r.streams);
            let line: Vec<(f64, f64)> = points.iter().map(|r| (r.streams as f64, r.median)).collect();
            series(&mut chart, &line, look(i))?;
            let (color, _) = look(i);
            chart
                .draw_series(points.iter().map(|r| {
                    ErrorBar::new_vertical(r.streams as f64, r.min, r.median, r.max, color.stroke_width(1), 8)
                }))
                .map_err(err)?;
            if let Some(end) = line.last() {
                ends.push((label, i, chart.backend_coord(end), end.1));
            }
        }
        // Highest end first, so that two ends on one pixel row keep the
        // order of their values.
        ends.sort_by(|a, b| b.3.total_cmp(&a.3));
        let wanted: Vec<i32> = ends.iter().map(|(_, _, (_, y), _)| *y).collect();
        let placed = spread(&wanted, 19, 24, PLOT_HEIGHT as i32 - 12);
        let x = THROUGHPUT_CHART_WIDTH as i32 + 16;
        for ((label, i, end, _), y) in ends.iter().zip(placed) {
            let (color, _) = look(*i);
            root.draw(&PathElement::new(
                vec![(end.0 + 6, end.1), (x - 4, y)],
                color.mix(0.5).stroke_width(1),
            ))
            .map_err(err)?;
            legend_row(&root, (x, y), *i, label)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The tail scale of the latency plot: `-log10(1 - fraction)`, a decade
/// of the tail per unit (0 at none answered, 1 at 90 %, 2 at 99 %).
fn tail(fraction: f64) -> f64 {
    -(1.0 - fraction).max(1e-9).log10()
}

/// A tail-scale value as the percentile it stands for: `99%`, `99.9%`.
fn percentile(y: f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-y));
    let decimals = (y.round() as i64 - 2).max(0) as usize;
    if (y - y.round()).abs() < 1e-6 {
        format!("{p:.decimals$}%")
    } else {
        format!("{p:.1}%")
    }
}

/// A line's latency (ms) at the fraction 0.99, read off its points.
fn p99_ms(points: &[(f64, u64)]) -> f64 {
    points
        .iter()
        .find(|(f, _)| *f >= 0.99)
        .or(points.last())
        .map(|(_, us)| *us as f64 / 1000.0)
        .unwrap_or(0.0)
}

/// Each real-time system's latency at its capacity: the fraction of
/// pulses answered within a latency, latency on a log axis and the
/// fraction on the tail scale, the budget as a dashed line; the legend
/// below, in the order of the lines' p99 (left to right where they cross
/// 99 %), each with its p99.
pub fn latency_cdf(report: &Report) -> Result<String> {
    let rt = &report.real_time;
    let lines: Vec<Vec<(f64, u64)>> = rt.iter().map(|r| r.latency_points()).collect();
    let budget = rt.first().map(|r| r.budget_ms).unwrap_or(1.0);
    let all_ms = || lines.iter().flatten().map(|(_, us)| (*us).max(1) as f64 / 1000.0);
    let lo = all_ms().fold(budget, f64::min) / 1.5;
    let hi = all_ms().fold(budget, f64::max) * 1.5;
    let top = lines.iter().flatten().map(|(f, _)| tail(*f)).fold(2.0, f64::max).ceil();
    let mut order: Vec<usize> = (0..rt.len()).collect();
    order.sort_by(|&a, &b| p99_ms(&lines[a]).total_cmp(&p99_ms(&lines[b])));
    let legend_height = 20 * rt.len() as u32 + 20;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, PLOT_HEIGHT + legend_height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (top_area, bottom) = root.split_vertically(PLOT_HEIGHT);
        let title = match rt.first() {
            Some(r) => format!(
                "{}: latency at each system's capacity (a pulse every {:.0} ms, p99 budget {:.0} ms)",
                r.model, r.period_ms, r.budget_ms
            ),
            None => "latency at capacity: no real-time run".into(),
        };
        let mut chart = ChartBuilder::on(&top_area)
            .caption(title, font(17))
            .margin(16)
            .x_label_area_size(52)
            .y_label_area_size(76)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .light_line_style(WHITE)
            .x_desc("latency, ms (log scale)")
            .y_desc("pulses answered within (tail scale)")
            .label_style(font(TEXT))
            .axis_desc_style(font(TEXT))
            .x_label_formatter(&|x| format!("{x}"))
            .y_labels(top as usize + 1)
            .y_label_formatter(&|y| percentile(*y))
            .draw()
            .map_err(err)?;
        for (i, points) in lines.iter().enumerate() {
            let points: Vec<(f64, f64)> = points
                .iter()
                .map(|(f, us)| ((*us as f64 / 1000.0).max(lo), tail(*f)))
                .collect();
            let (color, _) = look(i);
            chart
                .draw_series(LineSeries::new(points.iter().cloned(), color.stroke_width(2)))
                .map_err(err)?;
            // One marker where the line crosses 99 %, so the line is known
            // by it too.
            if let Some(p) = points.iter().find(|(_, y)| *y >= 2.0).or(points.last()) {
                series(&mut chart, &[*p], look(i))?;
            }
        }
        if !rt.is_empty() {
            chart
                .draw_series(DashedLineSeries::new(
                    [(budget, 0.0), (budget, top)],
                    6,
                    4,
                    BLACK.stroke_width(1),
                ))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("budget {budget:.0} ms"),
                    (budget * 1.05, top * 0.04),
                    font(TEXT),
                )))
                .map_err(err)?;
        }
        for (row, &i) in order.iter().enumerate() {
            let r = &rt[i];
            let label = format!("p99 {:.2} ms: {} ({} streams)", p99_ms(&lines[i]), r.system, r.capacity);
            legend_row(&bottom, (20, 12 + 20 * row as i32), i, &label)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The panels' layout: columns, and a panel's size in pixels.
const PANEL_COLUMNS: usize = 2;
const PANEL: (u32, u32) = (WIDTH / PANEL_COLUMNS as u32, 290);
/// Characters of a panel's caption line at its text size.
const CAPTION_CHARS: usize = 62;

/// `text` broken at spaces into lines of at most `width` characters (a
/// longer word stands alone).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = vec![];
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// A panel per real-time system: p50 and p99 latency of every probe
/// against the streams probed (both log), the budget as a dashed line.
/// Where the p99 crosses the budget is where the system breaks; a p99
/// near the budget at low load is a policy that spends its budget
/// waiting.
pub fn p99_against_load(report: &Report) -> Result<String> {
    let rt = &report.real_time;
    let rows = rt.len().div_ceil(PANEL_COLUMNS).max(1);
    let head_height = 64u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, PANEL.1 * rows as u32 + head_height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (head, body) = root.split_vertically(head_height);
        let title = match rt.first() {
            Some(r) => vec![
                format!("{}: latency of every probe against the streams probed", r.model),
                format!(
                    "line: p99 (the median where a count was probed more than once); dots: p50; dashed: the {:.0} ms budget",
                    r.budget_ms
                ),
            ],
            None => vec!["no real-time run".into()],
        };
        for (k, line) in title.iter().enumerate() {
            let size = if k == 0 { 18 } else { TEXT };
            head.draw(&Text::new(line.clone(), (16, 10 + 26 * k as i32), font(size)))
                .map_err(err)?;
        }
        let panels = body.split_evenly((rows, PANEL_COLUMNS));
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
    // The caption in full, on as many lines as it takes (two for the
    // longest names), the short name first: nothing is cut.
    let caption = wrap(&format!("[{}] {}", r.short, r.system), CAPTION_CHARS);
    let caption_height = 8 + 18 * caption.len() as u32;
    let (top, area) = panel.split_vertically(caption_height);
    for (k, line) in caption.iter().enumerate() {
        top.draw(&Text::new(line.clone(), (12, 6 + 18 * k as i32), font(13)))
            .map_err(err)?;
    }
    let mut chart = ChartBuilder::on(&area)
        .margin(8)
        .margin_right(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((4f64..max_n * 1.3).log_scale(), (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("streams (log)")
        .y_desc("latency, ms (log)")
        .label_style(font(13))
        .axis_desc_style(font(13))
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
            font(13),
        )))
        .map_err(err)?;
    Ok(())
}

/// The file a model's throughput plot goes to: `throughput-light.svg` for
/// "light TDNN".
pub fn throughput_file(model: &str) -> String {
    format!("throughput-{}.svg", model.split_whitespace().next().unwrap_or("model"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Labels keep their order and their gap, stay in bounds where there
    /// is room, and move only as far as a neighbour pushes them.
    #[test]
    fn labels_are_spread_in_order_without_overlap() {
        assert_eq!(spread(&[100, 300], 20, 0, 500), vec![100, 300]);
        assert_eq!(spread(&[100, 105, 110], 20, 0, 500), vec![100, 120, 140]);
        assert_eq!(spread(&[110, 100], 20, 0, 500), vec![120, 100]);
        assert_eq!(spread(&[495, 498], 20, 0, 500), vec![480, 500]);
        assert_eq!(spread(&[-5], 20, 10, 500), vec![10]);
    }

    /// The tail scale gives a decade per unit and its ticks read as
    /// percentiles; a caption wraps at spaces without losing a word.
    #[test]
    fn tail_scale_and_captions() {
        assert!((tail(0.99) - 2.0).abs() < 1e-9 && tail(0.0).abs() < 1e-9);
        assert_eq!(percentile(0.0), "0%");
        assert_eq!(percentile(1.0), "90%");
        assert_eq!(percentile(2.0), "99%");
        assert_eq!(percentile(3.0), "99.9%");
        let text = "ours async (defaults: a shard per core; latency budget 5 ms; tasks; latency from send)";
        let lines = wrap(text, 40);
        assert!(lines.iter().all(|l| l.chars().count() <= 40), "{lines:?}");
        assert_eq!(lines.join(" "), text);
    }
}
