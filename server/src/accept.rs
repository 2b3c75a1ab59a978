//! Accepting connections, bounded: what a connection that never finishes
//! its request, or one too many, may cost the server.
//!
//! - **The cap.** At most `max_connections` connections are served at
//!   once (those still reading their request plus the live WebSocket
//!   sessions). A connection accepted at the cap takes the place of the
//!   connection that has been reading its request longest among those
//!   that sent nothing yet (else the longest of all; closed): idle or slow connections never lock new streams out, whoever holds them,
//!   and the live sessions are never touched. With every place a live
//!   session's, up to [`PROBE_RESERVE`] more are accepted but answer only
//!   the probes (`/live`, `/ready`, `/metrics`); anything else gets 503 and
//!   the connection is closed. The reserve is kept the same way (a new
//!   connection takes the place of the oldest idle one). Idle connections
//!   never displace one sending its request (though one whose first
//!   bytes were not read yet can lose its place to a fast churn); ones
//!   that send slowly are
//!   bounded by the header timeout, and the probe address
//!   (`probe_listen`) has places of its own, out of a flood's reach where
//!   the network keeps it private.
//! - **The header timeout.** A connection must send its whole request
//!   head within `header_timeout` of waiting for it (from the accept, or
//!   from its last answer): idle TCP and slowloris requests are closed
//!   then, their place freed.
//! - **The socket.** Every accepted socket sends at once (`TCP_NODELAY`:
//!   an answer is never held back waiting for the client's delayed
//!   acknowledgement, Nagle's rule) and its kernel send buffer is bounded
//!   ([`SEND_BUFFER`]), so a client that does not read costs the kernel
//!   that much at most, beside the session's own write buffer.
//! - **The open-files limit.** An accept refused for want of a file
//!   descriptor is logged (once a second at most) and retried shortly after,
//!   rather than spun on. [`open_files_limit`] reads the limit so that the
//!   cap can be set below it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// Connections accepted past the cap to answer probes only.
pub const PROBE_RESERVE: usize = 16;

/// The kernel send buffer asked for each accepted socket, in bytes (the
/// kernel doubles it for its own bookkeeping).
pub const SEND_BUFFER: usize = 64 * 1024;

/// How accepting is bounded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// The connections holding places of one kind (reading their request, or
/// the probes' reserve), oldest first, each with the handle that closes it.
struct Pool {
    count: Arc<AtomicUsize>,
    held: Mutex<VecDeque<Held>>,
}

/// A connection in a pool: its place's id, the handle that closes it, and
/// whether its place went to a newer connection (then its end frees none).
struct Held {
    id: u64,
    /// Whether the connection sent anything yet.
    spoke: Arc<AtomicBool>,
    abort: AbortHandle,
    given_up: Arc<AtomicBool>,
}

impl Pool {
    fn new(count: Arc<AtomicUsize>) -> Arc<Pool> {
        Arc::new(Pool {
            count,
            held: Mutex::new(VecDeque::new()),
        })
    }

    /// A place if fewer than `cap` are held (counting `also` too), or the
    /// place of the connection held longest, closed for it; `None` when
    /// the pool holds none to give up.
    fn take(self: &Arc<Pool>, also: usize, cap: usize) -> Option<Place> {
        let free = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n + also < cap).then_some(n + 1)
            })
            .is_ok();
        if !free {
            // The place of the oldest that has sent nothing yet (else the
            // oldest) passes to this one: the count stays. A connection
            // sending its request is never closed for an idle one.
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let at = held.iter().position(|h| !h.spoke.load(Ordering::Acquire)).unwrap_or(0);
            let oldest = held.remove(at)?;
            drop(held);
            oldest.given_up.store(true, Ordering::Release);
            oldest.abort.abort();
        }
        static IDS: AtomicU64 = AtomicU64::new(0);
        Some(Place {
            pool: self.clone(),
            id: IDS.fetch_add(1, Ordering::Relaxed),
            given_up: Arc::new(AtomicBool::new(false)),
        })
    }
}

/// Who holds a place: dropped, it frees it (unless it was given up to a
/// newer connection).
struct Place {
    pool: Arc<Pool>,
    id: u64,
    given_up: Arc<AtomicBool>,
}

impl Place {
    /// Its connection's task, closed by `abort` if a newer connection
    /// needs the place; `spoke` set once it sent a byte. Called by the task
    /// itself, so that it is never held after the task ended.
    fn hold(&self, abort: AbortHandle, spoke: Arc<AtomicBool>) {
        self.pool
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(Held {
                id: self.id,
                spoke,
                abort,
                given_up: self.given_up.clone(),
            });
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.pool.held.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|h| h.id != self.id);
        // Under the lock: a `take` either popped this one (and set the
        // flag) before, or finds it gone after.
        if !self.given_up.load(Ordering::Acquire) {
            self.pool.count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// An accepted connection, marking when it first sends a byte.
struct Watched {
    inner: TcpStream,
    spoke: Arc<AtomicBool>,
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.spoke.store(true, Ordering::Release);
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The socket options every accepted connection gets (see the module's
/// doc): sent at once, a bounded kernel send buffer.
pub(crate) fn tune(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    socket2::SockRef::from(stream).set_send_buffer_size(SEND_BUFFER)
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
    let reading = Pool::new(reading);
    let reserve = Pool::new(Arc::new(AtomicUsize::new(0)));
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
        if let Err(e) = tune(&stream) {
            out_of_files.say(|| format!("a connection's socket options could not be set ({e})"));
        }
        let live = sessions.load(Ordering::Acquire);
        let (router, place, probes_only) = match reading.take(live, limits.max_connections) {
            Some(place) => (app.clone(), place, false),
            None => {
                let cap = limits.max_connections;
                at_cap.say(|| {
                    format!("the connection cap ({cap}) is reached by live sessions: only probes are answered")
                });
                match reserve.take(0, PROBE_RESERVE) {
                    Some(place) => (probes.clone(), place, true),
                    // Dropped here: closed at once.
                    None => continue,
                }
            }
        };
        let timeout = limits.header_timeout;
        // The task registers its own abort handle, so that no handle of a
        // task already ended is ever held.
        let (abort_tx, abort_rx) = tokio::sync::oneshot::channel::<AbortHandle>();
        let task = tokio::spawn(async move {
            let Ok(abort) = abort_rx.await else { return };
            let spoke = Arc::new(AtomicBool::new(false));
            place.hold(abort, spoke.clone());
            let stream = Watched { inner: stream, spoke };
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
        let _ = abort_tx.send(task.abort_handle());
    }
}

/// The soft open-files limit of this process, where the system says it
/// (Linux's `/proc/self/limits`).
pub fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}
