//! The CPU clocks a run is costed with: this process's, another's (a
//! server the bench started), and its threads' of one name. Linux reads
//! them from `/proc`; elsewhere they are `None`.

use std::time::Duration;

/// CPU time this process has used so far, all threads together, from
/// `/proc/self/stat` (Linux; in USER_HZ ticks of 10 ms); `None` elsewhere.
/// Over a probe of seconds, what a runner costs besides the latency it
/// gives.
pub fn process_cpu_time() -> Option<Duration> {
    cpu_time_from("/proc/self/stat")
}

/// [`process_cpu_time`] of another process (a server the bench started).
pub fn cpu_time_of(pid: u32) -> Option<Duration> {
    cpu_time_from(&format!("/proc/{pid}/stat"))
}

fn cpu_time_from(path: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may hold spaces), from `state`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// CPU time (user and system) of this process's live threads whose name
/// starts with `prefix` (a runner's worker threads: `laned-worker`,
/// tract's `tract-lanes`), in clock ticks of 10 ms. Linux; `None`
/// elsewhere.
pub fn threads_cpu_time(prefix: &str) -> Option<Duration> {
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (open, close) = (stat.find('(')?, stat.rfind(')')?);
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        ticks += fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    }
    Some(Duration::from_millis(ticks * 10))
}

// Linux only: elsewhere the clocks are `None`.
#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Work the optimiser cannot remove: a count run through `black_box`.
    fn work(x: u64) -> u64 {
        (0..100_000).fold(x, |x, _| std::hint::black_box(x.wrapping_add(1)))
    }

    /// A named thread's CPU time is counted under its name's prefix, and
    /// another name's is not.
    #[test]
    fn threads_cpu_time_counts_the_named_threads_only() {
        let busy = std::thread::Builder::new()
            .name("cpu-probe-busy".into())
            .spawn(|| {
                let give_up = Instant::now() + Duration::from_secs(20);
                let mut x = 1u64;
                while threads_cpu_time("cpu-probe-busy").unwrap() < Duration::from_millis(50) {
                    x = work(x);
                    assert!(
                        Instant::now() < give_up,
                        "20 s of work and the thread's clock did not move 50 ms"
                    );
                }
                x
            })
            .unwrap();
        assert_ne!(busy.join().unwrap(), 0);
        assert_eq!(threads_cpu_time("no-such-thread"), Some(Duration::ZERO));
    }

    /// The process CPU clock moves while this thread computes.
    #[test]
    fn process_cpu_time_advances_with_work() {
        let start = process_cpu_time().expect("/proc/self/stat is readable on Linux");
        let give_up = Instant::now() + Duration::from_secs(20);
        let mut x = 1u64;
        while process_cpu_time().unwrap() < start + Duration::from_millis(30) {
            x = work(x);
            assert!(
                Instant::now() < give_up,
                "20 s of work and the CPU clock did not move 30 ms"
            );
        }
        assert_ne!(x, 0);
    }
}
