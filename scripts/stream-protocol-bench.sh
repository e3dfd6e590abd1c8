#!/usr/bin/env bash
# The stream protocol side by side (not a test): berth (target/release/berth,
# --stream-listen) and RabbitMQ 3.10.8 with rabbitmq_stream
# (scripts/rabbitmq.sh, a private node), RUNS alternating runs each of
# scripts/stream-protocol-bench.py (one rstream publisher with confirms,
# 1 KB, batches of 100, then one consumer from first), printing each run's
# JSON and min/median/max of berth/RabbitMQ ratios.
#
#   RUNS=3 MESSAGES=100000 scripts/stream-protocol-bench.sh
#
# Uses tests/python/.venv (tests/python/run.sh makes it) for rstream.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}; n=${MESSAGES:-100000}
py=${PYTHON:-tests/python/.venv/bin/python}
work=$(mktemp -d /tmp/berth-stream-bench.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
bport=$(free_port); rport=$(free_port); ramqp=$(free_port); rhttp=$(free_port)
target/release/berth serve --amqp-listen 127.0.0.1:0 --stream-listen "127.0.0.1:$bport" \
  --data-dir "$work/berth" >"$work/berth.log" 2>&1 &
bpid=$!
RABBITMQ_STREAM_PORT=$rport scripts/rabbitmq.sh start "$work/rabbit" "$ramqp" "$rhttp" \
  "$(free_port)" "$(free_port)"
rpid=$(cat "$work/rabbit/rabbit.pid")
for _ in $(seq 1 300); do (exec 3<>"/dev/tcp/127.0.0.1/$rport") 2>/dev/null && break; sleep 0.1; done
cleanup() { kill "$bpid" 2>/dev/null || true; scripts/rabbitmq.sh stop "$work/rabbit"; rm -rf "$work"; }
trap cleanup EXIT
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); messages per run: $n"
: >"$work/results"
for i in $(seq 1 "$runs"); do
  b=$("$py" scripts/stream-protocol-bench.py "$bport" "$bpid" "$n")
  r=$("$py" scripts/stream-protocol-bench.py "$rport" "$rpid" "$n")
  echo "run $i berth    $b"; echo "run $i rabbitmq $r"
  echo "$b $r" >>"$work/results"
done
python3 - "$work/results" <<'PY'
import json, statistics, sys
rows = [l.split("} {") for l in open(sys.argv[1])]
pairs = [(json.loads(a + "}"), json.loads("{" + b)) for a, b in rows]
for k in ["publish_msg_s", "publish_cpu_us_per_msg", "consume_msg_s", "consume_cpu_us_per_msg"]:
    r = sorted(b[k] / q[k] for b, q in pairs)
    print(f"{k:26} berth/rabbitmq  min {r[0]:.2f}  median {statistics.median(r):.2f}  max {r[-1]:.2f}"
          f"   (berth median {statistics.median(b[k] for b, _ in pairs):.1f},"
          f" rabbitmq median {statistics.median(q[k] for _, q in pairs):.1f})")
PY
