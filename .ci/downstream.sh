#!/usr/bin/env bash
# Downstream smoke test: lane-table stands on its own.
#
# Packages lane-table as crates.io would receive it, unpacks the .crate,
# and builds and runs a scratch crate that depends on that unpacked package
# alone (by path), whose main.rs is the first ```rust block of the packaged
# README: the README's example is what is tested, against what is published.
set -euo pipefail
cd "$(dirname "$0")/.."

crate=lane-table
version=$(cargo pkgid -p "$crate" | sed 's/.*[#@]//')
smoke=target/downstream-smoke

# The package, verified (an std-only build of the unpacked crate: seconds).
cargo package -p "$crate" --allow-dirty

# Unpack the .crate itself, so nothing but the published files is seen.
rm -rf "$smoke"
mkdir -p "$smoke"
tar -xzf "target/package/$crate-$version.crate" -C "$smoke"
pkg="$smoke/$crate-$version"

# The scratch crate: its own workspace (it sits under ours), one dependency.
app="$smoke/app"
mkdir -p "$app/src"
cat > "$app/Cargo.toml" <<EOF
[package]
name = "downstream-smoke"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
$crate = { path = "../$crate-$version" }

[workspace]
EOF

# main.rs: the first \`\`\`rust block of the packaged README, verbatim.
awk '/^```rust[[:space:]]*$/ { inside = 1; next } inside && /^```/ { exit } inside' \
    "$pkg/README.md" > "$app/src/main.rs"
if ! grep -q 'fn main' "$app/src/main.rs"; then
    echo "downstream smoke: no runnable \`\`\`rust example with fn main in $pkg/README.md" >&2
    exit 1
fi

export CARGO_TARGET_DIR="$PWD/$smoke/target"
cargo build --manifest-path "$app/Cargo.toml"
cargo run --quiet --manifest-path "$app/Cargo.toml"
echo "downstream smoke: $crate $version builds and runs its README example on its own"
