#!/usr/bin/env bash
# A/B of two berth builds in one run (issue 20 goals 1-2, docs/BENCHMARKS.md
# "Per-batch cost of a confirmed publish"): both brokers started on free
# ports with their own temporary data directories, measured alternately by
# `berth bench fanin` (one bench per concurrency level) and `pagesize`
# (`--uri A --vs B`, broker pids for CPU per message), and each broker's
# fdatasyncs per message read from its /metrics before and after each bench.
# Both brokers are stopped and their data removed at exit.
#
#   flock /tmp/berth-bench.lock scripts/bench-berth-ab.sh OLD_BIN NEW_BIN OUTDIR [RUNS]
#
# Each broker's minor page faults per message come from its /proc/PID/stat.
#
# Environment: LEVELS (default "1 10 20"; " " for no fanin), DUR (seconds per phase, 3),
# NO_PAGESIZE=1 to skip pagesize, SIZES (pagesize body sizes, comma-separated, default 2048), BENCH (bench client binary, default NEW_BIN).
set -u
[ $# -ge 3 ] || { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2; }
A=$1; B=$2; OUT=$3; RUNS=${4:-5}
BENCH=${BENCH:-$B}
mkdir -p "$OUT"; W=$(mktemp -d /var/tmp/segs-ab.XXXX)
read -r pa ha pb hb <<<"$(python3 -c '
import socket
ss=[socket.socket() for _ in range(4)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(" ".join(str(s.getsockname()[1]) for s in ss))')"
start() { # bin dir amqp http
  mkdir -p "$2"
  # Not in a session of its own (no setsid), as RabbitMQ is started: with the
  # kernel's scheduler autogroups a session is a CPU group, which skewed the
  # comparison (docs/BENCHMARKS.md, "The first seconds' loss was the harness").
  sh -c "echo \$\$ >'$2/pid'; exec '$1' serve --amqp-listen 127.0.0.1:$3 --http-listen 127.0.0.1:$4 --data-dir '$2/data' >>'$2/log' 2>&1" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 300); do (exec 3<>/dev/tcp/127.0.0.1/$3) 2>/dev/null && return 0; sleep 0.1; done
  echo "broker $1 did not start"; return 1
}
stop() { local p; p=$(cat "$1/pid" 2>/dev/null) || return; kill -TERM "$p" 2>/dev/null; for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || return; sleep 0.1; done; kill -KILL "$p"; }
cleanup() { stop "$W/a"; stop "$W/b"; cp "$W/a/log" "$OUT/a.log"; cp "$W/b/log" "$OUT/b.log"; rm -rf "$W"; }
trap cleanup EXIT
start "$A" "$W/a" $pa $ha || exit 1
start "$B" "$W/b" $pb $hb || exit 1
PA=$(cat $W/a/pid); PB=$(cat $W/b/pid)
scrape() { # http pid -> "fsyncs fsync_s records received minor_faults"
  curl -s -u guest:guest "http://127.0.0.1:$1/metrics" | awk -v flt="$(awk '{print $10}' "/proc/$2/stat")" '
    /^berth_store_fsyncs_total/ {f+=$NF} /^berth_store_fsync_seconds_total/ {s+=$NF}
    /^berth_store_records_total/ {r+=$NF} /^rabbitmq_global_messages_received_total/ {m+=$NF}
    END {printf "%d %.6f %d %d %d\n", f, s, r, m, flt}'
}
delta() { # before after label
  python3 - "$1" "$2" "$3" <<'PY'
import sys
b=list(map(float,sys.argv[1].split())); a=list(map(float,sys.argv[2].split()))
f,s,r,m,flt=[x-y for x,y in zip(a,b)]
print(f"{sys.argv[3]}: fdatasyncs {f:.0f}, messages received {m:.0f}, records {r:.0f}, fdatasync/msg {f/max(m,1):.4f}, msgs/fdatasync {m/max(f,1):.2f}, mean fdatasync {1e6*s/max(f,1):.0f} us, minor page faults {flt:.0f} ({flt/max(m,1):.2f}/msg)")
PY
}
echo "A=$A ($PA) B=$B ($PB) bench=$BENCH runs=$RUNS" | tee "$OUT/info.txt"
uA="amqp://guest:guest@127.0.0.1:$pa/%2f"; uB="amqp://guest:guest@127.0.0.1:$pb/%2f"
for c in ${LEVELS:-1 10 20}; do
  echo "== fanin c$c $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/info.txt"
  sa=$(scrape $ha $PA); sb=$(scrape $hb $PB)
  "$BENCH" bench fanin --uri "$uA" --vs "$uB" --pid $PA --vs-pid $PB --runs $RUNS --concurrency $c --duration ${DUR:-3} --limits-dir "$W/b/data" --quiet --out "$OUT/fanin-c$c" > "$OUT/fanin-c$c.out" 2>&1
  echo "   rc $? end $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/info.txt"
  delta "$sa" "$(scrape $ha $PA)" "A c$c" | tee -a "$OUT/info.txt"
  delta "$sb" "$(scrape $hb $PB)" "B c$c" | tee -a "$OUT/info.txt"
done
if [ -z "${NO_PAGESIZE:-}" ]; then
  echo "== pagesize ${SIZES:-2048} $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/info.txt"
  sa=$(scrape $ha $PA); sb=$(scrape $hb $PB)
  "$BENCH" bench pagesize --uri "$uA" --vs "$uB" --pid $PA --vs-pid $PB --runs $RUNS --sizes ${SIZES:-2048} --messages 10000 --warm --quiet --out "$OUT/pagesize" > "$OUT/pagesize.out" 2>&1
  echo "   rc $? end $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/info.txt"
  delta "$sa" "$(scrape $ha $PA)" "A pagesize" | tee -a "$OUT/info.txt"
  delta "$sb" "$(scrape $hb $PB)" "B pagesize" | tee -a "$OUT/info.txt"
fi
