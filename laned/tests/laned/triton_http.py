"""tritonclient.http (Triton's own client, from PyPI) against `laned serve`.

Run by laned/tests/laned/kserve.rs with one argument, a JSON file naming:
`url` (host:port), `model`, `input`/`output` (names), `in_shape`,
`sequences`, `pulses` (each sequence's count), `pulses_file` and
`answers_file` (raw little-endian f32: every sequence's pulses, then
every sequence's answers, sequence by sequence), and optionally
`restart`: {"pid": replica A's pid, "after": pulses, "other": B's
host:port} for a rolling restart mid-sequence. Exits non-zero on the
first check that fails, saying which.
"""

import os
import signal
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from triton_common import load

spec, S, P, shape, pulses, answers, model, in_name, out_name = load()
per_pulse = int(np.prod(shape))


def client(url):
    return httpclient.InferenceServerClient(url=url)


def request(c, s, p, start, end, binary=True, seq=None):
    x = httpclient.InferInput(in_name, shape, "FP32")
    x.set_data_from_numpy(pulses[s, p], binary_data=binary)
    out = [httpclient.InferRequestedOutput(out_name, binary_data=binary)]
    r = c.infer(
        model,
        [x],
        outputs=out,
        sequence_id=seq if seq is not None else s + 1,
        sequence_start=start,
        sequence_end=end,
    )
    return r.as_numpy(out_name)


def same(got, s, p, what):
    want = answers[s, p]
    if got.reshape(-1).tobytes() != want.tobytes():
        sys.exit(f"{what}: sequence {s} pulse {p}: {got.reshape(-1)[:4]} where the model alone gives {want[:4]}")


def refused(what, call, *words):
    try:
        call()
    except InferenceServerException as e:
        msg = str(e)
        for w in words:
            if w not in msg:
                sys.exit(f"{what}: the error {msg!r} does not say {w!r}")
        return
    sys.exit(f"{what}: not refused")


c = client(spec["url"])
if not c.is_server_live() or not c.is_model_ready(model):
    sys.exit("the server or the model is not ready")
meta = c.get_model_metadata(model)
if meta["inputs"][0]["datatype"] != "FP32" or meta["inputs"][0]["shape"][0] != -1:
    sys.exit(f"metadata: {meta}")

if "restart" in spec:
    # Rolling restart: SIGTERM replica A after `after` pulses of every
    # sequence; each later request A turns away (503 restarting, or no
    # connection once it is gone) is sent again to B, which resumes the
    # sequence from the record A handed over.
    r = spec["restart"]
    urls = [spec["url"], r["other"]]
    on = [0] * S
    moved = 0
    for p in range(P):
        if p == r["after"]:
            os.kill(r["pid"], signal.SIGTERM)
        for s in range(S):
            for attempt in range(200):
                try:
                    got = request(client(urls[on[s]]), s, p, p == 0, p == P - 1)
                    break
                except Exception as e:  # 503, or A gone
                    if on[s] == 0 and p >= r["after"]:
                        on[s] = 1
                        moved += 1
                        continue
                    time.sleep(0.05)
                    if attempt == 199:
                        sys.exit(f"sequence {s} pulse {p}: {e}")
            same(got, s, p, "across the restart")
    if moved != S:
        sys.exit(f"{moved} of {S} sequences moved to B")
    print(f"restart: {S} sequences of {P} pulses exact, every one resumed on B")
    sys.exit(0)

# S sequences (the first half numbered, the rest named), interleaved one
# request a pulse; the last pulse ends each.
ids = [s + 1 if s < S // 2 else f"seq-{s}" for s in range(S)]
good = client(spec["url"])
for p in range(P):
    for s in range(S):
        binary = s % 3 != 0  # a third of them as JSON
        got = request(good, s, p, p == 0, p == P - 1, binary=binary, seq=ids[s])
        same(got, s, p, "interleaved")
        if p == 1 and s == 0:
            # Bad requests beside the live sequences, each its error.
            def send(dtype="FP32", shp=None, name=in_name, mdl=model, seq=9999, start=True):
                x = httpclient.InferInput(name, shp or shape, dtype)
                a = np.zeros(shp or shape, "<f8" if dtype == "FP64" else "<f4")
                x.set_data_from_numpy(a)
                return c.infer(mdl, [x], sequence_id=seq, sequence_start=start)
            refused("a wrong datatype", lambda: send(dtype="FP64"), in_name, "FP64", "FP32")
            refused("a wrong shape", lambda: send(shp=[1, per_pulse + 1]), in_name, "shape")
            refused("an unknown input", lambda: send(name="nope"), "nope", in_name)
            refused("an unknown model", lambda: send(mdl="nope"), "nope")
            refused("no sequence_start", lambda: send(seq=4242, start=False), "never started")
            refused("a second start", lambda: send(seq=ids[0], start=True), "started twice")
            big = httpclient.InferInput(in_name, [1, 4_000_000], "FP32")
            big.set_data_from_numpy(np.zeros([1, 4_000_000], "<f4"))
            refused("a request past the limit", lambda: c.infer(model, [big], sequence_id=77, sequence_start=True))
# Two sequences fed the same pulses get the same bits.
twins = []
for seq in ("twin-a", "twin-b"):
    twins.append([request(good, 0, p, p == 0, p == P - 1, seq=seq).tobytes() for p in range(P)])
if twins[0] != twins[1]:
    sys.exit("two sequences fed the same pulses differ")
print(f"{S} sequences of {P} pulses exact (a third as JSON), 7 bad requests refused, twins equal")
