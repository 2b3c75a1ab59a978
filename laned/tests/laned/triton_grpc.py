"""tritonclient.grpc (Triton's own client, from PyPI) against `laned serve
--grpc-listen`.

Run by laned/tests/laned/kserve.rs with one argument, a JSON file as
triton_http.py's (`url` is the gRPC address here), and optionally
`restart`: {"pid": replica A's pid, "after": rounds, "other": B's gRPC
address}. Exits non-zero on the first check that fails, saying which.
"""

import json
import os
import queue
import signal
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

spec = json.load(open(sys.argv[1]))
S, P = spec["sequences"], spec["pulses"]
shape = spec["in_shape"]
pulses = np.fromfile(spec["pulses_file"], "<f4").reshape(S, P, *shape)
answers = np.fromfile(spec["answers_file"], "<f4").reshape(S, P, -1)
model, in_name, out_name = spec["model"], spec["input"], spec["output"]


def one(s, p):
    x = grpcclient.InferInput(in_name, shape, "FP32")
    x.set_data_from_numpy(pulses[s, p])
    return [x]


def same(got, s, p, what):
    want = answers[s, p]
    if got.reshape(-1).tobytes() != want.tobytes():
        sys.exit(f"{what}: sequence {s} pulse {p}: {got.reshape(-1)[:4]} where the model alone gives {want[:4]}")


class Stream:
    """A gRPC stream and the answers it delivered, by request id."""

    def __init__(self, url):
        self.client = grpcclient.InferenceServerClient(url=url)
        self.answers = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, s, p, seq):
        try:
            self.client.async_stream_infer(
                model,
                one(s, p),
                request_id=f"{s}:{p}",
                sequence_id=seq,
                sequence_start=p == 0,
                sequence_end=p == P - 1,
            )
        except Exception as e:  # the stream is gone: no answer will come
            self.answers.put((None, e))

    def take(self, n, within=10.0):
        """Up to `n` answers (results by (s, p), and errors), within a time."""
        got, errors = {}, []
        until = time.time() + within
        while len(got) + len(errors) < n and time.time() < until:
            try:
                result, error = self.answers.get(timeout=max(0.01, until - time.time()))
            except queue.Empty:
                break
            if error is not None:
                errors.append(str(error))
                continue
            s, p = map(int, result.get_response().id.split(":"))
            got[(s, p)] = result.as_numpy(out_name)
        return got, errors

    def stop(self):
        try:
            self.client.stop_stream()
        except Exception:
            pass


c = grpcclient.InferenceServerClient(url=spec["url"])
if not c.is_server_live() or not c.is_model_ready(model):
    sys.exit("the server or the model is not ready")
meta = c.get_model_metadata(model, as_json=True)
if meta["inputs"][0]["datatype"] != "FP32" or int(meta["inputs"][0]["shape"][0]) != -1:
    sys.exit(f"metadata: {meta}")
config = c.get_model_config(model, as_json=True)["config"]
if config["input"][0]["name"] != in_name:
    sys.exit(f"config: {config}")

if "restart" in spec:
    # One round a pulse of every sequence on one stream; A told SIGTERM
    # before round `after`; a sequence whose answer does not come from A
    # (an error, A gone) sends the same pulse on B's stream, and every
    # later one there.
    r = spec["restart"]
    a, b = Stream(spec["url"]), None
    on_b = set()
    for p in range(P):
        if p == r["after"]:
            os.kill(r["pid"], signal.SIGTERM)
            time.sleep(0.2)
        left = [s for s in range(S)]
        for attempt in range(50):
            on_a = [s for s in left if s not in on_b]
            for s in on_a:
                a.send(s, p, s + 1)
            got, _ = a.take(len(on_a), within=3.0) if on_a else ({}, [])
            for s in on_a:
                if (s, p) in got:
                    same(got[(s, p)], s, p, "on A")
                    left.remove(s)
                elif p >= r["after"]:
                    on_b.add(s)
            if b is None and on_b:
                b = Stream(r["other"])
            mine = [s for s in left if s in on_b]
            for s in mine:
                b.send(s, p, s + 1)
            got, errors = b.take(len(mine), within=5.0) if mine else ({}, [])
            for s in mine:
                if (s, p) in got:
                    same(got[(s, p)], s, p, "resumed on B")
                    left.remove(s)
            if not left:
                break
            time.sleep(0.1)
        if left:
            sys.exit(f"pulse {p}: sequences {left} never answered")
    a.stop()
    b.stop()
    if len(on_b) != S:
        sys.exit(f"{len(on_b)} of {S} sequences moved to B")
    print(f"restart: {S} sequences of {P} pulses on one stream exact, every one resumed on B")
    sys.exit(0)

# S sequences multiplexed on one stream, every pulse sent at once, in order.
st = Stream(spec["url"])
for p in range(P):
    for s in range(S):
        st.send(s, p, s + 1 if s % 2 else f"stream-{s}")
got, errors = st.take(S * P, within=60.0)
if errors or len(got) != S * P:
    sys.exit(f"one stream: {len(got)} answers of {S * P}, errors {errors[:3]}")
for (s, p), y in got.items():
    same(y, s, p, "one stream")
st.stop()
# S connections of one sequence each, unary, interleaved.
clients = [grpcclient.InferenceServerClient(url=spec["url"]) for _ in range(S)]
for p in range(P):
    for s in range(S):
        r = clients[s].infer(model, one(s, p), sequence_id=1000 + s, sequence_start=p == 0, sequence_end=p == P - 1)
        same(r.as_numpy(out_name), s, p, "a connection a sequence")
# Twins: two sequences fed the same pulses get the same bits.
twins = [[c.infer(model, one(0, p), sequence_id=t, sequence_start=p == 0, sequence_end=p == P - 1).as_numpy(out_name).tobytes()
          for p in range(P)] for t in (5001, 5002)]
if twins[0] != twins[1]:
    sys.exit("two sequences fed the same pulses differ")
# Bad requests, each its error.
def refused(what, call, *words):
    try:
        call()
    except InferenceServerException as e:
        for w in words:
            if w not in str(e):
                sys.exit(f"{what}: the error {str(e)!r} does not say {w!r}")
        return
    sys.exit(f"{what}: not refused")
def bad(dtype="FP32", shp=None, name=in_name, mdl=model, seq=9999, start=True):
    x = grpcclient.InferInput(name, shp or shape, dtype)
    x.set_data_from_numpy(np.zeros(shp or shape, "<f8" if dtype == "FP64" else "<f4"))
    return c.infer(mdl, [x], sequence_id=seq, sequence_start=start)
refused("a wrong datatype", lambda: bad(dtype="FP64"), in_name, "FP64", "FP32")
refused("a wrong shape", lambda: bad(shp=[1, int(np.prod(shape)) + 1]), in_name, "shape")
refused("an unknown input", lambda: bad(name="nope"), "nope")
refused("an unknown model", lambda: bad(mdl="nope"), "nope")
refused("no sequence_start", lambda: bad(seq=4242, start=False), "never started")
print(f"{S} sequences of {P} pulses exact on one stream and on {S} connections, twins equal, 5 bad requests refused")
