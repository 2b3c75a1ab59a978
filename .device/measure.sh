#!/usr/bin/env bash
# The measurements that need the lent 16-core device machine, in one run:
#   #9  shards: light TDNN at 256 streams pinned to 1, 4 and every core
#       (ours with a shard per core vs the shards ideal loop vs tract's
#       LanedRunnable vs a state per stream), and Silero VAD likewise;
#   #3  one state, a thread per stream, light and heavy TDNN, n = 1..64;
#   #10 real-time capacity at p99 <= 5 ms: tract vs ours (Linger sweep,
#       LatencyBudget on one state and with the defaults).
#
# Prepared here with `cargo xtask device` (stripped release binaries and the
# Silero model in target/device/), then run once on the device machine:
#   run(command="bash .device/measure.sh", carry=["target/device"], timeout_s=330)
# A device run hands back at most 8 files from $OUT, so everything lands in
# three: log.txt (what ran, how long, its exit status; the machine),
# summary.md (every step's tables, appended as each step ends, so a run cut
# short still returns what it finished) and raw.tar.gz (every report, JSON
# and plot). Each step has its own time limit, and a step that would start
# past the run's budget is skipped, so a slow step costs itself, not the
# rest. `cargo xtask device --smoke` runs it here, tiny.
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=${LANED_DEVICE_BIN:-target/device}
OUT=${OUT:-target/device-out}
# Seconds the whole run may take; steps that would start later are skipped.
BUDGET=${LANED_DEVICE_BUDGET:-300}
WORK=$(mktemp -d)
mkdir -p "$OUT"
: >"$OUT/log.txt"
: >"$OUT/summary.md"

if [ -n "${LANED_DEVICE_SMOKE:-}" ]; then
    # A check of the script itself, on any machine: tiny loads, short runs.
    STREAMS=8 SHORT=(--seconds 0.05 --repeats 1) NS=1,4 RT_MAX=32 SILERO_N=4 SILERO_WIDE=8
    SILERO_RT=(--skip-real-time)
else
    STREAMS=256 SHORT=(--seconds 0.3 --repeats 3) NS=1,4,16,64 RT_MAX=8192 SILERO_N=64 SILERO_WIDE=256
    SILERO_RT=()
fi

log() { echo "[$(date -u +%T) +${SECONDS}s] $*" | tee -a "$OUT/log.txt"; }

# step NAME LIMIT_S COMMAND...: run COMMAND, its output in $WORK/NAME.txt and
# its report (if it writes one, under $WORK/NAME/) appended to summary.md.
step() {
    local name=$1 limit=$2
    shift 2
    if [ $((SECONDS + 10)) -ge "$BUDGET" ]; then
        log "skip $name: the run's budget of ${BUDGET}s is spent"
        return
    fi
    [ $((SECONDS + limit)) -gt "$BUDGET" ] && limit=$((BUDGET - SECONDS))
    log "start $name (limit ${limit}s): $*"
    if command -v timeout >/dev/null; then
        timeout --kill-after=5 "$limit" "$@" >"$WORK/$name.txt" 2>&1
    else
        "$@" >"$WORK/$name.txt" 2>&1
    fi
    local rc=$?
    log "end $name: exit $rc"
    [ $rc -eq 0 ] || FAILED+=("$name")
    {
        echo "# $name (exit $rc): $*"
        echo
        if [ -f "$WORK/$name/report.md" ]; then
            cat "$WORK/$name/report.md"
        else
            # The binary's own tables; progress lines left out.
            grep -v '^\[' "$WORK/$name.txt" | tail -n 60
        fi
        echo
    } >>"$OUT/summary.md"
}
FAILED=()

# allowed_cpus: the CPUs this script may run on, one per line (a cpuset's
# list need not start at 0 nor be contiguous).
allowed_cpus() {
    local part
    for part in $(awk '/^Cpus_allowed_list:/ {gsub(",", " ", $2); print $2}' /proc/self/status); do
        if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
    done
}

# pin N: the command prefix running on the first N allowed cores (none
# without taskset).
pin() {
    if command -v taskset >/dev/null; then
        echo taskset -c "$(allowed_cpus | head -n "$1" | paste -sd, -)"
    fi
}

all=$(nproc)
log "machine: $all cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
{ uname -a; free -g; } >>"$OUT/log.txt" 2>&1
for b in laned-bench silero-bench; do
    [ -x "$BIN/$b" ] || { log "missing $BIN/$b: run \`cargo xtask device\` before carrying target/device"; exit 2; }
done

# #10 first: its searches take longest and matter most to the open issues.
step rt-light 150 "$BIN/laned-bench" --model light --skip-closed-loop --quick --rt-max "$RT_MAX" \
    --systems tract,worker,linger,budget,budget-shards --out "$WORK/rt-light"

# #3: one state, every core free for the callers.
step one-state 90 "$BIN/laned-bench" --skip-real-time "${SHORT[@]}" --streams "$NS" \
    --systems solo,tract,worker,combining --out "$WORK/one-state"

# #9: shards, pinned to 1, 4 and every core.
for cores in 1 4 "$all"; do
    [ "$cores" -gt "$all" ] && continue
    # shellcheck disable=SC2046 # the prefix is words
    step "shards-$cores-cores" 30 $(pin "$cores") "$BIN/laned-bench" --model light --skip-real-time "${SHORT[@]}" \
        --streams "$STREAMS" --systems solo,tract,shards,combining-shards,ideal-shards --out "$WORK/shards-$cores-cores"
done

if [ -f "$BIN/silero_vad_op18_ifless.onnx" ]; then
    export LANED_SILERO_ONNX=$BIN/silero_vad_op18_ifless.onnx
    # shellcheck disable=SC2046
    step "silero-1-core" 60 $(pin 1) "$BIN/silero-bench" --quick --skip-real-time --streams "$SILERO_N"
    step "silero-$all-cores" 90 "$BIN/silero-bench" --quick "${SILERO_RT[@]}" --streams "$SILERO_WIDE"
else
    log "skip silero: $BIN/silero_vad_op18_ifless.onnx is missing"
fi

tar -czf "$OUT/raw.tar.gz" -C "$WORK" . && rm -rf "$WORK"
if [ ${#FAILED[@]} -gt 0 ]; then
    log "done; failed: ${FAILED[*]}"
    exit 1
fi
log "done"
