"""tritonclient.grpc (Triton's own client, from PyPI) and grpcio's raw stub
as a hostile client would use them, against `laned serve --grpc-listen`.

Run by laned/tests/laned/kserve.rs with one argument, a JSON file as
triton_grpc.py's (`url` the gRPC address) with `case` naming the attack:

- `validate`: a request of a live sequence asking for an unknown output is
  refused before the model runs: the same pulse sent again is answered as
  the model alone answers it (not applied twice).
- `requests`: the model has one lane, held by a sequence on another
  connection; one stream sends `S` requests of no sequence at once: those
  past `bound` (the server's `grpc_max_requests`) are refused at once
  naming it, the others wait for the lane and are answered exactly once
  the sequence ends.
- `ended`: the same lane held; one stream sends `S` sequences of one
  request each, started and ended by it (ids cycling): a sequence ended
  but not yet served still counts, so the one past `bound` (256) is
  refused naming the bound; every answer that comes is exact.
- `sigterm`: a stream with a live sequence; the server (`pid`) told
  SIGTERM: the stream ends UNAVAILABLE saying `restarting` before the
  process exits.

Exits non-zero on the first check that fails, saying which; prints one
line saying what held.
"""

import os

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from triton_common import OWN, arm, end, load, take

arm()

spec, S, P, shape, pulses, answers, model, in_name, out_name = load()


def connect(url=None):
    return grpcclient.InferenceServerClient(url=url or spec["url"], channel_args=OWN)


def one(s, p):
    x = grpcclient.InferInput(in_name, shape, "FP32")
    x.set_data_from_numpy(pulses[s, p])
    return [x]


def same(got, s, p, what):
    want = answers[s, p]
    if got.reshape(-1).tobytes() != want.tobytes():
        end(f"{what}: sequence {s} pulse {p}: {got.reshape(-1)[:4]} where the model alone gives {want[:4]}")


def refused(what, call, status, *words):
    try:
        call()
    except InferenceServerException as e:
        if e.status() != f"StatusCode.{status}":
            end(f"{what}: {e.status()} {e}, wanted {status}")
        for w in words:
            if w not in str(e):
                end(f"{what}: the error {str(e)!r} does not say {w!r}")
        return str(e)
    end(f"{what}: not refused")


case = spec["case"]

if case == "validate":
    c = connect()
    seq = 4711
    r = c.infer(model, one(0, 0), sequence_id=seq, sequence_start=True)
    same(r.as_numpy(out_name), 0, 0, "the first pulse")
    unknown = [grpcclient.InferRequestedOutput("zzz")]
    refused(
        "an unknown output on a live sequence",
        lambda: c.infer(model, one(0, 1), outputs=unknown, sequence_id=seq),
        "INVALID_ARGUMENT",
        "zzz",
    )
    # The refused request moved nothing: its pulse, sent again, is the
    # sequence's second.
    r = c.infer(model, one(0, 1), sequence_id=seq)
    same(r.as_numpy(out_name), 0, 1, "the pulse after a refused one")
    for p in range(2, P):
        r = c.infer(model, one(0, p), sequence_id=seq, sequence_end=p == P - 1)
        same(r.as_numpy(out_name), 0, p, "the pulses after")
    print("validate: an unknown output refused before the call, the sequence unmoved and exact")
    end(0)

class Stream:
    """A gRPC stream and the answers it delivered (results by request id,
    errors in order)."""

    def __init__(self, url=None):
        import queue

        self.client = connect(url)
        self.answers = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, s, p, seq=None, start=False, end=False):
        kw = {} if seq is None else dict(sequence_id=seq, sequence_start=start, sequence_end=end)
        self.client.async_stream_infer(model, one(s, p), request_id=f"{s}:{p}", **kw)

    def take(self, n, within):
        return take(self.answers, n, within, out_name)


def hold_the_lane():
    """The model's one lane, held by a live sequence on a connection of its
    own; a function that ends it."""
    holder = connect()
    r = holder.infer(model, one(0, 0), sequence_id=999999, sequence_start=True)
    same(r.as_numpy(out_name), 0, 0, "the lane's holder")

    def release():
        r = holder.infer(model, one(0, 1), sequence_id=999999, sequence_end=True)
        same(r.as_numpy(out_name), 0, 1, "the lane's holder")

    return release


if case == "requests":
    bound = spec["bound"]
    release = hold_the_lane()
    st = Stream()
    for s in range(S):
        st.send(s, 0)
    # Those past the bound are refused at once (the others wait for the
    # lane).
    got, errors = st.take(S - bound, within=30.0)
    if got or len(errors) != S - bound:
        end(f"past the bound of {bound}: {len(got)} answers, errors {errors[:3]}")
    for e in errors:
        if f"{bound} requests in flight on this connection (grpc_max_requests)" not in e:
            end(f"a refusal that does not name the bound: {e}")
    release()
    got, errors = st.take(bound, within=60.0)
    if errors or len(got) != bound:
        end(f"under the bound: {len(got)} answers of {bound}, errors {errors[:3]}")
    for (s, p), y in got.items():
        same(y, s, p, "a request of no sequence")
    print(f"requests: {S - bound} of {S} refused naming grpc_max_requests ({bound}), the {bound} others exact")
    end(0)

if case == "ended":
    bound = spec["bound"]
    release = hold_the_lane()
    st = Stream()
    for s in range(S):
        st.send(s, 0, seq=1 + s % (S + 1), start=True, end=True)
    got, errors = st.take(1, within=30.0)
    if got or len(errors) != 1 or f"{bound} sequences live on this connection" not in errors[0]:
        end(f"one past the bound of {bound}: {len(got)} answers, errors {errors[:3]}")
    release()
    got, errors = st.take(S - 1, within=120.0)
    for (s, p), y in got.items():
        same(y, s, p, "a sequence of one request")
    if not got:
        end(f"none of the {S - 1} sequences under the bound answered: {errors[:3]}")
    print(f"ended: the sequence past {bound} refused naming the bound, ended ones counted; {len(got)} answered exact")
    end(0)

if case == "sigterm":
    import signal
    import time

    st = Stream()
    st.send(0, 0, seq=31, start=True)
    got, errors = st.take(1, within=30.0)
    if errors or (0, 0) not in got:
        end(f"the first pulse: {errors[:3]}")
    same(got[(0, 0)], 0, 0, "the first pulse")
    os.kill(spec["pid"], signal.SIGTERM)
    got, errors = st.take(1, within=60.0)
    if len(errors) != 1 or "restarting" not in errors[0]:
        end(f"after SIGTERM the stream got {got} and {errors[:3]}, not restarting")
    print(f"sigterm: the stream told {errors[0]!r}")
    end(0)

end(f"unknown case {case!r}")
