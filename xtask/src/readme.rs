//! The README's figures carry their provenance: every `##` section of the
//! front page that gives a measured figure (a decimal like `0.97` or a
//! ratio like `9.5x`, outside code blocks) says in one line when, at which
//! commit and on how quiet a machine it was measured:
//!
//! ```text
//! Measured 2026-12-02 at commit 1a2b3c4, load average 0.31 at its start, ...
//! ```
//!
//! A load average above [`QUIET`] is not a quiet machine (builds beside a
//! bench move its figures). Each such section also names the record its
//! figures come from: a record file of `bench/records/` (the whole file is
//! the record), written bare or as a link,
//!
//! ```text
//! Record: bench/records/2026-12-04-small-models-pay.md.
//! Record: [bench/records/2026-12-04-small-models-pay.md](bench/records/2026-12-04-small-models-pay.md).
//! ```
//!
//! or, the older form, a section of `BENCHMARKS.md` by its heading:
//!
//! ```text
//! Record: BENCHMARKS.md, "2026-12-04: small models pay".
//! ```
//!
//! and every figure sits in a table row that the record holds word for
//! word (the model, the system the figure is of, the figures): a row whose
//! figures or system were changed on the front page alone, or a figure
//! written in prose, fails. The unit tests run this on the workspace's
//! README and the records it names (CI runs them with the rest of the
//! suite) and on pinned bad cases, so a figure pasted without its stamp or
//! its record fails CI.

/// The most load average a front-page figure may have been measured at.
pub const QUIET: f64 = 1.0;

/// A word that is a figure: `0.97`, `12.5`, `9.5x`, `3x` (not a version
/// like `0.23.9`, not a plain integer such as a port or a count).
fn is_figure(word: &str) -> bool {
    let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '.');
    let w = w.trim_end_matches('.');
    let (number, ratio) = match w.strip_suffix('x') {
        Some(n) => (n, true),
        None => (w, false),
    };
    let mut parts = number.split('.');
    let whole = parts.next().unwrap_or("");
    let frac = parts.next();
    if parts.next().is_some() || whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    match frac {
        Some(f) => !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()),
        None => ratio,
    }
}

/// The stamp on `line`, if it is one: its date, commit and load average.
pub fn stamp(line: &str) -> Option<(String, String, f64)> {
    let rest = line.trim().strip_prefix("Measured ")?;
    let (date, rest) = rest.split_once(" at commit ")?;
    let ok_date = date.len() == 10
        && date.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    let commit: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
    let load = rest.split_once("load average ")?.1;
    let load: String = load.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let load = load.trim_end_matches('.').parse().ok()?;
    (ok_date && commit.len() >= 7).then(|| (date.to_string(), commit, load))
}

/// `readme`'s sections by heading (`#` and `##`), each with its lines
/// outside code blocks; what comes before the first heading is "(top)".
fn sections(readme: &str) -> Vec<(String, Vec<&str>)> {
    let mut sections: Vec<(String, Vec<&str>)> = vec![("(top)".into(), vec![])];
    let mut in_code = false;
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if line.starts_with("## ") || line.starts_with("# ") {
            sections.push((line.to_string(), vec![]));
        } else if let Some((_, lines)) = sections.last_mut() {
            lines.push(line);
        }
    }
    sections
}

/// What is wrong with `readme`'s figures, a line per section; empty when
/// every figure is stamped by a quiet run.
pub fn unstamped(readme: &str) -> Vec<String> {
    let mut problems = vec![];
    for (heading, lines) in sections(readme) {
        let figures: Vec<&str> = lines
            .iter()
            .flat_map(|l| l.split(|c: char| c.is_whitespace() || c == '|' || c == '/'))
            .filter(|w| is_figure(w))
            .collect();
        if figures.is_empty() {
            continue;
        }
        let stamps: Vec<_> = lines.iter().filter_map(|l| stamp(l)).collect();
        match stamps.as_slice() {
            [] => problems.push(format!(
                "{heading}: figures ({}) without a line \"Measured YYYY-MM-DD at commit HASH, load average L ...\"",
                figures.join(", ")
            )),
            stamps => {
                for (date, commit, load) in stamps {
                    if *load > QUIET {
                        problems.push(format!(
                            "{heading}: measured {date} at {commit} at load average {load}, above {QUIET}: not a quiet machine"
                        ));
                    }
                }
            }
        }
    }
    problems
}

/// The record a `Record:` line names.
#[derive(Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// `Record: BENCHMARKS.md, "HEADING"`: that `##` section of BENCHMARKS.md.
    Heading(&'a str),
    /// `Record: bench/records/NAME.md` (or a link to it): that whole file.
    File(&'a str),
}

/// Where the record files live, from the workspace root.
pub const RECORDS: &str = "bench/records/";

/// The record a line names: `Record: BENCHMARKS.md, "HEADING"`, or
/// `Record: bench/records/NAME.md`, bare or as a markdown link
/// `[text](bench/records/NAME.md)`, a full stop or comma after it allowed.
/// A file outside `bench/records/`, not `.md`, or climbing out with `..`
/// is no record.
pub fn record(line: &str) -> Option<Record<'_>> {
    let rest = line.trim().strip_prefix("Record: ")?;
    if let Some(heading) = rest.strip_prefix("BENCHMARKS.md, \"") {
        return Some(Record::Heading(&heading[..heading.find('"')?]));
    }
    let path = match rest.strip_prefix('[') {
        Some(link) => {
            let target = &link[link.find("](")? + 2..];
            &target[..target.find(')')?]
        }
        None => rest.split_whitespace().next()?.trim_end_matches(['.', ',', ';']),
    };
    let name = path.strip_prefix(RECORDS)?;
    (name.ends_with(".md") && !name.contains('/') && !name.contains("..") && name.len() > 3)
        .then_some(Record::File(path))
}

/// The lines of `benchmarks` under `## heading`, to the next `## `.
fn record_section<'a>(benchmarks: &'a str, heading: &str) -> Option<Vec<&'a str>> {
    let wanted = format!("## {heading}");
    let mut lines = benchmarks.lines().skip_while(|l| l.trim_end() != wanted);
    lines.next()?;
    Some(lines.take_while(|l| !l.starts_with("## ")).collect())
}

/// What ties `readme`'s figures to their records fails to, a line each:
/// a section with figures and no record named, a record not found, a
/// figure outside a table row, a row the record does not hold. `read`
/// gives a file's text by its path from the workspace root
/// (`BENCHMARKS.md`, `bench/records/NAME.md`), `None` where there is none.
pub fn untied(readme: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut problems = vec![];
    for (heading, lines) in sections(readme) {
        let figured: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| stamp(l).is_none() && record(l).is_none())
            .filter(|l| {
                l.split(|c: char| c.is_whitespace() || c == '|' || c == '/')
                    .any(is_figure)
            })
            .collect();
        if figured.is_empty() {
            continue;
        }
        let Some(named) = lines.iter().find_map(|l| record(l)) else {
            problems.push(format!(
                "{heading}: figures without a line \"Record: bench/records/NAME.md\" (or \"Record: BENCHMARKS.md, \\\"HEADING\\\"\")"
            ));
            continue;
        };
        let text;
        let held: Vec<&str> = match named {
            Record::Heading(name) => {
                text = read("BENCHMARKS.md").unwrap_or_default();
                match record_section(&text, name) {
                    Some(held) => held,
                    None => {
                        problems.push(format!(
                            "{heading}: the record it names is not a heading of BENCHMARKS.md"
                        ));
                        continue;
                    }
                }
            }
            Record::File(path) => match read(path) {
                Some(file) => {
                    text = file;
                    text.lines().collect()
                }
                None => {
                    problems.push(format!("{heading}: the record it names, {path}, is not a file"));
                    continue;
                }
            },
        };
        for line in figured {
            if !line.trim_start().starts_with('|') {
                problems.push(format!("{heading}: a figure outside a table row: {line}"));
            } else if !held.iter().any(|h| h.trim() == line.trim()) {
                problems.push(format!("{heading}: the record does not hold this row: {line}"));
            }
        }
    }
    problems
}

/// The commits the stamps of `readme` name.
pub fn commits(readme: &str) -> Vec<String> {
    readme.lines().filter_map(stamp).map(|(_, c, _)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workspace README: every figure stamped by a quiet run, and each
    /// stamp's commit in this repository's history (where git can tell:
    /// not in a shallow clone).
    #[test]
    fn the_readme_figures_carry_a_date_a_commit_and_a_quiet_load() {
        let readme = include_str!("../../README.md");
        let problems = unstamped(readme);
        assert!(problems.is_empty(), "README.md:\n{}", problems.join("\n"));
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let read = |path: &str| std::fs::read_to_string(root.join(path)).ok();
        let problems = untied(readme, &read);
        assert!(
            problems.is_empty(),
            "README.md against its records:\n{}",
            problems.join("\n")
        );
        let shallow = std::process::Command::new("git")
            .args(["rev-parse", "--is-shallow-repository"])
            .output();
        match shallow {
            Ok(out) if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "false" => {
                for commit in commits(readme) {
                    let known = std::process::Command::new("git")
                        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
                        .status()
                        .unwrap();
                    assert!(known.success(), "README.md names commit {commit}, not in this history");
                }
            }
            _ => eprintln!("not a full git clone here: the stamps' commits are not looked up"),
        }
    }

    /// Pinned cases of the record check: a row the record holds, the same
    /// row relabelled to another system or with a figure changed, a figure
    /// in prose, a record not named, a record that is not there.
    #[test]
    fn figures_must_be_rows_of_their_record() {
        let benchmarks = "# B\n\n## 2026-12-04: run\n\n| model | system | 1 |\n| gru | ours (tasks, combining) | 0.97x |\n\n## older\n\n| gru | ours (threads, worker) | 0.50x |\n";
        let benchmarks = |path: &str| (path == "BENCHMARKS.md").then(|| benchmarks.to_string());
        let benchmarks = &benchmarks;
        let page = |row: &str, record: &str| {
            format!("## Where\n\nMeasured 2026-12-04 at commit 1a2b3c4, load average 0.2 at its start.\n{record}\n\n| model | system | 1 |\n|---|---|---|\n{row}\n")
        };
        let named = "Record: BENCHMARKS.md, \"2026-12-04: run\".";
        assert_eq!(
            untied(&page("| gru | ours (tasks, combining) | 0.97x |", named), benchmarks),
            Vec::<String>::new()
        );
        let relabelled = untied(&page("| gru | ours (threads, worker) | 0.97x |", named), benchmarks);
        assert_eq!(relabelled.len(), 1, "{relabelled:?}");
        assert!(relabelled[0].contains("does not hold"), "{relabelled:?}");
        let changed = untied(&page("| gru | ours (tasks, combining) | 0.99x |", named), benchmarks);
        assert_eq!(changed.len(), 1, "{changed:?}");
        // The row of another record does not count.
        let elsewhere = untied(&page("| gru | ours (threads, worker) | 0.50x |", named), benchmarks);
        assert_eq!(elsewhere.len(), 1, "{elsewhere:?}");
        let prose = untied(
            &format!(
                "{}\nours is 0.97x here\n",
                page("| gru | ours (tasks, combining) | 0.97x |", named)
            ),
            benchmarks,
        );
        assert!(
            prose.len() == 1 && prose[0].contains("outside a table row"),
            "{prose:?}"
        );
        let unnamed = untied(&page("| gru | ours (tasks, combining) | 0.97x |", ""), benchmarks);
        assert!(
            unnamed.len() == 1 && unnamed[0].contains("without a line"),
            "{unnamed:?}"
        );
        let missing = untied(
            &page(
                "| gru | ours (tasks, combining) | 0.97x |",
                "Record: BENCHMARKS.md, \"nowhere\".",
            ),
            benchmarks,
        );
        assert!(
            missing.len() == 1 && missing[0].contains("not a heading"),
            "{missing:?}"
        );
    }

    /// Pinned cases of the record-file form: a row its file holds, bare or
    /// linked; a row only another file holds; a figure changed; a file
    /// that is not there; and paths that are no record file.
    #[test]
    fn figures_must_be_rows_of_their_record_file() {
        let files = |path: &str| match path {
            "bench/records/2026-12-04-run.md" => Some(
                "## 2026-12-04: run\n\n| model | system | 1 |\n| gru | ours (tasks, combining) | 0.97x |\n".to_string(),
            ),
            "bench/records/2026-12-03-older.md" => {
                Some("## 2026-12-03: older\n\n| gru | ours (threads, worker) | 0.50x |\n".to_string())
            }
            // The old form's file holds the row too: it must not count.
            "BENCHMARKS.md" => Some("## 2026-12-04: run\n\n| gru | ours (threads, worker) | 0.97x |\n".to_string()),
            _ => None,
        };
        let page = |row: &str, record: &str| {
            format!("## Where\n\nMeasured 2026-12-04 at commit 1a2b3c4, load average 0.2 at its start.\n{record}\n\n| model | system | 1 |\n|---|---|---|\n{row}\n")
        };
        let bare = "Record: bench/records/2026-12-04-run.md.";
        let linked = "Record: [bench/records/2026-12-04-run.md](bench/records/2026-12-04-run.md).";
        let row = "| gru | ours (tasks, combining) | 0.97x |";
        assert_eq!(untied(&page(row, bare), &files), Vec::<String>::new());
        assert_eq!(untied(&page(row, linked), &files), Vec::<String>::new());
        let elsewhere = untied(&page("| gru | ours (threads, worker) | 0.50x |", bare), &files);
        assert!(
            elsewhere.len() == 1 && elsewhere[0].contains("does not hold"),
            "{elsewhere:?}"
        );
        let relabelled = untied(&page("| gru | ours (threads, worker) | 0.97x |", linked), &files);
        assert!(
            relabelled.len() == 1 && relabelled[0].contains("does not hold"),
            "{relabelled:?}"
        );
        let changed = untied(&page("| gru | ours (tasks, combining) | 0.99x |", bare), &files);
        assert_eq!(changed.len(), 1, "{changed:?}");
        let missing = untied(&page(row, "Record: bench/records/2026-12-05-nowhere.md."), &files);
        assert!(
            missing.len() == 1 && missing[0].contains("is not a file"),
            "{missing:?}"
        );
        for not_a_record in [
            "Record: bench/records/../../README.md",
            "Record: bench/records/sub/x.md",
            "Record: bench/records/x.txt",
            "Record: docs/x.md",
            "Record: [x](bench/records/x.txt)",
        ] {
            assert_eq!(record(not_a_record), None, "{not_a_record}");
            let unnamed = untied(&page(row, not_a_record), &files);
            assert!(
                unnamed.len() == 1 && unnamed[0].contains("without a line"),
                "{not_a_record}: {unnamed:?}"
            );
        }
        assert_eq!(
            record("Record: BENCHMARKS.md, \"2026-12-04: run\"."),
            Some(Record::Heading("2026-12-04: run"))
        );
        assert_eq!(record(linked), Some(Record::File("bench/records/2026-12-04-run.md")));
    }

    /// Pinned cases: a figure without a stamp, a stamp from a loaded
    /// machine, and a stamped section, a version and a code block that are
    /// not figures.
    #[test]
    fn figures_without_a_quiet_stamp_are_found() {
        let bad = "# t\n\n## Where\n\n| model | ratio |\n|---|---|\n| a | 9.5x |\n";
        let found = unstamped(bad);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("## Where") && found[0].contains("9.5x"), "{found:?}");
        let loaded =
            "## Where\n\nMeasured 2026-12-02 at commit 1a2b3c4, load average 2.5 at its start.\n\nours is 1.25 of it\n";
        let found = unstamped(loaded);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("not a quiet machine"), "{found:?}");
        let fine = "## Where\n\nMeasured 2026-12-02 at commit 1a2b3c4, load average 0.3 at its start.\n\n| a | 0.97 |\n\n## Other\n\ntract 0.23.9 on port 8080\n\n```\nx = 1.5\n```\n";
        assert_eq!(unstamped(fine), Vec::<String>::new());
        assert_eq!(commits(fine), vec!["1a2b3c4".to_string()]);
        assert!(is_figure("(0.97,") && is_figure("3x") && is_figure("12.5x"));
        assert!(!is_figure("0.23.9") && !is_figure("8080") && !is_figure("x") && !is_figure("1."));
    }
}
