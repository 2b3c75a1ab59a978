//! The one place a session's close frame is sent from ([`close_with`]),
//! and the reads that end a session otherwise.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use laned_wire::close;

/// The longest close reason a control frame carries (125 bytes less the
/// code's two).
const MAX_REASON: usize = 123;

/// Frames without audio a closing session discards at most while it waits
/// (a second at most) for the client's close reply; audio, and the rest of
/// an oversized message, are discarded for the whole second.
const LINGER_FRAMES: usize = 256;

/// Sends the close frame `code` with `reason`, then lingers for the
/// client's reply.
pub(crate) async fn close_with(socket: &mut WebSocket, code: u16, reason: &str) {
    // A control frame holds 125 bytes: a longer reason (one quoting the
    // client's own input, say) is cut at a character boundary, or the
    // close itself would be a protocol error.
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    // Bounded: a client that reads nothing must not hold the session.
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        socket.send(Message::Close(Some(CloseFrame {
            code,
            reason: reason[..end].into(),
        }))),
    )
    .await;
    // Linger: read and discard until the client's close reply (or the
    // end of the connection), up to a second, so that the frame reaches a
    // client still sending (a socket closed with bytes unread would be
    // reset, the close frame lost). A read that fails on the client's
    // input (the rest of an oversized message) is discarded too.
    // Frames without audio count against a budget too, so that a flood
    // of them is not read for the whole second (the close frame was sent
    // first: a client reading gets it long before).
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut control = 0;
        while control < LINGER_FRAMES {
            match socket.recv().await {
                None | Some(Ok(Message::Close(_))) => break,
                Some(Ok(Message::Binary(b))) if !b.is_empty() => (),
                Some(Ok(_)) => control += 1,
                Some(Err(e)) => {
                    if connection_gone(e) {
                        break;
                    }
                    tokio::task::yield_now().await
                }
            }
        }
    })
    .await;
}

/// A read that failed: a frame or message past what the transport takes
/// (twice `max`; a fragmented message counts whole) is refused with 1009
/// and a reason, as a frame over `max` is; any other failure (the
/// connection gone, a protocol error) just ends the session.
pub(crate) async fn refuse_transport_error(socket: &mut WebSocket, error: axum::Error, max: usize) {
    let too_big = error
        .into_inner()
        .downcast::<tokio_tungstenite::tungstenite::Error>()
        .is_ok_and(|e| matches!(*e, tokio_tungstenite::tungstenite::Error::Capacity(_)));
    if too_big {
        let why = format!("a frame or message far over the {max}-byte limit");
        close_with(socket, close::TOO_BIG, &why).await;
    }
}

/// Whether a failed read means the connection is gone (nothing more to
/// read), not only that the client's input was refused.
fn connection_gone(error: axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error;
    match error.into_inner().downcast::<Error>() {
        Ok(e) => matches!(*e, Error::ConnectionClosed | Error::AlreadyClosed | Error::Io(_)),
        Err(_) => true,
    }
}
