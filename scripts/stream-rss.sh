#!/usr/bin/env bash
# Issue 18: "a stream of 10x RAM can be read from `first` with bounded
# RSS". Starts berth in a memory cgroup limited to --limit-mb (default
# 256), fills one stream with --stream-mb (default 2560, ten times the
# limit) of --body-bytes bodies (default 1000) from 4 confirmed
# publishers, then reads all of it from `first` with one consumer
# (prefetch 500), checking every offset comes once and in order
# (crates/itest/tests/stream_rss.rs). Not a timed test.
#
#   scripts/stream-rss.sh [--limit-mb N] [--stream-mb N] [--body-bytes N]
#                         [--no-build] [--out DIR]
#
# Reports per phase the broker's peak VmRSS (sampled every 100 ms), and
# for the cgroup its peak charge (RSS + page cache: the kernel reclaims
# the cache at the limit) and whether the OOM killer ran. Results:
# OUT/summary.txt (default bench-results/stream-rss-DATE).
#
# The cgroup: cgroup v2 (memory.max) where the unified hierarchy has the
# memory controller, else cgroup v1 (memory.limit_in_bytes). Needs root.
# Every process it starts is stopped by its pid; the cgroup is removed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

limit_mb=256 stream_mb=2560 body=1000 build=1 out=""
while [ $# -gt 0 ]; do
  case "$1" in
  --limit-mb) limit_mb=${2:?}; shift ;;
  --stream-mb) stream_mb=${2:?}; shift ;;
  --body-bytes) body=${2:?}; shift ;;
  --no-build) build=0 ;;
  --out) out=${2:?}; shift ;;
  -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
out=${out:-bench-results/stream-rss-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out" && out=$(cd "$out" && pwd)
log="$out/run.log"
say() { echo "$*" | tee -a "$out/summary.txt" >&2; }

if [ $build = 1 ]; then
  cargo build --release -j 2 -p berth-cli >>"$log" 2>&1 || { echo "build failed: $log" >&2; exit 1; }
fi
# The driver, built before the broker starts (so its build is not timed
# or charged to anything).
driver=$(cargo test --release -j 2 -p berth-itest --test stream_rss --no-run --message-format=json 2>>"$log" |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "stream_rss":
        print(m["executable"])')
[ -x "$driver" ] || { echo "no driver built: $log" >&2; exit 1; }
bin="$root/target/release/berth"

# ---- the cgroup
name="berth-stream-rss-$$"
if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  cg="/sys/fs/cgroup/$name"
  mkdir "$cg" || exit 1
  echo $((limit_mb << 20)) >"$cg/memory.max"
  echo 0 >"$cg/memory.swap.max" 2>/dev/null
  peak_of() { cat "$cg/memory.peak" 2>/dev/null || echo 0; }
  ooms_of() { awk '$1 == "oom_kill" { print $2 }' "$cg/memory.events"; }
  version=2
else
  cg="/sys/fs/cgroup/memory/$name"
  mkdir "$cg" || exit 1
  echo $((limit_mb << 20)) >"$cg/memory.limit_in_bytes"
  peak_of() { cat "$cg/memory.max_usage_in_bytes"; }
  ooms_of() { awk '$1 == "oom_kill" { print $2 }' "$cg/memory.oom_control"; }
  version=1
fi

data=$(mktemp -d /tmp/berth-stream-rss.XXXXXX)
ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
read -r amqp http <<<"$ports"
# Started inside the cgroup: the shell moves itself in, then becomes berth.
sh -c "echo \$\$ > '$cg/cgroup.procs' && exec '$bin' serve --data-dir '$data' \
  --amqp-listen 127.0.0.1:$amqp --http-listen 127.0.0.1:$http" >"$out/berth.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rmdir "$cg" 2>/dev/null
  rm -rf "$data"
}
trap cleanup EXIT
for _ in $(seq 100); do
  grep -q "ready" "$out/berth.log" 2>/dev/null && break
  sleep 0.1
done

say "stream-rss $(date -u +%Y-%m-%dT%H:%MZ) cgroup v$version limit ${limit_mb} MiB, stream ${stream_mb} MiB of ${body}-byte bodies"
say "machine: $(nproc) cores, $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
say "berth $(git rev-parse --short HEAD) pid $pid"
BERTH_TEST_URI="amqp://guest:guest@127.0.0.1:$amqp/%2f" BERTH_RSS_PID=$pid \
  STREAM_RSS_BYTES=$((stream_mb << 20)) STREAM_RSS_BODY_BYTES=$body \
  "$driver" --ignored --nocapture --test-threads 1 >"$out/driver.log" 2>&1
rc=$?
grep '^RESULT' "$out/driver.log" | tee -a "$out/summary.txt" >&2
alive=yes
kill -0 "$pid" 2>/dev/null || alive="no (it died: see $out/berth.log)"
say "cgroup peak charge $(($(peak_of) >> 20)) MiB (RSS and page cache), oom kills $(ooms_of), berth alive: $alive, VmHWM $(awk '/VmHWM/ {print int($2/1024) " MiB"}' /proc/$pid/status 2>/dev/null)"
say "load after: $(cut -d' ' -f1-3 /proc/loadavg); driver exit $rc"
exit $rc
