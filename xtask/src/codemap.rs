//! ARCHITECTURE.md's code map of `laned-runner` stays true: every source
//! file of the crate is named in its section (by its path under `src/`,
//! or by its name where the file is alone of that name), and every `.rs`
//! file the section names exists (under `src/`, or `tests/` for the
//! crate's tests). Run by the unit tests, so a file added,
//! renamed or removed without the map fails CI.

/// The `## `laned-runner`` section of `architecture`.
pub fn section(architecture: &str) -> String {
    architecture
        .lines()
        .skip_while(|l| l.trim() != "## `laned-runner`")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The backticked words of `text` that end in `.rs`.
fn named_files(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.ends_with(".rs") && !w.contains(' '))
        .collect()
}

/// What is wrong between `section` and the crate's `files` (paths under
/// `src/`), a line each.
pub fn drift(section: &str, files: &[String]) -> Vec<String> {
    let named = named_files(section);
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let mut problems = vec![];
    for file in files {
        let alone = files.iter().filter(|f| base(f) == base(file)).count() == 1;
        let listed = named.iter().any(|n| *n == file || n.ends_with(&format!("/{file}")))
            || (alone && named.iter().any(|n| base(n) == base(file)));
        if !listed {
            problems.push(format!("laned-runner/src/{file} is not in ARCHITECTURE.md's code map"));
        }
    }
    // The crate's tests (`tests/...`) are outside `src/`: looked up apart.
    for n in named.into_iter().filter(|n| !n.starts_with("tests/")) {
        let exists = files
            .iter()
            .any(|f| f == n || n.ends_with(&format!("/{f}")) || base(f) == base(n));
        if !exists {
            problems.push(format!(
                "ARCHITECTURE.md's code map names {n}, which laned-runner/src does not have"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(dir: &std::path::Path, under: &str, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let rel = if under.is_empty() {
                name.clone()
            } else {
                format!("{under}/{name}")
            };
            if path.is_dir() {
                sources(&path, &rel, out);
            } else if name.ends_with(".rs") {
                out.push(rel);
            }
        }
    }

    /// The workspace's map against the crate's files as they are.
    #[test]
    fn the_code_map_names_every_runner_file_and_no_other() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![];
        sources(&root.join("laned-runner/src"), "", &mut files);
        assert!(files.len() > 20, "{files:?}");
        let map = section(&std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap());
        let problems = drift(&map, &files);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        for test in named_files(&map).into_iter().filter(|n| n.starts_with("tests/")) {
            assert!(
                root.join("laned-runner").join(test).exists(),
                "the code map names laned-runner/{test}"
            );
        }
    }

    /// Pinned cases: a file missing, a file named that is gone, a `mod.rs`
    /// named by its folder's path, a name shared by two files.
    #[test]
    fn drift_is_found_both_ways() {
        let files: Vec<String> = ["lib.rs", "a.rs", "shard/mod.rs", "engine/mod.rs"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let map = "- `lib.rs`, `a.rs`: x\n- `shard/mod.rs` and `engine/mod.rs`";
        assert_eq!(drift(map, &files), Vec::<String>::new());
        let missing = drift("- `lib.rs`, `shard/mod.rs`, `engine/mod.rs`", &files);
        assert_eq!(
            missing,
            vec!["laned-runner/src/a.rs is not in ARCHITECTURE.md's code map"]
        );
        let gone = drift(&format!("{map} `b.rs`"), &files);
        assert_eq!(
            gone,
            vec!["ARCHITECTURE.md's code map names b.rs, which laned-runner/src does not have"]
        );
        // `mod.rs` alone does not say which of the two.
        let vague = drift("- `lib.rs`, `a.rs`, `mod.rs`", &files);
        assert_eq!(vague.len(), 2, "{vague:?}");
    }
}
