#!/usr/bin/env bash
# The MSRV, checked without its toolchain: this project's machines can fetch
# no toolchain but the one installed (rustup downloads fail), so
# `cargo +1.91 check` cannot run here. What is checked instead:
#
# 1. every package the six library crates build with (normal and build
#    dependencies, every feature) declares a rust-version no newer than
#    ours, or none: the toolchain resolving them is not the bound;
# 2. our own code uses no std API newer than ours: clippy's
#    `incompatible_msrv` lint reads `rust-version` and is denied in the
#    clippy step of .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo metadata --format-version 1 --all-features --locked > target/msrv-metadata.json
python3 - <<'PY'
import json, sys
meta = json.load(open("target/msrv-metadata.json"))
pkgs = {p["id"]: p for p in meta["packages"]}
libs = ["lane-table", "laned-metrics", "kernel-memo", "laned-wire", "laned-runner", "laned-testkit"]
ours = {p["name"]: p for p in meta["packages"] if p["name"] in libs and p["source"] is None}
msrv = {p["rust_version"] for p in ours.values()}
if len(msrv) != 1 or None in msrv:
    sys.exit(f"msrv: the library crates must declare one rust-version, they declare {msrv}")
msrv = msrv.pop()
def v(s):
    parts = [int(x) for x in s.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
seen, stack = set(), [pid for pid, p in pkgs.items() if p["name"] in ours and p["source"] is None]
too_new = []
while stack:
    pid = stack.pop()
    if pid in seen:
        continue
    seen.add(pid)
    p = pkgs[pid]
    rv = p.get("rust_version")
    if rv and v(rv) > v(msrv):
        too_new.append(f'{p["name"]} {p["version"]} needs {rv}')
    for dep in nodes[pid]["deps"]:
        kinds = {k["kind"] for k in dep["dep_kinds"]}
        targets = {k.get("target") for k in dep["dep_kinds"]}
        # Normal and build dependencies on Linux; dev-dependencies don't
        # reach a user, and Windows-only ones don't build here.
        if kinds & {None, "build"} and not all(t and "windows" in t for t in targets):
            stack.append(dep["pkg"])
if too_new:
    sys.exit(f"msrv {msrv}: newer dependencies:\n  " + "\n  ".join(sorted(too_new)))
print(f"msrv {msrv}: {len(seen)} packages the libraries build with declare no newer rust-version")
PY
