//! Fixtures the tests of this crate and of the `laned` tool share, written
//! once: a free port on 127.0.0.1, SIGTERM for a child server, a real Redis (Debian's
//! `redis-server`) on a private port and directory, and a real Redis
//! Cluster of three masters with a replica each ([`RedisCluster`]). Not part of the API
//! (hidden from the docs); built on std and this crate's own dependencies
//! only, so the library pulls in nothing for its tests.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Sends SIGTERM to process `pid` (a child server: it drains, handing its
/// streams over where a store is configured).
pub fn sigterm(pid: u32) {
    let sent = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    assert!(sent.as_ref().is_ok_and(|s| s.success()), "kill -TERM {pid}: {sent:?}");
}

/// A port nobody listened on a moment ago, on 127.0.0.1 (the tests'
/// servers, probes and stores bind it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// `redis-server` on a private port and directory (no persistence),
/// killed and its directory removed when dropped.
pub struct Redis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    /// Started and answering `PING`, or `None` after a `SKIPPED` line
    /// where `redis-server` is not installed.
    pub fn start() -> Option<Redis> {
        Redis::start_at(free_port())
    }

    /// As [`Redis::start`], on `port` (one a Redis killed a moment ago
    /// held: a store restarted empty where its clients look for it).
    pub fn start_at(port: u16) -> Option<Redis> {
        let dir = std::env::temp_dir().join(format!("laned-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for redis-server");
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            let _ = std::fs::remove_dir_all(&dir);
            eprintln!("SKIPPED: redis-server is not installed (Debian's `redis-server`; .ci/run installs it)");
            return None;
        };
        let redis = Redis { child, port, dir };
        let until = Instant::now() + Duration::from_secs(10);
        while !redis.pongs() {
            assert!(Instant::now() < until, "redis-server never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(redis)
    }

    /// Whether it answers a `PING` now.
    fn pongs(&self) -> bool {
        let pong = std::net::TcpStream::connect(("127.0.0.1", self.port)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            s.write_all(b"PING\r\n")?;
            let mut b = [0u8; 5];
            s.read_exact(&mut b).map(|_| b)
        });
        pong.is_ok_and(|b| &b == b"+PONG")
    }

    /// Its address as a `--store` takes it.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client connection, checked with a `PING`.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let mut c = redis::Client::open(self.url())?.get_connection()?;
        redis::cmd("PING").query::<String>(&mut c)?;
        Ok(c)
    }

    /// Sends it `signal` (as `kill` spells it: `-STOP`, `-KILL`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal} redis-server");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster on loopback: three masters with a replica each
/// (`redis-server --cluster-enabled yes`, joined by `redis-cli --cluster
/// create`), each node on private ports (its own and its cluster bus) and
/// directory, no persistence, a node timeout of 1 s (a master killed is
/// replaced by its replica within a few seconds). Every node killed and
/// the directory removed when dropped.
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    dir: PathBuf,
}

/// One node of a [`RedisCluster`]: `None` once killed.
struct ClusterNode {
    child: Option<Child>,
    port: u16,
}

/// What `CLUSTER NODES` says of one node.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    /// The slot ranges it serves (a master's), inclusive.
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Started, joined and `cluster_state:ok` on every node, each replica
    /// in sync with its master; or `None` after a `SKIPPED` line where
    /// `redis-server` or `redis-cli` is not installed.
    pub fn start() -> Option<RedisCluster> {
        let installed = |tool: &str| {
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !installed("redis-server") || !installed("redis-cli") {
            eprintln!(
                "SKIPPED: redis-server or redis-cli is not installed (Debian's `redis-server`; .ci/run installs it)"
            );
            return None;
        }
        let dir = std::env::temp_dir().join(format!("laned-redis-cluster-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("a directory for the cluster");
        let mut cluster = RedisCluster { nodes: vec![], dir };
        for _ in 0..6 {
            let (port, bus) = (free_port(), free_port());
            let own = cluster.dir.join(port.to_string());
            std::fs::create_dir_all(&own).expect("a directory for a cluster node");
            let child = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--cluster-enabled", "yes", "--cluster-port", &bus.to_string()])
                .args(["--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"])
                // A replica takes over whatever its data's age (the default
                // refuses one that lost its master's link long enough).
                .args(["--cluster-replica-validity-factor", "0"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&own)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server starts");
            cluster.nodes.push(ClusterNode {
                child: Some(child),
                port,
            });
        }
        for node in &cluster.nodes {
            let until = Instant::now() + Duration::from_secs(10);
            while cluster.cli(node.port, &["PING"]).as_deref() != Some("PONG") {
                assert!(Instant::now() < until, "cluster node {} never answered", node.port);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let created = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        cluster.settled(Duration::from_secs(30));
        Some(cluster)
    }

    /// `redis-cli -p port ARGS`'s output, trimmed; `None` where it failed.
    fn cli(&self, port: u16, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }

    /// The ports of the nodes not killed.
    fn live(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// `CLUSTER NODES` as node `port` sees it.
    fn nodes_seen(&self, port: u16) -> Vec<NodeLine> {
        let text = self.cli(port, &["CLUSTER", "NODES"]).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = f.get(1)?.split('@').next()?.rsplit(':').next()?.parse().ok()?;
                let flags = f.get(2)?;
                let slots = f
                    .iter()
                    .skip(8)
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|s| match s.split_once('-') {
                        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                        None => s.parse().ok().map(|a| (a, a)),
                    })
                    .collect();
                Some(NodeLine {
                    id: f[0].to_string(),
                    port,
                    master: flags.contains("master"),
                    failed: flags.split(',').any(|f| f == "fail"),
                    slots,
                })
            })
            .collect()
    }

    /// Waits (up to `within`) until every live node says `cluster_state:ok`,
    /// every slot is served by a live master on every live node's map, and
    /// every live replica's link to its master is up.
    fn settled(&self, within: Duration) {
        let until = Instant::now() + within;
        loop {
            let live = self.live();
            let ok = live.iter().all(|&port| {
                let info = self.cli(port, &["CLUSTER", "INFO"]).unwrap_or_default();
                let masters: Vec<NodeLine> = self
                    .nodes_seen(port)
                    .into_iter()
                    .filter(|n| n.master && live.contains(&n.port))
                    .collect();
                let served: u32 = masters
                    .iter()
                    .flat_map(|n| n.slots.iter())
                    .map(|(a, b)| u32::from(b - a) + 1)
                    .sum();
                let replication = self.cli(port, &["INFO", "replication"]).unwrap_or_default();
                let in_sync = replication.contains("role:master") || replication.contains("master_link_status:up");
                info.contains("cluster_state:ok") && served == 16384 && in_sync
            });
            if ok {
                return;
            }
            assert!(Instant::now() < until, "the cluster did not settle within {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its nodes as a `--store` takes them: `redis+cluster://127.0.0.1:P,...`
    /// (every node, masters and replicas).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let port = self.live()[0];
        self.cli(port, &["CLUSTER", "KEYSLOT", key])
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("CLUSTER KEYSLOT {key:?}"))
    }

    /// The port of the master serving `key`'s slot now.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot = self.slot_of(key);
        let live = self.live();
        self.nodes_seen(live[0])
            .into_iter()
            .find(|n| n.master && !n.failed && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no master serves slot {slot} of {key:?}"))
    }

    /// The ports of the masters serving slots now, each with how many keys
    /// it holds (`DBSIZE`).
    pub fn keys_per_master(&self) -> Vec<(u16, u64)> {
        self.masters()
            .into_iter()
            .map(|n| {
                (
                    n.port,
                    self.cli(n.port, &["DBSIZE"]).and_then(|s| s.parse().ok()).unwrap_or(0),
                )
            })
            .collect()
    }

    /// A plain connection to node `port` (no redirection followed).
    pub fn node(&self, port: u16) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))?.get_connection()
    }

    /// SIGKILLs the master serving `key`'s slot and waits (30 s at most)
    /// until its replica is promoted and the cluster says ok again on every
    /// node left; the killed master's port.
    pub fn kill_master_of(&mut self, key: &str) -> u16 {
        let port = self.master_of(key);
        let node = self.nodes.iter_mut().find(|n| n.port == port).expect("a node of ours");
        let mut child = node.child.take().expect("a live node");
        let _ = child.kill();
        let _ = child.wait();
        self.settled(Duration::from_secs(30));
        let now = self.master_of(key);
        assert_ne!(now, port, "{key:?}'s slot is still served by the master killed");
        port
    }

    /// The live masters serving slots, as node `port` sees them.
    fn masters(&self) -> Vec<NodeLine> {
        let live = self.live();
        self.nodes_seen(live[0])
            .into_iter()
            .filter(|n| n.master && !n.slots.is_empty() && live.contains(&n.port))
            .collect()
    }

    /// `redis-cli -p port ARGS`, which must not fail: its output.
    fn must(&self, port: u16, args: &[&str]) -> String {
        let said = self.cli(port, args);
        assert!(
            said.as_deref().is_some_and(|s| !s.starts_with("ERR")),
            "redis-cli -p {port} {args:?}: {said:?}"
        );
        said.unwrap_or_default()
    }

    /// Starts moving `key`'s slot from its master to another and moves its
    /// keys (`CLUSTER SETSLOT ... IMPORTING` and `MIGRATING`, `MIGRATE`):
    /// the slot is still the first master's, which answers `ASK` for the
    /// keys moved; [`RedisCluster::finish_moving`] ends it. The two
    /// masters' ports, from and to.
    pub fn start_moving_slot_of(&self, key: &str) -> (u16, u16) {
        let slot = self.slot_of(key).to_string();
        let masters = self.masters();
        let from = self.master_of(key);
        let source = masters.iter().find(|n| n.port == from).expect("the slot's master");
        let target = masters.iter().find(|n| n.port != from).expect("another master");
        self.must(target.port, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source.id]);
        self.must(source.port, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target.id]);
        loop {
            let keys = self.must(source.port, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let target_port = target.port.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &target_port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            self.must(source.port, &args);
        }
        (source.port, target.port)
    }

    /// Ends the move [`RedisCluster::start_moving_slot_of`] began: `key`'s
    /// slot is master `to`'s on every master (`CLUSTER SETSLOT ... NODE`),
    /// so a client that learnt the old map is answered `MOVED`.
    pub fn finish_moving(&self, key: &str, to: u16) {
        let slot = self.slot_of(key).to_string();
        let masters = self.masters();
        let target = masters.iter().find(|n| n.port == to).expect("the target master");
        for m in &masters {
            self.must(m.port, &["CLUSTER", "SETSLOT", &slot, "NODE", &target.id]);
        }
        let until = Instant::now() + Duration::from_secs(10);
        while self.master_of(key) != to {
            assert!(Instant::now() < until, "slot {slot} never moved to {to}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
