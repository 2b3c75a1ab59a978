//! Fixtures the tests of this crate and of the `laned` tool share, written
//! once: a free port on 127.0.0.1, SIGTERM for a child server and a real Redis (Debian's
//! `redis-server`) on a private port and directory. Not part of the API
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
