//! ARCHITECTURE.md's code map of `laned-runner` stays true: every source
//! file of the crate is named in its section (by its path under `src/`,
//! or by its name where the file is alone of that name), and every `.rs`
//! file the section names exists (under `src/`, or `tests/` for the
//! crate's tests). And the map's `Two-way pairs:` line names exactly the
//! pairs of modules that use each other (read off the `crate::` paths of
//! the code, a re-exported item counting as `lib`'s). Run by the unit
//! tests, so a file added, renamed or removed, or a dependency turned
//! round, without the map fails CI.

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
        // A bare name stands for the one file of that name; a path must be
        // the file's.
        let listed = named.iter().any(|n| *n == file || n.ends_with(&format!("/{file}")))
            || (alone && named.iter().any(|n| !n.contains('/') && *n == base(file)));
        if !listed {
            problems.push(format!("laned-runner/src/{file} is not in ARCHITECTURE.md's code map"));
        }
    }
    // The crate's tests (`tests/...`) are outside `src/`: looked up apart.
    for n in named.into_iter().filter(|n| !n.starts_with("tests/")) {
        let exists = files
            .iter()
            .any(|f| f == n || n.ends_with(&format!("/{f}")) || (!n.contains('/') && base(f) == n));
        if !exists {
            problems.push(format!(
                "ARCHITECTURE.md's code map names {n}, which laned-runner/src does not have"
            ));
        }
    }
    problems
}

/// The module a source file (its path under `src/`) belongs to: its
/// first path segment, `.rs` dropped.
fn module_of(file: &str) -> &str {
    let first = file.split('/').next().unwrap_or(file);
    first.strip_suffix(".rs").unwrap_or(first)
}

/// The modules a file's code (comments left out) names through `crate::`
/// paths: `crate::a::...` is `a`, `crate::{a, b::c}` is `a` and `b`; an
/// item re-exported at the root (`crate::Name`, capitalised or a constant)
/// is `lib`'s.
fn uses(code: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let word = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut name = |w: String| {
        if w.chars().next().is_some_and(|c| c.is_uppercase()) {
            out.insert("lib".to_string());
        } else if !w.is_empty() {
            out.insert(w);
        }
    };
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (i, _) in line.match_indices("crate::") {
            let rest = &line[i + "crate::".len()..];
            match rest.strip_prefix('{') {
                // One level of braces: the first segment of each item.
                Some(list) => {
                    let mut depth = 0usize;
                    let mut start = true;
                    for (j, c) in list.char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 0 => break,
                            '}' => depth -= 1,
                            ',' if depth == 0 => start = true,
                            c if start && !c.is_whitespace() => {
                                start = false;
                                name(word(&list[j..]));
                            }
                            _ => (),
                        }
                    }
                }
                None => name(word(rest)),
            }
        }
    }
    out
}

/// The pairs of modules that use each other, given each source file (path
/// under `src/`) and its text: the crate's top-level modules (`lib.rs` uses
/// every module it declares), and within a folder its files (`shard/mod`,
/// `shard/worker`: a `super::name` path names the sibling file `name`, or
/// else the folder's `mod.rs`, which uses the files it declares).
pub fn two_way_pairs(sources: &[(String, String)]) -> Vec<(String, String)> {
    use std::collections::{BTreeMap, BTreeSet};
    let declared = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim_start)
            .filter_map(|l| l.strip_prefix("pub mod ").or_else(|| l.strip_prefix("mod ")))
            .filter(|m| m.ends_with(';'))
            .map(|m| m.trim_end_matches(';').to_string())
            .collect()
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in sources {
        let from = module_of(file).to_string();
        let mut used = uses(text);
        if from == "lib" {
            used.extend(declared(text));
        }
        used.remove(&from);
        edges.entry(from).or_default().extend(used);
        // Within a folder.
        let Some((folder, name)) = file.split_once('/') else {
            continue;
        };
        let stem = |n: &str| n.strip_suffix(".rs").unwrap_or(n).to_string();
        let here = format!("{folder}/{}", stem(name));
        let siblings: BTreeSet<String> = sources
            .iter()
            .filter_map(|(f, _)| f.strip_prefix(&format!("{folder}/")).map(stem))
            .collect();
        let mut used: BTreeSet<String> = BTreeSet::new();
        // A file's own test module (at its end) says `super` for the file.
        let text = text.split("#[cfg(test)]").next().unwrap_or(text);
        let text = text.split("#[cfg(all(test").next().unwrap_or(text);
        for (i, _) in text.match_indices("super::") {
            let word: String = text[i + "super::".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let line_start = text[..i].rfind('\n').map_or(0, |n| n + 1);
            if text[line_start..i].trim_start().starts_with("//") || word.is_empty() {
                continue;
            }
            used.insert(if siblings.contains(&word) {
                word
            } else {
                "mod".to_string()
            });
        }
        if stem(name) == "mod" {
            used.extend(declared(text));
        }
        used.remove(&stem(name));
        edges
            .entry(here)
            .or_default()
            .extend(used.into_iter().map(|u| format!("{folder}/{u}")));
    }
    let mut pairs = vec![];
    for (a, used) in &edges {
        for b in used.iter().filter(|b| a < *b) {
            if edges.get(b).is_some_and(|back| back.contains(a)) {
                pairs.push((a.clone(), b.clone()));
            }
        }
    }
    pairs
}

/// The pairs the section's `Two-way pairs:` line names (`a` ↔ `b`, each
/// in backticks), or `None` without such a line.
pub fn named_pairs(section: &str) -> Option<Vec<(String, String)>> {
    let start = section.find("Two-way pairs:")?;
    let paragraph = section[start..].split("\n\n").next().unwrap_or_default();
    let paragraph = paragraph.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut pairs = vec![];
    for (i, _) in paragraph.match_indices("` ↔ `") {
        let before = &paragraph[..i];
        let after = &paragraph[i + "` ↔ `".len()..];
        let a = &before[before.rfind('`').map_or(0, |j| j + 1)..];
        let b = &after[..after.find('`').unwrap_or(after.len())];
        let (a, b) = (a.to_string(), b.to_string());
        pairs.push(if a < b { (a, b) } else { (b, a) });
    }
    pairs.sort();
    Some(pairs)
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

    /// The map's two-way pairs are the code's.
    #[test]
    fn the_code_map_names_the_two_way_pairs_the_code_has() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![];
        sources(&root.join("laned-runner/src"), "", &mut files);
        let texts: Vec<(String, String)> = files
            .iter()
            .map(|f| {
                (
                    f.clone(),
                    std::fs::read_to_string(root.join("laned-runner/src").join(f)).unwrap(),
                )
            })
            .collect();
        let map = section(&std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap());
        let named = named_pairs(&map).expect("ARCHITECTURE.md's code map has a `Two-way pairs:` line");
        assert_eq!(
            named,
            two_way_pairs(&texts),
            "ARCHITECTURE.md's two-way pairs against the code's"
        );
    }

    /// The server crate's fronts import no circle (issue 68): `server`
    /// starts the REST front (`v2`) and the gRPC front (`grpc`), and
    /// what their handlers share is `routes`', below all three; no two of
    /// them use each other.
    #[test]
    fn the_servers_routes_and_fronts_use_each_other_one_way() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![];
        sources(&root.join("server/src"), "", &mut files);
        let texts: Vec<(String, String)> = files
            .iter()
            .filter(|f| !f.starts_with("bin/"))
            .map(|f| {
                (
                    f.clone(),
                    std::fs::read_to_string(root.join("server/src").join(f)).unwrap(),
                )
            })
            .collect();
        assert!(texts.iter().any(|(f, _)| f == "routes.rs"), "{files:?}");
        let fronts = ["server", "v2", "grpc", "routes"];
        let circles: Vec<(String, String)> = two_way_pairs(&texts)
            .into_iter()
            .filter(|(a, b)| fronts.contains(&a.as_str()) && fronts.contains(&b.as_str()))
            .collect();
        assert_eq!(
            circles,
            vec![],
            "server/src: modules among {fronts:?} that use each other"
        );
    }

    /// Pinned cases of reading the code: a plain path, braces, a
    /// re-exported item, a comment left out, a module declared by `lib.rs`.
    #[test]
    fn two_way_pairs_are_read_off_crate_paths() {
        let src = |f: &str, t: &str| (f.to_string(), t.to_string());
        // Each case would add a pair if misread: `c` uses `a` and `b`, so
        // counting the nested `b::{x, c}` as `c`, or `b/mod`'s comment,
        // would make `a` <-> `c` or `b` <-> `c`; `b/other`'s test module
        // says `super` for itself, not `b/mod`.
        let sources = vec![
            src("lib.rs", "mod a;\nmod b;\npub use a::Thing;"),
            src("a.rs", "use crate::{b::{x, c}, sync::lock};\nfn f() -> crate::Other {}"),
            src("b/mod.rs", "// crate::c is only a comment\nuse crate::a::Z;"),
            src("b/part.rs", "use crate::sync::W;\nuse super::Shared;"),
            src(
                "b/other.rs",
                "use super::part::P;\n#[cfg(test)]\nmod tests { use super::Shared; }",
            ),
            src("c.rs", "use crate::{a::K, b::Q};"),
        ];
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        // `b/mod` declares nothing: `b/part` using it is one way.
        assert_eq!(two_way_pairs(&sources), vec![pair("a", "b"), pair("a", "lib")]);
        let mut declaring = sources.clone();
        declaring[2].1.push_str("\nmod part;\nmod other;");
        assert_eq!(
            two_way_pairs(&declaring),
            vec![pair("a", "b"), pair("a", "lib"), pair("b/mod", "b/part")]
        );
        let named = named_pairs("Two-way pairs: `b` ↔ `a` (a `note`), `lib` ↔\n`a`.\n\nMore `x` ↔ `y`").unwrap();
        assert_eq!(
            named,
            vec![("a".to_string(), "b".to_string()), ("a".to_string(), "lib".to_string())]
        );
        assert_eq!(named_pairs("no such line"), None);
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
        // A file moved to another folder: the old path is stale, the new
        // one unnamed, though the names agree.
        let moved: Vec<String> = ["lib.rs", "shard/worker.rs"].iter().map(|s| s.to_string()).collect();
        let stale = drift("- `lib.rs`, `engine/worker.rs`", &moved);
        assert_eq!(
            stale,
            vec![
                "laned-runner/src/shard/worker.rs is not in ARCHITECTURE.md's code map",
                "ARCHITECTURE.md's code map names engine/worker.rs, which laned-runner/src does not have"
            ]
        );
    }
}
