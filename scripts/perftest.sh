#!/usr/bin/env bash
# Cross-check of `berth bench` with a load tool nobody here wrote: RabbitMQ's
# PerfTest (com.rabbitmq:perf-test from Maven Central), persistent messages
# with publisher confirms into a durable queue, against berth and a private
# RabbitMQ started on free ports, runs alternating (berth, rabbitmq, ...).
#
#   scripts/perftest.sh [--runs N] [--time S] [--out DIR] [--no-build]
#                       [--fanout MESSAGES [--readers R]]
#                       [--berth-args "ARGS"] [--persist-2k-5q]
#                       [--rates "R1 R2 ... max" [--prefetch "100 0"]]
#                       [-- EXTRA_PERFTEST_ARGS...]
#
# --rates (issue 20 goal 3, the latency-vs-rate curve): each run is one
# PerfTest per offered rate (msg/s over all 4 producers; "max" is
# unthrottled) and per consumer prefetch in --prefetch (0 = no basic.qos,
# unlimited; default "100 0"), against both brokers in turn, on fresh
# queues. runs.tsv then has the offered rate, the prefetch and PerfTest's
# consumer latency p50 and p99 too; `berth bench curve --tsv OUT/runs.tsv
# --svg FILE` draws it.
#
# --fanout (streams, issue 18): instead of the publish run, each run first
# fills a fresh stream (x-queue-type=stream) with MESSAGES 1 KB persistent
# messages from 4 confirmed producers, then R consumers (default 10,
# prefetch 500, x-stream-offset=first) each read all of it; reported: the
# aggregate receive rate, the broker's CPU per delivery and its peak RSS
# during the read (VmRSS sampled every 0.5 s). A stream's publish rate is
# the default mode with
#   -- -qa x-queue-type=stream --consumer-args x-stream-offset=first -q 500
#
# Default per run: 4 producers, 1 consumer, 1 KB persistent messages, at
# most 100 unconfirmed per producer, one durable queue, 20 s; 3 runs per
# broker (about 3 minutes in all). Reports PerfTest's average send and
# receive rates, its median consumer latency, and the broker's CPU
# microseconds per message (from /proc, the broker pid's user+system time
# over the run divided by messages received). Results: OUT/summary.txt,
# OUT/runs.tsv and each run's PerfTest output.
#
# --persist-2k-5q (issue 20 goal 2's third scenario, on one node): each
# run is 5 producers and 5 consumers on 5 fresh durable queues
# (pt<run>-1 .. pt<run>-5), 2 KB persistent messages, at most 100
# unconfirmed per producer: the cluster bench's throughput scenario
# (scripts/bench-cluster-vs-rabbitmq.sh) with classic queues on one
# node. The queues are deleted after each run.
#
# --berth-args: more arguments for `berth serve`, e.g. "--sync interval"
# (RabbitMQ's streams do not fdatasync: the like-for-like setting).
# Each run's load average (1 min) goes into run.log.
#
# Maven resolves PerfTest and its dependencies once into the repo-local
# cache .cache/m2 (like tests/java/run.sh); warm runs need no network.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

runs=3 time_s=20 out="" build=1 extra=() fanout=0 readers=10 rates="" prefetches="100 0" berth_args="" five=0
while [ $# -gt 0 ]; do
  case "$1" in
  --runs) runs=${2:?}; shift ;;
  --time) time_s=${2:?}; shift ;;
  --out) out=${2:?}; shift ;;
  --no-build) build=0 ;;
  --fanout) fanout=${2:?}; shift ;;
  --readers) readers=${2:?}; shift ;;
  --rates) rates=${2:?}; shift ;;
  --prefetch) prefetches=${2:?}; shift ;;
  --berth-args) berth_args=${2:?}; shift ;;
  --persist-2k-5q) five=1 ;;
  --) shift; extra=("$@"); break ;;
  -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
out=${out:-bench-results/perftest-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out" && out=$(cd "$out" && pwd)
log="$out/run.log"
say() { echo "$*" | tee -a "$log" >&2; }

# ---- tools: JDK, Maven, PerfTest's classpath (shared with the cluster bench)
classpath=$("$root/scripts/perftest-classpath.sh" "$log") || { say "no PerfTest classpath; see $log"; exit 1; }

bin="$root/target/release/berth"
if [ $build = 1 ] && command -v cargo >/dev/null 2>&1; then
  cargo build --release --bin berth >>"$log" 2>&1 || { say "cargo build failed; see $log"; exit 1; }
fi
[ -x "$bin" ] || { say "no $bin"; exit 1; }

# ---- brokers on free ports (as scripts/bench-vs-rabbitmq.sh does) --------
read -r b_amqp b_http r_amqp r_http r_dist r_epmd <<<"$(python3 -c '
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')" || { say "cannot pick free ports"; exit 1; }
work=$(mktemp -d /var/tmp/berth-perftest.XXXXXX)
bdir="$work/berth" rdir="$work/rabbitmq"
mkdir -p "$bdir/data" "$rdir"
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
cleanup() {
  trap - EXIT INT TERM
  local pid; pid=$(cat "$bdir/berth.pid" 2>/dev/null)
  if alive "$pid"; then
    kill -TERM "$pid"
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  fi
  "$root/scripts/rabbitmq.sh" stop "$rdir" >/dev/null 2>&1
  rm -rf "$work"
  say "results: $out/summary.txt"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Not in a session of its own (no setsid): with the kernel's scheduler
# autogroups (sched_autogroup_enabled=1 here) a new session is a CPU group
# of its own, and berth's group then took a whole core from PerfTest's JVM
# while it compiled its first seconds, where RabbitMQ (started with nohup,
# in this session) shared the JVM's group: berth's p99 at 10,000 msg/s was
# 114-132 ms with setsid and 3.2-5.5 ms without, RabbitMQ's 11-19 ms in both.
sh -c "echo \$\$ >'$bdir/berth.pid'; exec '$bin' serve --amqp-listen 127.0.0.1:$b_amqp --http-listen 127.0.0.1:$b_http --data-dir '$bdir/data' $berth_args >>'$bdir/berth.log' 2>&1" </dev/null >/dev/null 2>&1 &
for _ in $(seq 1 300); do listening "$b_amqp" && break; sleep 0.1; done
listening "$b_amqp" || { say "berth did not start; see $bdir/berth.log"; exit 1; }
"$root/scripts/rabbitmq.sh" start "$rdir" "$r_amqp" "$r_http" "$r_dist" "$r_epmd" || exit 1
for _ in $(seq 1 100); do [ -s "$rdir/rabbit.pid" ] && break; sleep 0.1; done
berth_pid=$(cat "$bdir/berth.pid") rabbit_pid=$(cat "$rdir/rabbit.pid")

cpu_s() { awk '{ sub(/.*\) /, ""); print ($12 + $13) / 100 }' "/proc/$1/stat"; }
if [ $five = 1 ]; then
  [ $fanout = 0 ] && [ -z "$rates" ] || { say "--persist-2k-5q goes with neither --fanout nor --rates"; exit 2; }
  args=(-x 5 -y 5 -s 2048 -f persistent -c 100 -z "$time_s" -i 5 "${extra[@]}")
  queues="5 fresh durable queues pt<run>-1..5"
else
  args=(-x 4 -y 1 -s 1024 -f persistent -c 100 -z "$time_s" -i 5 "${extra[@]}")
  queues="a fresh durable queue"
fi
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null)"
  echo "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), kernel $(uname -r)"
  echo "perf-test $(basename "${classpath%%:*}" .jar), rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server)"
  echo "PerfTest args per run: ${args[*]} on $queues, -ad false"
  echo "berth serve arguments added: ${berth_args:-none}"
} >>"$log"
printf 'run\tbroker\tsend_msgs_per_s\trecv_msgs_per_s\tlatency_median_us\tbroker_cpu_us_per_msg\tclient_cpu_s\n' >"$out/runs.tsv"

rss_peak_kib() { # PID FLAG_FILE: samples VmRSS until FLAG_FILE goes away
  local peak=0 v
  while [ -e "$2" ]; do
    v=$(awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null)
    [ -n "$v" ] && [ "$v" -gt "$peak" ] && peak=$v
    sleep 0.5
  done
  echo "$peak"
}

if [ "$fanout" -gt 0 ]; then
  stream=(-qa x-queue-type=stream -ad false -s 1024 -f persistent)
  printf 'run\tbroker\tfill_msgs_per_s\tfanout_recv_msgs_per_s\tbroker_cpu_us_per_delivery\tclient_cpu_us_per_delivery\trss_peak_mib\tdelivered\n' >"$out/runs.tsv"
  for run in $(seq 1 "$runs"); do
    for broker in berth rabbitmq; do
      if [ $broker = berth ]; then port=$b_amqp pid=$berth_pid; else port=$r_amqp pid=$rabbit_pid; fi
      alive "$pid" || { say "$broker (pid $pid) is gone"; exit 1; }
      q="fanout-$run" uri="amqp://guest:guest@127.0.0.1:$port/%2f"
      fill=(-x 4 -y 0 -c 100 -C $((fanout / 4)) "${stream[@]}" -u "$q" "${extra[@]}")
      read_=(-x 0 -y "$readers" -q 500 -D "$fanout" --consumer-args x-stream-offset=first "${stream[@]}" -u "$q" -z 600 "${extra[@]}")
      say "run $run $broker: fill: PerfTest ${fill[*]}"
      t0=$(date +%s.%N)
      timeout -k 10 900 java -cp "$classpath" com.rabbitmq.perf.PerfTest -h "$uri" "${fill[@]}" >"$out/$broker-$run-fill.txt" 2>&1 ||
        { say "PerfTest fill failed; see $out/$broker-$run-fill.txt"; exit 1; }
      t1=$(date +%s.%N)
      say "run $run $broker: read: PerfTest ${read_[*]}"
      flag="$work/sampling"; : >"$flag"
      rss_peak_kib "$pid" "$flag" >"$work/peak" &
      sampler=$!
      c0=$(cpu_s "$pid"); t2=$(date +%s.%N)
      timeout -k 10 900 /usr/bin/time -f 'client_cpu_s %U %S' -o "$out/$broker-$run-read.time" \
        java -cp "$classpath" com.rabbitmq.perf.PerfTest -h "$uri" "${read_[@]}" >"$out/$broker-$run-read.txt" 2>&1 ||
        { rm -f "$flag"; say "PerfTest read failed; see $out/$broker-$run-read.txt"; exit 1; }
      t3=$(date +%s.%N); c1=$(cpu_s "$pid")
      rm -f "$flag"; wait "$sampler"
      # Each consumer stops after -D messages (all of the stream): the rate
      # is every delivery over the read's wall time, the JVM's start-up
      # (about a second) included, so it is a slight under-estimate.
      delivered=$((fanout * readers))
      recv=$(awk -v n="$delivered" -v a="$t2" -v b="$t3" 'BEGIN { printf "%.0f", n / (b - a) }')
      fillr=$(awk -v n="$fanout" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", n / (b - a) }')
      cpd=$(awk -v a="$c0" -v b="$c1" -v n="$delivered" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')
      peak=$(awk '{ printf "%.0f", $1 / 1024 }' "$work/peak")
      ccpd=$(awk -v n="$delivered" '/client_cpu_s/ { printf "%.2f", ($2 + $3) * 1e6 / n }' "$out/$broker-$run-read.time")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$broker" "$fillr" "$recv" "$cpd" "${ccpd:-nan}" "$peak" "$delivered" >>"$out/runs.tsv"
      say "run $run $broker: fill $fillr msg/s, fan-out $recv deliveries/s, $cpd us broker CPU per delivery, ${ccpd:-nan} us client CPU per delivery, peak RSS $peak MiB, load $(cut -d' ' -f1 /proc/loadavg)"
      curl -s -o /dev/null -u guest:guest -X DELETE "http://127.0.0.1:$([ $broker = berth ] && echo "$b_http" || echo "$r_http")/api/queues/%2F/$q" || true
    done
  done
  cols='["fill_msgs_per_s", "fanout_recv_msgs_per_s", "broker_cpu_us_per_delivery", "client_cpu_us_per_delivery", "rss_peak_mib"]'
elif [ -n "$rates" ]; then
  printf 'run\tbroker\tprefetch\trate\tsend_msgs_per_s\trecv_msgs_per_s\tlatency_median_us\tlatency_p99_us\tbroker_cpu_us_per_msg\tclient_cpu_s\tlatency_p99_us_by_interval\n' >"$out/runs.tsv"
  for run in $(seq 1 "$runs"); do
    for prefetch in $prefetches; do
      for rate in $rates; do
        for broker in berth rabbitmq; do
          if [ $broker = berth ]; then port=$b_amqp pid=$berth_pid http=$b_http; else port=$r_amqp pid=$rabbit_pid http=$r_http; fi
          alive "$pid" || { say "$broker (pid $pid) is gone"; exit 1; }
          q="latency-$run-q$prefetch-$rate" f="$out/$broker-$run-q$prefetch-$rate.txt"
          a=("${args[@]}")
          [ "$rate" = max ] || a+=(-r $((rate / 4)))
          [ "$prefetch" = 0 ] || a+=(-q "$prefetch")
          c0=$(cpu_s "$pid")
          say "run $run $broker: PerfTest ${a[*]} -u $q"
          timeout -k 10 $((time_s + 120)) /usr/bin/time -f 'client_cpu_s %U %S' -o "$f.time" \
            java -cp "$classpath" com.rabbitmq.perf.PerfTest \
            -h "amqp://guest:guest@127.0.0.1:$port/%2f" "${a[@]}" -u "$q" -ad false >"$f" 2>&1 ||
            { say "PerfTest failed; see $f"; exit 1; }
          c1=$(cpu_s "$pid")
          send=$(sed -n 's/.*sending rate avg: \([0-9]*\) msg\/s.*/\1/p' "$f" | tail -1)
          recv=$(sed -n 's/.*receiving rate avg: \([0-9]*\) msg\/s.*/\1/p' "$f" | tail -1)
          # "consumer latency min/median/75th/95th/99th A/B/C/D/E µs"
          read -r p50 p99 < <(sed -n 's/.*consumer latency min\/median[^ ]* \([0-9/]*\) .*/\1/p' "$f" | tail -1 |
            awk -F/ '{ print $2, $5 }')
          cpm=$(awk -v a="$c0" -v b="$c1" -v r="$recv" -v t="$time_s" 'BEGIN { if (r > 0) printf "%.1f", (b - a) * 1e6 / (r * t); else print "nan" }')
          # PerfTest's own CPU (user + system: the client's side of the cost)
          # and the p99 of each of its -i 5 reports (the start of a run apart
          # from its steady state), comma-separated.
          ccpu=$(awk '/client_cpu_s/ { print $2 + $3 }' "$f.time")
          p99s=$(sed -n 's/.*, time .* consumer latency: [0-9]*\/[0-9]*\/[0-9]*\/[0-9]*\/\([0-9]*\) .*/\1/p' "$f" | paste -sd, -)
          printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$broker" "$prefetch" "$rate" "${send:-nan}" "${recv:-nan}" \
            "${p50:-nan}" "${p99:-nan}" "$cpm" "${ccpu:-nan}" "${p99s:-nan}" >>"$out/runs.tsv"
          say "run $run $broker q$prefetch rate $rate: recv ${recv:-nan} msg/s, latency p50 ${p50:-nan} p99 ${p99:-nan} us (per report ${p99s:-nan}), client CPU ${ccpu:-nan} s"
          curl -s -o /dev/null -u guest:guest -X DELETE "http://127.0.0.1:$http/api/queues/%2F/$q" || true
        done
      done
    done
  done
  python3 - "$out/runs.tsv" >"$out/summary.txt" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def key(r):
    return (int(r["prefetch"]), float("inf") if r["rate"] == "max" else float(r["rate"]))
groups = sorted({(r["prefetch"], r["rate"]) for r in rows}, key=lambda k: key({"prefetch": k[0], "rate": k[1]}))
def mmm(vals):
    v = sorted(vals)
    return v[0], statistics.median(v), v[-1]
print(f"{'prefetch':>8} {'rate':>6} {'broker':9} {'recv min/med/max':>26} {'p50 us min/med/max':>26} {'p99 us min/med/max':>28}")
for pf, rate in groups:
    med = {}
    for b in ("berth", "rabbitmq"):
        rs = [r for r in rows if (r["prefetch"], r["rate"], r["broker"]) == (pf, rate, b) and r["latency_p99_us"] != "nan"]
        if not rs:
            continue
        cols = [mmm(float(r[c]) for r in rs) for c in ("recv_msgs_per_s", "latency_median_us", "latency_p99_us")]
        med[b] = [c[1] for c in cols]
        print(f"{pf:>8} {rate:>6} {b:9} " + " ".join(f"{'/'.join(f'{x:.0f}' for x in c):>26}" for c in cols))
    if len(med) == 2:
        print(f"{'':>8} {'':>6} {'ratio':9} p50 berth/rabbitmq {med['berth'][1] / med['rabbitmq'][1]:.2f}, p99 {med['berth'][2] / med['rabbitmq'][2]:.2f}")
PY
  cat "$out/summary.txt" | tee -a "$log"
  exit 0
else
  cols='["send_msgs_per_s", "recv_msgs_per_s", "latency_median_us", "broker_cpu_us_per_msg", "client_cpu_s"]'
for run in $(seq 1 "$runs"); do
  for broker in berth rabbitmq; do
    if [ $broker = berth ]; then port=$b_amqp pid=$berth_pid; else port=$r_amqp pid=$rabbit_pid; fi
    alive "$pid" || { say "$broker (pid $pid) is gone"; exit 1; }
    if [ $five = 1 ]; then
      qs=(--queue-pattern "pt$run-%d" --queue-pattern-from 1 --queue-pattern-to 5)
    else
      qs=(-u "perftest-$run")
    fi
    f="$out/$broker-$run.txt"
    c0=$(cpu_s "$pid")
    say "run $run $broker: PerfTest ${args[*]} ${qs[*]}"
    timeout -k 10 $((time_s + 120)) /usr/bin/time -f 'client_cpu_s %U %S' -o "$f.time" \
      java -cp "$classpath" com.rabbitmq.perf.PerfTest -h "amqp://guest:guest@127.0.0.1:$port/%2f" \
      "${args[@]}" "${qs[@]}" -ad false >"$f" 2>&1 || { say "PerfTest failed; see $f"; exit 1; }
    c1=$(cpu_s "$pid")
    if [ $five = 1 ]; then
      http=$([ $broker = berth ] && echo "$b_http" || echo "$r_http")
      for i in 1 2 3 4 5; do
        curl -s -o /dev/null -u guest:guest -X DELETE "http://127.0.0.1:$http/api/queues/%2F/pt$run-$i" || true
      done
    fi
    send=$(sed -n 's/.*sending rate avg: \([0-9]*\) msg\/s.*/\1/p' "$f" | tail -1)
    recv=$(sed -n 's/.*receiving rate avg: \([0-9]*\) msg\/s.*/\1/p' "$f" | tail -1)
    # "consumer latency min/median/75th/95th/99th A/B/C/D/E µs"
    lat=$(sed -n 's/.*consumer latency min\/median[^ ]* \([0-9]*\)\/\([0-9]*\)\/.*/\2/p' "$f" | tail -1)
    ccpu=$(awk '/client_cpu_s/ {print $2 + $3}' "$f.time")
    cpm=$(awk -v a="$c0" -v b="$c1" -v r="$recv" -v t="$time_s" 'BEGIN { if (r > 0) printf "%.1f", (b - a) * 1e6 / (r * t); else print "nan" }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$broker" "${send:-nan}" "${recv:-nan}" "${lat:-nan}" "$cpm" "${ccpu:-nan}" >>"$out/runs.tsv"
    say "run $run $broker: sent ${send:-nan} msg/s, received ${recv:-nan} msg/s, latency median ${lat:-nan} us, broker ${cpm} us/msg, load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
fi

python3 - "$out/runs.tsv" "$cols" >"$out/summary.txt" <<'PY'
import csv, json, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
cols = json.loads(sys.argv[2])
print(f"{'figure':24} {'broker':9} {'N':>2} {'min':>10} {'median':>10} {'max':>10}")
for c in cols:
    med = {}
    for b in ("berth", "rabbitmq"):
        v = sorted(float(r[c]) for r in rows if r["broker"] == b and r[c] != "nan")
        if not v:
            continue
        med[b] = statistics.median(v)
        print(f"{c:24} {b:9} {len(v):>2} {v[0]:>10.1f} {med[b]:>10.1f} {v[-1]:>10.1f}")
    if len(med) == 2 and med["rabbitmq"]:
        print(f"{'':24} berth/rabbitmq median ratio: {med['berth'] / med['rabbitmq']:.2f}")
PY
cat "$out/summary.txt" | tee -a "$log"
