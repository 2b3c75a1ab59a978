"""tritonclient.grpc (Triton's own client, from PyPI) and grpcio's raw stub
as a hostile client would use them, against `laned serve --grpc-listen`.

Run by laned/tests/laned/kserve.rs with one argument, a JSON file as
triton_grpc.py's (`url` the gRPC address) with `case` naming the attack:

- `validate`: a request of a live sequence asking for an unknown output is
  refused before the model runs: the same pulse sent again is answered as
  the model alone answers it (not applied twice).

Exits non-zero on the first check that fails, saying which; prints one
line saying what held.
"""

import faulthandler
import json
import os
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

faulthandler.dump_traceback_later(200, exit=True)


def end(status=0):
    """Ends the script now (see triton_grpc.py: not through the
    interpreter's teardown), a failed check's message on stderr."""
    if isinstance(status, str):
        print(status, file=sys.stderr)
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


spec = json.load(open(sys.argv[1]))
S, P = spec["sequences"], spec["pulses"]
shape = spec["in_shape"]
pulses = np.fromfile(spec["pulses_file"], "<f4").reshape(S, P, *shape)
answers = np.fromfile(spec["answers_file"], "<f4").reshape(S, P, -1)
model, in_name, out_name = spec["model"], spec["input"], spec["output"]
OWN = [("grpc.use_local_subchannel_pool", 1)]


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

end(f"unknown case {case!r}")
