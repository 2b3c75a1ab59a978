//! The CPUs this process may run on, for pinning the benches with `taskset`.
//!
//! Under a cpuset (a container, a CI runner, `taskset` itself) the allowed
//! CPUs need not start at 0 nor be contiguous, so a pin list is built from
//! the kernel's own list (`Cpus_allowed_list` in `/proc/self/status`), not
//! from a count.

/// The CPUs this process may run on, in ascending order. Where the kernel's
/// list cannot be read (not Linux), CPUs 0 to the available parallelism.
pub fn allowed() -> Vec<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
            parse_list(line.trim())
        })
        .filter(|cpus| !cpus.is_empty())
        .unwrap_or_else(|| (0..std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1)).collect())
}

/// Parses a kernel CPU list such as `0-3,8,10-11`; `None` if malformed.
pub fn parse_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = vec![];
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// `cpus` as a `taskset -c` list (`2,3,5`).
pub fn to_list(cpus: &[usize]) -> String {
    cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_lists_parse_to_each_cpu_once() {
        assert_eq!(parse_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_list("2,4-6,9"), Some(vec![2, 4, 5, 6, 9]));
        assert_eq!(parse_list("3,3,1-2"), Some(vec![1, 2, 3]));
        assert_eq!(parse_list("5-2"), None);
        assert_eq!(parse_list("a-3"), None);
        assert_eq!(to_list(&[2, 4, 5]), "2,4,5");
    }

    #[test]
    fn this_process_may_run_somewhere() {
        let cpus = allowed();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]), "{cpus:?} is not ascending");
    }
}
