"""tritonclient (Triton's own clients, from PyPI, HTTP and gRPC) against
`laned serve`'s KServe v2 extensions: `statistics`, `model_repository`,
`system_shared_memory`.

Run by laned/tests/laned/kserve.rs with one argument, a JSON file as
triton_http.py's, with `http` and `grpc` (the two fronts' addresses)
and `mode`: "stats" (good and bad requests over both fronts, the
statistics adding up to them), "repository" (the index, load and unload),
"shm" (sequences through system shared memory, exact; bad regions
refused). Exits non-zero on the first check that fails, saying which.
"""

import faulthandler
import json
import os
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

faulthandler.dump_traceback_later(200, exit=True)


def end(status=0):
    """Ends now (not through the interpreter's teardown: tritonclient's
    gRPC client can wait forever in `__del__`, see triton_grpc.py)."""
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
H = httpclient.InferenceServerClient(url=spec["http"])
G = grpcclient.InferenceServerClient(url=spec["grpc"], channel_args=OWN)
FRONTS = [("http", httpclient, H), ("grpc", grpcclient, G)]


def refused(what, call, *words):
    try:
        call()
    except InferenceServerException as e:
        said = str(e)
        for w in words:
            if w not in said:
                end(f"{what}: refused without naming {w!r}: {said}")
        return said
    end(f"{what}: not refused")


def stats_of(client, name=""):
    """Model statistics as a dict by model name, counts as ints (gRPC's
    JSON writes uint64 as strings and leaves zeros out)."""
    if client is G:
        got = client.get_inference_statistics(model_name=name, as_json=True)
    else:
        got = client.get_inference_statistics(model_name=name)
    out = {}
    for m in got.get("model_stats", []):
        s = m.get("inference_stats", {})
        part = lambda k: (int(s.get(k, {}).get("count", 0)), int(s.get(k, {}).get("ns", 0)))
        out[m["name"]] = {
            "version": m.get("version"),
            "last_inference": int(m.get("last_inference", 0)),
            "inference_count": int(m.get("inference_count", 0)),
            "execution_count": int(m.get("execution_count", 0)),
            **{k: part(k) for k in ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output"]},
        }
    return out


def check_stats(good, bad, what):
    for front, _, c in FRONTS:
        for name in ["", model]:
            got = stats_of(c, name)
            if model not in got:
                end(f"{what}: {front} statistics ({name!r}) have no {model}: {got}")
            m = got[model]
            if m["success"][0] != good or m["fail"][0] != bad:
                end(f"{what}: {front}: success {m['success']}, fail {m['fail']}: sent {good} good, {bad} bad")
            for k in ["queue", "compute_input", "compute_infer", "compute_output"]:
                if m[k][0] != good:
                    end(f"{what}: {front}: {k} count {m[k][0]}, {good} successes")
            if m["inference_count"] != good or m["execution_count"] != good:
                end(f"{what}: {front}: inference/execution counts {m['inference_count']}/{m['execution_count']}")
            if good:
                for k in ["success", "compute_input", "compute_infer", "compute_output"]:
                    if m[k][1] <= 0:
                        end(f"{what}: {front}: {k} ns {m[k][1]}")
                parts = sum(m[k][1] for k in ["queue", "compute_input", "compute_infer", "compute_output"])
                if parts > m["success"][1]:
                    end(f"{what}: {front}: the parts' {parts} ns over the successes' {m['success'][1]}")
                if m["last_inference"] <= 0:
                    end(f"{what}: {front}: last_inference {m['last_inference']}")
            if bad and m["fail"][1] <= 0:
                end(f"{what}: {front}: fail ns {m['fail'][1]}")
            if m["version"] != "1":
                end(f"{what}: {front}: version {m['version']!r}")


def infer_one(lib, c, s, p, good):
    x = lib.InferInput(in_name, shape if good else [1, shape[-1] - 1], "FP32")
    x.set_data_from_numpy(pulses[s, p] if good else pulses[s, p][:, :-1])
    return c.infer(model, [x], outputs=[lib.InferRequestedOutput(out_name)])


def stats():
    check_stats(0, 0, "before any request")
    good = bad = 0
    for front, lib, c in FRONTS:
        for k in range(6):
            if k % 3 == 2:
                refused(f"{front} bad request {k}", lambda: infer_one(lib, c, 0, 0, False), "shape")
                bad += 1
            else:
                infer_one(lib, c, 0, k % P, True)
                good += 1
        check_stats(good, bad, f"after {front}'s requests")
    for front, _, c in FRONTS:
        refused(f"{front} statistics of no model", lambda: c.get_inference_statistics(model_name="nope"), "nope")
    print(f"statistics add up over HTTP and gRPC: {good} successes, {bad} failures")


def repository():
    for front, _, c in FRONTS:
        meta = c.get_server_metadata(as_json=True) if c is G else c.get_server_metadata()
        for ext in spec["extensions"]:
            if ext not in meta.get("extensions", []):
                end(f"{front} server metadata lists no {ext}: {meta}")
        index = c.get_model_repository_index(as_json=True) if c is G else c.get_model_repository_index()
        models = index.get("models", []) if isinstance(index, dict) else index
        got = [(m.get("name"), m.get("version"), m.get("state")) for m in models]
        if got != [(model, "1", "READY")]:
            end(f"{front} repository index: {got}")
        c.load_model(model)
        refused(f"{front} load of another model", lambda: c.load_model("nope"), "nope", "laned serves the models of its spec")
        refused(f"{front} unload", lambda: c.unload_model(model), model, "models are fixed at start")
        # Still served after all that.
        infer_one(*[(lib, cl) for f, lib, cl in FRONTS if f == front][0], 0, 0, True)
    print("repository: index, load and unload as served over HTTP and gRPC")


def main():
    mode = spec["mode"]
    {"stats": stats, "repository": repository}[mode]()
    end(0)


main()
