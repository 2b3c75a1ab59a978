"""The asyncio API: `connect` a stream, `call` it a pulse at a time;
`stream_all` sends every pulse and follows the stream across restarts.

    stream = await connect(url, stream="call-17")
    (y,) = await stream.call(x)
    await stream.close()

or `async with connect(url) as stream: ...`.
"""

import asyncio
import time

from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from . import transport
from .errors import InputError, LanedError
from .resume import RETRY_PAUSE, Resumption, new_stream_id, pause
from .wire import Hello, stream_url


class Stream:
    """One stream of a served model, connected, its hello read.

    `inputs` and `outputs` are its ports (`index`, `name`, `dtype`,
    `shape`), `resume` the pulse the server expects next (0 for a fresh
    stream), `stream_id` its id (`None` where the server keeps none),
    `audio` how to cut audio into its pulses (`None` but for audio
    models), `format` `"binary"` or `"json"`."""

    def __init__(self, ws, hello, url):
        self._ws, self.hello, self.url = ws, hello, url
        self._ended = None

    model = property(lambda self: self.hello.model)
    inputs = property(lambda self: self.hello.inputs)
    outputs = property(lambda self: self.hello.outputs)
    resume = property(lambda self: self.hello.resume)
    stream_id = property(lambda self: self.hello.stream_id)
    audio = property(lambda self: self.hello.audio)
    format = property(lambda self: self.hello.format)
    pulse_bytes = property(lambda self: self.hello.pulse_bytes)

    async def call(self, *arrays):
        """Send one pulse, an array per input (each of the input's shape),
        and return its answer: a numpy array per output."""
        return await self.send(self.hello.encode(*arrays))

    async def send(self, pulse):
        """Send one pulse given as its bytes (or as `call`'s arrays, a tuple
        for several inputs) and return its answer's arrays."""
        if self._ended is not None:
            raise self._ended
        pulse = self.hello.pulse(pulse)
        try:
            await self._ws.send(pulse)
            message = await self._ws.recv()
        except ConnectionClosed as e:
            raise self._end(transport.closed_error(e)) from None
        except (WebSocketException, OSError) as e:
            raise self._end(transport.connect_error(self.url, e)) from None
        try:
            return self.hello.decode(message)
        except LanedError as e:
            await self.close()
            raise self._end(e) from None

    def _end(self, error):
        self._ended = error
        return error

    async def close(self):
        """Close the stream (normally, 1000); a closed one stays closed."""
        if self._ended is None:
            self._ended = InputError("the stream is closed")
        try:
            await self._ws.close()
        except (WebSocketException, OSError):
            pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class _Connecting:
    """`connect`'s answer: awaited, the stream; `async with`, the stream
    closed at the block's end."""

    def __init__(self, url, stream, format, open_timeout, generation=None):
        self._args = (url, stream, format, open_timeout, generation)
        self._stream = None

    def __await__(self):
        return _open(*self._args).__await__()

    async def __aenter__(self):
        self._stream = await _open(*self._args)
        return self._stream

    async def __aexit__(self, *exc):
        await self._stream.close()


def connect(url, stream=None, format="binary", open_timeout=10.0, generation=None):
    """Connect to `url` (`ws://HOST:PORT/v1/models/NAME/stream`) as stream
    id `stream` (sent as `x-stream-id`; `None`: none) asking for `format`
    answers, and read the hello. `await connect(...)` gives the `Stream`;
    `async with connect(...) as s:` closes it after. Raises `HttpRefused`
    (`UnknownModel`, `Unavailable`), `Closed` (`Busy`, ...) for a close
    before the hello, `ConnectFailed`, `ProtocolError`. `generation`: the
    one the stream's last hello said, on a reconnect."""
    return _Connecting(url, stream, format, open_timeout, generation)


async def _open(url, stream, format, open_timeout, generation=None):
    target = stream_url(url, format)
    try:
        ws = await ws_connect(
            target,
            additional_headers=transport.headers(stream, generation),
            open_timeout=open_timeout,
            **transport.OPTIONS,
        )
    except Exception as e:  # noqa: BLE001 - every failure becomes one of ours
        error = transport.connect_error(url, e)
        if error is None:
            raise
        raise error from None
    try:
        try:
            message = await ws.recv()
        except ConnectionClosed as e:
            raise transport.closed_error(e) from None
        except (WebSocketException, OSError) as e:
            raise transport.connect_error(url, e) from None
        return Stream(ws, Hello.parse(message), url)
    except BaseException:
        try:
            await ws.close()
        except (WebSocketException, OSError):
            pass
        raise


async def stream_all(url, pulses, stream=None, format="binary", resume_for=30.0, every=0.0, on_event=None, open_timeout=10.0):
    """Send every pulse of `pulses` on stream `stream` (default: an id
    nobody can guess) and return every answer (each a list of arrays, one
    per output), in order.

    `pulses` is a list of pulses (bytes, an array, or a tuple of an array
    per input), or a function of the `Hello` returning one (called once,
    at the first hello). A close 1012 or a dropped connection is followed
    for `resume_for` seconds from each interruption: reconnected with the
    same id, the pulses resent from the new hello's `resume`. `every`
    paces the pulses (seconds between sends; 0: each when the last is
    answered). `on_event(line)` hears of each reconnection. An error
    raised has `answers` (those had) and `stream_id` set."""
    stream = stream or new_stream_id()
    run = Resumption(pulses, resume_for)
    while True:
        try:
            async with connect(url, stream, format, open_timeout, run.generation) as s:
                if s.hello.restarted and on_event is not None:
                    on_event(f"stream {stream}: restarted at pulse 0: {s.hello.restarted}")
                start = time.monotonic()
                for k, pulse in enumerate(run.start(s.hello)):
                    wait = pause(start, k, every)
                    if wait > 0:
                        await asyncio.sleep(wait)
                    run.answers.append(await s.send(pulse))
            return run.answers
        except LanedError as e:
            if not run.retry(e):
                e.answers, e.stream_id = run.answers, stream
                raise
            if on_event is not None:
                on_event(f"stream {stream}: {e}: reconnecting")
            await asyncio.sleep(RETRY_PAUSE)

