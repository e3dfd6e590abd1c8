#!/usr/bin/env bash
# Builds berth's container image (packaging/Containerfile) from a built
# binary: a stripped copy of it, the C library files it links (as ldd
# lists them) and packaging/image/berth.toml, FROM scratch. Prints the
# binary's and the image's sizes.
#
#   scripts/image.sh                                  # target/release/berth -> localhost/berth:latest
#   scripts/image.sh target/dist/berth localhost/berth:0.1.0
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/target/release/berth}
tag=${2:-localhost/berth:latest}
[ -x "$bin" ] || { echo "image.sh: no binary at $bin (cargo build --release -p berth-cli)" >&2; exit 1; }

stage=$(mktemp -d /tmp/berth-image.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/rootfs/usr/bin" "$stage/rootfs/etc/berth" "$stage/data"
# Strip a copy: the release profile keeps line tables for profiling.
objcopy --strip-all "$bin" "$stage/rootfs/usr/bin/berth"
# Every library the dynamic linker loads (and the linker itself), at
# the path ldd shows, symlinks resolved.
libs=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
for lib in $libs; do
  mkdir -p "$stage/rootfs$(dirname "$lib")"
  cp -L "$lib" "$stage/rootfs$lib"
done
cp "$root/packaging/image/berth.toml" "$stage/rootfs/etc/berth/berth.toml"
cp "$root/packaging/image/nsswitch.conf" "$stage/rootfs/etc/nsswitch.conf"

"$root/scripts/podman.sh" build --quiet --format docker --network host \
  -f "$root/packaging/Containerfile" -t "$tag" "$stage" >/dev/null
echo "libraries: $(echo $libs | tr ' ' ',')"
echo "binary: $(stat -c %s "$bin") bytes as built, $(stat -c %s "$stage/rootfs/usr/bin/berth") stripped"
echo "image $tag: $("$root/scripts/podman.sh" image inspect --format '{{.Size}}' "$tag") bytes"
