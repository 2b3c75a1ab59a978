//! The soak's figures: streams, answers, faults by kind, wrong answers,
//! streams lost with and without being told, restarts at 0 by the reason
//! told, late answers, the replicas' memory and sockets; every answer
//! checked against its stream run alone. A wrong answer is named by the
//! seed, the stream, the pulse and the last fault before it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::faults::{Fault, Kind};
use super::places::Held;
use super::stream::{Ended, Run};
use super::Config;

/// An answer later than this after its pulse is counted late.
pub const LATE: Duration = Duration::from_secs(1);

/// What one soak came to.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Figures {
    pub seed: u64,
    pub seconds: u64,
    /// `redis` or `cluster`.
    pub store: &'static str,
    pub streams: usize,
    /// Streams by front.
    pub fronts: BTreeMap<&'static str, usize>,
    pub answers: usize,
    pub faults: BTreeMap<Kind, usize>,
    /// Answers that are not the stream's alone, and what the server did
    /// that no client may see (must be 0).
    pub wrong: usize,
    /// The first of them, each named.
    pub wrong_named: Vec<String>,
    /// Streams given up on after interruptions nothing explained (must be
    /// 0), and those given up on with a reason said.
    pub lost_silently: usize,
    pub lost_told: BTreeMap<String, usize>,
    /// Streams that went on from a record's position (above 0).
    pub resumes: u64,
    /// Streams started again at 0 after answers, by the reason told.
    pub restarted_at_0: BTreeMap<String, usize>,
    pub late_answers: usize,
    pub slowest_answer_ms: u64,
    /// Each replica at the start and at the end.
    pub replicas_start: Vec<Held>,
    pub replicas_end: Vec<Held>,
}

/// `text` with its stream ids and numbers made general, so that reasons
/// told to different streams count together.
fn general(text: &str, id: &str) -> String {
    let text = text.replace(id, "ID");
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('N') {
                out.push('N');
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Figures {
    /// No stream yet.
    pub fn new(config: &Config, replicas_start: Vec<Held>) -> Figures {
        Figures {
            seed: config.seed,
            seconds: config.seconds,
            store: if config.cluster { "cluster" } else { "redis" },
            replicas_start,
            ..Figures::default()
        }
    }

    /// The figures of `runs`, each answer checked against `alone(model,
    /// pulses)`, the stream's answers alone.
    pub fn of(
        config: &Config,
        runs: &[Run],
        faults: &[Fault],
        alone: impl Fn(usize, &[Vec<u8>]) -> Vec<Vec<u8>>,
        (replicas_start, replicas_end): (Vec<Held>, Vec<Held>),
        started: Instant,
    ) -> Figures {
        let mut f = Figures::new(config, replicas_start);
        for run in runs {
            f.add(run, &alone(run.plan.model, &run.plan.pulses), faults, started);
        }
        f.end(faults, replicas_end);
        f
    }

    /// The faults and the replicas at the end.
    pub fn end(&mut self, faults: &[Fault], replicas_end: Vec<Held>) {
        for fault in faults {
            *self.faults.entry(fault.kind).or_default() += 1;
        }
        self.replicas_end = replicas_end;
    }

    /// One stream, its answers checked against `want` (its answers alone);
    /// a wrong one named with the last of `faults` before it.
    pub fn add(&mut self, run: &Run, want: &[Vec<u8>], faults: &[Fault], started: Instant) {
        let f = self;
        let seed = f.seed;
        f.streams += 1;
        *f.fronts.entry(run.front).or_default() += 1;
        f.answers += run.answers.len();
        f.resumes += run.resumes as u64;
        for why in &run.restarts {
            *f.restarted_at_0.entry(general(why, &run.plan.id)).or_default() += 1;
        }
        match &run.ended {
            Ended::Done => {}
            Ended::Lost { told: Some(why) } => {
                *f.lost_told.entry(general(why, &run.plan.id)).or_default() += 1;
            }
            Ended::Lost { told: None } => f.lost_silently += 1,
        }
        for b in &run.broken {
            f.wrong += 1;
            f.name_wrong(format!("seed {seed}: stream {} ({}): {b}", run.plan.id, run.front));
        }
        for a in &run.answers {
            let waited = a.got - a.sent;
            f.late_answers += (waited > LATE) as usize;
            f.slowest_answer_ms = f.slowest_answer_ms.max(waited.as_millis() as u64);
            if want.get(a.pulse) != Some(&a.bytes) {
                f.wrong += 1;
                let at = (a.got - started).as_secs_f64();
                let before = faults
                    .iter()
                    .rev()
                    .find(|x| x.at_s <= at)
                    .map_or("none".to_string(), |x| {
                        format!("{:?} on {} at {:.1} s", x.kind, x.target, x.at_s)
                    });
                f.name_wrong(format!(
                    "seed {seed}: stream {} ({}), pulse {}: answered at {at:.1} s, not the stream's answer alone; \
                     the last fault before it: {before}",
                    run.plan.id, run.front, a.pulse
                ));
            }
        }
    }

    fn name_wrong(&mut self, what: String) {
        if self.wrong_named.len() < 10 {
            self.wrong_named.push(what);
        }
    }

    /// Written as JSON to `path`.
    pub fn write(&self, path: &Path) {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, serde_json::to_string_pretty(self).unwrap()).unwrap();
    }

    /// The figures in a few lines.
    pub fn summary(&self) -> String {
        format!(
            "soak, seed {} ({} s, the store on {}): {} streams {:?}, {} answers; faults {:?}\n\
             wrong answers {}; lost silently {}, lost told {:?}; resumed {} times; restarted at 0 {:?}\n\
             answers later than 1 s {} (slowest {} ms); replicas (RSS KiB, sockets) at start {:?}, at end {:?}",
            self.seed,
            self.seconds,
            self.store,
            self.streams,
            self.fronts,
            self.answers,
            self.faults,
            self.wrong,
            self.lost_silently,
            self.lost_told,
            self.resumes,
            self.restarted_at_0,
            self.late_answers,
            self.slowest_answer_ms,
            self.replicas_start
                .iter()
                .map(|h| (h.rss_kib, h.sockets))
                .collect::<Vec<_>>(),
            self.replicas_end
                .iter()
                .map(|h| (h.rss_kib, h.sockets))
                .collect::<Vec<_>>(),
        )
    }

    /// Panics, naming what, unless every answer was right, no stream was
    /// lost silently, every front carried streams and every kind of fault
    /// happened.
    pub fn assert_green(&self) {
        let replay = format!(
            "replay: cargo xtask soak --seconds {} --seed {}",
            self.seconds, self.seed
        );
        assert!(
            self.wrong == 0,
            "{} wrong: {:#?}\n{replay}",
            self.wrong,
            self.wrong_named
        );
        assert!(
            self.lost_silently == 0,
            "{} streams lost silently\n{replay}",
            self.lost_silently
        );
        for front in ["ws", "mux", "rest", "grpc"] {
            assert!(self.fronts.get(front).is_some_and(|n| *n > 0), "no stream on {front}");
        }
        if self.seconds >= 60 {
            assert!(
                self.faults.len() == 6,
                "not every kind of fault happened: {:?}",
                self.faults
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::stream::{Answer, Plan};
    use super::*;

    /// The checker catches a broken server: an answer one bit off is
    /// named with its seed, stream, pulse and the fault before it, and a
    /// stream lost with nothing said is counted silent.
    #[test]
    fn the_soak_checker_names_a_wrong_answer_and_a_silent_loss() {
        let started = Instant::now();
        let alone = |_: usize, pulses: &[Vec<u8>]| pulses.iter().map(|p| p.iter().map(|b| b ^ 1).collect()).collect();
        let plan = Plan {
            id: "s".into(),
            model: 0,
            pulses: vec![vec![1, 2], vec![3, 4], vec![5, 6]],
        };
        let mut run = Run::new("ws", plan.clone());
        for (k, p) in plan.pulses.iter().enumerate() {
            let mut bytes: Vec<u8> = p.iter().map(|b| b ^ 1).collect();
            if k == 2 {
                bytes[1] ^= 0x80;
            }
            run.answers.push(Answer {
                pulse: k,
                bytes,
                sent: started,
                got: started + Duration::from_secs(2),
            });
        }
        run.ended = Ended::Done;
        let mut lost = Run::new("mux", plan);
        lost.ended = Ended::Lost { told: None };
        let fault = Fault {
            kind: Kind::Sigkill,
            target: "replica 1".into(),
            at_s: 1.5,
            until_s: 2.5,
        };
        let config = Config {
            seconds: 1,
            seed: 7,
            json: "/dev/null".into(),
            cluster: false,
        };
        let f = Figures::of(
            &config,
            &[run.clone(), lost],
            &[fault],
            alone,
            (vec![], vec![]),
            started,
        );
        assert_eq!((f.wrong, f.lost_silently, f.answers, f.late_answers), (1, 1, 3, 3));
        let named = &f.wrong_named[0];
        for words in ["seed 7", "stream s", "pulse 2", "Sigkill on replica 1"] {
            assert!(named.contains(words), "{named:?} should say {words:?}");
        }
        // The same stream answered right is green.
        let mut right = run;
        right.answers[2].bytes = vec![5 ^ 1, 6 ^ 1];
        let f = Figures::of(&config, &[right], &[], alone, (vec![], vec![]), started);
        assert_eq!(f.wrong, 0);
    }
}
