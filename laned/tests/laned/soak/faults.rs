//! The soak's faults: drawn from the seed (kind, target, moment,
//! length), one at a time, from the traffic's start to its end. The kinds
//! come in a shuffled round, so every kind comes once a round (six with a
//! single Redis; with a cluster, a master killed in place of a restart
//! empty, and a master stalled past the node timeout, so that it fails
//! over too).

use std::time::{Duration, Instant};

use super::places::{self, Replicas, Store, REPLICAS};
use super::Ctx;

/// What went wrong, on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A replica told SIGTERM (it drains, handing its streams over), then
    /// started again.
    Sigterm,
    /// A replica killed outright (SIGKILL; checkpoints every 4 pulses),
    /// then started again.
    Sigkill,
    /// Redis stopped (SIGSTOP) for 2 to 4 s.
    StoreStall,
    /// Redis killed and started again empty.
    StoreEmpty,
    /// A client's connection dropped between a pulse and its answer.
    ClientDrop,
    /// A Redis Cluster's master killed outright (SIGKILL), its replica
    /// promoted: what a cluster's store goes through in place of a
    /// restart (while a master has a replica to take over).
    Failover,
    /// A replica stopped (SIGSTOP) for 2 to 4 s: a stall, not a death.
    ReplicaStall,
}

/// The kinds with a single Redis as the store.
pub const KINDS: [Kind; 6] = [
    Kind::Sigterm,
    Kind::Sigkill,
    Kind::StoreStall,
    Kind::StoreEmpty,
    Kind::ClientDrop,
    Kind::ReplicaStall,
];

/// The kinds with a Redis Cluster as the store (a store stall is a
/// master's, past the node timeout: it fails over too).
pub const CLUSTER_KINDS: [Kind; 6] = [
    Kind::Sigterm,
    Kind::Sigkill,
    Kind::StoreStall,
    Kind::Failover,
    Kind::ClientDrop,
    Kind::ReplicaStall,
];

/// One fault as it happened.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Fault {
    pub kind: Kind,
    /// What it hit: `replica 2`, `redis`, `client 4`.
    pub target: String,
    /// When it began and ended, in seconds from the soak's start.
    pub at_s: f64,
    pub until_s: f64,
}

/// Draws and makes faults until the traffic's end; each is logged in
/// `ctx.faults` as it begins (its end filled when it is over).
pub fn run(ctx: &Ctx, replicas: &mut Replicas, store: &mut Store) {
    let mut rng = fastrand::Rng::with_seed(ctx.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xFA17);
    let mut round: Vec<Kind> = vec![];
    // The first fault after the clients have settled.
    std::thread::sleep(Duration::from_secs(3));
    while ctx.open() {
        if round.is_empty() {
            round = if store.is_cluster() {
                CLUSTER_KINDS.to_vec()
            } else {
                KINDS.to_vec()
            };
            rng.shuffle(&mut round);
        }
        let kind = round.pop().unwrap();
        let secs = |d: Instant| d.duration_since(ctx.started).as_secs_f64();
        let begun = Instant::now();
        let log = |target: String| {
            let mut faults = ctx.faults.lock().unwrap();
            faults.push(Fault {
                kind,
                target,
                at_s: secs(begun),
                until_s: secs(begun),
            });
            faults.len() - 1
        };
        let stall = Duration::from_millis(rng.u64(2000..=4000));
        let at = match kind {
            Kind::Sigterm => {
                let r = rng.usize(..REPLICAS);
                let at = log(format!("replica {r}"));
                places::signal(replicas.pid(r).expect("a replica"), "-TERM");
                if !replicas.exited_within(r, Duration::from_secs(15)) {
                    eprintln!("soak: replica {r} did not exit within 15 s of SIGTERM");
                }
                replicas.restart(r);
                at
            }
            Kind::Sigkill => {
                let r = rng.usize(..REPLICAS);
                let at = log(format!("replica {r}"));
                places::signal(replicas.pid(r).expect("a replica"), "-KILL");
                replicas.exited_within(r, Duration::from_secs(5));
                std::thread::sleep(Duration::from_millis(500));
                replicas.restart(r);
                at
            }
            Kind::StoreStall if store.is_cluster() => {
                let at = log("a cluster master".into());
                let port = store.stall_master(&format!("soak-stall-{}", rng.u32(..)), stall);
                ctx.faults.lock().unwrap()[at].target = format!("cluster master :{port}");
                at
            }
            Kind::StoreStall => {
                let at = log("redis".into());
                store.signal("-STOP");
                std::thread::sleep(stall);
                store.signal("-CONT");
                at
            }
            Kind::StoreEmpty => {
                let at = log("redis".into());
                store.restart_empty();
                at
            }
            Kind::Failover => {
                let at = log("a cluster master".into());
                match store.fail_over() {
                    Some(port) => ctx.faults.lock().unwrap()[at].target = format!("cluster master :{port}"),
                    None => {
                        // No master has a replica left to take over:
                        // nothing done.
                        ctx.faults.lock().unwrap().remove(at);
                        continue;
                    }
                }
                at
            }
            Kind::ClientDrop => {
                let c = rng.usize(..ctx.drops.len());
                let at = log(format!("client {c}"));
                ctx.drops[c].store(true, std::sync::atomic::Ordering::SeqCst);
                at
            }
            Kind::ReplicaStall => {
                let r = rng.usize(..REPLICAS);
                let at = log(format!("replica {r}"));
                let pid = replicas.pid(r).expect("a replica");
                places::signal(pid, "-STOP");
                std::thread::sleep(stall);
                places::signal(pid, "-CONT");
                at
            }
        };
        ctx.faults.lock().unwrap()[at].until_s = secs(Instant::now());
        // The next one 3 to 7 s after this one is over.
        let gap = Duration::from_millis(rng.u64(3000..=7000));
        let until = (Instant::now() + gap).min(ctx.end);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
    }
}
