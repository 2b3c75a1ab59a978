"""Every way a stream can fail, as one hierarchy under `LanedError`.

Each class carries `exit_status`, the status `laned client` (and this
package's command) exits with for it:

    LanedError
    ├── ConnectFailed          1  no connection at all (refused, unresolved, timed out)
    ├── InputError             2  the caller's input (also a ValueError)
    ├── HttpRefused            5  the server answered the upgrade with an HTTP error
    │   ├── UnknownModel       5    404: no such model on this server
    │   └── Unavailable        3    503: the connection cap is reached
    ├── Closed                    the server closed the stream (`code`, `reason`)
    │   ├── ConnectionLost     1    1006: dropped without a close frame (resumable)
    │   ├── Busy               3    1013: no lane freed up in time
    │   ├── GoingAway          4    1001, 1012 (1012: the server restarts, resumable)
    │   ├── Refused            5    1003, 1008, 1009: what was sent is refused
    │   └── ServerError        6    1011 and any other code
    └── ProtocolError          6  the server said something this client cannot follow
"""


class LanedError(Exception):
    """Anything that ends a stream of `laned serve` early."""

    exit_status = 6


class ConnectFailed(LanedError):
    """No connection was made: the address refused, did not resolve, or
    did not answer in time. `url` is where it was tried."""

    exit_status = 1

    def __init__(self, url, why):
        super().__init__(f"{url}: no connection: {why}")
        self.url, self.why = url, why


class InputError(LanedError, ValueError):
    """The caller's input is unusable: an array of the wrong shape or
    count, a file that is not whole pulses, a WAV of another rate."""

    exit_status = 2


class ProtocolError(LanedError):
    """The server said something this client cannot follow (a hello it
    cannot read, an answer of the wrong length, another protocol)."""

    exit_status = 6


class HttpRefused(LanedError):
    """The server refused the WebSocket upgrade with an HTTP answer:
    `status` and `body` (its text, stripped) as it gave them."""

    exit_status = 5

    def __init__(self, status, body, url=None):
        where = f"{url}: " if url else ""
        super().__init__(f"{where}HTTP {status}: {body}")
        self.status, self.body, self.url = status, body, url

    @staticmethod
    def of(status, body, url=None):
        """The class for `status`: 404 `UnknownModel`, 503 `Unavailable`."""
        cls = {404: UnknownModel, 503: Unavailable}.get(status, HttpRefused)
        return cls(status, body, url)


class UnknownModel(HttpRefused):
    """404: the server serves no model of that name (the body names the
    models it does serve)."""

    exit_status = 5


class Unavailable(HttpRefused):
    """503: the server's connection cap is reached; retry later."""

    exit_status = 3


class Closed(LanedError):
    """The server closed the stream: `code` and `reason` from its close
    frame (1006 when there was none)."""

    exit_status = 6

    def __init__(self, code, reason=""):
        super().__init__(f"closed {code}: {reason}" if reason else f"closed {code}")
        self.code, self.reason = code, reason

    @property
    def resumable(self):
        """Whether reconnecting with the same stream id may go on with the
        stream: 1012 (the server restarts and hands the stream over) and a
        dropped connection."""
        return self.code in (1006, 1012)

    @staticmethod
    def of(code, reason=""):
        """The class of close `code`, as `laned client` classes them."""
        if code == 1013:
            cls = Busy
        elif code in (1001, 1012):
            cls = GoingAway
        elif code in (1003, 1008, 1009):
            cls = Refused
        elif code == 1006:
            return ConnectionLost(reason)
        else:
            cls = ServerError
        return cls(code, reason)


class ConnectionLost(Closed):
    """The connection dropped without a close frame (code 1006)."""

    exit_status = 1

    def __init__(self, reason=""):
        super().__init__(1006, reason)


class Busy(Closed):
    """1013: no lane freed up within the server's admission wait."""

    exit_status = 3


class GoingAway(Closed):
    """1001 (the server shuts down) or 1012 (it restarts: the stream is
    handed over, `resumable`)."""

    exit_status = 4


class Refused(Closed):
    """1003, 1008 or 1009: the server refused what was sent (a frame that
    is not one pulse, a text frame, a frame too big, an idle stream, a
    stream id live elsewhere)."""

    exit_status = 5


class ServerError(Closed):
    """1011 or any other code: the server failed the stream."""

    exit_status = 6
