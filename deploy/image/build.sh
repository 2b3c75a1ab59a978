#!/usr/bin/env bash
# The OCI image of `laned serve`, made from Debian's packages alone (no
# image registry is needed nor asked):
#
#   LANED=target/release/laned deploy/image/build.sh [TAG]     # TAG: laned:dev
#
# 1. The base: a Debian bookworm root file system made by mmdebstrap
#    (variant essential, merged /usr, no docs), with the packages of the
#    libraries `ldd` finds the binary needs (libc6, libgcc-s1), and the
#    user `laned` (10001:10001). Kept as a tarball in target/image/ (its
#    name a hash of the recipe) and imported into podman's store as
#    localhost/laned-base:HASH, so that a second build skips both (about a
#    minute the first time, seconds after). Delete target/image/rootfs-*.tar
#    to take newer packages from the mirror.
# 2. The built-in models (`laned fetch`, pip on this host, each checked
#    against its pin) into target/image/models, kept between builds.
# 3. `podman build` of deploy/image/Containerfile on that base: the binary
#    (debug info stripped) at /usr/local/bin/laned, the models at
#    /var/cache/laned (LANED_CACHE_DIR), the default spec /etc/laned/vad.toml
#    (Silero as `vad`), user 10001, port 8080, `laned serve` the entrypoint.
#    No RUN step: nothing runs a container at build time.
#
# Environment:
#   LANED         the laned binary (required); built on bookworm (glibc 2.36)
#                 or older, as `cargo build --release -p laned` here
#   VAD_SERVER    also build vad-server's image on it (VAD_TAG, default
#                 vad-server:dev): target/release/vad-server
#   MODELS        the built-ins to fetch into the image (default: silero;
#                 `all` for silero, dtln-chain and deepfilternet3)
#   DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR   the package mirrors
#                 (deb.debian.org by default)
#   KEEP_DEBUG=1  keep the binary's debug info
#
# Needs: podman and mmdebstrap (Debian's packages), python3 with pip (the
# models' fetch, once), binutils (strip), dpkg (which package a library is
# from). Tested as root (mmdebstrap's root mode, podman's root store).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
tag=${1:-laned:dev}
: "${LANED:?LANED=path/to/laned: the binary to put in the image}"
laned=$(realpath "$LANED")
models=${MODELS:-silero}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
suite=bookworm
work=${CARGO_TARGET_DIR:-$repo/target}/image
mkdir -p "$work"
# One build at a time per target/ (two would share the rootfs and context).
exec 9>"$work/.lock"
flock 9

say() { printf 'image: %s\n' "$*" >&2; }
for tool in podman mmdebstrap strip dpkg ldd; do
    command -v "$tool" >/dev/null || { say "$tool is missing (apt-get install podman mmdebstrap binutils)"; exit 2; }
done
binaries=("$laned")
if [ -n "${VAD_SERVER:-}" ]; then
    binaries+=("$(realpath "$VAD_SERVER")")
fi

# The packages the binaries' libraries come from, found by ldd and dpkg.
declare -A packages=()
libraries=()
for binary in "${binaries[@]}"; do
    while read -r lib; do
        [ -n "$lib" ] || continue
        libraries+=("$lib")
        owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(realpath "$lib")" 2>/dev/null) || {
            say "$binary needs $lib, which no Debian package installed here holds"
            exit 2
        }
        packages[${owner%%:*}]=1
    done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
done
include=$(printf '%s\n' "${!packages[@]}" | sort | paste -sd,)
say "libraries: ${libraries[*]} (packages: $include)"

# 1. The base root file system, cached by its recipe's hash.
recipe=(
    --variant=essential
    --include="$include"
    # Merged /usr by symlinks and usr-is-merged: no usrmerge, so no perl.
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --customize-hook='echo "laned:x:10001:10001:laned serve:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"'
    --customize-hook='echo "laned:x:10001:" >> "$1/etc/group"'
    --customize-hook='rm -f "$1"/var/log/*.log "$1"/var/cache/debconf/*-old "$1"/etc/machine-id'
    --format=tar
    "$suite"
)
sources=(
    "deb $mirror $suite main"
    "deb $mirror $suite-updates main"
    "deb $security $suite-security main"
)
key=$(printf '%s\n' "${recipe[@]}" "${sources[@]}" | sha256sum | cut -c1-16)
rootfs=$work/rootfs-$key.tar
base=localhost/laned-base:$key
if [ ! -s "$rootfs" ]; then
    say "making the $suite root file system with mmdebstrap (about a minute): $rootfs"
    if ! mmdebstrap "${recipe[@]}" "$rootfs.part" "${sources[@]}" >"$work/mmdebstrap.log" 2>&1; then
        tail -n 30 "$work/mmdebstrap.log" >&2
        say "mmdebstrap failed (its whole log: $work/mmdebstrap.log)"
        rm -f "$rootfs.part"
        exit 1
    fi
    mv "$rootfs.part" "$rootfs"
fi
# Every library the binaries need is in it (the ldd above, on this host).
listing=$(tar tf "$rootfs")
for lib in "${libraries[@]}"; do
    path=$(realpath "$lib")
    grep -qxF ".${path/#\/lib//usr/lib}" <<<"$listing" || {
        say "$lib is not in $rootfs"
        exit 1
    }
done
if ! podman image exists "$base"; then
    say "importing $rootfs as $base"
    podman import --quiet --message "laned base: Debian $suite (mmdebstrap, essential, $include)" "$rootfs" "$base" >/dev/null
fi

# 2. The built-in models, fetched (or found, checked) in their own cache.
say "fetching $models into $work/models"
LANED_CACHE_DIR=$work/models "$laned" fetch $models >&2

# 3. The build context: the binary, the models, the default spec.
context=$work/context
rm -rf "$context"
mkdir -p "$context"
if [ "${KEEP_DEBUG:-0}" = 1 ]; then
    cp "$laned" "$context/laned"
else
    strip --strip-debug -o "$context/laned" "$laned"
fi
cp -r "$work/models" "$context/cache"
rm -rf "$context"/cache/*/download-*
chmod -R a+rX "$context/cache"
cp "$repo/deploy/image/vad.toml" "$context/vad.toml"

replace() {
    # Builds the tag $1 (podman build "${@:2}") and removes the image it named before.
    local old
    old=$(podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true)
    podman build --quiet --pull=never --layers=false "${@:2}" --tag "$1" "$context" >/dev/null
    local new
    new=$(podman image inspect --format '{{.Id}}' "$1")
    if [ -n "$old" ] && [ "$old" != "$new" ]; then
        podman rmi "$old" >/dev/null 2>&1 || true
    fi
    say "built $1 ($new)"
}
replace "$tag" --build-arg BASE="$base" --file "$repo/deploy/image/Containerfile"
if [ -n "${VAD_SERVER:-}" ]; then
    if [ "${KEEP_DEBUG:-0}" = 1 ]; then
        cp "$VAD_SERVER" "$context/vad-server"
    else
        strip --strip-debug -o "$context/vad-server" "$VAD_SERVER"
    fi
    replace "${VAD_TAG:-vad-server:dev}" --build-arg LANED_IMAGE="$tag" --file "$repo/deploy/image/vad-server.Containerfile"
fi
rm -rf "$context"
podman image inspect --format '{{.Id}}' "$tag"
