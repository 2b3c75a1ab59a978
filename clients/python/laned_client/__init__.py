"""A client of `laned serve`: streams of a served model over WebSocket, in
the tensor protocol (`laned_client.wire`).

asyncio:

    stream = await laned_client.connect(url, stream="call-17")
    (y,) = await stream.call(x)          # one pulse in, one answer out
    await stream.close()

blocking:

    with laned_client.connect_sync(url) as stream:
        (y,) = stream.call(x)

every pulse at once, following restarts: `stream_all` (asyncio) and
`run` (blocking). Every error is a `LanedError` (`laned_client.errors`).
"""

from .aio import Stream, connect, stream_all
from .audio import Audio, cut_pulses, read_wav
from .errors import (
    Busy,
    Closed,
    ConnectFailed,
    ConnectionLost,
    GoingAway,
    HttpRefused,
    InputError,
    LanedError,
    ProtocolError,
    Refused,
    ServerError,
    Unavailable,
    UnknownModel,
)
from .resume import new_stream_id
from .sync import Stream as SyncStream
from .sync import connect as connect_sync
from .sync import run
from .wire import DTYPES, PROTOCOL, Hello, Port

__version__ = "0.1.0"

__all__ = [
    "Audio",
    "Busy",
    "Closed",
    "ConnectFailed",
    "ConnectionLost",
    "DTYPES",
    "GoingAway",
    "Hello",
    "HttpRefused",
    "InputError",
    "LanedError",
    "PROTOCOL",
    "Port",
    "ProtocolError",
    "Refused",
    "ServerError",
    "Stream",
    "SyncStream",
    "Unavailable",
    "UnknownModel",
    "connect",
    "connect_sync",
    "cut_pulses",
    "new_stream_id",
    "read_wav",
    "run",
    "stream_all",
]
