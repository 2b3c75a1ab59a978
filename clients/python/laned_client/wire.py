"""The tensor protocol, version 1, as bytes and JSON (the server's
`wire/src/tensor.rs` says it byte for byte):

1. The server's first message is a JSON hello: `protocol`, `model`,
   `stream` (the id, or null), `resume` (the pulse to send from),
   `format`, `inputs` and `outputs` (each `{"index", "name", "dtype",
   "shape"}`, one stream's shape), and for audio models `audio`
   (`{"sample_rate", "hop", "context"}`).
2. A pulse is one binary frame: every input in order, each its shape's
   elements row-major, little-endian, of its dtype (booleans one byte).
3. An answer is one binary frame, every output likewise; or, with
   `?format=json`, a text message `{"pulse": n, "outputs": [[...], ...]}`,
   each output flattened, finite numbers as JSON numbers and NaN, +inf,
   -inf as the strings "NaN", "Infinity", "-Infinity".
"""

from dataclasses import dataclass, field
import json
import math
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from .audio import Audio
from .errors import InputError, ProtocolError

PROTOCOL = 1

FORMATS = ("binary", "json")

# The element types on the wire (little-endian), by the names the hello
# gives them (tract's datum types, lowercase).
DTYPES = {
    "bool": np.dtype("|b1"),
    "u8": np.dtype("|u1"),
    "u16": np.dtype("<u2"),
    "u32": np.dtype("<u4"),
    "u64": np.dtype("<u8"),
    "i8": np.dtype("|i1"),
    "i16": np.dtype("<i2"),
    "i32": np.dtype("<i4"),
    "i64": np.dtype("<i8"),
    "f16": np.dtype("<f2"),
    "f32": np.dtype("<f4"),
    "f64": np.dtype("<f8"),
}

# Quantized types go on the wire as their stored integers; the hello names
# them with their zero point and scale, `qi8(z:0 s:0.05)`.
QUANTIZED = {"qi8": np.dtype("|i1"), "qu8": np.dtype("|u1"), "qi32": np.dtype("<i4")}
_QUANTIZED_NAME = re.compile(r"^(qi8|qu8|qi32)\(z:(-?\d+) s:([^)\s]+)\)$")

# JSON's stand-ins for the numbers it has no literal for. `null` is read as
# NaN too: a server before the strings wrote non-finite numbers so.
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclass(frozen=True)
class Port:
    """One fed input or output, as one stream sees it: `dtype` is numpy's
    (little-endian), `wire` the hello's name for it; `zero_point` and
    `scale` for a quantized type."""

    index: int
    name: str
    dtype: np.dtype
    shape: tuple
    wire: str
    zero_point: int = None
    scale: float = None

    @property
    def size(self):
        """Elements in one pulse of it."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        """Bytes of one pulse of it."""
        return self.size * self.dtype.itemsize

    @staticmethod
    def of(p):
        try:
            index, name, wire, shape = int(p["index"]), str(p["name"]), str(p["dtype"]), tuple(int(d) for d in p["shape"])
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"a port of the hello, {p!r}, is not index, name, dtype, shape: {e}") from None
        if wire in DTYPES:
            return Port(index, name, DTYPES[wire], shape, wire)
        q = _QUANTIZED_NAME.match(wire)
        if q:
            return Port(index, name, QUANTIZED[q.group(1)], shape, wire, int(q.group(2)), float(q.group(3)))
        raise ProtocolError(f"port {name!r}: dtype {wire!r} is unknown to this client (it knows {', '.join(DTYPES)})")


@dataclass(frozen=True)
class Hello:
    """The server's hello: what the stream feeds and gets, and from where."""

    model: str
    stream_id: str
    resume: int
    format: str
    inputs: list
    outputs: list
    audio: Audio = None
    raw: dict = field(default=None, repr=False, compare=False)
    # The stream's generation (a store and an id), to send back on a
    # reconnect; why a stream the client had started restarted at 0.
    generation: int = None
    restarted: str = None

    @staticmethod
    def parse(message):
        """The hello from the server's first message."""
        if not isinstance(message, str):
            raise ProtocolError(f"a binary frame of {len(message)} bytes where the hello was due")
        try:
            h = json.loads(message)
        except ValueError as e:
            raise ProtocolError(f"the hello is not JSON ({e}): {message[:200]!r}") from None
        if not isinstance(h, dict):
            raise ProtocolError(f"the hello is not a JSON object: {message[:200]!r}")
        if h.get("protocol") != PROTOCOL:
            raise ProtocolError(f"the server speaks protocol {h.get('protocol')!r}, this client {PROTOCOL}")
        fmt = h.get("format", "binary")
        if fmt not in FORMATS:
            raise ProtocolError(f"the hello's format {fmt!r} is not binary or json")
        try:
            inputs, outputs, resume = h["inputs"], h["outputs"], int(h.get("resume", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"the hello lacks {e}: {message[:200]!r}") from None
        return Hello(
            model=h.get("model"),
            stream_id=h.get("stream"),
            resume=resume,
            format=fmt,
            inputs=[Port.of(p) for p in inputs],
            outputs=[Port.of(p) for p in outputs],
            audio=Audio.of(h.get("audio")),
            raw=h,
            generation=h.get("generation"),
            restarted=h.get("restarted"),
        )

    @property
    def pulse_bytes(self):
        """Bytes of one pulse: every input."""
        return sum(p.nbytes for p in self.inputs)

    @property
    def answer_bytes(self):
        """Bytes of one binary answer: every output."""
        return sum(p.nbytes for p in self.outputs)

    def encode(self, *arrays):
        """One pulse's bytes from an array per fed input, in order; each
        must have the input's shape exactly (`InputError`, a `ValueError`,
        naming the input and both shapes, where it has not)."""
        if len(arrays) != len(self.inputs):
            names = ", ".join(repr(p.name) for p in self.inputs)
            raise InputError(f"{len(arrays)} arrays for a model that takes {len(self.inputs)} ({names})")
        parts = []
        for port, a in zip(self.inputs, arrays):
            try:
                a = np.asarray(a)
            except (TypeError, ValueError) as e:
                raise InputError(f"input {port.name!r}: not an array: {e}") from None
            if a.shape != port.shape:
                raise InputError(f"input {port.name!r}: shape {a.shape}, wanted {port.shape}")
            if port.dtype.kind in "biu" and a.dtype.kind in "fc":
                raise InputError(f"input {port.name!r}: {a.dtype} values for a {port.wire} input")
            try:
                parts.append(a.astype(port.dtype, copy=False).tobytes())
            except (TypeError, ValueError) as e:
                raise InputError(f"input {port.name!r}: {a.dtype} is not {port.wire}: {e}") from None
        return b"".join(parts)

    def pulse(self, item):
        """One pulse's bytes from `item`: bytes (the whole pulse, checked by
        length), an array for a model of one input, or a tuple or list of
        an array per input."""
        if isinstance(item, (bytes, bytearray, memoryview)):
            item = bytes(item)
            if len(item) != self.pulse_bytes:
                raise InputError(f"a pulse is {self.pulse_bytes} bytes, got {len(item)}")
            return item
        if isinstance(item, (tuple, list)) and len(self.inputs) != 1:
            return self.encode(*item)
        return self.encode(item)

    def decode(self, message):
        """An answer's arrays, one per output shaped as the hello says, from
        the message the server sent (binary or JSON, by the hello's format)."""
        if self.format == "json":
            if not isinstance(message, str):
                raise ProtocolError(f"a binary frame of {len(message)} bytes where a JSON answer was due")
            return self.decode_json(message)
        if not isinstance(message, (bytes, bytearray, memoryview)):
            raise ProtocolError(f"a text message where a binary answer was due: {message[:200]!r}")
        return self.decode_binary(message)

    def decode_binary(self, frame):
        """The arrays of a binary answer."""
        if len(frame) != self.answer_bytes:
            raise ProtocolError(f"an answer of {len(frame)} bytes, wanted {self.answer_bytes}")
        out, at = [], 0
        for port in self.outputs:
            a = np.frombuffer(frame, port.dtype, port.size, at).reshape(port.shape)
            out.append(a.copy())
            at += port.nbytes
        return out

    def decode_json(self, text):
        """The arrays of a JSON answer (non-finite numbers as their strings).
        A quantized output comes as the numbers the server wrote, `float64`."""
        try:
            answer = json.loads(text)
            outputs = answer["outputs"]
        except (ValueError, KeyError, TypeError) as e:
            raise ProtocolError(f"a JSON answer without outputs ({e}): {text[:200]!r}") from None
        if not isinstance(outputs, list) or len(outputs) != len(self.outputs):
            raise ProtocolError(f"a JSON answer of {len(outputs) if isinstance(outputs, list) else 'no'} outputs, wanted {len(self.outputs)}")
        out = []
        for port, values in zip(self.outputs, outputs):
            if not isinstance(values, list) or len(values) != port.size:
                got = len(values) if isinstance(values, list) else repr(values)[:40]
                raise ProtocolError(f"output {port.name!r}: {got} numbers, wanted {port.size}")
            numbers = np.array([_number(port, v) for v in values], np.float64).reshape(port.shape)
            if port.zero_point is not None:
                out.append(numbers)
            elif port.dtype.kind == "b":
                out.append(numbers != 0)
            else:
                out.append(numbers.astype(port.dtype))
        return out

    def answer_to_bytes(self, arrays):
        """An answer's arrays as the bytes of a binary answer (every output,
        little-endian, in order)."""
        return b"".join(np.asarray(a).astype(p.dtype, copy=False).tobytes() for p, a in zip(self.outputs, arrays))


def _number(port, v):
    if type(v) in (int, float):
        return v
    if v is None:
        return math.nan
    if isinstance(v, str) and v in _NON_FINITE:
        return _NON_FINITE[v]
    raise ProtocolError(f"output {port.name!r}: {v!r} is not a number")


def stream_url(url, format="binary"):
    """`url` asking for `format`: `?format=json` added (or replaced) for
    JSON; the URL as given for binary."""
    if format not in FORMATS:
        raise InputError(f"format {format!r}: binary or json")
    if format == "binary":
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "format"]
    query.append(("format", format))
    return urlunsplit(parts._replace(query=urlencode(query)))
