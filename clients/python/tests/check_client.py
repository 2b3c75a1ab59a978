"""Checks of the installed `laned_client` package against a real `laned
serve` (run by laned/tests/laned/serve.rs with a venv's python):

    python check_client.py ws://HOST:PORT MODEL PULSES.raw ANSWERS.raw

MODEL is served at ws://HOST:PORT/v1/models/MODEL/stream; PULSES.raw is
whole pulses of it and ANSWERS.raw the answers the model alone gives them,
byte for byte. Plain asserts, no test runner: every check runs, each
failure is said, and the exit status is 1 where any failed.
"""

import asyncio
import math
import sys
import traceback

import numpy as np

import laned_client as lc
from laned_client.wire import Hello

CHECKS = []


def check(f):
    CHECKS.append(f)
    return f


def arrays_of(hello, pulse):
    """A pulse's bytes as `call`'s arrays, one per input."""
    out, at = [], 0
    for port in hello.inputs:
        out.append(np.frombuffer(pulse, port.dtype, port.size, at).reshape(port.shape))
        at += port.nbytes
    return out


def to_bytes(hello, answer):
    return hello.answer_to_bytes(answer)


def expect_raises(cls, f, *args, **kwargs):
    try:
        f(*args, **kwargs)
    except cls as e:
        return e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{f.__name__} raised {type(e).__module__}.{type(e).__name__}: {e}, wanted {cls.__name__}")
    raise AssertionError(f"{f.__name__} raised nothing, wanted {cls.__name__}")


async def expect_raises_async(cls, coro):
    try:
        await coro
    except cls as e:
        return e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"raised {type(e).__module__}.{type(e).__name__}: {e}, wanted {cls.__name__}")
    raise AssertionError(f"raised nothing, wanted {cls.__name__}")


# Without a server: the wire, the errors, the audio cutting.


@check
def json_non_finite_numbers_are_read_back(_):
    hello = Hello.parse(
        '{"protocol": 1, "model": "m", "stream": null, "resume": 0, "format": "json",'
        ' "inputs": [{"index": 0, "name": "x", "dtype": "f32", "shape": [1, 2]}],'
        ' "outputs": [{"index": 0, "name": "y", "dtype": "f32", "shape": [1, 5]},'
        ' {"index": 1, "name": "k", "dtype": "i64", "shape": [2]},'
        ' {"index": 2, "name": "b", "dtype": "bool", "shape": [2]}]}'
    )
    y, k, b = hello.decode('{"pulse": 0, "outputs": [[1.5, "NaN", "Infinity", "-Infinity", null], [3, -4], [1, 0]]}')
    assert y.dtype == np.float32 and y.shape == (1, 5), (y.dtype, y.shape)
    assert y[0, 0] == 1.5 and math.isnan(y[0, 1]) and y[0, 2] == math.inf and y[0, 3] == -math.inf and math.isnan(y[0, 4]), y
    assert k.dtype == np.int64 and k.tolist() == [3, -4], k
    assert b.dtype == np.bool_ and b.tolist() == [True, False], b
    expect_raises(lc.ProtocolError, hello.decode, '{"pulse": 0, "outputs": [["nan", 1, 2, 3, 4], [3, -4], [1, 0]]}')
    expect_raises(lc.ProtocolError, hello.decode, b"\0" * 8)


@check
def every_dtype_of_the_server_has_its_width(_):
    widths = {"bool": 1, "u8": 1, "u16": 2, "u32": 4, "u64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "f16": 2, "f32": 4, "f64": 8}
    for name, width in widths.items():
        assert lc.DTYPES[name].itemsize == width, name
        assert lc.DTYPES[name].byteorder in "<|=" and lc.DTYPES[name].str[0] in "<|", name
    port = lc.Port.of({"index": 0, "name": "q", "dtype": "qi8(z:-3 s:0.25)", "shape": [1, 2]})
    assert port.dtype == np.int8 and port.zero_point == -3 and port.scale == 0.25, port
    expect_raises(lc.ProtocolError, lc.Port.of, {"index": 0, "name": "s", "dtype": "string", "shape": [1]})


@check
def close_codes_fall_in_the_command_s_classes(_):
    want = {1013: (lc.Busy, 3), 1001: (lc.GoingAway, 4), 1012: (lc.GoingAway, 4), 1003: (lc.Refused, 5),
            1008: (lc.Refused, 5), 1009: (lc.Refused, 5), 1011: (lc.ServerError, 6), 4000: (lc.ServerError, 6),
            1006: (lc.ConnectionLost, 1)}
    for code, (cls, status) in want.items():
        e = lc.Closed.of(code, "why")
        assert type(e) is cls and e.code == code and e.exit_status == status, (code, e)
        assert isinstance(e, lc.Closed) and isinstance(e, lc.LanedError)
        assert e.resumable == (code in (1006, 1012)), code
    assert type(lc.HttpRefused.of(404, "no model")) is lc.UnknownModel
    assert type(lc.HttpRefused.of(503, "cap")) is lc.Unavailable and lc.Unavailable.exit_status == 3
    assert type(lc.HttpRefused.of(400, "bad")) is lc.HttpRefused
    assert issubclass(lc.InputError, ValueError) and issubclass(lc.InputError, lc.LanedError)


@check
def audio_is_cut_with_its_context(_):
    samples = np.arange(1, 1101, dtype=np.float32)
    audio = lc.Audio.of({"sample_rate": 16000, "hop": 512, "context": 64})
    assert audio.pulse_len == 576
    pulses = audio.cut(samples)
    assert pulses.shape == (3, 576), pulses.shape
    for k in range(3):
        for i in range(576):
            at = k * 512 - 64 + i
            want = samples[at] if 0 <= at < len(samples) else 0.0
            assert pulses[k, i] == want, (k, i, pulses[k, i], want)
    assert audio.cut(samples, shape=(1, 576)).shape == (3, 1, 576)
    assert lc.cut_pulses(np.zeros(0), 512, 64).shape == (0, 576)
    assert lc.cut_pulses(np.ones(4), 2).tolist() == [[1, 1], [1, 1]]


# Against the server.


@check
def the_asyncio_api_answers_as_the_model_alone(ctx):
    async def go():
        stream = await lc.connect(ctx.url(ctx.model))
        assert stream.resume == 0 and stream.model == ctx.model, stream.hello
        got = [to_bytes(stream.hello, await stream.call(*arrays_of(stream.hello, p))) for p in ctx.pulses]
        await stream.close()
        assert got == ctx.answers, "the asyncio stream's answers differ from the model alone"
        async with lc.connect(ctx.url(ctx.model), stream=lc.new_stream_id()) as s:
            for p, want in zip(ctx.pulses[:3], ctx.answers):
                answer = await s.send(p)
                assert len(answer) == len(s.outputs)
                for a, port in zip(answer, s.outputs):
                    assert a.shape == port.shape and a.dtype == port.dtype, (a.shape, a.dtype, port)
                assert to_bytes(s.hello, answer) == want
        answers = await lc.stream_all(ctx.url(ctx.model), ctx.pulses)
        assert [to_bytes(stream.hello, a) for a in answers] == ctx.answers, "stream_all's answers"

    asyncio.run(go())


@check
def the_blocking_api_answers_as_the_model_alone(ctx):
    with lc.connect_sync(ctx.url(ctx.model)) as s:
        got = [to_bytes(s.hello, s.call(*arrays_of(s.hello, p))) for p in ctx.pulses]
    assert got == ctx.answers, "the blocking stream's answers differ from the model alone"
    answers = lc.run(ctx.url(ctx.model), ctx.pulses, stream=lc.new_stream_id())
    assert [to_bytes(s.hello, a) for a in answers] == ctx.answers, "run's answers"


@check
def an_unknown_model_is_unknown_model(ctx):
    e = asyncio.run(expect_raises_async(lc.UnknownModel, lc.connect(ctx.url("no-such-model"))))
    assert e.status == 404 and "no-such-model" in e.body and ctx.model in e.body, (e.status, e.body)
    assert isinstance(e, lc.HttpRefused) and e.exit_status == 5
    e = expect_raises(lc.UnknownModel, lc.connect_sync, ctx.url("no-such-model"))
    assert e.status == 404, e


@check
def json_answers_equal_binary_ones(ctx):
    async def go():
        async with lc.connect(ctx.url(ctx.model), format="json") as s:
            assert s.format == "json", s.hello
            for p, want in zip(ctx.pulses, ctx.answers):
                answer = await s.send(p)
                for a, port in zip(answer, s.outputs):
                    assert a.shape == port.shape and a.dtype == port.dtype, (a.shape, a.dtype, port)
                assert to_bytes(s.hello, answer) == want, "a JSON answer differs from the binary one"

    asyncio.run(go())
    with lc.connect_sync(ctx.url(ctx.model), format="json") as s:
        assert [to_bytes(s.hello, s.send(p)) for p in ctx.pulses] == ctx.answers


@check
def a_nan_pulse_answers_the_same_in_json_and_binary(ctx):
    with lc.connect_sync(ctx.url(ctx.model)) as s:
        nan = [np.full(p.shape, np.nan, p.dtype) if p.dtype.kind == "f" else np.zeros(p.shape, p.dtype) for p in s.inputs]
        binary = s.call(*nan)
    with lc.connect_sync(ctx.url(ctx.model), format="json") as s:
        json_answer = s.call(*nan)
    for b, j in zip(binary, json_answer):
        assert np.array_equal(b, j, equal_nan=b.dtype.kind == "f"), (b, j)


@check
def a_wrong_shape_is_a_value_error_naming_both(ctx):
    with lc.connect_sync(ctx.url(ctx.model)) as s:
        port = s.inputs[0]
        wrong = tuple(port.shape) + (2,)
        arrays = arrays_of(s.hello, ctx.pulses[0])
        arrays[0] = np.zeros(wrong, port.dtype)
        e = expect_raises(ValueError, s.call, *arrays)
        said = str(e)
        assert port.name in said and str(wrong) in said and str(tuple(port.shape)) in said, said
        assert isinstance(e, lc.InputError)
        expect_raises(ValueError, s.call)
        # Nothing was sent: the stream goes on.
        assert to_bytes(s.hello, s.send(ctx.pulses[0])) == ctx.answers[0]


class Context:
    def __init__(self, base, model, pulses_path, answers_path):
        self.base, self.model = base.rstrip("/"), model
        with open(pulses_path, "rb") as f:
            pulses = f.read()
        with open(answers_path, "rb") as f:
            answers = f.read()
        with lc.connect_sync(self.url(model)) as s:
            n, m = s.hello.pulse_bytes, s.hello.answer_bytes
        assert len(pulses) % n == 0 and len(answers) == len(pulses) // n * m, (len(pulses), n, len(answers), m)
        self.pulses = [pulses[at : at + n] for at in range(0, len(pulses), n)]
        self.answers = [answers[at : at + m] for at in range(0, len(answers), m)]

    def url(self, model):
        return f"{self.base}/v1/models/{model}/stream"


def main(argv):
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    ctx = Context(*argv[1:])
    failed = 0
    for f in CHECKS:
        try:
            f(ctx)
            print(f"ok: {f.__name__}")
        except Exception:  # noqa: BLE001
            failed += 1
            print(f"FAILED: {f.__name__}\n{traceback.format_exc()}")
    print(f"check_client: {len(CHECKS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
