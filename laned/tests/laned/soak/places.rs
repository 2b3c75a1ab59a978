//! The soak's processes: three `laned serve` replicas on fixed ports (a
//! replica stopped is started again where it was), the store, and HAProxy
//! on the shipped `deploy/haproxy/laned.cfg` with a third server added.
//! Each is a real process, killed when its holder is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use laned_server::testing::{free_port, Redis, RedisCluster};

use super::super::serve::{serve, Serving};

/// The replicas' count: the shipped config's two and one more.
pub const REPLICAS: usize = 3;

/// One replica's place: its ports and the process now there, if any.
pub struct Replica {
    pub listen: String,
    pub grpc: String,
    pub serving: Option<Serving>,
}

/// The replicas, all started with the same arguments.
pub struct Replicas {
    pub args: Vec<String>,
    pub each: Vec<Replica>,
}

impl Replicas {
    /// `REPLICAS` replicas of `laned serve ARGS`, each on ports of its own.
    pub fn start(args: Vec<String>) -> Replicas {
        let each = (0..REPLICAS)
            .map(|_| Replica {
                listen: format!("127.0.0.1:{}", free_port()),
                grpc: format!("127.0.0.1:{}", free_port()),
                serving: None,
            })
            .collect();
        let mut replicas = Replicas { args, each };
        for r in 0..REPLICAS {
            replicas.restart(r);
        }
        replicas
    }

    /// Replica `r` started (again) on its ports; a port still held by the
    /// process before is waited for, up to 20 s.
    pub fn restart(&mut self, r: usize) {
        let place = &mut self.each[r];
        drop(place.serving.take());
        let mut args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        args.extend(["--listen", &place.listen, "--grpc-listen", &place.grpc]);
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match serve(&args) {
                Ok(s) => {
                    place.serving = Some(s);
                    return;
                }
                Err(e) if Instant::now() < until => {
                    eprintln!("soak: replica {r} did not start ({e}); again");
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => panic!("replica {r} never started again: {e}"),
            }
        }
    }

    /// The process id of replica `r`, if one runs.
    pub fn pid(&self, r: usize) -> Option<u32> {
        self.each[r].serving.as_ref().map(Serving::pid)
    }

    /// Waits up to `within` for replica `r`'s exit; whether it exited.
    pub fn exited_within(&mut self, r: usize, within: Duration) -> bool {
        self.each[r].serving.as_mut().is_none_or(|s| s.exited_within(within))
    }
}

/// Sends `signal` (as `kill` spells it) to process `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").args([signal, &pid.to_string()]).status();
    assert!(status.is_ok_and(|s| s.success()), "kill {signal} {pid}");
}

/// What a process holds: its resident memory (KiB) and open sockets.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Held {
    pub rss_kib: u64,
    pub sockets: u64,
}

impl Held {
    /// Read from `/proc` for `pid` (zeros where it is gone).
    pub fn of(pid: u32) -> Held {
        let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:")))
                    .count() as u64
            })
            .unwrap_or(0);
        Held { rss_kib, sockets }
    }
}

/// The store: a Redis (Debian's `redis-server`) on a port that stays its
/// own across a restart, so the replicas' `--store` URL stays right; or a
/// Redis Cluster of three masters with a replica each.
pub enum Store {
    Single(Option<Redis>),
    Cluster { cluster: RedisCluster },
}

impl Store {
    /// Started, or `None` after `SKIPPED` where redis-server is missing.
    pub fn start(cluster: bool) -> Option<Store> {
        if !cluster {
            return Some(Store::Single(Some(Redis::start()?)));
        }
        Some(Store::Cluster {
            cluster: RedisCluster::start()?,
        })
    }

    /// The URL the replicas are given.
    pub fn url(&self) -> String {
        match self {
            Store::Single(redis) => redis.as_ref().expect("a store").url(),
            Store::Cluster { cluster, .. } => cluster.url(),
        }
    }

    /// Killed outright and started again empty on the same port (a single
    /// Redis only).
    pub fn restart_empty(&mut self) {
        let Store::Single(redis) = self else {
            panic!("a cluster is not restarted empty: its masters fail over")
        };
        let url = redis.as_ref().expect("a store").url();
        let port: u16 = url
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port in the store's URL");
        drop(redis.take());
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match Redis::start_at(port) {
                Some(r) => {
                    *redis = Some(r);
                    return;
                }
                None if Instant::now() < until => std::thread::sleep(Duration::from_millis(100)),
                None => panic!("redis-server never started again on port {port}"),
            }
        }
    }

    /// Sends a single Redis `signal` (`-STOP`, `-CONT`).
    pub fn signal(&self, signal: &str) {
        match self {
            Store::Single(redis) => redis.as_ref().expect("a store").signal(signal),
            Store::Cluster { .. } => panic!("a cluster's nodes are not signalled as one"),
        }
    }

    /// Whether it is a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Store::Cluster { .. })
    }

    /// A cluster's master killed outright (one with a replica to take
    /// over), its replica promoted; the killed master's port, `None` where
    /// no master has a replica left (nothing done).
    pub fn fail_over(&mut self) -> Option<u16> {
        let Store::Cluster { cluster } = self else {
            panic!("only a cluster fails over")
        };
        let key = (0..1000)
            .map(|i| format!("soak-failover-{i}"))
            .find(|k| replicas_of(cluster.master_of(k)) > 0)?;
        Some(cluster.kill_master_of(&key))
    }

    /// A cluster's master serving `key` stopped (SIGSTOP) for `stall`,
    /// past the node timeout: its replica takes over, and the master, let
    /// go on, rejoins as the replica's replica. Its port.
    pub fn stall_master(&self, key: &str, stall: Duration) -> u16 {
        let Store::Cluster { cluster } = self else {
            panic!("only a cluster's master is stalled")
        };
        let port = cluster.master_of(key);
        // A cluster node's process title is `redis-server 127.0.0.1:PORT [cluster]`.
        let found = Command::new("pgrep")
            .args(["-f", &format!("redis-server 127.0.0.1:{port} ")])
            .output()
            .expect("pgrep");
        let pid: u32 = String::from_utf8_lossy(&found.stdout)
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no redis-server process on port {port}"));
        signal(pid, "-STOP");
        std::thread::sleep(stall);
        signal(pid, "-CONT");
        port
    }
}

/// How many replicas the Redis node on `port` has connected
/// (`INFO replication`'s `connected_slaves`).
fn replicas_of(port: u16) -> u32 {
    let info = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "replication"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// HAProxy on the shipped `deploy/haproxy/laned.cfg`: its two servers
/// pointed at the first two replicas and a third server line added for
/// the third, in every backend; one backend of its own per model in
/// `models` (as the config says to copy `laned_vad`'s).
pub struct Proxy {
    child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// Started and forwarding `/ready`, or `None` after `SKIPPED` where
    /// haproxy is missing.
    pub fn start(replicas: &Replicas, models: &[&str]) -> Option<Proxy> {
        if Command::new("haproxy").arg("-v").output().is_err() {
            eprintln!("SKIPPED: haproxy is not installed (Debian's `haproxy`; .ci/run installs it)");
            return None;
        }
        let addr = format!("127.0.0.1:{}", free_port());
        let cfg = config(&shipped(), &addr, replicas, models);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("haproxy.cfg"), cfg).unwrap();
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(dir.path().join("haproxy.cfg"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let proxy = Proxy { child, addr, _dir: dir };
        let until = Instant::now() + Duration::from_secs(10);
        while !super::super::serve::http_get(&proxy.addr, "/ready").starts_with("model") {
            assert!(Instant::now() < until, "haproxy never forwarded /ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(proxy)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The shipped config's text.
fn shipped() -> String {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/haproxy/laned.cfg");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The shipped config pointed at this soak's proxy address and replicas:
/// `laned_vad` copied for each model of `models`, a third server added.
fn config(shipped: &str, front: &str, replicas: &Replicas, models: &[&str]) -> String {
    assert!(
        shipped.contains("127.0.0.1:8000") && shipped.contains("server laned2 127.0.0.1:9002 check"),
        "the shipped config's addresses changed"
    );
    let start = shipped.find("# Model `vad`'s streams.").expect("the per-model backend");
    let end = shipped[start..]
        .find("\n# Every other model")
        .map(|e| start + e)
        .expect("its end");
    let per_model = &shipped[start..end];
    let mut cfg = shipped[..start].to_string();
    let use_line = "    use_backend laned_vad if { path_beg /v1/models/vad/ }\n";
    assert!(cfg.contains(use_line), "the shipped use_backend line changed");
    let uses: String = models.iter().map(|m| use_line.replace("vad", m)).collect();
    cfg = cfg.replace(use_line, &uses);
    for m in models {
        cfg.push_str(&per_model.replace("vad", m));
    }
    cfg.push_str(&shipped[end..]);
    let third = format!(
        "    server laned2 127.0.0.1:9002 check\n    server laned3 {} check\n",
        replicas.each[2].listen
    );
    cfg.replace("127.0.0.1:8000", front)
        .replace("    server laned2 127.0.0.1:9002 check\n", &third)
        .replace("127.0.0.1:9001", &replicas.each[0].listen)
        .replace("127.0.0.1:9002", &replicas.each[1].listen)
}
