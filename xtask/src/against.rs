//! `cargo xtask bench --against REV [--rounds R] ARGS [-- ARGS ...]`: the
//! before/after guard. The working tree's bench (after) against REV's
//! (before), the same scenarios in one sitting:
//!
//! 1. REV checked out in a worktree, `target/against/<short>` (`git worktree
//!    add --detach`, reused when there), its `laned-bench` built in release
//!    with `CARGO_TARGET_DIR=target/against-target`, shared by every REV so
//!    tract is built there once (the workspace's own crates cleaned out
//!    first when another tree built them last: cargo would take them for
//!    fresh), and copied to `target/against/<short>.laned-bench`; then the
//!    working tree's built as any release build of it (`target/release`)
//!    and copied to `target/against/after.laned-bench`. A run whose report
//!    says another commit built it is refused as stale: REV's must name
//!    REV; the working tree's must not name REV (the tree's own commit
//!    may move while the sitting runs: others commit in a shared tree, and
//!    a report names the commit checked out when it ran).
//! 2. Every flag of the scenarios checked against both binaries' `--help`:
//!    an old REV that does not know a flag is named before anything runs.
//! 3. `R` rounds (default 3); in each, every scenario (the arguments, split
//!    at a lone `--`) run by both binaries one after the other, the order
//!    turned every round (before, after; after, before; ...) so that drift
//!    hits both alike; each run writes its `report.json` (`--out`, which
//!    every REV's bench knows) under `target/against/runs/`.
//! 4. Each row a report holds (a closed-loop median by model, streams and
//!    system; a real-time capacity by model and system) paired across the
//!    two binaries: before's and after's median over the rounds, after /
//!    before, and the spread of the per-round ratios (min..max), printed as
//!    a table and written to `target/laned-bench-against.json`.
//!
//! Drives git and cargo only; reads the reports with the small JSON reader
//! below (xtask has no dependency).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::{cargo, run, target_dir};

/// What `--against` was asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    pub rev: String,
    pub rounds: usize,
    /// Each scenario's arguments, as laned-bench takes them.
    pub scenarios: Vec<Vec<String>>,
}

/// Flags `--against` sets itself or cannot pair.
const REFUSED: [(&str, &str); 4] = [
    ("--out", "--against gives each run its own --out"),
    (
        "--compare",
        "--compare reads two stored reports; --against makes its own",
    ),
    ("--scenario", "--against runs laned-bench's scenarios only"),
    ("--cores", "--against runs laned-bench, which is not pinned"),
];

/// Parses `bench`'s arguments holding `--against REV`.
pub fn parse(args: &[String]) -> Result<Asked, String> {
    let mut rev = None;
    let mut rounds = 3;
    let mut scenarios = vec![vec![]];
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--against" => {
                rev = Some(
                    it.next()
                        .ok_or("--against needs a revision (a commit, a branch, HEAD~1)")?
                        .clone(),
                )
            }
            "--rounds" => {
                let v = it.next().ok_or("--rounds needs a number")?;
                rounds = v
                    .parse()
                    .ok()
                    .filter(|r| *r > 0)
                    .ok_or(format!("--rounds {v:?}: wanted a positive number"))?;
            }
            "--" => scenarios.push(vec![]),
            _ => {
                if let Some((_, why)) = REFUSED.iter().find(|(flag, _)| flag == arg) {
                    return Err(format!("bench --against: {arg} is not taken here: {why}"));
                }
                if arg == "--model" {
                    if let Some(model) = it.clone().next() {
                        if ["silero", "dtln", "oww"].contains(&model.as_str()) {
                            return Err(format!(
                                "bench --against: --model {model} runs another binary ({}), which writes no report to pair; \
                                 --against runs laned-bench's scenarios (--model light|heavy|tiny|all|PATH)",
                                if model == "silero" { "silero-bench" } else { "audio-bench" }
                            ));
                        }
                    }
                }
                scenarios.last_mut().expect("one at least").push(arg.clone());
            }
        }
    }
    let rev = rev.ok_or("bench --against needs a revision")?;
    // `--a -- --b` or a trailing `--`: no empty scenario; none at all is
    // laned-bench's default scenario.
    let mut scenarios: Vec<Vec<String>> = scenarios.into_iter().filter(|s| !s.is_empty()).collect();
    if scenarios.is_empty() {
        scenarios.push(vec![]);
    }
    Ok(Asked { rev, rounds, scenarios })
}

/// Which binary runs first in `round` (0-based): before, after in even
/// rounds, after, before in odd ones (A B B A ...), so a drift over the
/// sitting hits both alike. `true`: before first.
pub fn before_first(round: usize) -> bool {
    round.is_multiple_of(2)
}

/// The flags of `args` (words starting `--`) that `help` does not name as
/// a whole word.
pub fn unknown_flags<'a>(help: &str, args: &'a [String]) -> Vec<&'a str> {
    let known = |flag: &str| {
        help.match_indices(flag).any(|(at, _)| {
            let after = help[at + flag.len()..].chars().next();
            let before = help[..at].chars().next_back();
            !after.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
                && !before.is_some_and(|c| c.is_alphanumeric() || c == '-')
        })
    };
    args.iter()
        .map(String::as_str)
        .filter(|a| a.starts_with("--") && a.len() > 2 && !known(a))
        .collect()
}

/// The median of `v` (NaN for none).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The smallest and the largest of `v` (NaN, NaN for none).
pub fn spread(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

/// One figure of a report: its key (what it measures) and its unit.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub key: String,
    pub unit: &'static str,
    pub value: f64,
}

/// Every figure of a laned-bench `report.json`: each closed-loop row's
/// median (`MODEL, N streams, SYSTEM`, pulses/s) and each real-time
/// system's capacity (`MODEL, real time, SYSTEM`, streams), in the
/// report's order.
pub fn figures(report: &Json) -> Result<Vec<Figure>, String> {
    let mut out = vec![];
    for row in report.get("closed_loop").and_then(Json::array).unwrap_or(&[]) {
        let (Some(model), Some(streams), Some(system), Some(median)) = (
            row.get("model").and_then(Json::str),
            row.get("streams").and_then(Json::num),
            row.get("system").and_then(Json::str),
            row.get("median").and_then(Json::num),
        ) else {
            return Err(format!(
                "a closed-loop row without model, streams, system and median: {row:?}"
            ));
        };
        out.push(Figure {
            key: format!("{model}, {streams} streams, {system}"),
            unit: "pulses/s",
            value: median,
        });
    }
    for row in report.get("real_time").and_then(Json::array).unwrap_or(&[]) {
        let (Some(model), Some(short), Some(capacity)) = (
            row.get("model").and_then(Json::str),
            row.get("short").and_then(Json::str),
            row.get("capacity").and_then(Json::num),
        ) else {
            return Err(format!("a real-time row without model, short and capacity: {row:?}"));
        };
        out.push(Figure {
            key: format!("{model}, real time, {short}"),
            unit: "streams",
            value: capacity,
        });
    }
    Ok(out)
}

/// One row both binaries measured, over the rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    pub key: String,
    pub unit: &'static str,
    /// Each round's figure (rounds where the row is missing left out).
    pub before: Vec<f64>,
    pub after: Vec<f64>,
    /// After / before of each round holding both.
    pub ratios: Vec<f64>,
}

impl Paired {
    pub fn before_median(&self) -> f64 {
        median(&self.before)
    }
    pub fn after_median(&self) -> f64 {
        median(&self.after)
    }
    /// After's median over before's.
    pub fn ratio(&self) -> f64 {
        self.after_median() / self.before_median()
    }
    /// The smallest and largest per-round ratio.
    pub fn spread(&self) -> (f64, f64) {
        spread(&self.ratios)
    }
}

/// A scenario's rows paired: `before[r]` and `after[r]` are round `r`'s
/// figures of each binary. Rows in both, in before's first round's order;
/// the keys only one side has, each listed once.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pairing {
    pub rows: Vec<Paired>,
    pub only_before: Vec<String>,
    pub only_after: Vec<String>,
}

pub fn pair(before: &[Vec<Figure>], after: &[Vec<Figure>]) -> Pairing {
    let index = |runs: &[Vec<Figure>]| -> Vec<BTreeMap<String, f64>> {
        runs.iter()
            .map(|run| run.iter().map(|f| (f.key.clone(), f.value)).collect())
            .collect()
    };
    let (b, a) = (index(before), index(after));
    let mut order: Vec<(&str, &'static str)> = vec![];
    for f in before.iter().chain(after).flatten() {
        if !order.iter().any(|(k, _)| *k == f.key) {
            order.push((&f.key, f.unit));
        }
    }
    let mut pairing = Pairing::default();
    for (key, unit) in order {
        let in_b = b.iter().any(|r| r.contains_key(key));
        let in_a = a.iter().any(|r| r.contains_key(key));
        match (in_b, in_a) {
            (true, false) => pairing.only_before.push(key.into()),
            (false, true) => pairing.only_after.push(key.into()),
            _ => {
                let rounds = b.len().max(a.len());
                let at = |side: &[BTreeMap<String, f64>], r: usize| side.get(r).and_then(|m| m.get(key)).copied();
                pairing.rows.push(Paired {
                    key: key.into(),
                    unit,
                    before: (0..rounds).filter_map(|r| at(&b, r)).collect(),
                    after: (0..rounds).filter_map(|r| at(&a, r)).collect(),
                    ratios: (0..rounds).filter_map(|r| Some(at(&a, r)? / at(&b, r)?)).collect(),
                });
            }
        }
    }
    pairing
}

/// The geometric mean of `v` (NaN for none): the pairing's one figure.
pub fn geometric_mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

/// A scenario's table: a row per paired figure, then what only one side
/// has, then the geometric mean of after / before.
pub fn table(before: &str, pairing: &Pairing) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| row | unit | before ({before}) | after | after / before | spread of the rounds |\n|---|---|---:|---:|---:|---|"
    );
    for p in &pairing.rows {
        let (lo, hi) = p.spread();
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.3} | {:.3}..{:.3} ({} rounds) |",
            p.key,
            p.unit,
            p.before_median(),
            p.after_median(),
            p.ratio(),
            lo,
            hi,
            p.ratios.len()
        );
    }
    for (side, keys) in [("before", &pairing.only_before), ("after", &pairing.only_after)] {
        if !keys.is_empty() {
            let _ = writeln!(out, "\nonly {side} has: {}", keys.join("; "));
        }
    }
    let ratios: Vec<f64> = pairing
        .rows
        .iter()
        .map(Paired::ratio)
        .filter(|r| r.is_finite())
        .collect();
    let _ = writeln!(
        out,
        "\ngeometric mean of after / before over {} rows: {:.3}",
        ratios.len(),
        geometric_mean(&ratios)
    );
    out
}

/// A JSON string literal.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            '\n' => out += "\\n",
            c if (c as u32) < 0x20 => out += &format!("\\u{:04x}", c as u32),
            c => out.push(c),
        }
    }
    out + "\""
}

/// A JSON number: `null` where not finite.
fn number(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

fn numbers(v: &[f64]) -> String {
    format!("[{}]", v.iter().map(|x| number(*x)).collect::<Vec<_>>().join(", "))
}

/// The whole sitting as JSON: the revisions, the rounds, and per scenario
/// its arguments and its pairing.
pub fn to_json(
    rev: &str,
    rev_commit: &str,
    after: &str,
    rounds: usize,
    scenarios: &[(Vec<String>, Pairing)],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{{\n  \"before\": {},\n  \"before_commit\": {},\n  \"after\": {},\n  \"rounds\": {rounds},\n  \"scenarios\": [",
        quote(rev),
        quote(rev_commit),
        quote(after)
    );
    for (s, (args, pairing)) in scenarios.iter().enumerate() {
        let args: Vec<String> = args.iter().map(|a| quote(a)).collect();
        let _ = writeln!(out, "    {{\n      \"args\": [{}],\n      \"rows\": [", args.join(", "));
        for (r, p) in pairing.rows.iter().enumerate() {
            let (lo, hi) = p.spread();
            let _ = writeln!(
                out,
                "        {{\"key\": {}, \"unit\": {}, \"before\": {}, \"after\": {}, \"before_median\": {}, \"after_median\": {}, \"ratio\": {}, \"ratios\": {}, \"spread\": [{}, {}]}}{}",
                quote(&p.key),
                quote(p.unit),
                numbers(&p.before),
                numbers(&p.after),
                number(p.before_median()),
                number(p.after_median()),
                number(p.ratio()),
                numbers(&p.ratios),
                number(lo),
                number(hi),
                if r + 1 < pairing.rows.len() { "," } else { "" }
            );
        }
        let list = |keys: &[String]| keys.iter().map(|k| quote(k)).collect::<Vec<_>>().join(", ");
        let _ = writeln!(
            out,
            "      ],\n      \"only_before\": [{}],\n      \"only_after\": [{}]\n    }}{}",
            list(&pairing.only_before),
            list(&pairing.only_after),
            if s + 1 < scenarios.len() { "," } else { "" }
        );
    }
    out += "  ]\n}\n";
    out
}

/// A JSON value, as much of JSON as a report needs (all of it but
/// surrogate pairs, which are read as U+FFFD).
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            at: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.at != p.s.len() {
            return Err(format!("JSON: trailing text at byte {}", p.at));
        }
        Ok(v)
    }
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    pub fn array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(v) => Some(v),
            _ => None,
        }
    }
    pub fn str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn num(&self) -> Option<f64> {
        match self {
            Json::Num(x) => Some(*x),
            _ => None,
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.at).is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }
    fn fail<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("JSON: {what} at byte {}", self.at))
    }
    fn eat(&mut self, word: &str) -> bool {
        if self.s[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            true
        } else {
            false
        }
    }
    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.at) {
            None => self.fail("a value expected, the end found"),
            Some(b'{') => {
                self.at += 1;
                let mut fields = vec![];
                self.ws();
                if self.eat("}") {
                    return Ok(Json::Obj(fields));
                }
                loop {
                    self.ws();
                    let Json::Str(key) = self.value()? else {
                        return self.fail("a key expected");
                    };
                    self.ws();
                    if !self.eat(":") {
                        return self.fail("':' expected");
                    }
                    fields.push((key, self.value()?));
                    self.ws();
                    if self.eat("}") {
                        return Ok(Json::Obj(fields));
                    }
                    if !self.eat(",") {
                        return self.fail("',' or '}' expected");
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                let mut items = vec![];
                self.ws();
                if self.eat("]") {
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    if self.eat("]") {
                        return Ok(Json::Arr(items));
                    }
                    if !self.eat(",") {
                        return self.fail("',' or ']' expected");
                    }
                }
            }
            Some(b'"') => {
                self.at += 1;
                let mut out = String::new();
                loop {
                    let Some(&c) = self.s.get(self.at) else {
                        return self.fail("an unterminated string");
                    };
                    self.at += 1;
                    match c {
                        b'"' => return Ok(Json::Str(out)),
                        b'\\' => {
                            let Some(&e) = self.s.get(self.at) else {
                                return self.fail("an unterminated escape");
                            };
                            self.at += 1;
                            out.push(match e {
                                b'"' => '"',
                                b'\\' => '\\',
                                b'/' => '/',
                                b'b' => '\u{8}',
                                b'f' => '\u{c}',
                                b'n' => '\n',
                                b'r' => '\r',
                                b't' => '\t',
                                b'u' => {
                                    let hex = self
                                        .s
                                        .get(self.at..self.at + 4)
                                        .and_then(|h| std::str::from_utf8(h).ok());
                                    let Some(code) = hex.and_then(|h| u32::from_str_radix(h, 16).ok()) else {
                                        return self.fail("a bad \\u escape");
                                    };
                                    self.at += 4;
                                    char::from_u32(code).unwrap_or('\u{fffd}')
                                }
                                _ => return self.fail("a bad escape"),
                            });
                        }
                        _ => {
                            // A UTF-8 sequence: copied whole.
                            let start = self.at - 1;
                            let len = match c {
                                0..=0x7f => 1,
                                0xc0..=0xdf => 2,
                                0xe0..=0xef => 3,
                                _ => 4,
                            };
                            let Some(text) = self.s.get(start..start + len).and_then(|b| std::str::from_utf8(b).ok())
                            else {
                                return self.fail("bad UTF-8");
                            };
                            out += text;
                            self.at = start + len;
                        }
                    }
                }
            }
            Some(_) if self.eat("true") => Ok(Json::Bool(true)),
            Some(_) if self.eat("false") => Ok(Json::Bool(false)),
            Some(_) if self.eat("null") => Ok(Json::Null),
            Some(_) => {
                let start = self.at;
                while self
                    .s
                    .get(self.at)
                    .is_some_and(|c| c.is_ascii_digit() || b"+-.eE".contains(c))
                {
                    self.at += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.at]).unwrap_or("");
                match text.parse::<f64>() {
                    Ok(x) if !text.is_empty() => Ok(Json::Num(x)),
                    _ => {
                        self.at = start;
                        self.fail("a value expected")
                    }
                }
            }
        }
    }
}

/// `git` in the workspace, its output trimmed, or why not.
fn git(root: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .current_dir(root)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The names of the workspace's packages at `dir` (`cargo metadata`).
fn packages(dir: &Path) -> Result<Vec<String>, String> {
    let out = cargo()
        .current_dir(dir)
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline"])
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let json = Json::parse(&String::from_utf8_lossy(&out.stdout))?;
    Ok(json
        .get("packages")
        .and_then(Json::array)
        .unwrap_or(&[])
        .iter()
        .filter_map(|p| p.get("name").and_then(Json::str).map(str::to_string))
        .collect())
}

/// What built the workspace's crates in a shared target directory last.
const LAST_BUILT: &str = "laned-against-last-built";

/// Builds `laned-bench` in release from the workspace at `dir` into
/// `target`, and copies it to `to`.
///
/// Cargo names a workspace crate's artifacts by its path relative to the
/// workspace root and judges them fresh by the sources' times, so two
/// checkouts building into one target directory take each other's crates
/// for fresh (a worktree made before the other's build looks older than
/// it). Where `tree` names what is built (`Some(commit)`, the REVs' shared
/// directory), the workspace's crates are cleaned first whenever another
/// tree built them last; the registry's (tract) stay.
fn build(dir: &Path, target: &Path, to: &Path, what: &str, tree: Option<&str>) -> Result<(), String> {
    if let Some(tree) = tree {
        let marker = target.join(LAST_BUILT);
        if std::fs::read_to_string(&marker).ok().as_deref() != Some(tree) {
            let mut clean = cargo();
            clean
                .current_dir(dir)
                .args(["clean", "--release"])
                .env("CARGO_TARGET_DIR", target);
            for package in packages(dir)? {
                clean.args(["-p", &package]);
            }
            if !run(clean) {
                return Err(format!("cleaning {what}'s crates out of {} failed", target.display()));
            }
            let _ = std::fs::remove_file(&marker);
        }
    }
    let mut build = cargo();
    build
        .current_dir(dir)
        .args(["build", "--release", "-p", "laned-bench", "--bin", "laned-bench"])
        .env("CARGO_TARGET_DIR", target);
    if !run(build) {
        return Err(format!("building {what}'s laned-bench failed (see above)"));
    }
    if let Some(tree) = tree {
        std::fs::write(target.join(LAST_BUILT), tree).map_err(|e| format!("writing {LAST_BUILT}: {e}"))?;
    }
    let built = target.join("release").join("laned-bench");
    std::fs::copy(&built, to).map_err(|e| format!("copying {} to {}: {e}", built.display(), to.display()))?;
    Ok(())
}

/// Whether `git describe --always --dirty` output `describe` (what a
/// report's `machine.commit` holds) names `commit`: `None` where it holds
/// no abbreviated hash to tell (`unknown`, a bare tag).
pub fn describes(describe: &str, commit: &str) -> Option<bool> {
    let d = describe.trim().trim_end_matches("-dirty");
    let hash = d.rsplit_once("-g").map_or(d, |(_, h)| h);
    let is_hash = hash.len() >= 4 && hash.chars().all(|c| c.is_ascii_hexdigit());
    is_hash.then(|| commit.starts_with(hash))
}

/// `binary --help`, or `None` where it gives none.
fn help(binary: &Path) -> Option<String> {
    let out = Command::new(binary).arg("--help").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    out.status.success().then_some(text)
}

/// Which commit a run's report must name, where it names one.
enum Built<'a> {
    /// REV's binary: REV.
    From(&'a str),
    /// The working tree's: anything but REV (unless the tree is at REV).
    NotFrom(&'a str),
}

/// One run of `binary` on `args`, its report in `out`; its figures. The
/// report must say it was built as `built` says where it says (a stale
/// build is refused, not measured).
fn run_once(binary: &Path, args: &[String], out: &Path, who: &str, built: Built<'_>) -> Result<Vec<Figure>, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let log = out.join("output.txt");
    let file = std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let status = Command::new(binary)
        .args(args)
        .arg("--out")
        .arg(out)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    if !status.success() {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = said
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(format!(
            "{who}'s laned-bench refused or failed on {args:?} ({status}); its last words ({}):\n{}",
            log.display(),
            tail.join("\n")
        ));
    }
    let path = out.join("report.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{who}: reading {}: {e}", path.display()))?;
    let json = Json::parse(&text).map_err(|e| format!("{who}: {}: {e}", path.display()))?;
    let named = json.get("machine").and_then(|m| m.get("commit")).and_then(Json::str);
    let stale = match (named, built) {
        (Some(named), Built::From(commit)) => {
            (describes(named, commit) == Some(false)).then(|| format!("says it was built from {named}, not {commit}"))
        }
        (Some(named), Built::NotFrom(commit)) => {
            (describes(named, commit) == Some(true)).then(|| format!("says it was built from {named}, REV itself"))
        }
        (None, _) => None,
    };
    if let Some(why) = stale {
        return Err(format!(
            "{who}'s laned-bench ({}) {why}: a stale build; \
             remove target/against-target/{LAST_BUILT} and run again",
            binary.display()
        ));
    }
    figures(&json).map_err(|e| format!("{who}: {}: {e}", path.display()))
}

/// The task: see the module's doc.
pub fn against(args: &[String]) -> bool {
    match sitting(args) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("bench --against: {e}");
            false
        }
    }
}

fn sitting(args: &[String]) -> Result<(), String> {
    let asked = parse(args)?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root.canonicalize().unwrap_or(root);
    let target = target_dir();
    let target = if target.is_absolute() {
        target
    } else {
        root.join(target)
    };
    let target = target.canonicalize().unwrap_or(target);
    let commit = git(&root, &["rev-parse", "--verify", &format!("{}^{{commit}}", asked.rev)])
        .map_err(|e| format!("REV {:?} is not a commit here: {e}", asked.rev))?;
    let short = git(&root, &["rev-parse", "--short=10", &commit])?;
    let before = format!("{} ({short})", asked.rev);
    let head_commit = git(&root, &["rev-parse", "HEAD"])?;
    let head = git(&root, &["rev-parse", "--short=10", "HEAD"])?;
    let dirty = !git(&root, &["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    let after = format!("the working tree at {head}{}", if dirty { " with changes" } else { "" });

    let home = target.join("against");
    std::fs::create_dir_all(&home).map_err(|e| format!("creating {}: {e}", home.display()))?;
    let tree = home.join(&short);
    let reusable = tree.join(".git").exists() && git(&tree, &["rev-parse", "HEAD"]).is_ok_and(|h| h == commit);
    if reusable {
        eprintln!("bench --against: reusing the worktree {}", tree.display());
    } else {
        if tree.exists() {
            return Err(format!(
                "{} exists but is not a worktree of {commit}: remove it (git worktree remove --force {})",
                tree.display(),
                tree.display()
            ));
        }
        let _ = git(&root, &["worktree", "prune"]);
        let mut add = Command::new("git");
        add.current_dir(&root)
            .args(["worktree", "add", "--detach"])
            .arg(&tree)
            .arg(&commit);
        if !run(add) {
            return Err(format!("git worktree add for {before} failed (see above)"));
        }
    }
    let shared = target.join("against-target");
    let before_bin = home.join(format!("{short}.laned-bench"));
    let after_bin = home.join("after.laned-bench");
    build(&tree, &shared, &before_bin, &before, Some(&commit))?;
    // The working tree in its own target directory, as any release build
    // of it: incremental there, and no other checkout's crates in it.
    build(&root, &target, &after_bin, "the working tree", None)?;

    for scenario in &asked.scenarios {
        for (bin, who) in [(&before_bin, before.as_str()), (&after_bin, "the working tree")] {
            if let Some(help) = help(bin) {
                let unknown = unknown_flags(&help, scenario);
                if !unknown.is_empty() {
                    return Err(format!(
                        "{who}'s laned-bench does not know {} (its --help names no such flag): pass only flags both binaries accept",
                        unknown.join(", ")
                    ));
                }
            }
        }
    }

    let runs = home.join("runs").join(&short);
    let n = asked.scenarios.len();
    // Per scenario, each round's figures: before's, after's.
    let mut figures_of: Vec<[Vec<Vec<Figure>>; 2]> = vec![[vec![], vec![]]; n];
    let started = Instant::now();
    for round in 0..asked.rounds {
        for (s, scenario) in asked.scenarios.iter().enumerate() {
            let order = if before_first(round) {
                [true, false]
            } else {
                [false, true]
            };
            for is_before in order {
                let (bin, who, side, built) = if is_before {
                    (&before_bin, before.as_str(), "before", Built::From(&commit))
                } else if head_commit == commit {
                    (&after_bin, "the working tree", "after", Built::From(&head_commit))
                } else {
                    (&after_bin, "the working tree", "after", Built::NotFrom(&commit))
                };
                eprintln!(
                    "bench --against: round {}/{}, scenario {}/{n} {scenario:?}: {side} ({who}), {:.0} s in",
                    round + 1,
                    asked.rounds,
                    s + 1,
                    started.elapsed().as_secs_f64()
                );
                let out = runs
                    .join(format!("scenario-{}", s + 1))
                    .join(format!("{side}-{}", round + 1));
                let got = run_once(bin, scenario, &out, who, built)?;
                figures_of[s][usize::from(!is_before)].push(got);
            }
        }
    }

    let mut scenarios = vec![];
    println!(
        "# bench --against: after ({after}) / before ({before}), {} round(s), interleaved\n",
        asked.rounds
    );
    for (scenario, [b, a]) in asked.scenarios.iter().zip(&figures_of) {
        let pairing = pair(b, a);
        println!(
            "## laned-bench {}\n\n{}",
            if scenario.is_empty() {
                "(its defaults)".to_string()
            } else {
                scenario.join(" ")
            },
            table(&short, &pairing)
        );
        scenarios.push((scenario.clone(), pairing));
    }
    let json = to_json(&asked.rev, &commit, &after, asked.rounds, &scenarios);
    let path = target.join("laned-bench-against.json");
    std::fs::write(&path, json).map_err(|e| format!("writing {}: {e}", path.display()))?;
    println!("written: {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parse_takes_the_rev_the_rounds_and_the_scenarios() {
        let asked = parse(&strings(&[
            "--against",
            "HEAD~1",
            "--quick",
            "--model",
            "tiny",
            "--rounds",
            "5",
            "--",
            "--model",
            "light",
            "--",
        ]))
        .unwrap();
        assert_eq!(asked.rev, "HEAD~1");
        assert_eq!(asked.rounds, 5);
        assert_eq!(
            asked.scenarios,
            vec![strings(&["--quick", "--model", "tiny"]), strings(&["--model", "light"])]
        );
        // No scenario: laned-bench's defaults, three rounds.
        let asked = parse(&strings(&["--against", "main"])).unwrap();
        assert_eq!((asked.rounds, asked.scenarios), (3, vec![vec![]]));
        for bad in [
            &["--against"][..],
            &["--quick"],
            &["--against", "x", "--rounds", "0"],
            &["--against", "x", "--out", "d"],
            &["--against", "x", "--compare", "a", "b"],
            &["--against", "x", "--model", "silero"],
        ] {
            assert!(parse(&strings(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rounds_alternate_which_binary_runs_first() {
        let order: Vec<bool> = (0..4).map(before_first).collect();
        assert_eq!(order, vec![true, false, true, false]);
    }

    #[test]
    fn unknown_flags_are_those_help_does_not_name_whole() {
        let help = "laned-bench [--quick] [--model light]\n  --seconds S  per run\n  --skip-real-time\n";
        let args = strings(&[
            "--quick",
            "--model",
            "tiny",
            "--seconds",
            "0.1",
            "--skip-real",
            "--rt-max",
            "8",
        ]);
        assert_eq!(unknown_flags(help, &args), vec!["--skip-real", "--rt-max"]);
        assert!(unknown_flags(help, &strings(&["--skip-real-time", "--quick"])).is_empty());
    }

    #[test]
    fn a_report_names_the_commit_it_was_built_from() {
        let commit = "f45ee4a22470fbd18a69a14af707f90c8171f36c";
        assert_eq!(describes("f45ee4a", commit), Some(true));
        assert_eq!(describes("f45ee4a-dirty", commit), Some(true));
        assert_eq!(describes("v0.1.0-12-gf45ee4a2", commit), Some(true));
        assert_eq!(describes("c84a623", commit), Some(false));
        assert_eq!(describes("c84a623-dirty", commit), Some(false));
        assert_eq!(describes("unknown", commit), None);
        assert_eq!(describes("v0.1.0", commit), None);
    }

    #[test]
    fn median_and_spread() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(spread(&[0.9, 1.2, 1.0]), (0.9, 1.2));
        assert!(spread(&[]).0.is_nan());
        assert!((geometric_mean(&[0.5, 2.0]) - 1.0).abs() < 1e-12);
    }

    const REPORT: &str = r#"{
      "machine": {"cores": 2, "cpu_model": "x \"quoted\" \u00e9", "load_average": null, "nice": -10},
      "quick": true, "seconds_per_run": 0.2, "repeats": 3,
      "closed_loop": [
        {"model": "tiny TDNN", "streams": 4, "system": "ideal", "label": "ideal", "runs": [1.5e3, 2000.0], "median": 1750.0},
        {"model": "tiny TDNN", "streams": 4, "system": "worker", "label": "ours", "runs": [], "median": 1000}
      ],
      "real_time": [{"model": "tiny TDNN", "short": "worker", "system": "ours", "capacity": 512, "probes": []}]
    }"#;

    #[test]
    fn a_report_gives_its_figures() {
        let json = Json::parse(REPORT).unwrap();
        assert_eq!(
            json.get("machine").and_then(|m| m.get("cpu_model")).and_then(Json::str),
            Some("x \"quoted\" é")
        );
        let figures = figures(&json).unwrap();
        let keys: Vec<(&str, f64)> = figures.iter().map(|f| (f.key.as_str(), f.value)).collect();
        assert_eq!(
            keys,
            vec![
                ("tiny TDNN, 4 streams, ideal", 1750.0),
                ("tiny TDNN, 4 streams, worker", 1000.0),
                ("tiny TDNN, real time, worker", 512.0),
            ]
        );
        for bad in ["{", "[1,]", "{\"a\" 1}", "\"open", "1 2", "nul"] {
            assert!(Json::parse(bad).is_err(), "{bad}");
        }
    }

    fn run(figures: &[(&str, f64)]) -> Vec<Figure> {
        figures
            .iter()
            .map(|(k, v)| Figure {
                key: k.to_string(),
                unit: "pulses/s",
                value: *v,
            })
            .collect()
    }

    #[test]
    fn rows_pair_across_rounds_and_the_table_says_each() {
        let before = vec![
            run(&[("a", 100.0), ("b", 10.0), ("gone", 1.0)]),
            run(&[("a", 110.0), ("b", 12.0), ("gone", 1.0)]),
            run(&[("a", 90.0), ("b", 11.0), ("gone", 1.0)]),
        ];
        let after = vec![
            run(&[("b", 11.0), ("a", 120.0), ("new", 2.0)]),
            run(&[("a", 99.0), ("b", 12.0), ("new", 2.0)]),
            run(&[("a", 99.0), ("b", 11.0), ("new", 2.0)]),
        ];
        let pairing = pair(&before, &after);
        assert_eq!(pairing.only_before, vec!["gone".to_string()]);
        assert_eq!(pairing.only_after, vec!["new".to_string()]);
        assert_eq!(pairing.rows.len(), 2);
        let a = &pairing.rows[0];
        assert_eq!(a.key, "a");
        assert_eq!((a.before_median(), a.after_median()), (100.0, 99.0));
        assert!((a.ratio() - 0.99).abs() < 1e-12);
        // Round by round: 1.2, 0.9, 1.1.
        let (lo, hi) = a.spread();
        assert!((lo - 0.9).abs() < 1e-12 && (hi - 1.2).abs() < 1e-12, "{lo} {hi}");
        let t = table("abc1234", &pairing);
        assert!(
            t.contains("| row | unit | before (abc1234) | after | after / before | spread of the rounds |"),
            "{t}"
        );
        assert!(
            t.contains("| a | pulses/s | 100 | 99 | 0.990 | 0.900..1.200 (3 rounds) |"),
            "{t}"
        );
        assert!(
            t.contains("| b | pulses/s | 11 | 11 | 1.000 | 1.000..1.100 (3 rounds) |"),
            "{t}"
        );
        assert!(t.contains("only before has: gone"), "{t}");
        assert!(t.contains("only after has: new"), "{t}");
        assert!(t.contains("geometric mean of after / before over 2 rows: 0.995"), "{t}");
        // The JSON written reads back, every row there.
        let json = to_json(
            "HEAD~1",
            "abcdef",
            "the working tree",
            3,
            &[(strings(&["--quick"]), pairing)],
        );
        let back = Json::parse(&json).unwrap();
        let scenario = &back.get("scenarios").and_then(Json::array).unwrap()[0];
        let rows = scenario.get("rows").and_then(Json::array).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].get("before_median").and_then(Json::num), Some(100.0));
        assert_eq!(
            scenario.get("only_after").and_then(Json::array).unwrap()[0].str(),
            Some("new")
        );
    }
}
