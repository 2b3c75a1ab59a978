//! `laned fetch NAME...`: the built-in models' files put in the cache
//! ahead of time (`LANED_CACHE_DIR`, else the user's cache), checked
//! against their pins, so that `laned serve` finds them there and needs no
//! registry client (python3, pip) when it starts: an image fetches at
//! build time. Exit status: 0 every one fetched, 1 one could not be, 2 a
//! name that is no built-in.

use std::process::ExitCode;

use laned_models::spec::Builtin;

/// What `laned fetch` was asked.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The built-ins to fetch: `silero`, `dtln-chain`, `deepfilternet3`,
    /// or `all`.
    #[arg(required = true)]
    pub names: Vec<String>,
}

pub fn run(args: &Args) -> ExitCode {
    let mut wanted = Vec::new();
    for name in &args.names {
        if name == "all" {
            wanted.extend(Builtin::ALL);
            continue;
        }
        match Builtin::named(name) {
            Some(b) => wanted.push(b),
            None => {
                let names: Vec<&str> = Builtin::ALL.iter().map(|b| b.name()).collect();
                eprintln!(
                    "laned fetch: no built-in model {name:?}: the built-ins are {} (or all)",
                    names.join(", ")
                );
                return ExitCode::from(2);
            }
        }
    }
    for b in wanted {
        match b.fetch() {
            Ok(files) => {
                for f in files {
                    println!("{}: {}", b.name(), f.display());
                }
            }
            Err(e) => {
                eprintln!("laned fetch: {}: {e}", b.name());
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}
