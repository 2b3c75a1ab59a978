"""The blocking API, over websockets' threading client: the same `Stream`
as the asyncio one, its calls blocking; `run` sends every pulse and
follows the stream across restarts.

    with connect(url, stream="call-17") as stream:
        (y,) = stream.call(x)
"""

import time

from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import connect as ws_connect

from . import transport
from .errors import InputError, LanedError
from .resume import RETRY_PAUSE, Resumption, new_stream_id, pause
from .wire import Hello, stream_url


class Stream:
    """One stream of a served model, connected, its hello read (see
    `laned_client.aio.Stream`: the same attributes, blocking calls)."""

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

    def call(self, *arrays):
        """Send one pulse, an array per input (each of the input's shape),
        and return its answer: a numpy array per output."""
        return self.send(self.hello.encode(*arrays))

    def send(self, pulse):
        """Send one pulse given as its bytes (or as `call`'s arrays, a tuple
        for several inputs) and return its answer's arrays."""
        if self._ended is not None:
            raise self._ended
        pulse = self.hello.pulse(pulse)
        try:
            self._ws.send(pulse)
            message = self._ws.recv()
        except ConnectionClosed as e:
            raise self._end(transport.closed_error(e)) from None
        except (WebSocketException, OSError) as e:
            raise self._end(transport.connect_error(self.url, e)) from None
        try:
            return self.hello.decode(message)
        except LanedError as e:
            self.close()
            raise self._end(e) from None

    def _end(self, error):
        self._ended = error
        return error

    def close(self):
        """Close the stream (normally, 1000); a closed one stays closed."""
        if self._ended is None:
            self._ended = InputError("the stream is closed")
        try:
            self._ws.close()
        except (WebSocketException, OSError):
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect(url, stream=None, format="binary", open_timeout=10.0, generation=None):
    """Connect to `url` as stream id `stream` asking for `format` answers,
    read the hello and return the `Stream` (usable as `with`). Raises as
    `laned_client.connect` does."""
    target = stream_url(url, format)
    try:
        ws = ws_connect(
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
            message = ws.recv()
        except ConnectionClosed as e:
            raise transport.closed_error(e) from None
        except (WebSocketException, OSError) as e:
            raise transport.connect_error(url, e) from None
        return Stream(ws, Hello.parse(message), url)
    except BaseException:
        try:
            ws.close()
        except (WebSocketException, OSError):
            pass
        raise


def run(url, pulses, stream=None, format="binary", resume_for=30.0, every=0.0, on_event=None, open_timeout=10.0):
    """Send every pulse and return every answer, following the stream
    across restarts: blocking, as `laned_client.stream_all` does."""
    stream = stream or new_stream_id()
    progress = Resumption(pulses, resume_for)
    while True:
        try:
            with connect(url, stream, format, open_timeout, progress.generation) as s:
                if s.hello.restarted and on_event is not None:
                    on_event(f"stream {stream}: restarted at pulse 0: {s.hello.restarted}")
                start = time.monotonic()
                for k, pulse in enumerate(progress.start(s.hello)):
                    wait = pause(start, k, every)
                    if wait > 0:
                        time.sleep(wait)
                    progress.answers.append(s.send(pulse))
            return progress.answers
        except LanedError as e:
            if not progress.retry(e):
                e.answers, e.stream_id = progress.answers, stream
                raise
            if on_event is not None:
                on_event(f"stream {stream}: {e}: reconnecting")
            time.sleep(RETRY_PAUSE)
