#!/usr/bin/env bash
# podman as this project runs it: installs Debian's podman and runc when
# missing (idempotent), then runs podman with the global options these
# machines need (runc, cgroupfs, the vfs storage driver: no overlay or
# systemd inside the VM). Options of `podman run` (--network host,
# --ulimit) are the caller's.
#
#   scripts/podman.sh images
set -euo pipefail
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc >/dev/null
fi
exec podman --runtime runc --cgroup-manager cgroupfs --storage-driver vfs "$@"
