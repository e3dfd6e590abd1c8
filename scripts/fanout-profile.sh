#!/usr/bin/env bash
# One broker at a time, for looking into a stream's fan-out (issue 18):
# fills a stream with N 1 KB persistent messages (PerfTest, 4 confirmed
# producers), then times PerfTest's 10 consumers reading it from `first`
# (prefetch 500) and prints deliveries/s, the broker's and the client's
# CPU per delivery (/proc and /usr/bin/time), and the bytes the broker
# read (/proc/PID/io rchar: files and sockets) during the read.
#
#   BROKER=berth|rabbitmq N=200000 PERF=0|1 EXTRA='--multi-ack-every 100' \
#     flock /tmp/berth-bench.lock scripts/fanout-profile.sh
#
# PERF=1 records the broker with `perf record -g` into OUT/perf.data
# (OUT defaults to a fresh directory under /tmp). Not a benchmark of its
# own: scripts/perftest.sh --fanout runs both brokers alternately.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
N=${N:-200000} PERF=${PERF:-0} BROKER=${BROKER:-berth} BIN=${BIN:-$root/target/release/berth}
OUT=${OUT:-$(mktemp -d /tmp/fanout-profile.XXXXXX)}
cp=$(scripts/perftest-classpath.sh /dev/null) || exit 1
read -r amqp http dist epmd <<<"$(python3 -c '
import socket
s = [socket.socket() for _ in range(4)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')"
work=$(mktemp -d /var/tmp/fanout-profile.XXXXXX)
stop() {
  if [ "$BROKER" = berth ]; then
    kill "$bp" 2>/dev/null && wait "$bp"
  else
    scripts/rabbitmq.sh stop "$work/r" >/dev/null 2>&1
  fi
  rm -rf "$work"
}
if [ "$BROKER" = berth ]; then
  "$BIN" serve --amqp-listen 127.0.0.1:$amqp --http-listen 127.0.0.1:$http --data-dir "$work/data" >"$work/berth.log" 2>&1 &
  bp=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$amqp") 2>/dev/null && break; sleep 0.1; done
else
  scripts/rabbitmq.sh start "$work/r" "$amqp" "$http" "$dist" "$epmd" || exit 1
  for _ in $(seq 1 100); do [ -s "$work/r/rabbit.pid" ] && break; sleep 0.1; done
  bp=$(cat "$work/r/rabbit.pid")
fi
trap stop EXIT
uri="amqp://guest:guest@127.0.0.1:$amqp/%2f"
stream=(-qa x-queue-type=stream -ad false -s 1024 -f persistent -u fan)
cpu_s() { awk '{ sub(/.*\) /, ""); print ($12 + $13) / 100 }' "/proc/$1/stat"; }
rchar() { awk '/^rchar/ { print $2 }' "/proc/$1/io"; }
t0=$(date +%s.%N)
java -cp "$cp" com.rabbitmq.perf.PerfTest -h "$uri" -x 4 -y 0 -c 100 -C $((N / 4)) "${stream[@]}" >"$OUT/fill.txt" 2>&1 || { echo "fill failed: $OUT/fill.txt"; exit 1; }
t1=$(date +%s.%N)
c0=$(cpu_s "$bp") r0=$(rchar "$bp")
if [ "$PERF" = 1 ]; then perf record -g -F 999 -p "$bp" -o "$OUT/perf.data" 2>/dev/null & pp=$!; fi
t2=$(date +%s.%N)
# shellcheck disable=SC2086 # EXTRA is PerfTest arguments, split on purpose
/usr/bin/time -f '%U %S' -o "$OUT/client.time" java -cp "$cp" com.rabbitmq.perf.PerfTest -h "$uri" -x 0 -y 10 -q 500 -D "$N" \
  --consumer-args x-stream-offset=first "${stream[@]}" -z 600 ${EXTRA:-} >"$OUT/read.txt" 2>&1 || { echo "read failed: $OUT/read.txt"; exit 1; }
t3=$(date +%s.%N)
c1=$(cpu_s "$bp") r1=$(rchar "$bp")
if [ "$PERF" = 1 ]; then kill -INT "$pp"; wait "$pp"; fi
n=$((N * 10))
awk -v b="$BROKER" -v n="$n" -v N="$N" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v t3="$t3" -v c0="$c0" -v c1="$c1" \
  -v r0="$r0" -v r1="$r1" -v load="$(cut -d' ' -f1 /proc/loadavg)" -v extra="${EXTRA:-}" '
  { cu = $1; cs = $2 }
  END {
    printf "%s%s: fill %.0f msg/s; fan-out %.0f deliveries/s; broker %.2f us/delivery; client %.2f us/delivery (user %.2f s, sys %.2f s); broker read %.0f MiB; wall %.1f s; load %s\n",
      b, (extra == "" ? "" : " (" extra ")"), N / (t1 - t0), n / (t3 - t2), (c1 - c0) * 1e6 / n,
      (cu + cs) * 1e6 / n, cu, cs, (r1 - r0) / 1048576, t3 - t2, load
  }' "$OUT/client.time"
