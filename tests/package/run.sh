#!/usr/bin/env bash
# The packaging suite (issue 49): builds berth's container image from
# target/release/berth with podman and tests it black-box (SIGTERM and
# kill -9 of the container, every confirmed message still there), checks
# the systemd unit with systemd-analyze verify and berth's READY=1 /
# STOPPING=1 notifications, validates the Kubernetes manifests against
# the schemas of Kubernetes 1.37 (kubernetes-validate, pinned), and forms
# a three-member cluster whose peers are DNS names (/etc/hosts entries
# the test writes and removes).
#
#   tests/package/run.sh            # everything
#   tests/package/run.sh -k systemd # extra arguments go to pytest
#
# Idempotent: creates tests/package/.venv, installs podman and runc
# (scripts/podman.sh) and systemd's systemd-analyze when missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv="$here/.venv"
export BERTH_BIN=${BERTH_BIN:-$root/target/release/berth}

if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    dpkg -s python3-venv >/dev/null 2>&1 || {
      apt-get update -qq && apt-get install -y -qq python3-venv
    }
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" - "$here/requirements.txt" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, _, pinned = line.partition("==")
    if version(name) != pinned:
        sys.exit(1)
PY
then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
fi
command -v systemd-analyze >/dev/null 2>&1 || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
}

# The image under test, from the one release build.
export BERTH_IMAGE=localhost/berth:test
start=$SECONDS
"$root/scripts/image.sh" "$BERTH_BIN" "$BERTH_IMAGE"
echo "image built in $((SECONDS - start)) s"

set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$here" "$here" "$@"
rc=$?
"$root/scripts/podman.sh" rmi -f "$BERTH_IMAGE" >/dev/null 2>&1
exit $rc
