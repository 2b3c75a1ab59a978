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

import os

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from triton_common import CLEANUP, OWN, arm, end, load

arm()

spec, S, P, shape, pulses, answers, model, in_name, out_name = load()
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


def shm():
    import tritonclient.utils.shared_memory as shm

    per_in = int(np.prod(shape)) * 4
    per_out = answers.shape[-1] * 4
    tag = os.getpid()
    key_in, key_out = f"/laned_in_{tag}", f"/laned_out_{tag}"
    h_in = shm.create_shared_memory_region("in", key_in, S * per_in)
    h_out = shm.create_shared_memory_region("out", key_out, S * per_out)
    CLEANUP.extend([lambda: shm.destroy_shared_memory_region(h_in), lambda: shm.destroy_shared_memory_region(h_out)])
    # Regions are the server's: one registered over each front, both used
    # over both.
    H.register_system_shared_memory("in", key_in, S * per_in)
    G.register_system_shared_memory("out", key_out, S * per_out)
    listed = sorted(r["name"] for r in H.get_system_shared_memory_status())
    if listed != ["in", "out"]:
        end(f"http shared memory status: {listed}")
    listed = sorted(G.get_system_shared_memory_status(as_json=True).get("regions", {}))
    if listed != ["in", "out"]:
        end(f"grpc shared memory status: {listed}")

    def request(s, p, lib, c):
        shm.set_shared_memory_region(h_in, [pulses[s, p]], offset=s * per_in)
        x = lib.InferInput(in_name, shape, "FP32")
        x.set_shared_memory("in", per_in, offset=s * per_in)
        y = lib.InferRequestedOutput(out_name)
        y.set_shared_memory("out", per_out, offset=s * per_out)
        r = c.infer(model, [x], outputs=[y], sequence_id=s + 1, sequence_start=p == 0, sequence_end=p == P - 1)
        said = r.get_output(out_name)
        if isinstance(said, dict):
            # HTTP: name, datatype and shape alone, as Triton answers it
            # (Triton's C++ client, perf_analyzer's, reads any `parameters`
            # of an output as its binary data's, `binary_data_size` wanted).
            if "parameters" in said or "data" in said:
                end(f"sequence {s} pulse {p}: over HTTP, an output in shared memory answered with more than Triton's: {said}")
        elif "shared_memory_region" not in said.parameters:
            end(f"sequence {s} pulse {p}: the answer's output names no region: {said}")
        got = shm.get_contents_as_numpy(h_out, np.float32, [per_out // 4], offset=s * per_out)
        want = answers[s, p]
        if got.tobytes() != want.tobytes():
            end(f"sequence {s} pulse {p}: {got[:4]} through shared memory where the model alone gives {want[:4]}")

    # Sixteen sequences interleaved, half over each front.
    for p in range(P):
        for s in range(S):
            _, lib, c = FRONTS[s % 2]
            request(s, p, lib, c)

    # Each bad region refused, over both fronts.
    for front, lib, c in FRONTS:
        refused(f"{front}: offset past the end", lambda: c.register_system_shared_memory("bad", key_in, 8, offset=S * per_in), "pass the end")
        refused(f"{front}: size past the end", lambda: c.register_system_shared_memory("bad", key_in, S * per_in + 1), "pass the end")
        refused(f"{front}: no such key", lambda: c.register_system_shared_memory("bad", f"/laned_none_{tag}", 8), "laned_none")
        refused(f"{front}: a duplicate", lambda: c.register_system_shared_memory("in", key_in, 8), "\"in\"", "registered already")
        refused(f"{front}: CUDA", lambda: c.register_cuda_shared_memory("gpu", "eA==", 0, 8), "CUDA shared memory is not served")
        # Unregistering CUDA regions, none being registered, is done (as
        # Triton built without GPUs answers it): perf_analyzer's cleanup of
        # --shared-memory system unregisters both kinds.
        try:
            c.unregister_cuda_shared_memory()
            c.unregister_cuda_shared_memory("gpu")
        except InferenceServerException as e:
            end(f"{front}: unregistering CUDA shared memory (none registered) refused: {e}")

        def bad_input(region, size, offset):
            x = lib.InferInput(in_name, shape, "FP32")
            x.set_shared_memory(region, size, offset=offset)
            return lambda: c.infer(model, [x])

        refused(f"{front}: an unknown region", bad_input("nope", per_in, 0), "no shared memory region \"nope\"")
        refused(f"{front}: an input past its region's end", bad_input("in", per_in, S * per_in - 4), "pass its end")
        refused(f"{front}: an input's byte size not the tensor's", bad_input("in", per_in - 4, 0), "shared_memory_byte_size")

        def bad_output(size, offset):
            x = lib.InferInput(in_name, shape, "FP32")
            x.set_shared_memory("in", per_in)
            y = lib.InferRequestedOutput(out_name)
            y.set_shared_memory("out", size, offset=offset)
            return lambda: c.infer(model, [x], outputs=[y])

        refused(f"{front}: an output past its region's end", bad_output(per_out, S * per_out - 4), "pass its end")
        refused(f"{front}: an output region too small", bad_output(per_out - 4, 0), "shared_memory_byte_size")

    # Unregistered: gone from the status, refused by name at use.
    H.unregister_system_shared_memory("in")
    if [r["name"] for r in H.get_system_shared_memory_status()] != ["out"]:
        end(f"after unregistering: {H.get_system_shared_memory_status()}")
    x = grpcclient.InferInput(in_name, shape, "FP32")
    x.set_shared_memory("in", per_in)
    refused("an unregistered region", lambda: G.infer(model, [x]), "no shared memory region \"in\"")
    G.unregister_system_shared_memory()
    if G.get_system_shared_memory_status(as_json=True).get("regions"):
        end("regions left after unregistering all")
    print(f"{S} sequences of {P} pulses exact through shared memory; every bad region refused over HTTP and gRPC")


def main():
    mode = spec["mode"]
    {"stats": stats, "repository": repository, "shm": shm}[mode]()
    end(0)


main()
