"""A client of `laned serve`: one stream of a served model over WebSocket.

The tensor protocol, version 1 (see the server crate's `tensor` module):
the server's first message is a JSON hello naming the model's fed inputs
and outputs (name, dtype, one stream's shape); then each binary frame the
client sends is one pulse (every input in order, little-endian, row-major)
and each binary frame it gets back one answer (every output likewise).

    import asyncio, numpy as np
    from laned_client import Stream

    async def main():
        async with Stream.connect("ws://127.0.0.1:8080/v1/models/gru/stream") as s:
            x = np.zeros(s.inputs[0].shape, np.float32)
            (y,) = await s.call(x)

    asyncio.run(main())

As a command: `python laned_client.py URL IN.raw OUT.raw [--stream ID]`
sends IN.raw pulse by pulse (its length a whole number of pulses) and
writes every answer to OUT.raw; exit 0 when every pulse was answered, 3
when the server closed the stream first (the close code and reason said).
"""

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass

import numpy as np
import websockets

PROTOCOL = 1

# The wire's element types (little-endian), by the names the hello uses.
DTYPES = {
    "f32": "<f4",
    "f64": "<f8",
    "f16": "<f2",
    "i64": "<i8",
    "i32": "<i4",
    "i16": "<i2",
    "i8": "i1",
    "u8": "u1",
    "bool": "?",
}


@dataclass
class Port:
    """One fed input or output, as one stream sees it."""

    index: int
    name: str
    dtype: np.dtype
    shape: tuple

    @property
    def nbytes(self):
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @staticmethod
    def of(p):
        if p["dtype"] not in DTYPES:
            raise ValueError(f"port {p['name']!r}: dtype {p['dtype']!r} unknown to this client")
        return Port(p["index"], p["name"], np.dtype(DTYPES[p["dtype"]]), tuple(p["shape"]))


class Closed(Exception):
    """The server closed the stream: `code` and `reason` from its close frame."""

    def __init__(self, code, reason):
        super().__init__(f"closed {code}: {reason}")
        self.code, self.reason = code, reason


class Stream:
    """One stream: `call` sends a pulse and returns its answer."""

    def __init__(self, ws, hello):
        if hello.get("protocol") != PROTOCOL:
            raise ValueError(f"the server speaks protocol {hello.get('protocol')}, this client {PROTOCOL}")
        self.ws, self.hello = ws, hello
        self.inputs = [Port.of(p) for p in hello["inputs"]]
        self.outputs = [Port.of(p) for p in hello["outputs"]]
        self.resume = hello["resume"]

    @classmethod
    def connect(cls, url, stream=None):
        return _Connecting(cls, url, stream)

    @property
    def pulse_bytes(self):
        return sum(p.nbytes for p in self.inputs)

    def encode(self, *arrays):
        """One pulse's bytes from an array per fed input (checked by shape)."""
        if len(arrays) != len(self.inputs):
            raise ValueError(f"{len(arrays)} arrays, the model takes {len(self.inputs)}")
        parts = []
        for port, a in zip(self.inputs, arrays):
            a = np.asarray(a)
            if a.shape != port.shape:
                raise ValueError(f"input {port.name!r}: shape {a.shape}, wanted {port.shape}")
            parts.append(a.astype(port.dtype, copy=False).tobytes())
        return b"".join(parts)

    def decode(self, frame):
        """An answer's arrays, an array per output."""
        out, at = [], 0
        for port in self.outputs:
            out.append(np.frombuffer(frame, port.dtype, int(np.prod(port.shape)), at).reshape(port.shape))
            at += port.nbytes
        return out

    async def send_bytes(self, pulse):
        """Send one pulse's bytes, return the answer's bytes."""
        await self.ws.send(pulse)
        try:
            while True:
                m = await self.ws.recv()
                if isinstance(m, bytes):
                    return m
        except websockets.ConnectionClosed as e:
            rcvd = e.rcvd
            raise Closed(rcvd.code if rcvd else 1006, rcvd.reason if rcvd else "") from None

    async def call(self, *arrays):
        return self.decode(await self.send_bytes(self.encode(*arrays)))


class _Connecting:
    def __init__(self, cls, url, stream):
        self.cls, self.url, self.stream, self.ws = cls, url, stream, None

    async def __aenter__(self):
        headers = {"x-stream-id": self.stream} if self.stream else None
        self.ws = await websockets.connect(self.url, additional_headers=headers, max_size=None)
        hello = json.loads(await self.ws.recv())
        return self.cls(self.ws, hello)

    async def __aexit__(self, *exc):
        await self.ws.close()


async def _run(url, src, dst, stream):
    data = open(src, "rb").read()
    async with Stream.connect(url, stream) as s:
        n = s.pulse_bytes
        if len(data) % n:
            print(f"{src}: {len(data)} bytes is not a whole number of {n}-byte pulses", file=sys.stderr)
            return 2
        with open(dst, "wb") as out:
            for at in range(s.resume * n, len(data), n):
                try:
                    out.write(await s.send_bytes(data[at : at + n]))
                except Closed as e:
                    print(f"the stream ended at pulse {at // n}: {e}", file=sys.stderr)
                    return 3
    return 0


def main():
    p = argparse.ArgumentParser(description="Send a raw file of pulses to a laned serve model.")
    p.add_argument("url")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--stream", help="the stream id (resumable with a store)")
    a = p.parse_args()
    sys.exit(asyncio.run(_run(a.url, a.input, a.output, a.stream)))


if __name__ == "__main__":
    main()
