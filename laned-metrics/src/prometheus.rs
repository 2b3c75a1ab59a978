//! The Prometheus text exposition of a [`Snapshot`]: tract's names
//! (`tract_autobatch_*`) for the six things tract-core's `LanedRunnable`
//! counts itself (turns, seats, seats per turn, lanes taken, queue wait,
//! turn time), ours (`laned_*`) for everything else (lanes, the queue,
//! admissions, refusals, failures, policy waits, deadline misses), the same
//! names the runner records through the `metrics` facade.

use std::fmt::Write;

use crate::{HistogramSnapshot, Snapshot};

/// Bucket bounds of the exported duration histograms, in seconds: fixed, so
/// the series stay the same from one scrape to the next.
const SECONDS: [f64; 17] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 1.0,
];

fn label_set(labels: &[(&str, &str)], extra: Option<(&str, String)>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            format!(
                "{k}=\"{}\"",
                v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
            )
        })
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn scalar(out: &mut String, name: &str, kind: &str, help: &str, labels: &[(&str, &str)], value: u64) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name}{} {value}", label_set(labels, None));
}

fn durations(out: &mut String, name: &str, help: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
    header(out, name, "histogram", help);
    for le in SECONDS {
        let n = h.count_at_most((le * 1e9) as u64);
        let _ = writeln!(
            out,
            "{name}_bucket{} {n}",
            label_set(labels, Some(("le", format!("{le}"))))
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{} {}",
        label_set(labels, Some(("le", "+Inf".into()))),
        h.count
    );
    let _ = writeln!(out, "{name}_sum{} {}", label_set(labels, None), h.sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{name}_count{} {}", label_set(labels, None), h.count);
}

pub(crate) fn render(s: &Snapshot, labels: &[(&str, &str)]) -> String {
    let mut out = String::new();
    scalar(
        &mut out,
        "tract_autobatch_turns_total",
        "counter",
        "Turns a laned runtime ran",
        labels,
        s.turns,
    );
    scalar(
        &mut out,
        "tract_autobatch_seats_total",
        "counter",
        "Seats filled over those turns",
        labels,
        s.seats,
    );
    header(
        &mut out,
        "tract_autobatch_seats_per_turn",
        "histogram",
        "Seats one turn filled",
    );
    let mut cumulative = 0;
    for (k, n) in s.occupancy.iter().enumerate() {
        cumulative += n;
        let _ = writeln!(
            out,
            "tract_autobatch_seats_per_turn_bucket{} {cumulative}",
            label_set(labels, Some(("le", k.to_string())))
        );
    }
    let _ = writeln!(
        out,
        "tract_autobatch_seats_per_turn_bucket{} {}",
        label_set(labels, Some(("le", "+Inf".into()))),
        s.turns
    );
    let _ = writeln!(
        out,
        "tract_autobatch_seats_per_turn_sum{} {}",
        label_set(labels, None),
        s.seats
    );
    let _ = writeln!(
        out,
        "tract_autobatch_seats_per_turn_count{} {}",
        label_set(labels, None),
        s.turns
    );
    scalar(
        &mut out,
        "tract_autobatch_lanes_taken",
        "gauge",
        "Lanes held by streams",
        labels,
        s.lanes_taken,
    );
    scalar(
        &mut out,
        "laned_lanes_max",
        "gauge",
        "Lanes there are",
        labels,
        s.lanes_max,
    );
    scalar(
        &mut out,
        "laned_lanes_free",
        "gauge",
        "Lanes free for a new stream",
        labels,
        s.lanes_free(),
    );
    scalar(
        &mut out,
        "laned_seats_queued",
        "gauge",
        "Seats queued for a turn",
        labels,
        s.seats_queued,
    );
    scalar(
        &mut out,
        "laned_learned_width",
        "gauge",
        "The turn width learned to cost least per row, where it caps turns (0: no cap)",
        labels,
        s.learned_width,
    );
    scalar(
        &mut out,
        "laned_spawners_waiting",
        "gauge",
        "Spawners waiting for a lane",
        labels,
        s.spawners_waiting,
    );
    durations(
        &mut out,
        "tract_autobatch_queue_wait_seconds",
        "From a seat queued to the start of the turn seating it, linger included",
        labels,
        &s.queue_wait,
    );
    durations(
        &mut out,
        "tract_autobatch_turn_seconds",
        "One turn, stacking and slicing included",
        labels,
        &s.turn_time,
    );
    scalar(
        &mut out,
        "laned_admissions_total",
        "counter",
        "Streams given a lane",
        labels,
        s.admissions,
    );
    scalar(
        &mut out,
        "laned_admissions_waited_total",
        "counter",
        "Streams given a lane after waiting for one",
        labels,
        s.admissions_waited,
    );
    durations(
        &mut out,
        "laned_admission_wait_seconds",
        "How long admitted streams waited for a lane",
        labels,
        &s.admission_wait,
    );
    scalar(
        &mut out,
        "laned_admissions_refused_total",
        "counter",
        "Streams refused a lane",
        labels,
        s.admissions_refused,
    );
    scalar(
        &mut out,
        "laned_failed_seats_total",
        "counter",
        "Seats answered with an error",
        labels,
        s.failed_seats,
    );
    scalar(
        &mut out,
        "laned_failed_turns_total",
        "counter",
        "Turns that failed as a whole",
        labels,
        s.failed_turns,
    );
    durations(
        &mut out,
        "laned_policy_wait_seconds",
        "Waits the turn policy chose before turns",
        labels,
        &s.policy_waits,
    );
    scalar(
        &mut out,
        "laned_deadline_misses_total",
        "counter",
        "Seats answered later than the LatencyBudget policy's budget (not DeadlineExceeded calls)",
        labels,
        s.deadline_misses,
    );
    scalar(
        &mut out,
        "laned_policy_changes_total",
        "counter",
        "Changes of the turn policy or max_seats while serving",
        labels,
        s.policy_changes,
    );
    for (name, help, value) in [
        ("laned_evictions_total", "Streams evicted for being idle", s.evictions),
        (
            "laned_cancelled_total",
            "Calls answered Cancelled, withdrawn unserved",
            s.cancelled,
        ),
        (
            "laned_deadline_exceeded_total",
            "Calls answered DeadlineExceeded: their deadline passed before they were seated",
            s.deadline_exceeded,
        ),
        (
            "laned_lost_streams_total",
            "Streams that lost their state in a failed turn or a rebuilt state",
            s.lost_streams,
        ),
        (
            "laned_rebuilt_states_total",
            "States rebuilt after a failed turn that could not be cleaned",
            s.rebuilt_states,
        ),
    ] {
        scalar(&mut out, name, "counter", help, labels, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::Metrics;

    #[test]
    fn renders_tract_names_with_labels_and_cumulative_buckets() {
        let m = Metrics::new(3);
        m.record_turn(1, Duration::from_micros(3));
        m.record_turn(3, Duration::from_millis(3));
        m.record_queue_wait(Duration::from_micros(20));
        let text = m.snapshot().to_prometheus(&[("runnable", "tdnn \"light\"")]);
        let l = "runnable=\"tdnn \\\"light\\\"\"";
        for line in [
            "# TYPE tract_autobatch_turns_total counter".to_string(),
            format!("tract_autobatch_turns_total{{{l}}} 2"),
            format!("tract_autobatch_seats_total{{{l}}} 4"),
            format!("tract_autobatch_seats_per_turn_bucket{{{l},le=\"1\"}} 1"),
            format!("tract_autobatch_seats_per_turn_bucket{{{l},le=\"2\"}} 1"),
            format!("tract_autobatch_seats_per_turn_bucket{{{l},le=\"3\"}} 2"),
            format!("tract_autobatch_turn_seconds_bucket{{{l},le=\"0.00001\"}} 1"),
            format!("tract_autobatch_turn_seconds_bucket{{{l},le=\"0.005\"}} 2"),
            format!("tract_autobatch_turn_seconds_count{{{l}}} 2"),
            format!("tract_autobatch_queue_wait_seconds_bucket{{{l},le=\"0.00001\"}} 0"),
            format!("tract_autobatch_queue_wait_seconds_bucket{{{l},le=\"0.000025\"}} 1"),
            format!("laned_failed_turns_total{{{l}}} 0"),
        ] {
            assert!(text.lines().any(|x| x == line), "missing {line:?} in\n{text}");
        }
    }

    /// tract's names carry only what tract's runner counts itself; every
    /// other series is ours, under `laned_`.
    #[test]
    fn tracts_names_only_for_what_tract_counts() {
        const TRACTS: [&str; 6] = [
            "tract_autobatch_turns_total",
            "tract_autobatch_seats_total",
            "tract_autobatch_seats_per_turn",
            "tract_autobatch_lanes_taken",
            "tract_autobatch_queue_wait_seconds",
            "tract_autobatch_turn_seconds",
        ];
        let text = Metrics::new(2).snapshot().to_prometheus(&[]);
        let names: std::collections::BTreeSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let (tract, ours): (Vec<&str>, Vec<&str>) = names.iter().partition(|n| n.starts_with("tract_autobatch_"));
        assert_eq!(tract.len(), 6, "{tract:?}");
        assert!(tract.iter().all(|n| TRACTS.contains(n)), "{tract:?}");
        assert!(ours.iter().all(|n| n.starts_with("laned_")), "{ours:?}");
        for name in [
            "laned_admissions_refused_total",
            "laned_failed_turns_total",
            "laned_failed_seats_total",
            "laned_deadline_misses_total",
            "laned_policy_wait_seconds",
            "laned_evictions_total",
            "laned_cancelled_total",
            "laned_deadline_exceeded_total",
            "laned_lost_streams_total",
            "laned_rebuilt_states_total",
        ] {
            assert!(ours.contains(&name), "{name} missing: {ours:?}");
        }
    }

    #[test]
    fn renders_without_labels() {
        let text = Metrics::new(1).snapshot().to_prometheus(&[]);
        assert!(text.lines().any(|l| l == "tract_autobatch_lanes_taken 0"), "{text}");
        for gauge in [
            "laned_lanes_max",
            "laned_lanes_free",
            "laned_seats_queued",
            "laned_learned_width",
            "laned_spawners_waiting",
        ] {
            assert!(text.lines().any(|l| l == format!("{gauge} 0")), "{gauge}: {text}");
        }
    }
}
