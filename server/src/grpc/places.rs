//! The gRPC front's connections under the server's connection cap
//! (`max_connections`), counted with the live WebSocket sessions: an
//! accepted gRPC connection holds a place as a live session does (never
//! displaced by a newer connection) until it closes. One accepted at the
//! cap is served for a moment only: every call on it is answered
//! UNAVAILABLE naming the cap, and the connection is closed after
//! [`REFUSED_FOR`]; up to [`crate::accept::PROBE_RESERVE`] such at once,
//! any further closed at once. A connection that sends nothing for
//! `idle_ms` is closed (its place freed). When the drain ends, each of
//! its streams is told `restarting` (UNAVAILABLE), then it is sent GOAWAY
//! and closes as its streams end (the server's `listen`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::Connected;

use crate::session::Shared;

/// How long a connection accepted past the cap is answered (UNAVAILABLE)
/// before it is closed.
pub(crate) const REFUSED_FOR: Duration = Duration::from_secs(2);

/// What the service sees of a connection.
#[derive(Clone, Debug)]
pub(crate) struct Place {
    /// `Some(cap)` where it came past the cap (every call refused).
    pub(crate) over_cap: Option<usize>,
    /// What its streams (`ModelStreamInfer`) hold, all of them together:
    /// their sequences and their requests in flight.
    pub(crate) held: super::Bounds,
}

/// A counted place, freed when dropped.
struct Count(Arc<AtomicUsize>);

impl Drop for Count {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An accepted gRPC connection, holding its place; it reads as ended once
/// `end` completes (idle, or its refusal's time up).
pub(crate) struct Counted {
    inner: TcpStream,
    place: Place,
    _count: Count,
    /// Milliseconds since `epoch` when it last sent a byte.
    last_read: Arc<AtomicU64>,
    end: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Connected for Counted {
    type ConnectInfo = Place;

    fn connect_info(&self) -> Place {
        self.place.clone()
    }
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.end.as_mut().poll(cx).is_ready() {
            // Read as the end of the connection: closed, its place freed.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.last_read.store(now_ms(), Ordering::Release);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Milliseconds since the first call (a monotonic clock).
fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

/// Completes when the connection has sent nothing for `idle`. (The
/// drain's end closes connections another way: each stream told
/// `restarting`, then GOAWAY; see `listen`.)
async fn idle_for(idle: Duration, last_read: Arc<AtomicU64>) {
    let idle_ms = idle.as_millis() as u64;
    loop {
        let quiet = now_ms().saturating_sub(last_read.load(Ordering::Acquire));
        if quiet >= idle_ms {
            return;
        }
        tokio::time::sleep(Duration::from_millis(idle_ms - quiet)).await;
    }
}

/// The accepted connections of `listener`, each counted under `cap` with
/// the server's live sessions (or past it, refused).
pub(crate) fn incoming(
    listener: TcpListener,
    shared: Arc<Shared>,
    cap: usize,
) -> impl futures_util::Stream<Item = std::io::Result<Counted>> + Send + 'static {
    let refused = Arc::new(AtomicUsize::new(0));
    let said = Arc::new(crate::accept::Said::new());
    futures_util::stream::unfold(listener, move |listener| {
        let (shared, refused, said) = (shared.clone(), refused.clone(), said.clone());
        async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // EMFILE, ENFILE: no descriptor for it; retried shortly.
                        let wait = if matches!(e.raw_os_error(), Some(23 | 24)) {
                            50
                        } else {
                            1
                        };
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                        continue;
                    }
                };
                let _ = crate::accept::tune(&stream);
                let reading = shared.reading.load(Ordering::Acquire);
                let counted = shared
                    .live
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n + reading < cap).then_some(n + 1)
                    })
                    .is_ok();
                let last_read = Arc::new(AtomicU64::new(now_ms()));
                let (count, over_cap, end): (_, _, Pin<Box<dyn Future<Output = ()> + Send>>) = if counted {
                    let idle = Duration::from_millis(shared.limits.idle_ms);
                    let end = Box::pin(idle_for(idle, last_read.clone()));
                    (Count(shared.live.clone()), None, end)
                } else {
                    let taken = refused
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                            (n < crate::accept::PROBE_RESERVE).then_some(n + 1)
                        })
                        .is_ok();
                    said.say(|| format!("the connection cap ({cap}) is reached: gRPC connections are refused"));
                    if !taken {
                        // Dropped here: closed at once.
                        continue;
                    }
                    (
                        Count(refused.clone()),
                        Some(cap),
                        Box::pin(tokio::time::sleep(REFUSED_FOR)),
                    )
                };
                let connection = Counted {
                    inner: stream,
                    place: Place {
                        over_cap,
                        held: super::Bounds {
                            sequences: Arc::new(AtomicUsize::new(0)),
                            requests: Arc::new(tokio::sync::Semaphore::new(shared.limits.grpc_max_requests)),
                        },
                    },
                    _count: count,
                    last_read,
                    end,
                };
                return Some((Ok(connection), listener));
            }
        }
    })
}
