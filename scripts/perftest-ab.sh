#!/usr/bin/env bash
# A/B of two berth builds under RabbitMQ's PerfTest persist-2k-5q (issue 20
# goal 2; docs/BENCHMARKS.md "PerfTest persist-2k-5q on one node"): 5
# producers and 5 consumers on 5 durable queues, 2 KB persistent messages,
# at most 100 unconfirmed per producer. Each run starts one broker on free
# ports with a fresh data directory, runs PerfTest for TIME seconds (default
# 20), and measures the broker's CPU (/proc/PID/stat) and the messages it
# received (/metrics) over a window from the 8th second to 4 s before the
# end, so that start-up and the ramp are left out. The broker is stopped by
# its pid after each run. Pairs alternate their order (old, new; new, old).
#
#   flock /tmp/berth-bench.lock scripts/perftest-ab.sh OLD_BIN NEW_BIN PAIRS [OUTDIR]
#
# Prints one line per run, then per binary min/median/max of broker CPU per
# message and of PerfTest's receive rate, and the median of the per-pair
# ratios new / old (pairs in one run share the machine's drift).
# Environment: TIME (seconds per run, at least 20).
set -uo pipefail
[ $# -ge 3 ] || { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
old=$1 new=$2 pairs=$3
out=${4:-$root/bench-results/perftest-ab-$(date +%Y%m%d-%H%M%S)}
time_s=${TIME:-20}
[ "$time_s" -ge 20 ] || { echo "TIME must be at least 20 (the window starts 8 s in and ends 4 s before the end)" >&2; exit 2; }
for b in "$old" "$new"; do [ -x "$b" ] || { echo "no executable $b" >&2; exit 2; }; done
mkdir -p "$out" && out=$(cd "$out" && pwd)
classpath=$("$root/scripts/perftest-classpath.sh" "$out/maven.log") || { echo "no PerfTest classpath; see $out/maven.log" >&2; exit 1; }
work=$(mktemp -d /var/tmp/berth-perftest-ab.XXXXXX)
pid=""
stop() {
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
  pid=""
}
trap 'stop; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

cpu_s() { awk '{ sub(/.*\) /, ""); print ($12 + $13) / 100 }' "/proc/$1/stat"; }
received() { curl -s -u guest:guest "http://127.0.0.1:$1/metrics" | awk '/^rabbitmq_global_messages_received_total/ {m += $NF} END {print m + 0}'; }

run_one() { # binary label -> one line: label msgs cpu_s us_per_msg rate
  local bin=$1 label=$2 amqp http d c0 c1 m0 m1 rate
  read -r amqp http <<<"$(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
[s.bind(("127.0.0.1", 0)) for s in ss]
print(" ".join(str(s.getsockname()[1]) for s in ss))')"
  d="$work/$label"; rm -rf "$d"; mkdir -p "$d"
  # Not in a session of its own (no setsid), as scripts/perftest.sh starts
  # berth: a new session is a CPU group of its own under autogroups.
  sh -c "echo \$\$ >'$d/pid'; exec '$bin' serve --amqp-listen 127.0.0.1:$amqp --http-listen 127.0.0.1:$http --data-dir '$d/data' >>'$d/log' 2>&1" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 300); do (exec 3<>"/dev/tcp/127.0.0.1/$amqp") 2>/dev/null && break; sleep 0.1; done
  pid=$(cat "$d/pid")
  java -cp "$classpath" com.rabbitmq.perf.PerfTest -h "amqp://guest:guest@127.0.0.1:$amqp/%2f" \
    -x 5 -y 5 -s 2048 -f persistent -c 100 -z "$time_s" -i 5 \
    --queue-pattern 'pt-%d' --queue-pattern-from 1 --queue-pattern-to 5 -ad false >"$d/perftest.txt" 2>&1 &
  local java=$!
  sleep 8
  c0=$(cpu_s "$pid") m0=$(received "$http")
  sleep $((time_s - 12))
  c1=$(cpu_s "$pid") m1=$(received "$http")
  wait "$java" || { echo "PerfTest failed; see $d/perftest.txt" >&2; stop; return 1; }
  stop
  rate=$(sed -n 's/.*receiving rate avg: \([0-9]*\) msg\/s.*/\1/p' "$d/perftest.txt" | tail -1)
  cp "$d/perftest.txt" "$out/$label.txt"
  awk -v l="$label" -v a="$c0" -v b="$c1" -v m="$((m1 - m0))" -v r="${rate:-nan}" \
    'BEGIN { printf "%s msgs %d cpu_s %.2f us_per_msg %.2f rate %s\n", l, m, b - a, (m > 0 ? 1e6 * (b - a) / m : 0), r }'
}

: >"$out/runs.txt"
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for w in $order; do
    bin=$([ "$w" = old ] && echo "$old" || echo "$new")
    run_one "$bin" "$w-$i" | tee -a "$out/runs.txt" || exit 1
  done
done
python3 - "$out/runs.txt" <<'PY' | tee "$out/summary.txt"
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    p = line.split()
    kind, pair = p[0].split("-")
    runs[(kind, int(pair))] = (float(p[6]), float(p[8]) if p[8] != "nan" else float("nan"))
for kind in ("old", "new"):
    cpu = sorted(v[0] for k, v in runs.items() if k[0] == kind)
    rate = sorted(v[1] for k, v in runs.items() if k[0] == kind)
    print(f"{kind}: broker us/msg {cpu[0]:.2f} / {statistics.median(cpu):.2f} / {cpu[-1]:.2f}, "
          f"receive rate {rate[0]:.0f} / {statistics.median(rate):.0f} / {rate[-1]:.0f} msg/s (min / median / max)")
ratios = [runs[("new", i)][0] / runs[("old", i)][0] for (k, i) in runs if k == "old" and ("new", i) in runs]
lower = sum(r < 1 for r in ratios)
print(f"new / old broker us/msg per pair: median {statistics.median(ratios):.3f}, lower in {lower} of {len(ratios)} pairs")
PY
