"""The command: `laned-client-py URL IN OUT [--stream ID] [--format json]`
(also `python -m laned_client`).

IN is a raw file of whole pulses (every input in order, little-endian, as
the hello describes them) or a `.wav` (16-bit PCM, mono) for a model fed
one float input: cut as the hello's `audio` says where it has one (the
WAV's rate checked against its `sample_rate`), else into pulses of the
input's size, the last padded with zeros. Every answer's bytes go to OUT
in order (the same bytes whichever `--format`). A close 1012 or a dropped
connection is followed for `--resume-for-ms` from each interruption.

The exit status is `laned client`'s: 0 done, 1 transport (no connection,
or one dropped past the window), 2 input, 3 busy (1013, or HTTP 503),
4 going away (1001, 1012 past the window), 5 refused (1003, 1008, 1009,
or another HTTP refusal such as 404), 6 server error (1011, any other
code, a protocol it cannot follow). An error is one line on stderr.
"""

import argparse
import sys
from pathlib import Path

from .audio import cut_pulses, read_wav
from .errors import Closed, InputError, LanedError, ProtocolError
from .resume import new_stream_id
from .sync import run
from .transport import one_line

PROG = "laned-client-py"


def say(line):
    print(f"{PROG}: {one_line(line)}", file=sys.stderr, flush=True)


def read_input(path):
    """IN read before connecting: a WAV's samples and rate, or raw bytes."""
    if path.suffix.lower() == ".wav":
        return read_wav(path)
    try:
        return path.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None


def pulses(path, source, hello):
    """IN's pulses, as bytes, for a stream whose hello is `hello`."""
    if isinstance(source, bytes):
        n = hello.pulse_bytes
        if n == 0 or len(source) % n:
            raise InputError(f"{path}: {len(source)} bytes is not a whole number of {n}-byte pulses")
        return [source[at : at + n] for at in range(0, len(source), n)]
    samples, rate = source
    ports = ", ".join(f"{p.name} {p.wire} {list(p.shape)}" for p in hello.inputs)
    if len(hello.inputs) != 1 or hello.inputs[0].dtype.kind != "f" or hello.inputs[0].zero_point is not None:
        raise InputError(f"{path}: a WAV feeds a model of one float input; this one takes {ports}")
    port = hello.inputs[0]
    audio = hello.audio
    if audio is None:
        rows = cut_pulses(samples, port.size)
    else:
        if rate != audio.sample_rate:
            raise InputError(f"{path}: {rate} Hz, the model takes {audio.sample_rate} Hz (resample it first)")
        if audio.pulse_len != port.size:
            raise ProtocolError(
                f"the hello's audio cuts pulses of {audio.pulse_len} samples ({audio.context} + {audio.hop}), "
                f"its input takes {port.size}"
            )
        rows = audio.cut(samples)
    return [row.astype(port.dtype).tobytes() for row in rows]


def parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Send a file of pulses (raw, or a WAV) to a model served by `laned serve`; write every answer.",
    )
    p.add_argument("url", help="the stream's URL: ws://HOST:PORT/v1/models/NAME/stream")
    p.add_argument("input", type=Path, help="a raw file of whole pulses, or a .wav (16-bit PCM, mono)")
    p.add_argument("output", type=Path, help="where every answer's bytes go")
    p.add_argument("--stream", help="the stream's id, sent as x-stream-id [default: 128 random bits]")
    p.add_argument("--format", choices=("binary", "json"), default="binary", help="the answers' format on the wire")
    p.add_argument(
        "--resume-for-ms",
        type=int,
        default=30_000,
        help="how long from each interruption (1012, a dropped connection) to keep reconnecting; 0: never",
    )
    p.add_argument("--every-ms", type=int, default=0, help="send a pulse every this many ms; 0: each when answered")
    return p


def command(args):
    """The command's run; its exit status."""
    try:
        source = read_input(args.input)
    except InputError as e:
        say(e)
        return e.exit_status
    stream = args.stream or new_stream_id()
    seen = {}

    def cut(hello):
        seen["hello"] = hello
        return pulses(args.input, source, hello)

    status = 0
    try:
        answers = run(
            args.url,
            cut,
            stream=stream,
            format=args.format,
            resume_for=args.resume_for_ms / 1000,
            every=args.every_ms / 1000,
            on_event=say,
        )
    except LanedError as e:
        answers = getattr(e, "answers", [])
        say(f"stream {stream}: {e}" if isinstance(e, Closed) else str(e))
        status = e.exit_status
    except KeyboardInterrupt:
        say(f"stream {stream}: interrupted")
        return 130
    hello = seen.get("hello")
    try:
        args.output.write_bytes(b"".join(hello.answer_to_bytes(a) for a in answers) if hello else b"")
    except OSError as e:
        say(f"writing {args.output}: {e.strerror or e}")
        return status or InputError.exit_status
    if status == 0:
        say(f"stream {stream}: {len(answers)} pulses answered")
    return status


def main(argv=None):
    sys.exit(command(parser().parse_args(argv)))
