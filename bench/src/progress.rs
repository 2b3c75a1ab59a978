//! The progress bar of a long run: what is measured now (system, load,
//! repeat), how far along, the time left. Drawn on stderr by `indicatif`,
//! and only when stdout and stderr are both terminals: a run piped to a
//! file or run by CI prints its tables and nothing else.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Steps of one phase of a run (the closed loop, the real-time searches).
pub struct Progress(ProgressBar);

impl Progress {
    /// A bar of `total` steps, prefixed with `phase`.
    pub fn new(phase: &str, total: usize) -> Progress {
        let bar = if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
            ProgressBar::new(total as u64)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:28}] {pos}/{len} {elapsed} (left {eta}) {wide_msg}")
                .expect("the template is valid")
                .progress_chars("=> "),
        );
        bar.set_prefix(phase.to_string());
        Progress(bar)
    }

    /// Says what runs now: the previous step is done.
    pub fn step(&self, now: String) {
        if !self.0.message().is_empty() {
            self.0.inc(1);
        }
        self.0.set_message(now);
    }

    /// The last step is done; the bar goes.
    pub fn finish(&self) {
        self.0.inc(1);
        self.0.finish_and_clear();
    }
}
