//! The flags the model benches (`silero-bench`, `audio-bench`,
//! `serve-bench`) share, and how they end on bad input.

/// The run's size: `--streams N`, `--seconds S` (per closed-loop run; a
/// real-time probe lasts 1.5 times that, 1 s at least), `--repeats N`,
/// `--skip-real-time`, and `--quick` (0.5 s, one repeat).
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// Streams of the closed loop.
    pub streams: usize,
    /// Seconds per closed-loop run.
    pub seconds: f64,
    /// Closed-loop runs per system, interleaved.
    pub repeats: usize,
    /// Whether to search real-time capacity.
    pub real_time: bool,
}

impl Default for Common {
    fn default() -> Common {
        Common {
            streams: 64,
            seconds: 2.0,
            repeats: 3,
            real_time: true,
        }
    }
}

impl Common {
    /// How long one real-time probe lasts.
    pub fn probe(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64((self.seconds * 1.5).max(1.0))
    }
}

/// The next flag's value, for the flags a binary has of its own.
pub type Value<'a> = &'a mut dyn FnMut(&str) -> Result<String, String>;

/// Reads `args` (without the program's name): the shared flags into
/// [`Common`], the others offered to `own(flag, value)`, which answers
/// whether it took the flag. `--help` prints `help` and exits 0; an
/// unknown flag is an error naming it, with `help`.
pub fn parse(
    args: impl IntoIterator<Item = String>,
    help: &str,
    mut own: impl FnMut(&str, Value<'_>) -> Result<bool, String>,
) -> Result<Common, String> {
    let mut common = Common::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--streams" => common.streams = number(&value("--streams")?, "--streams")?,
            "--seconds" => common.seconds = number(&value("--seconds")?, "--seconds")?,
            "--repeats" => common.repeats = number(&value("--repeats")?, "--repeats")?,
            "--skip-real-time" => common.real_time = false,
            "--quick" => {
                common.seconds = 0.5;
                common.repeats = 1;
            }
            "--help" | "-h" => {
                print!("{help}");
                std::process::exit(0);
            }
            flag => {
                if !own(flag, &mut value)? {
                    return Err(format!("unknown argument {flag:?}\n\n{help}"));
                }
            }
        }
    }
    Ok(common)
}

/// `text` parsed, or an error naming `flag` and what it got.
pub fn number<T: std::str::FromStr>(text: &str, flag: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e| format!("{flag} {text:?}: {e}"))
}

/// The value, or exit 2 after printing why (bad arguments).
pub fn or_exit<T>(r: Result<T, String>) -> T {
    r.unwrap_or_else(|why| {
        eprintln!("{why}");
        std::process::exit(2)
    })
}

/// The model, or exit 3 after printing why it is unavailable (no registry).
pub fn model_or_exit<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|why| {
        eprintln!("{what} is unavailable here: {why}");
        std::process::exit(3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn shared_and_own_flags_are_read_and_unknown_ones_named() {
        let mut model = None;
        let c = parse(args("--streams 8 --model oww --quick"), "help", |flag, value| {
            Ok(match flag {
                "--model" => {
                    model = Some(value("--model")?);
                    true
                }
                _ => false,
            })
        })
        .unwrap();
        assert_eq!((c.streams, c.seconds, c.repeats, c.real_time), (8, 0.5, 1, true));
        assert_eq!(model.as_deref(), Some("oww"));
        let e = parse(args("--bogus"), "HELP", |_, _| Ok(false)).unwrap_err();
        assert!(e.contains("--bogus") && e.contains("HELP"), "{e}");
        let e = parse(args("--streams many"), "", |_, _| Ok(false)).unwrap_err();
        assert!(e.contains("--streams") && e.contains("many"), "{e}");
        let e = parse(args("--model"), "", |_, value| value("--model").map(|_| true)).unwrap_err();
        assert!(e.contains("--model needs a value"), "{e}");
    }
}
