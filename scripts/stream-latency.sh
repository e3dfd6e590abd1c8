#!/usr/bin/env bash
# berth alone, for looking into a stream consumer's latency behind
# publishers (issue 18): PerfTest's publish-with-confirms run into a
# stream (4 confirmed producers, 1 KB persistent, one consumer from
# `first`, prefetch 500, as scripts/perftest.sh runs it), with PerfTest
# reporting every second, while the management API is sampled every
# 0.5 s for how far the consumer is behind what is committed:
#
#   lag = (committed_offset + 1) - deliver_get
#
# (the consumer starts at offset 0, so its deliveries are its position),
# and its unacknowledged deliveries: near the prefetch (500) while it lags,
# berth filled its window and the client is what is slow; far below it,
# berth is slow to deliver.
# Prints PerfTest's per-second lines (sent/received rates and consumer
# latency min/median/75th/95th/99th, µs) and the lag samples, and the
# broker's CPU per message.
#
#   BERTH_ARGS='--sync interval' EXTRA='-r 8000' TIME=20 \
#     flock /tmp/berth-bench.lock scripts/stream-latency.sh
#
# BERTH_ARGS go to `berth serve`; EXTRA to PerfTest (e.g. `-r N`: N msg/s
# per producer). OUT (default a fresh directory under /tmp) keeps
# perftest.txt, lag.tsv and berth.log.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
TIME=${TIME:-20} BIN=${BIN:-$root/target/release/berth}
OUT=${OUT:-$(mktemp -d /tmp/stream-latency.XXXXXX)}
mkdir -p "$OUT"
cp=$(scripts/perftest-classpath.sh /dev/null) || exit 1
read -r amqp http <<<"$(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')"
work=$(mktemp -d /var/tmp/stream-latency.XXXXXX)
bp=""
stop() {
  [ -n "$bp" ] && kill "$bp" 2>/dev/null && wait "$bp"
  [ -n "${sp:-}" ] && kill "$sp" 2>/dev/null
  rm -rf "$work"
}
trap stop EXIT
# shellcheck disable=SC2086 # BERTH_ARGS are arguments, split on purpose
"$BIN" serve --amqp-listen 127.0.0.1:$amqp --http-listen 127.0.0.1:$http --data-dir "$work/data" ${BERTH_ARGS:-} >"$OUT/berth.log" 2>&1 &
bp=$!
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$amqp") 2>/dev/null && break; sleep 0.1; done
uri="amqp://guest:guest@127.0.0.1:$amqp/%2f"
cpu_s() { awk '{ sub(/.*\) /, ""); print ($12 + $13) / 100 }' "/proc/$1/stat"; }
python3 - "$http" "$OUT/lag.tsv" <<'PY' &
import base64, json, sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
auth = "Basic " + base64.b64encode(b"guest:guest").decode()
t0 = time.time()
with open(out, "w") as f:
    f.write("t_s\tcommitted_next\tdelivered\tlag\tunacked\n")
    while True:
        time.sleep(0.5)
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/api/queues/%2f/lat", headers={"Authorization": auth})
            q = json.load(urllib.request.urlopen(req, timeout=2))
        except Exception:
            continue
        if "committed_offset" not in q:
            continue
        c = q["committed_offset"] + 1
        d = q.get("message_stats", {}).get("deliver_get", 0)
        u = q.get("messages_unacknowledged", 0)
        f.write(f"{time.time() - t0:.1f}\t{c}\t{d}\t{c - d}\t{u}\n")
        f.flush()
PY
sp=$!
c0=$(cpu_s "$bp")
# shellcheck disable=SC2086 # EXTRA is PerfTest arguments, split on purpose
java -cp "$cp" com.rabbitmq.perf.PerfTest -h "$uri" -x 4 -y 1 -s 1024 -f persistent -c 100 -z "$TIME" -i 1 \
  -u lat -ad false -qa x-queue-type=stream --consumer-args x-stream-offset=first -q 500 ${EXTRA:-} >"$OUT/perftest.txt" 2>&1
c1=$(cpu_s "$bp")
kill "$sp" 2>/dev/null
sp=""
grep -E 'time [0-9.]+ ?s|time: [0-9.]+s' "$OUT/perftest.txt" | sed 's/^id: [^,]*, //'
grep -E 'sending rate avg|receiving rate avg|consumer latency' "$OUT/perftest.txt"
echo "lag (offsets committed but not yet delivered), every 0.5 s:"
awk 'NR > 1 { printf "%s ", $4 } END { print "" }' "$OUT/lag.tsv"
echo "unacknowledged deliveries (prefetch 500), every 0.5 s:"
awk 'NR > 1 { printf "%s ", $5 } END { print "" }' "$OUT/lag.tsv"
recv=$(sed -n 's/.*receiving rate avg: \([0-9]*\) msg.*/\1/p' "$OUT/perftest.txt" | tail -1)
awk -v c0="$c0" -v c1="$c1" -v r="${recv:-0}" -v t="$TIME" -v load="$(cut -d' ' -f1-3 /proc/loadavg)" \
  'BEGIN { if (r > 0) printf "broker CPU %.1f us/msg; load %s\n", (c1 - c0) * 1e6 / (r * t), load }'
echo "out: $OUT"
