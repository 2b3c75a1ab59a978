#!/usr/bin/env bash
# Triton's Performance Analyzer (PyPI perf-analyzer 2.60.0, the tool
# Triton's users size a deployment with) against `laned serve`, unchanged:
# gRPC with --streaming and sequences, then HTTP, each with and without
# --shared-memory system; every run prints perf_analyzer's client figures
# and its "Server:" section (from laned's statistics extension).
#
#   bench/perf-analyzer.sh CACHE            # CACHE: a folder kept between runs
#
# Run from the repository root after `cargo build --release -p laned-bench
# -p laned` (the laned binary and serve-bench, which writes the model).
# Settings, from the environment:
#   LANED        the laned binary            (target/release/laned)
#   SERVE_BENCH  serve-bench                 (target/release/serve-bench, else target/debug/)
#   CONCURRENCY  perf_analyzer's sequences in flight (16)
#   SEQ_LEN      requests a sequence (20)
#   INTERVAL_MS  a measurement window (2000)
#   TRIALS, STABILITY  perf_analyzer's -r (10) and -s (100): the first 3
#                windows in a row whose throughput and latency are within
#                100% of their mean, 10 windows at most (a shared machine's
#                spread is wider than perf_analyzer's default 10%)
#   LANES        the model's lanes (64)
#   SERVER_CPU / CLIENT_CPU  taskset CPUs for laned and perf_analyzer
#                (0 and 1 where the machine has 2 or more; empty: unpinned)
#
# Nothing here touches the system: apt runs under a private APT_CONFIG
# (its own sources list, state and cache under CACHE), pip only downloads.
set -euo pipefail

CACHE=${1:?usage: bench/perf-analyzer.sh CACHE}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
LANED=${LANED:-target/release/laned}
if [[ -z ${SERVE_BENCH:-} ]]; then
    SERVE_BENCH=target/release/serve-bench
    [[ -x $SERVE_BENCH ]] || SERVE_BENCH=target/debug/serve-bench
fi
CONCURRENCY=${CONCURRENCY:-16}
SEQ_LEN=${SEQ_LEN:-20}
INTERVAL_MS=${INTERVAL_MS:-2000}
TRIALS=${TRIALS:-10}
STABILITY=${STABILITY:-100}
LANES=${LANES:-64}
if (($(nproc) >= 2)); then
    SERVER_CPU=${SERVER_CPU-0}
    CLIENT_CPU=${CLIENT_CPU-1}
else
    SERVER_CPU=${SERVER_CPU-}
    CLIENT_CPU=${CLIENT_CPU-}
fi
for bin in "$LANED" "$SERVE_BENCH"; do
    [[ -x $bin ]] || { echo "no $bin: cargo build --release -p laned-bench -p laned" >&2; exit 2; }
done
pin() { # pin CPU CMD...: CMD on CPU where one is set
    local cpu=$1
    shift
    if [[ -n $cpu ]]; then taskset -c "$cpu" "$@"; else "$@"; fi
}

# 1. perf_analyzer itself. Its 2.60.0 wheels are manylinux_2_38 only, so a
# plain `pip install` on glibc 2.36 falls back to 0.1.0, an empty
# placeholder: download the real wheel for its platform, and unzip it (the
# binary needs no Python).
PA=$CACHE/perf_analyzer/perf_analyzer/bin/perf_analyzer
if [[ ! -x $PA ]]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version 3.11 --platform manylinux_2_38_x86_64 \
        perf-analyzer==2.60.0 -d "$CACHE/wheels"
    python3 -m zipfile -e "$CACHE"/wheels/perf_analyzer-2.60.0-*.whl "$CACHE/perf_analyzer"
    chmod +x "$PA"
fi

# 2. A glibc new enough for it: Debian trixie's libc and the libraries
# perf_analyzer links (libstdc++, libgcc, OpenSSL, zlib, zstd), downloaded
# with apt under a private APT_CONFIG (the system's sources and state
# untouched) and unpacked with dpkg -x into a sysroot. perf_analyzer then
# runs through that sysroot's loader, nothing installed.
SYSROOT=$CACHE/sysroot
LIBS=$SYSROOT/usr/lib/x86_64-linux-gnu
if [[ ! -x $LIBS/ld-linux-x86-64.so.2 ]]; then
    APT=$CACHE/apt
    mkdir -p "$APT"/{etc/apt.conf.d,etc/preferences.d,state/lists/partial,cache/archives/partial} "$CACHE/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        >"$APT/etc/sources.list"
    : >"$APT/state/status"
    cat >"$APT/apt.conf" <<EOF
Dir::Etc "$APT/etc";
Dir::Etc::sourcelist "$APT/etc/sources.list";
Dir::Etc::sourceparts "-";
Dir::Etc::parts "$APT/etc/apt.conf.d";
Dir::Etc::preferencesparts "$APT/etc/preferences.d";
Dir::State "$APT/state";
Dir::State::status "$APT/state/status";
Dir::Cache "$APT/cache";
APT::Architecture "amd64";
APT::Sandbox::User "root";
EOF
    APT_CONFIG=$APT/apt.conf apt-get -q update >/dev/null
    (cd "$CACHE/debs" && APT_CONFIG=$APT/apt.conf apt-get -q download \
        libc6 libstdc++6 libgcc-s1 libssl3t64 zlib1g libzstd1 >/dev/null)
    for deb in "$CACHE"/debs/*.deb; do dpkg -x "$deb" "$SYSROOT"; done
fi

# 3. libcudart.so: --shared-memory system loads it first even for system
# shared memory (no GPU is used). PyPI's nvidia-pytriton 0.7.0 bundles
# one; take that file alone, under the name perf_analyzer opens.
if [[ ! -f $CACHE/cudart/libcudart.so ]]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version 3.11 --platform manylinux_2_35_x86_64 \
        nvidia-pytriton==0.7.0 -d "$CACHE/wheels"
    mkdir -p "$CACHE/cudart"
    python3 - "$CACHE"/wheels/nvidia_pytriton-0.7.0-*.whl "$CACHE/cudart/libcudart.so" <<'EOF'
import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
[name] = [n for n in wheel.namelist() if n.startswith("nvidia_pytriton.libs/libcudart")]
open(sys.argv[2], "wb").write(wheel.read(name))
EOF
fi
pa() { # perf_analyzer ARGS: through the sysroot's loader
    pin "$CLIENT_CPU" "$LIBS/ld-linux-x86-64.so.2" --library-path "$LIBS:$CACHE/cudart" "$PA" "$@"
}

# 4. The model: the serve scenario's GRU (testkit's gru_cell, 40 in, 64
# hidden, its state an input/output pair), as serve-bench writes it (the
# Rust fixture, the same bytes each time; one short in-process probe makes
# it), then its spec as `laned check` prints it, with LANES lanes.
MODEL=$CACHE/model
mkdir -p "$MODEL"
TMPDIR=$MODEL "$SERVE_BENCH" --in-process --gru --probe 1 --seconds 0.1 >/dev/null
NNEF=$MODEL/laned-serve-bench-gru-40x64/gru.nnef.tar
"$LANED" check "$NNEF" --state 1=1 | sed -n '/(TOML):/,$p' | sed 1d \
    | sed "s/^max_lanes = .*/max_lanes = $LANES/" >"$MODEL/gru.toml"
grep -q "^max_lanes = $LANES" "$MODEL/gru.toml" || { echo "no max_lanes in $MODEL/gru.toml" >&2; exit 1; }

# 5. laned serve on SERVER_CPU: HTTP and gRPC, each on a port the kernel
# picks (read from what it prints as it starts).
OUT=$CACHE/results
mkdir -p "$OUT"
pin "$SERVER_CPU" "$LANED" serve "gru=$MODEL/gru.toml" --listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 \
    >"$OUT/laned.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    grep -q "answering gRPC on" "$OUT/laned.log" && break
    kill -0 $SERVER 2>/dev/null || { cat "$OUT/laned.log" >&2; exit 1; }
    sleep 0.1
done
HTTP=$(sed -n 's/^laned serve listening on //p' "$OUT/laned.log")
GRPC=$(sed -n 's/^laned serve answering gRPC on //p' "$OUT/laned.log")

# 6. The runs: the same load (CONCURRENCY sequences of SEQ_LEN requests in
# flight, windows of INTERVAL_MS, TRIALS of them at most), over gRPC (one
# ModelStreamInfer stream, perf_analyzer's --streaming) and HTTP, each with
# the tensors inline and in system shared memory. -b stays 1: perf_analyzer
# refuses larger batches for sequence models.
COMMON=(-m gru --concurrency-range "$CONCURRENCY" --sequence-length "$SEQ_LEN"
    -p "$INTERVAL_MS" -r "$TRIALS" -s "$STABILITY")
run() { # run NAME ARGS: one perf_analyzer run, its output kept
    local name=$1
    shift
    echo "== $name: perf_analyzer ${COMMON[*]} $*"
    # A run that finds no stable windows says so and the others still run.
    pa "${COMMON[@]}" "$@" 2>&1 | tee "$OUT/$name.txt" || echo "== $name: perf_analyzer failed (exit ${PIPESTATUS[0]})"
}
echo "laned serve: HTTP on $HTTP, gRPC on $GRPC (CPU ${SERVER_CPU:-any}); perf_analyzer on CPU ${CLIENT_CPU:-any}"
uptime
run grpc-streaming -u "$GRPC" -i grpc --streaming
run grpc-streaming-shm -u "$GRPC" -i grpc --streaming --shared-memory system
run http -u "$HTTP" -i http
run http-shm -u "$HTTP" -i http --shared-memory system
uptime
echo "outputs in $OUT"
