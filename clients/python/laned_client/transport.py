"""websockets' exceptions as this package's errors: nothing of
websockets escapes `connect` or `call`."""

import asyncio

from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI, WebSocketException

from .errors import Closed, ConnectFailed, ConnectionLost, HttpRefused, InputError

# What a connection asks of websockets: no message size limit (an answer
# is as big as the model makes it; the server bounds the pulses), no
# compression (tensors do not compress).
OPTIONS = {"max_size": None, "compression": None}


def headers(stream, generation=None):
    """The upgrade's headers for stream id `stream` (`None`: none), and the
    generation its last hello said (`None`: none), sent back on a
    reconnect so that the server never resumes the stream from an older
    record (it restarts it at 0, its hello saying why in `restarted`)."""
    if not stream:
        return None
    if generation is None:
        return {"x-stream-id": stream}
    return {"x-stream-id": stream, "x-resume-generation": str(int(generation))}


def connect_error(url, e):
    """The error of a connection attempt to `url` that failed with `e`."""
    if isinstance(e, InvalidStatus):
        response = e.response
        body = response.body or b""
        if isinstance(body, (bytes, bytearray)):
            body = bytes(body).decode("utf-8", "replace")
        return HttpRefused.of(response.status_code, one_line(body), url)
    if isinstance(e, InvalidURI):
        return InputError(f"{url}: not a WebSocket URL (ws://HOST:PORT/v1/models/NAME/stream): {e}")
    if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
        return ConnectFailed(url, "timed out")
    if isinstance(e, OSError):
        return ConnectFailed(url, one_line(str(e)) or type(e).__name__)
    if isinstance(e, ConnectionClosed):
        return closed_error(e)
    if isinstance(e, WebSocketException):
        return ConnectFailed(url, one_line(str(e)) or type(e).__name__)
    if isinstance(e, ValueError):
        return InputError(f"{url}: {e}")
    return None


def closed_error(e):
    """The `Closed` for websockets' `ConnectionClosed` `e`: the close
    frame received, or `ConnectionLost` where none was."""
    rcvd = getattr(e, "rcvd", None)
    if rcvd is None:
        return ConnectionLost("no close frame")
    return Closed.of(rcvd.code, one_line(rcvd.reason))


def one_line(text):
    """`text` stripped, its lines joined: an error is one line."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())
