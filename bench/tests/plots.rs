//! Every plot renders from a stored report (a real `--quick` run's
//! `report.json`), names every system it plots, and keeps its legend out
//! of the plotting area.

use laned_bench::plot;
use laned_bench::report::{self, Report};

fn stored() -> Report {
    let text = include_str!("data/report.json");
    serde_json::from_str(text).expect("the stored report parses")
}

/// The (x, y) of every `<text>` element whose content is exactly
/// `content` (plotters writes it on a line of its own).
fn texts_at(svg: &str, content: &str) -> Vec<(f64, f64)> {
    let mut at = vec![];
    let mut from = 0;
    while let Some(found) = svg[from..].find(content) {
        let start = from + found;
        from = start + content.len();
        let before = svg[..start].trim_end();
        let after = svg[from..].trim_start();
        if !(before.ends_with('>') && after.starts_with("</text>")) {
            continue;
        }
        let open = before.rfind("<text").expect("a text element opens before its content");
        let attr = |name: &str| -> f64 {
            before[open..]
                .split(&format!(" {name}=\""))
                .nth(1)
                .and_then(|v| v.split('"').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("a text element has an {name}"))
        };
        at.push((attr("x"), attr("y")));
    }
    at
}

/// The SVG's width attribute.
fn width(svg: &str) -> f64 {
    svg.split(" width=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Keeps a rendered plot in `target/laned-bench-plots/`, where CI turns
/// each into a PNG (`rsvg-convert`), as a reader would look at it.
fn keep(name: &str, svg: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/laned-bench-plots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), svg).unwrap();
}

fn well_formed(svg: &str) {
    assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
    assert!(svg.trim_end().ends_with("</svg>"));
}

/// Each model's throughput plot names every system once, beside the
/// plotting area, top to bottom in the order the lines end (the highest
/// median at the most streams first), at page width.
#[test]
fn throughput_plots_name_each_line_beside_its_end_in_order() {
    let report = stored();
    assert!(!report.models().is_empty(), "the stored report has a closed loop");
    for model in report.models() {
        let svg = plot::throughput(&report, model).unwrap();
        well_formed(&svg);
        keep(&plot::throughput_file(model), &svg);
        assert!(width(&svg) <= 1000.0, "{model}: {} px wide", width(&svg));
        assert!(svg.contains("streams (log scale)") && svg.contains("pulses per second"));
        assert!(
            svg.contains("range of the repeats"),
            "{model}: the bars are not explained"
        );
        let rows: Vec<_> = report.closed_loop.iter().filter(|c| c.model == model).collect();
        let mut ends: Vec<(&str, f64)> = vec![];
        for row in &rows {
            let last = rows
                .iter()
                .filter(|r| r.system == row.system)
                .max_by_key(|r| r.streams)
                .unwrap();
            if !ends.iter().any(|(l, _)| *l == row.label) {
                ends.push((&row.label, last.median));
            }
        }
        ends.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut previous = f64::MIN;
        for (label, _) in &ends {
            let at = texts_at(&svg, label);
            assert_eq!(at.len(), 1, "{model}: {label:?} named once: {at:?}");
            let (x, y) = at[0];
            assert!(
                x > plot::THROUGHPUT_CHART_WIDTH as f64,
                "{model}: {label:?} at x={x} is inside the plotting area"
            );
            assert!(
                y > previous,
                "{model}: {label:?} at y={y} is out of the lines' end order: {ends:?}"
            );
            previous = y;
        }
    }
}

/// The latency plot names every real-time system with its capacity and
/// p99, in the order of the p99s, on a log time axis with the tail scale's
/// ticks and the budget drawn.
#[test]
fn latency_cdf_names_every_system_in_p99_order_with_the_budget() {
    let report = stored();
    assert!(!report.real_time.is_empty(), "the stored report has real-time searches");
    let svg = plot::latency_cdf(&report).unwrap();
    well_formed(&svg);
    keep("latency-cdf.svg", &svg);
    assert!(width(&svg) <= 1000.0);
    assert!(svg.contains("latency, ms (log scale)") && svg.contains("(tail scale)"));
    for tick in ["90%", "99%"] {
        assert_eq!(texts_at(&svg, tick).len(), 1, "no {tick} tick");
    }
    let budget = report.real_time[0].budget_ms;
    assert_eq!(
        texts_at(&svg, &format!("budget {budget:.0} ms")).len(),
        1,
        "the budget is not drawn"
    );
    let mut rows: Vec<(f64, f64)> = vec![];
    for rt in &report.real_time {
        let needle = format!(": {} ({} streams)", rt.system, rt.capacity);
        let line = svg
            .lines()
            .find(|l| l.trim_end().ends_with(&needle) && l.trim_start().starts_with("p99 "))
            .unwrap_or_else(|| panic!("no legend row for {}", rt.system));
        let p99: f64 = line.trim_start()["p99 ".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let (_, y) = texts_at(&svg, line.trim())[0];
        rows.push((y, p99));
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(
        rows.windows(2).all(|w| w[0].1 <= w[1].1),
        "legend rows top to bottom are not in p99 order: {rows:?}"
    );
}

/// The p99-against-load plot has a panel per real-time system, each
/// naming it in full (no caption cut) and its capacity, at page width.
#[test]
fn p99_against_load_has_a_whole_caption_per_panel() {
    let report = stored();
    let svg = plot::p99_against_load(&report).unwrap();
    well_formed(&svg);
    keep("p99-against-load.svg", &svg);
    assert!(width(&svg) <= 1000.0, "{} px wide", width(&svg));
    let texts: Vec<&str> = svg.lines().map(str::trim).filter(|l| !l.starts_with('<')).collect();
    for rt in &report.real_time {
        // Two systems may share a short name (the two lingers): the
        // caption is whole if some panel's lines, read on, spell it.
        let opening = format!("[{}] ", rt.short);
        let wanted = format!("{opening}{}", rt.system);
        let whole = texts
            .iter()
            .enumerate()
            .filter(|(_, t)| t.starts_with(&opening))
            .any(|(first, _)| {
                let mut caption = texts[first].to_string();
                let mut next = first + 1;
                while caption.len() < wanted.len() && next < texts.len() {
                    caption = format!("{caption} {}", texts[next]);
                    next += 1;
                }
                caption == wanted
            });
        assert!(whole, "{wanted:?}: no panel spells this caption whole");
    }
    let capacities = svg.lines().filter(|l| l.trim_start().starts_with("capacity ")).count();
    assert_eq!(capacities, report.real_time.len());
}

/// The markdown tables carry every system and the machine facts.
#[test]
fn markdown_tables_carry_every_system_and_the_machine() {
    let report = stored();
    let md = report::markdown(&report);
    assert!(md.contains(&report.machine.tract_version) && md.contains(&report.machine.commit));
    for row in &report.closed_loop {
        assert!(md.contains(&format!("| {} | {} |", row.streams, row.label)));
    }
    for rt in &report.real_time {
        assert!(md.contains(&format!("| {} | {} |", rt.system, rt.capacity)));
    }
}
