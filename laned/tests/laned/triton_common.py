"""What the tritonclient scripts of kserve.rs share: the check file they
are given (`load`), the end of a script (`end`), and the gRPC channel
option that gives each client a connection of its own (`OWN`).

Imported from the scripts' own folder (Python puts a script's folder
first on its path).
"""

import faulthandler
import json
import os
import queue
import sys
import time

import numpy as np

# Each client on a connection of its own (a local subchannel pool: gRPC
# would otherwise share one connection between the clients of a process).
OWN = [("grpc.use_local_subchannel_pool", 1)]

# What `end` undoes first (a script's shared memory regions, say).
CLEANUP = []


def arm(seconds=200):
    """A script stuck past its test's time says where (every thread's
    stack) and exits, instead of being killed without a word."""
    faulthandler.dump_traceback_later(seconds, exit=True)


def end(status=0):
    """Ends the script now, a message (a failed check) on stderr with
    status 1, after what `CLEANUP` holds. Not through the interpreter's
    teardown: tritonclient's clients close their gRPC channels in
    `__del__`, and one such close waited forever at exit in a full suite's
    run (the script had printed its success; faulthandler's dump showed the
    wait in `grpc._channel`'s `_close` under
    `InferenceServerClient.__del__`)."""
    if isinstance(status, str):
        print(status, file=sys.stderr)
        status = 1
    for undo in CLEANUP:
        try:
            undo()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def load(path=None):
    """The check file (the script's one argument): the spec as read, the
    sequences `S` and pulses `P` of each, the input's shape, every pulse
    `[S, P, *shape]` and every answer the model alone gives `[S, P, n]`
    (raw little-endian f32 files), and the model's, input's and output's
    names."""
    spec = json.load(open(path or sys.argv[1]))
    S, P = spec["sequences"], spec["pulses"]
    shape = spec["in_shape"]
    pulses = np.fromfile(spec["pulses_file"], "<f4").reshape(S, P, *shape)
    answers = np.fromfile(spec["answers_file"], "<f4").reshape(S, P, -1)
    return spec, S, P, shape, pulses, answers, spec["model"], spec["input"], spec["output"]


def take(answers, n, within, out_name):
    """Up to `n` answers from a gRPC stream's queue of (result, error)
    pairs, within `within` seconds: the results by (sequence, pulse) (their
    request ids say `s:p`), and the errors' texts in order."""
    got, errors = {}, []
    until = time.time() + within
    while len(got) + len(errors) < n and time.time() < until:
        try:
            result, error = answers.get(timeout=max(0.01, until - time.time()))
        except queue.Empty:
            break
        if error is not None:
            errors.append(str(error))
            continue
        s, p = map(int, result.get_response().id.split(":"))
        got[(s, p)] = result.as_numpy(out_name)
    return got, errors
