//! `cargo xtask links`: every relative link in the workspace's markdown
//! resolves. For each `*.md` file git knows of (tracked, or new and not
//! ignored), every inline link or image `[text](dest)` and every reference
//! definition `[label]: dest` outside code (fenced blocks and code spans)
//! whose destination is a path, not a URL:
//!
//! - names a file or folder that exists, taken from the linking file's
//!   folder (from the workspace root where it starts with `/`), never
//!   above the root;
//! - and, with a `#fragment`, into a markdown file (or the same file, for
//!   `#fragment` alone), names one of that file's headings by GitHub's
//!   anchor: [`slug`], the heading's text lowercased, every character but
//!   letters, digits, `_`, `-` and spaces dropped, spaces turned to `-`; a
//!   heading whose anchor is taken already gets `-1`, then `-2`, ...
//!
//! URLs (`https:`, `mailto:`, anything with a scheme) and rustdoc paths
//! (`crate::Item`) are not checked; a fragment into a file that is not
//! markdown (`main.rs#L10`) is not either. Run by CI (`.ci/run`) and by
//! this crate's unit tests on the workspace, so `cargo xtask test` catches
//! a link broken by a moved page or a renamed heading.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// GitHub's anchor for a heading's text (`## The text`, without the `#`s):
/// its rendered text (code spans' backticks, emphasis's `*`, a link's
/// target dropped), lowercased, every character but letters, digits, `_`,
/// `-` and spaces dropped, each space a `-`.
pub fn slug(heading: &str) -> String {
    plain(heading)
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// A heading's text as rendered: `[text](url)` as `text`, without
/// backticks and `*`.
fn plain(heading: &str) -> String {
    let mut out = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](").and_then(|mid| {
            let close = after[mid + 2..].find(')')?;
            Some((mid, mid + 2 + close))
        }) {
            Some((mid, end)) => {
                out.push_str(&after[..mid]);
                rest = &after[end + 1..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.chars().filter(|c| !matches!(c, '`' | '*')).collect()
}

/// Whether `line` opens or closes a fence: its character and length.
fn fence(line: &str) -> Option<(char, usize)> {
    let t = line.trim_start();
    let c = t.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = t.chars().take_while(|x| *x == c).count();
    (n >= 3).then_some((c, n))
}

/// The lines of `markdown` outside fenced code blocks, with their numbers
/// (from 1).
fn prose(markdown: &str) -> Vec<(usize, &str)> {
    let mut out = vec![];
    let mut open: Option<(char, usize)> = None;
    for (i, line) in markdown.lines().enumerate() {
        match (open, fence(line)) {
            (None, Some(f)) => open = Some(f),
            (Some((c, n)), Some((c2, n2))) if c == c2 && n2 >= n && line.trim().chars().all(|x| x == c) => open = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// The anchors of `markdown`'s headings (ATX, `#` to `######`, outside
/// code), in order, duplicates numbered as GitHub does.
pub fn anchors(markdown: &str) -> Vec<String> {
    let mut taken: HashMap<String, usize> = HashMap::new();
    let mut out = vec![];
    for (_, line) in prose(markdown) {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let t = line.trim_start_matches(' ');
        let hashes = t.chars().take_while(|c| *c == '#').count();
        if indent > 3 || hashes == 0 || hashes > 6 {
            continue;
        }
        let text = &t[hashes..];
        if !(text.is_empty() || text.starts_with(' ') || text.starts_with('\t')) {
            continue;
        }
        // A closing sequence of `#`s, after a space, is not the heading's.
        let text = text.trim();
        let text = match text.trim_end_matches('#') {
            t2 if t2.len() < text.len() && (t2.is_empty() || t2.ends_with(' ')) => t2.trim_end(),
            _ => text,
        };
        let base = slug(text);
        let mut anchor = base.clone();
        while taken.contains_key(&anchor) {
            let n = taken.get_mut(&base).unwrap();
            *n += 1;
            anchor = format!("{base}-{n}");
        }
        taken.insert(anchor.clone(), 0);
        out.push(anchor);
    }
    out
}

/// `text` with its code spans blanked (a run of N backticks to the next
/// run of exactly N; an unclosed run is text), so that nothing in code is
/// read as a link. Lengths and newlines are kept.
fn without_code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = text.as_bytes().to_vec();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'`' {
            i += 1;
            continue;
        }
        let n = b[i..].iter().take_while(|c| **c == b'`').count();
        let mut j = i + n;
        let mut close = None;
        while j < b.len() {
            if b[j] == b'`' {
                let m = b[j..].iter().take_while(|c| **c == b'`').count();
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                for c in &mut out[i..j + n] {
                    if *c != b'\n' {
                        *c = b' ';
                    }
                }
                i = j + n;
            }
            None => i += n,
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The link destinations of `markdown` outside code, each with its line:
/// inline links and images, and reference definitions.
pub fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut out = vec![];
    // Paragraphs (runs of non-blank prose lines) are read whole, so a code
    // span or a link's text may cross a line.
    let mut block: Vec<(usize, &str)> = vec![];
    let lines = prose(markdown);
    let mut previous = 0;
    for (number, line) in lines.iter().copied().chain([(usize::MAX, "")]) {
        let ends = line.trim().is_empty() || number != previous + 1;
        if ends && !block.is_empty() {
            paragraph(&block, &mut out);
            block.clear();
        }
        if !line.trim().is_empty() {
            block.push((number, line));
        }
        previous = number;
    }
    out
}

/// The links of one paragraph, `lines` with their numbers.
fn paragraph(lines: &[(usize, &str)], out: &mut Vec<(usize, String)>) {
    let joined: String = lines.iter().map(|(_, l)| *l).collect::<Vec<_>>().join("\n");
    let text = without_code(&joined);
    let line_at = |offset: usize| lines[text[..offset].matches('\n').count()].0;
    // Reference definitions: `[label]: dest` at a line's start.
    for (k, line) in text.split('\n').enumerate() {
        let t = line.trim_start();
        if line.len() - t.len() <= 3 && t.starts_with('[') && !t.starts_with("[^") {
            if let Some(end) = t.find("]:") {
                let dest = t[end + 2..].split_whitespace().next().unwrap_or("");
                let dest = dest.trim_start_matches('<').trim_end_matches('>');
                if !dest.is_empty() && !t[1..end].contains(']') {
                    out.push((lines[k].0, dest.to_string()));
                }
            }
        }
    }
    // Inline links and images: `](` then the destination.
    let mut from = 0;
    while let Some(at) = text[from..].find("](") {
        let start = from + at + 2;
        from = start;
        if text[..start - 2].rfind('[').is_none() {
            continue;
        }
        let rest = &text[start..];
        let dest = if let Some(angled) = rest.strip_prefix('<') {
            match angled.find('>') {
                Some(end) => &angled[..end],
                None => continue,
            }
        } else {
            let mut depth = 0usize;
            let end = rest
                .char_indices()
                .find(|(_, c)| match c {
                    '(' => {
                        depth += 1;
                        false
                    }
                    ')' if depth == 0 => true,
                    ')' => {
                        depth -= 1;
                        false
                    }
                    c => c.is_whitespace(),
                })
                .map_or(rest.len(), |(i, _)| i);
            &rest[..end]
        };
        out.push((line_at(start), dest.to_string()));
    }
}

/// What a path names, as [`broken`] asks for it.
pub enum Found {
    /// Nothing there.
    Missing,
    /// A folder.
    Folder,
    /// A file: its text where it is markdown (to look anchors up in).
    File(Option<String>),
}

/// Whether `dest` is a path to check (not a URL, not a rustdoc path).
fn is_path(dest: &str) -> bool {
    let scheme = dest
        .split_once(':')
        .is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c)));
    !(dest.is_empty() || scheme || dest.starts_with("//") || dest.contains("::"))
}

/// `%XX` decoded (a link to `a%20b.md` names `a b.md`).
fn decoded(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` (from the root) joined to `dest` and normalised: `.` and `..`
/// resolved, `None` where it climbs above the root.
fn resolve(file: &str, dest: &str) -> Option<String> {
    let mut parts: Vec<&str> = if dest.starts_with('/') {
        vec![]
    } else {
        let mut p: Vec<&str> = file.split('/').collect();
        p.pop();
        p
    };
    for part in dest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The broken links of `text`, the markdown file at `file` (its path from
/// the root, `/`-separated), a line each: `find` says what a path from the
/// root names.
pub fn broken(file: &str, text: &str, find: &dyn Fn(&str) -> Found) -> Vec<String> {
    let mut problems = vec![];
    let mut anchors_of: HashMap<String, Option<Vec<String>>> = HashMap::new();
    for (line, dest) in links(text) {
        if !is_path(&dest) {
            continue;
        }
        let (path, fragment) = match dest.split_once('#') {
            Some((p, f)) => (p, Some(f)),
            None => (dest.as_str(), None),
        };
        let path = path.split('?').next().unwrap_or("");
        let say = |why: &str| format!("{file}:{line}: ({dest}): {why}");
        let (target, markdown) = if path.is_empty() {
            (file.to_string(), Some(text.to_string()))
        } else {
            let Some(target) = resolve(file, &decoded(path)) else {
                problems.push(say("climbs above the workspace"));
                continue;
            };
            match find(&target) {
                Found::Missing => {
                    problems.push(say(&format!("{target} does not exist")));
                    continue;
                }
                Found::Folder => (target, None),
                Found::File(markdown) => (target, markdown),
            }
        };
        let Some(fragment) = fragment else { continue };
        if !target.ends_with(".md") {
            continue;
        }
        let known = anchors_of
            .entry(target.clone())
            .or_insert_with(|| markdown.map(|m| anchors(&m)));
        match known {
            Some(known) if known.iter().any(|a| *a == decoded(fragment)) => {}
            Some(_) => problems.push(say(&format!("{target} has no heading whose anchor is #{fragment}"))),
            None => problems.push(say(&format!("{target} could not be read"))),
        }
    }
    problems
}

/// The markdown files git knows of under `root` (tracked, or new and not
/// ignored), paths from the root; without git, every `*.md` under it but
/// `target/` and dot-folders.
pub fn markdown_files(root: &Path) -> Vec<String> {
    let listed = Command::new("git")
        .arg("-C")
        .arg(root)
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
            "--",
            "*.md",
        ])
        .output();
    let mut files: Vec<String> = match listed {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .split('\0')
            .filter(|f| !f.is_empty() && root.join(f).is_file())
            .map(str::to_string)
            .collect(),
        _ => {
            let mut found = vec![];
            walk(root, root, &mut found);
            found
        }
    };
    files.sort();
    files.dedup();
    files
}

fn walk(root: &Path, dir: &Path, found: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            let skipped = name.starts_with('.') || (dir == root && name == "target");
            if !skipped {
                walk(root, &path, found);
            }
        } else if name.ends_with(".md") {
            if let Ok(rel) = path.strip_prefix(root) {
                found.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
}

/// Every broken link of the workspace at `root`, a line each.
pub fn check(root: &Path) -> Vec<String> {
    let find = |path: &str| {
        let full: PathBuf = root.join(path);
        if full.is_dir() {
            Found::Folder
        } else if full.is_file() {
            Found::File(
                path.ends_with(".md")
                    .then(|| std::fs::read_to_string(&full).unwrap_or_default()),
            )
        } else {
            Found::Missing
        }
    };
    let mut problems = vec![];
    for file in markdown_files(root) {
        match std::fs::read_to_string(root.join(&file)) {
            Ok(text) => problems.extend(broken(&file, &text, &find)),
            Err(e) => problems.push(format!("{file}: cannot be read: {e}")),
        }
    }
    problems
}

/// The workspace's root: this crate's parent.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The task: `cargo xtask links`.
pub fn task(args: &[String]) -> bool {
    if let Some(other) = args.first() {
        eprintln!("links: takes no argument, got {other:?}");
        return false;
    }
    let root = root();
    let files = markdown_files(&root).len();
    let problems = check(&root);
    for p in &problems {
        eprintln!("{p}");
    }
    if problems.is_empty() {
        eprintln!("links: every relative link and anchor of {files} markdown files resolves");
        true
    } else {
        eprintln!("links: {} broken (above), in {files} markdown files", problems.len());
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's anchors, as its pages give them for headings of this kind.
    #[test]
    fn slugs_are_githubs() {
        assert_eq!(slug("The command line"), "the-command-line");
        assert_eq!(
            slug("The config file: `[server]` and `[models]`"),
            "the-config-file-server-and-models"
        );
        assert_eq!(
            slug("A spec: `[model]`, `[model.audio]`, `[runner]`"),
            "a-spec-model-modelaudio-runner"
        );
        assert_eq!(slug("`laned fetch` and `laned client`"), "laned-fetch-and-laned-client");
        assert_eq!(slug("Drain and hand-over"), "drain-and-hand-over");
        assert_eq!(
            slug("Triton's clients: the KServe v2 front"),
            "tritons-clients-the-kserve-v2-front"
        );
        assert_eq!(slug("max_lanes and `max_seats`"), "max_lanes-and-max_seats");
        assert_eq!(slug("**Bold** and [a link](x.md)"), "bold-and-a-link");
        assert_eq!(slug("Under `laned serve`"), "under-laned-serve");
        assert_eq!(slug("Café über"), "café-über");
        assert_eq!(slug("a  b"), "a--b");
        assert_eq!(slug("[Unreleased]"), "unreleased");
    }

    /// Duplicate headings are numbered; headings in code are none; a
    /// closing run of `#`s is dropped.
    #[test]
    fn anchors_number_duplicates_and_skip_code() {
        let md = "# T\n\n## Reading\n\n```sh\n# not a heading\n```\n\n## Reading\n\n### Reading ##\n\n#nohash\n\n    # indented code\n";
        assert_eq!(anchors(md), vec!["t", "reading", "reading-1", "reading-2"]);
    }

    /// Links outside code only: inline, images, references, a link whose
    /// text crosses a line; not in a code span or a fenced block.
    #[test]
    fn links_are_found_outside_code() {
        let md = "See [a](a.md) and ![p](img/p.svg \"t\").\n`[no](code.md)` and [two\nlines](b.md#x).\n\n```md\n[no](fenced.md)\n```\n\n[ref]: ref.md\n[q](<with space.md>) [paren](f(1).md)\n";
        let found: Vec<(usize, String)> = links(md);
        let dests: Vec<&str> = found.iter().map(|(_, d)| d.as_str()).collect();
        assert_eq!(
            dests,
            vec!["a.md", "img/p.svg", "b.md#x", "ref.md", "with space.md", "f(1).md"]
        );
        assert_eq!(found[2].0, 3, "{found:?}");
        assert_eq!(found[3].0, 9, "{found:?}");
    }

    /// Pinned cases: a good link, a missing file, a missing anchor, a
    /// same-file anchor, one above the root, a folder, a URL, a fragment
    /// into a file that is not markdown.
    #[test]
    fn broken_links_are_found() {
        let find = |path: &str| match path {
            "docs/serve.md" => Found::File(Some("# S\n\n## Routes\n\n## A stream\n".into())),
            "README.md" => Found::File(Some("# laned\n".into())),
            "docs" | "deploy" => Found::Folder,
            "server/src/mux.rs" => Found::File(None),
            _ => Found::Missing,
        };
        let page = "# Index\n\n## Here\n\n[ok](serve.md#routes) [up](../README.md) [dir](../deploy/) [self](#here) [web](https://x.org/y.md#nope) [rs](../server/src/mux.rs#L1)\n";
        assert_eq!(broken("docs/index.md", page, &find), Vec::<String>::new());
        let bad =
            "# Index\n\n[gone](gone.md)\n[anchor](serve.md#the-mux)\n[self](#nowhere)\n[above](../../etc/passwd)\n";
        let found = broken("docs/index.md", bad, &find);
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(found[0].starts_with("docs/index.md:3: (gone.md)") && found[0].contains("docs/gone.md does not exist"));
        assert!(found[1].contains("no heading whose anchor is #the-mux"), "{found:?}");
        assert!(
            found[2].contains("docs/index.md has no heading whose anchor is #nowhere"),
            "{found:?}"
        );
        assert!(found[3].contains("climbs above"), "{found:?}");
    }

    /// The workspace's own markdown: every relative link and anchor
    /// resolves (what `cargo xtask links` and CI check).
    #[test]
    fn the_workspace_links_resolve() {
        let problems = check(&root());
        assert!(problems.is_empty(), "broken links:\n{}", problems.join("\n"));
    }
}
