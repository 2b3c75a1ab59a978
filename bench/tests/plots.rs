//! Every plot renders from a stored report (a real `--quick` run's
//! `report.json`), names every system it plots, and keeps its legend out
//! of the plotting area.

use laned_bench::plot;
use laned_bench::report::{self, Report};

fn stored() -> Report {
    let text = include_str!("data/report.json");
    serde_json::from_str(text).expect("the stored report parses")
}

/// The y of every `<text>` element whose content is exactly `content`
/// (plotters writes it on a line of its own).
fn text_ys(svg: &str, content: &str) -> Vec<f64> {
    let mut ys = vec![];
    let mut from = 0;
    while let Some(found) = svg[from..].find(content) {
        let at = from + found;
        from = at + content.len();
        let before = svg[..at].trim_end();
        let after = svg[from..].trim_start();
        if !(before.ends_with('>') && after.starts_with("</text>")) {
            continue;
        }
        let open = before.rfind("<text").expect("a text element opens before its content");
        let y = before[open..]
            .split(" y=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .and_then(|v| v.parse().ok())
            .expect("a text element has a y");
        ys.push(y);
    }
    ys
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

/// Each model's throughput plot names every system of that model once, in
/// a legend below the plotting area, and titles both axes with units.
#[test]
fn throughput_plots_name_every_system_below_the_plot() {
    let report = stored();
    assert!(!report.models().is_empty(), "the stored report has a closed loop");
    for model in report.models() {
        let svg = plot::throughput(&report, model).unwrap();
        well_formed(&svg);
        keep(&plot::throughput_file(model), &svg);
        assert!(svg.contains("streams (log scale)") && svg.contains("pulses per second"));
        let mut labels: Vec<&str> = report
            .closed_loop
            .iter()
            .filter(|c| c.model == model)
            .map(|c| c.label.as_str())
            .collect();
        labels.sort();
        labels.dedup();
        for label in labels {
            let ys = text_ys(&svg, label);
            assert_eq!(ys.len(), 1, "{model}: {label:?} in the legend once: {ys:?}");
            assert!(
                ys[0] > 460.0,
                "{model}: {label:?}'s legend row at y={} is inside the plot",
                ys[0]
            );
        }
    }
}

/// The latency CDF names every real-time system with its capacity, below
/// the plot, on a log time axis.
#[test]
fn latency_cdf_names_every_real_time_system() {
    let report = stored();
    assert!(!report.real_time.is_empty(), "the stored report has real-time searches");
    let svg = plot::latency_cdf(&report).unwrap();
    well_formed(&svg);
    keep("latency-cdf.svg", &svg);
    assert!(svg.contains("latency, ms (log scale)"));
    for rt in &report.real_time {
        let label = format!("{} ({} streams)", rt.system, rt.capacity);
        let ys = text_ys(&svg, &label);
        assert_eq!(ys.len(), 1, "{label:?}: {ys:?}");
        assert!(ys[0] > 460.0, "{label:?} inside the plot");
    }
}

/// The p99-against-load plot has a panel per real-time system, each
/// naming it and its capacity.
#[test]
fn p99_against_load_has_a_panel_per_system() {
    let report = stored();
    let svg = plot::p99_against_load(&report).unwrap();
    well_formed(&svg);
    keep("p99-against-load.svg", &svg);
    for rt in &report.real_time {
        let caption = svg.lines().any(|l| l.trim_end().ends_with(&format!("[{}]", rt.short)));
        assert!(caption, "no panel for {}", rt.short);
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
