#!/usr/bin/env bash
# Issue 20 goals 4 and 5 (docs/BENCHMARKS.md, "Ten million"): one berth,
# `berth bench restart` fills Q durable queues x M persistent 2 KB messages
# (default 10 x 1,000,000 = 10,000,000, 21.6 GB of journal: needs ~25 GB
# free under /var/tmp) while this script samples the data directory's size
# and the broker's CPU every 5 s (fill rate by depth: samples.tsv), then
# kill -9 and a restart with a cold page cache (needs root to drop caches).
#
#   scripts/fill-and-restart.sh [--messages M] [--queues Q] [--cache cold|warm|both] [--out DIR]
#   BERTH_BIN=/path/to/berth scripts/fill-and-restart.sh        # another build
#   BERTH_SERVE_ARGS="--segment-cache-bytes 0" scripts/fill-and-restart.sh   # settings
#
# Every process started here is stopped by its pid on exit, and the data
# directory is removed. Run it under `flock /tmp/berth-bench.lock` on a
# shared machine. Not part of scripts/test.sh.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${BERTH_BIN:-$root/target/release/berth}
serve_args=${BERTH_SERVE_ARGS:-}
messages=1000000 queues=10 cache=cold out=$root/bench-results/fill-and-restart-$(date +%s)
while [ $# -gt 0 ]; do
  case $1 in
  --messages) messages=${2:?}; shift ;;
  --queues) queues=${2:?}; shift ;;
  --cache) cache=${2:?}; shift ;;
  --out) out=${2:?}; shift ;;
  *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
d=$(mktemp -d /var/tmp/berth-fill-restart-XXXXXX)
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
cat >"$d/start.sh" <<EOS
#!/bin/sh
NO_COLOR=1 "$bin" serve --amqp-listen 127.0.0.1:$port --http-listen 127.0.0.1:0 --data-dir "$d/data" $serve_args >>"$out/broker.log" 2>&1 &
echo \$! > "$d/pid"
EOS
chmod +x "$d/start.sh"
sampler=
cleanup() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null
  if [ -f "$d/pid" ]; then
    pid=$(cat "$d/pid")
    kill "$pid" 2>/dev/null && sleep 2
    kill -9 "$pid" 2>/dev/null
  fi
  rm -rf "$d"
}
trap cleanup EXIT
"$d/start.sh"
sleep 1
# time (s), data directory bytes, broker CPU ticks (utime+stime), load
# average, the machine's page cache and free memory (kB)
(while [ -d "$d/data" ]; do
  pid=$(cat "$d/pid" 2>/dev/null)
  echo "$(date +%s.%N | cut -c1-14) $(du -sb "$d/data" 2>/dev/null | cut -f1) $(awk '{print $14+$15}' "/proc/$pid/stat" 2>/dev/null) $(cut -d' ' -f1 /proc/loadavg) $(awk '/^Cached:/{c=$2} /^MemFree:/{f=$2} END{print c, f}' /proc/meminfo)"
  sleep 5
done) >"$out/samples.tsv" &
sampler=$!
"$bin" bench restart --uri "amqp://guest:guest@127.0.0.1:$port/%2f" --runs 1 --queues "$queues" \
  --messages "$messages" --size 2048 --cache "$cache" --pid-file "$d/pid" --start-cmd "$d/start.sh" \
  --broker-log "$out/broker.log" --quiet --no-limits --out "$out/bench" | tee "$out/bench.txt"
grep -E "store recovered|recovered from the store" "$out/broker.log" | tail -2
# Fill rate by depth from the samples: first 20 s, middle, last 20 s.
python3 - "$out/samples.tsv" <<'PY'
import sys
pts = []
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 2 and f[1].isdigit():
        pts.append((float(f[0]), int(f[1])))
t0 = pts[0][0]
pts = [(t - t0, b) for t, b in pts]
grow = [i for i in range(1, len(pts)) if (pts[i][1] - pts[i - 1][1]) / (pts[i][0] - pts[i - 1][0]) > 20e6]
if not grow:
    sys.exit("no fill seen in the samples")
te = pts[max(grow)][0]
def rate(a, b):
    i = min(range(len(pts)), key=lambda k: abs(pts[k][0] - a))
    j = min(range(len(pts)), key=lambda k: abs(pts[k][0] - b))
    return (pts[j][1] - pts[i][1]) / (pts[j][0] - pts[i][0]) / 1e6
first, mid, last = rate(0, 20), rate(te / 2 - 10, te / 2 + 10), rate(te - 20, te)
print(f"fill: {te:.0f} s; journal growth first 20 s {first:.0f} MB/s, middle {mid:.0f}, "
      f"last 20 s {last:.0f} MB/s; last / first {last / first:.2f} (goal 4: >= 0.80)")
PY
