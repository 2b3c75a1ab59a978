"""tritonclient.grpc (Triton's own client, from PyPI) against `laned serve
--grpc-listen`.

Run by laned/tests/laned/kserve.rs with one argument, a JSON file as
triton_http.py's (`url` is the gRPC address here), and optionally
`restart`: {"pid": replica A's pid, "after": rounds, "other": B's gRPC
address}, or `cap`: {"places": the server's max_connections, "http": its
HTTP address} (S is then the places), or `bound`: the sequences one
connection's streams may hold (S is then one more). Exits non-zero on the
first check that fails, saying which.

Each client is a connection of its own (a local subchannel pool: gRPC
would otherwise share one connection between the clients of a process).
"""

import os
import queue
import signal
import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from triton_common import OWN, arm, end, load, take

arm()

spec, S, P, shape, pulses, answers, model, in_name, out_name = load()


def connect(url):
    """A client on a connection of its own."""
    return grpcclient.InferenceServerClient(url=url, channel_args=OWN)


def one(s, p):
    x = grpcclient.InferInput(in_name, shape, "FP32")
    x.set_data_from_numpy(pulses[s, p])
    return [x]


def same(got, s, p, what):
    want = answers[s, p]
    if got.reshape(-1).tobytes() != want.tobytes():
        end(f"{what}: sequence {s} pulse {p}: {got.reshape(-1)[:4]} where the model alone gives {want[:4]}")


class Stream:
    """A gRPC stream and the answers it delivered, by request id."""

    def __init__(self, url):
        self.client = connect(url)
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
        return take(self.answers, n, within, out_name)

    def stop(self):
        try:
            self.client.stop_stream()
        except Exception:
            pass


c = grpcclient.InferenceServerClient(url=spec["url"])
if not c.is_server_live() or not c.is_model_ready(model):
    end("the server or the model is not ready")
meta = c.get_model_metadata(model, as_json=True)
if meta["inputs"][0]["datatype"] != "FP32" or int(meta["inputs"][0]["shape"][0]) != -1:
    end(f"metadata: {meta}")
config = c.get_model_config(model, as_json=True)["config"]
if config["input"][0]["name"] != in_name:
    end(f"config: {config}")

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
            end(f"pulse {p}: sequences {left} never answered")
    a.stop()
    b.stop()
    if len(on_b) != S:
        end(f"{len(on_b)} of {S} sequences moved to B")
    print(f"restart: {S} sequences of {P} pulses on one stream exact, every one resumed on B")
    end(0)

if "cap" in spec:
    # The places filled by gRPC connections, each a sequence; one more
    # connection refused UNAVAILABLE naming the cap, and an HTTP request
    # 503; the sequences exact all along; a place freed, a new connection
    # served.
    import http.client
    places = spec["cap"]["places"]
    clients = [connect(spec["url"]) for _ in range(S)]
    for p in range(P):
        for s in range(S):
            r = clients[s].infer(model, one(s, p), sequence_id=100 + s, sequence_start=p == 0, sequence_end=p == P - 1)
            same(r.as_numpy(out_name), s, p, "a connection under the cap")
        if p == 1:
            extra = connect(spec["url"])
            try:
                extra.infer(model, one(0, 0), sequence_id=999, sequence_start=True)
                end(f"a connection past the cap of {places} was served")
            except InferenceServerException as e:
                if e.status() != "StatusCode.UNAVAILABLE" or f"connection cap ({places})" not in str(e):
                    end(f"past the cap: {e.status()} {e}")
            extra.close()
            h = http.client.HTTPConnection(spec["cap"]["http"], timeout=10)
            h.request("GET", f"/v2/models/{model}")
            got = h.getresponse()
            if got.status != 503 or b"connection cap" not in got.read():
                end(f"an HTTP request past the cap got {got.status}")
            h.close()
    clients[0].close()
    # Its place freed (the server sees the close at once, or within a
    # moment): a new connection is served.
    for attempt in range(100):
        try:
            again = connect(spec["url"])
            r = again.infer(model, one(0, 0), sequence_id=998, sequence_start=True, sequence_end=True)
            same(r.as_numpy(out_name), 0, 0, "a connection in a freed place")
            again.close()
            break
        except InferenceServerException as e:
            again.close()
            if attempt == 99:
                end(f"a freed place: {e}")
            time.sleep(0.05)
    for c in clients[1:]:
        c.close()
    print(f"{S} connections at the cap of {places} exact; one more refused UNAVAILABLE, HTTP 503; a freed place served")
    end(0)

if "bound" in spec:
    # One connection's stream holding `bound` sequences; one more refused
    # naming the bound (an error_message on the stream, RESOURCE_EXHAUSTED's), the others exact; one ended, a
    # new one taken.
    bound = spec["bound"]
    st = Stream(spec["url"])
    for p in range(P):
        for s in range(bound):
            st.send(s, p, s + 1)
        if p == 0:
            st.send(bound, 0, bound + 1)
        got, errors = st.take(bound + (p == 0), within=120.0)
        if p == 0:
            if len(errors) != 1 or f"{bound} sequences live on this connection" not in errors[0]:
                end(f"one past the bound: {errors[:3]}")
        elif errors:
            end(f"pulse {p}: {errors[:3]}")
        if len(got) != bound or (bound, 0) in got:
            end(f"pulse {p}: {len(got)} answers of {bound}")
        for (s, q), y in got.items():
            same(y, s, q, "at the bound")
    # Every one ended with its last pulse: a new sequence is taken.
    st.send(bound, 0, bound + 1)
    got, errors = st.take(1, within=30.0)
    if errors or (bound, 0) not in got:
        end(f"after the others ended: {errors[:3]}")
    same(got[(bound, 0)], bound, 0, "after the others ended")
    st.stop()
    print(f"{bound} sequences on one connection's stream exact; one more refused naming the bound; taken once they ended")
    end(0)

# S sequences multiplexed on one stream and S connections of one sequence
# each (unary), interleaved: every pulse of the stream's sequences sent,
# then the connections' requests of that pulse, then the stream's answers.
st = Stream(spec["url"])
clients = [connect(spec["url"]) for _ in range(S)]
alone = {}
for p in range(P):
    for s in range(S):
        st.send(s, p, s + 1 if s % 2 else f"stream-{s}")
    for s in range(S):
        r = clients[s].infer(model, one(s, p), sequence_id=1000 + s, sequence_start=p == 0, sequence_end=p == P - 1)
        alone[(s, p)] = r.as_numpy(out_name)
        same(alone[(s, p)], s, p, "a connection a sequence")
    got, errors = st.take(S, within=60.0)
    if errors or len(got) != S:
        end(f"one stream, pulse {p}: {len(got)} answers of {S}, errors {errors[:3]}")
    for (s, q), y in got.items():
        same(y, s, q, "one stream")
        # The same pulses, on a stream and on a connection: the same bits.
        if y.tobytes() != alone[(s, q)].tobytes():
            end(f"sequence {s} pulse {q}: the stream's answer is not the connection's")
st.stop()
for cl in clients:
    cl.close()
# Twins: two sequences fed the same pulses get the same bits.
twins = [[c.infer(model, one(0, p), sequence_id=t, sequence_start=p == 0, sequence_end=p == P - 1).as_numpy(out_name).tobytes()
          for p in range(P)] for t in (5001, 5002)]
if twins[0] != twins[1]:
    end("two sequences fed the same pulses differ")
# Bad requests, each its error.
def refused(what, call, *words):
    try:
        call()
    except InferenceServerException as e:
        for w in words:
            if w not in str(e):
                end(f"{what}: the error {str(e)!r} does not say {w!r}")
        return
    end(f"{what}: not refused")
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
end(0)
