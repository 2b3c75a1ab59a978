//! Accepting connections, bounded: what a connection that never finishes
//! its request, or one too many, may cost the server.
//!
//! - **The cap.** At most `max_connections` connections are served at
//!   once (those still reading their request plus the live WebSocket
//!   sessions). Past it, up to [`PROBE_RESERVE`] more are accepted but
//!   answer only the probes (`/live`, `/ready`, `/metrics`); anything else
//!   gets 503 and the connection is closed. Past that, a connection is
//!   closed as soon as it is accepted. So a flood of connections never
//!   keeps the probes from being answered.
//! - **The header timeout.** A connection must send its whole request
//!   head within `header_timeout` of waiting for it (from the accept, or
//!   from its last answer): idle TCP and slowloris requests are closed
//!   then, their place freed.
//! - **The open-files limit.** An accept refused for want of a file
//!   descriptor is logged (once a second at most) and retried shortly after,
//!   rather than spun on. [`open_files_limit`] reads the limit so that the
//!   cap can be set below it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Connections accepted past the cap to answer probes only.
pub const PROBE_RESERVE: usize = 16;

/// How accepting is bounded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Who holds a place: dropped, it frees it.
struct Place(Arc<AtomicUsize>);

impl Place {
    /// A place under `cap` (counting `also` too), or `None`.
    fn take(count: &Arc<AtomicUsize>, also: usize, cap: usize) -> Option<Place> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n + also < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(count.clone()))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A log line at most once a second per kind, so a flood does not flood
/// the log too.
pub(crate) struct Said(Mutex<Option<Instant>>);

impl Said {
    pub(crate) fn new() -> Said {
        Said(Mutex::new(None))
    }

    pub(crate) fn say(&self, line: impl FnOnce() -> String) {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            *last = Some(Instant::now());
            eprintln!("vad-server: {}", line());
        }
    }
}

/// Serve `app` on `listener` within `limits`; `probes` answers the
/// connections of the reserve. `sessions` counts the live WebSocket
/// sessions (upgraded connections leave the accept's count), `reading`
/// the connections still reading their request (a shutdown waits for
/// both).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    probes: Router,
    limits: Limits,
    sessions: Arc<AtomicUsize>,
    reading: Arc<AtomicUsize>,
) {
    let reserve = Arc::new(AtomicUsize::new(0));
    let (at_cap, out_of_files) = (Said::new(), Said::new());
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE, ENFILE: no descriptor for the connection.
                if matches!(e.raw_os_error(), Some(23 | 24)) {
                    out_of_files.say(|| format!("the open-files limit is reached ({e}): new connections wait"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                continue;
            }
        };
        let live = sessions.load(Ordering::Acquire);
        let (router, place, probes_only) = match Place::take(&reading, live, limits.max_connections) {
            Some(place) => (app.clone(), place, false),
            None => {
                let cap = limits.max_connections;
                at_cap.say(|| format!("the connection cap ({cap}) is reached: only probes are answered"));
                match Place::take(&reserve, 0, PROBE_RESERVE) {
                    Some(place) => (probes.clone(), place, true),
                    // Dropped here: closed at once.
                    None => continue,
                }
            }
        };
        let timeout = limits.header_timeout;
        tokio::spawn(async move {
            let _place = place;
            // The header timeout runs whenever the connection waits for a
            // request head: from the accept (so idle TCP is closed too), and
            // between requests of a kept-alive connection.
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(timeout);
            // The reserve's places are for one probe each.
            http.keep_alive(!probes_only);
            let service = TowerToHyperService::new(router);
            let _ = http
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
}

/// The soft open-files limit of this process, where the system says it
/// (Linux's `/proc/self/limits`).
pub fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}
