"""Following a stream across restarts, as `laned client` does: a close
1012 (the server restarts and hands the stream over) or a dropped
connection is not the end while the window allows (it starts over at each
interruption the stream got past); the client reconnects with the same id
and resends from the pulse the new hello names. A URL that never gave a
connection is not retried."""

import secrets
import time

from .errors import Closed, ConnectFailed, HttpRefused, ProtocolError

# The pause between a resumable end and the next try, in seconds.
RETRY_PAUSE = 0.1


def new_stream_id():
    """An id nobody can guess (another client guessing it could resume the
    stream): 128 random bits, hex."""
    return secrets.token_hex(16)


class Resumption:
    """One stream's progress and whether an interruption is worth a retry.

    `pulses` is what to send (a list, or a function of the hello returning
    one: called once, at the first hello); `answers` the answers had, in
    order, kept across connections."""

    def __init__(self, pulses, resume_for):
        self._source = pulses
        self.pulses = None
        self.answers = []
        self.window = float(resume_for or 0)
        self.connected = False
        self._interrupted = None
        self._answered = 0
        # The generation the last hello said, sent back on a reconnect.
        self.generation = None

    def start(self, hello):
        """A connection's hello: the pulses to send on it, from its
        `resume` on (answers past it dropped: they will come again)."""
        self.connected = True
        if hello.generation is not None:
            self.generation = hello.generation
        if self.pulses is None:
            source = self._source(hello) if callable(self._source) else self._source
            self.pulses = [hello.pulse(p) for p in source]
        if hello.resume > len(self.answers):
            raise ProtocolError(f"the server resumes at pulse {hello.resume}, {len(self.answers)} answered here")
        self._answered = len(self.answers)
        del self.answers[hello.resume :]
        return self.pulses[hello.resume :]

    def retry(self, error):
        """Whether to reconnect after `error` (else it is the end)."""
        if not isinstance(error, (ConnectFailed, HttpRefused)):
            self.connected = True
        if len(self.answers) > self._answered:
            self._interrupted = None
        self._answered = len(self.answers)
        if isinstance(error, ConnectFailed):
            resumable = self.connected
        else:
            resumable = isinstance(error, Closed) and error.resumable
        if not resumable or self.window <= 0:
            return False
        now = time.monotonic()
        if self._interrupted is None:
            self._interrupted = now
        return now - self._interrupted <= self.window


def pause(start, k, every):
    """Seconds to wait before pulse `k` of a connection begun at `start`
    (`time.monotonic()`), one pulse every `every` seconds (0: none)."""
    if not every:
        return 0.0
    return max(0.0, start + k * every - time.monotonic())
