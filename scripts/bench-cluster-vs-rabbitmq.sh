#!/usr/bin/env bash
# Issue 17's "Measure": a three-member berth cluster against a three-node
# RabbitMQ cluster with quorum queues, on this machine, in one run.
#
#   scripts/bench-cluster-vs-rabbitmq.sh [--runs N] [--time S] [--kills N]
#                                        [--confirms N] [--out DIR] [--no-build]
#                                        [--no-throughput] [--no-failover]
#                                        [--bin PATH] [--no-rabbitmq]
#
# Throughput (persist-2k-5q with confirms): RabbitMQ's PerfTest, 5
# producers (at most --confirms unconfirmed each, default 50: at 100 a
# berth follower falls behind and cannot catch up, see BENCHMARKS.md) and
# 5 consumers, persistent 2 KB messages, 5 durable queues declared with x-queue-type=quorum (fresh names
# each run, deleted after it), S seconds (default 30) per run, N runs per
# broker (default 3), alternating berth, RabbitMQ, berth, ... PerfTest
# connects to berth's leader (followers turn clients away) and to all three
# RabbitMQ nodes (it spreads its connections over them; quorum queue
# leaders are placed on the declaring connection's node). Reported:
# confirmed msg/s (PerfTest's per-interval "confirmed" rates over the run)
# and broker CPU µs per confirmed message, /proc utime+stime summed over
# the three nodes' pids.
#
# Failover (scripts/failover-probe.py, pika in .cache/bench-venv): kill -9
# of the node leading the queue (berth: the cluster leader; RabbitMQ: the
# quorum queue's leader), alternating brokers, N kills each (default 3);
# time until a publish is confirmed again and until the queue's depth is
# readable again, then the node is restarted and rejoins.
#
# Both clusters run at once on free ports with their data in a temporary
# directory under /var/tmp; every process started here is stopped by its
# pid on exit, whatever happens. Results: OUT/summary.txt (the tables),
# OUT/runs.tsv, OUT/failover.jsonl, OUT/berth-cluster-samples.jsonl
# (leader and follower lag each second of berth's runs), each PerfTest
# output, OUT/run.log (commands, machine, versions) and the nodes' logs.
# Takes about 1 + 2 N (S + 15) / 60 minutes plus ~20 s per kill pair.
# Backlog (--backlog-mb N, issue 42; off unless asked): per broker, in
# turn, PerfTest fills 5 quorum queues with N MB of confirmed, unconsumed
# persistent 16 KB messages (5 producers, no consumer), then kills the
# leader once with the backlog in place (the failover probe), then
# consumes while publishing for --backlog-time S seconds (default 60).
# Reported: fill msg/s and nacks, the failover times, each node's peak
# RSS (VmHWM) after the fill, drain-phase confirmed and received msg/s,
# broker CPU per message, and whether berth's leader changed during the
# fill (samples). Disk: about 6 N for berth, 3 N for RabbitMQ.
# --bin runs another berth binary (e.g. one built from an older commit,
# for a bisection); --no-rabbitmq runs berth alone (no ratio is printed).
# Not part of scripts/test.sh.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

runs=3 time_s=30 kills=3 confirms=50 out="" build=1 throughput=1 failover=1 bin="" rabbit=1
backlog_mb=0 backlog_s=60
while [ $# -gt 0 ]; do
  case "$1" in
  --runs) runs=${2:?}; shift ;;
  --time) time_s=${2:?}; shift ;;
  --kills) kills=${2:?}; shift ;;
  --confirms) confirms=${2:?}; shift ;;
  --out) out=${2:?}; shift ;;
  --no-build) build=0 ;;
  --no-throughput) throughput=0 ;;
  --no-failover) failover=0 ;;
  --bin) bin=${2:?}; build=0; shift ;;
  --no-rabbitmq) rabbit=0 ;;
  --backlog-mb) backlog_mb=${2:?}; shift ;;
  --backlog-time) backlog_s=${2:?}; shift ;;
  -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
out=${out:-bench-results/cluster-vs-rabbitmq-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out" && out=$(cd "$out" && pwd)
log="$out/run.log"
say() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$log" >&2; }

# ---- tools ----------------------------------------------------------------
classpath=$("$root/scripts/perftest-classpath.sh" "$log") || { say "no PerfTest classpath; see $log"; exit 1; }
venv="$root/.cache/bench-venv"
if { [ $failover = 1 ] || [ "$backlog_mb" -gt 0 ]; } && ! "$venv/bin/python" -c 'import pika' 2>/dev/null; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q pika==1.3.2 >>"$log" 2>&1 ||
    { say "cannot install pika into $venv; see $log"; exit 1; }
fi
bin=${bin:-$root/target/release/berth}
if [ $build = 1 ] && command -v cargo >/dev/null 2>&1; then
  say "building the release binary"
  nice -n 10 cargo build --release -j 1 -p berth-cli >>"$log" 2>&1 || { say "cargo build failed; see $log"; exit 1; }
fi
[ -x "$bin" ] || { say "no $bin (build it, or drop --no-build)"; exit 1; }

# ---- both clusters, on free ports ----------------------------------------
work=$(mktemp -d /var/tmp/berth-clusterbench.XXXXXX)
bdir="$work/berth" rdir="$work/rabbitmq"
mkdir -p "$bdir"
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
berth_pid() { cat "$bdir/$1.pid" 2>/dev/null; }
cleanup() {
  trap - EXIT INT TERM
  local n pid pids=()
  [ -n "${sampler:-}" ] && kill "$sampler" 2>/dev/null
  for n in n1 n2 n3; do
    pid=$(berth_pid $n)
    # the pid file is rewritten at each start; check it is still our berth
    if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--data-dir $bdir/$n"; then
      kill -TERM "$pid" && pids+=("$pid")
    fi
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  "$root/scripts/rabbitmq-cluster.sh" stop "$rdir" >/dev/null 2>&1
  # kept for a post-mortem when something failed: the logs
  mkdir -p "$out/logs"
  cp "$bdir"/*.log "$out/logs/" 2>/dev/null
  for n in n1 n2 n3; do cp -r "$rdir/$n/log" "$out/logs/rabbitmq-$n" 2>/dev/null; done
  rm -rf "$work"
  say "results: $out/summary.txt"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r -a ports <<<"$(python3 -c '
import socket
socks = [socket.socket() for _ in range(9)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
head -c 32 /dev/urandom | base64 >"$bdir/secret"
peers="--cluster-peer n1@127.0.0.1:${ports[6]} --cluster-peer n2@127.0.0.1:${ports[7]} --cluster-peer n3@127.0.0.1:${ports[8]}"
declare -A b_amqp b_http
for i in 0 1 2; do
  n=n$((i + 1))
  b_amqp[$n]=${ports[$i]} b_http[$n]=${ports[$((i + 3))]}
  # one start script per member: the failover probe restarts a killed member with it.
  # Not in a session of its own (no setsid), as RabbitMQ is started: with the
  # kernel's scheduler autogroups a session is a CPU group, which skewed the
  # comparison (docs/BENCHMARKS.md, "The first seconds' loss was the harness").
  cat >"$bdir/$n.start" <<START
sh -c 'echo \$\$ >$bdir/$n.pid; exec $bin serve --amqp-listen 127.0.0.1:${b_amqp[$n]} --http-listen 127.0.0.1:${b_http[$n]} --data-dir $bdir/$n --cluster-node-id $n --cluster-listen 127.0.0.1:${ports[$((i + 6))]} $peers --cluster-secret-file $bdir/secret' </dev/null >>$bdir/$n.log 2>&1 &
START
  say "berth $n: $(sed -n "s/.*exec \(.*\)' <.*/\1/p" "$bdir/$n.start")"
  sh "$bdir/$n.start"
done
berth_leader() {
  local n
  for n in n1 n2 n3; do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${b_http[$n]}/api/health/checks/is-leader")" = 200 ] &&
      echo "$n" && return 0
  done
  return 1
}
# Samples GET /api/berth/cluster of whichever member leads, every second,
# until killed: one JSON line per sample (time, leader, term, each member's
# lag in entries). A follower that falls behind during a run does less work,
# which would flatter CPU per message; a lost leader would stall the run.
berth_sampler() {
  exec python3 - "$1" "${b_http[n1]}" "${b_http[n2]}" "${b_http[n3]}" <<'SAMPLER'
import base64, json, sys, time, urllib.request
out, ports = sys.argv[1], sys.argv[2:]
auth = "Basic " + base64.b64encode(b"guest:guest").decode()
with open(out, "a") as f:
    while True:
        row = {"t": round(time.time(), 2), "leader": None}
        for port in ports:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/api/berth/cluster", headers={"Authorization": auth})
                s = json.load(urllib.request.urlopen(req, timeout=1))
            except Exception:
                continue
            if s.get("role") == "leader":
                row.update(leader=s["node"], term=s["term"],
                           lag={m["name"]: m["lag_entries"] for m in s["members"]})
                break
        f.write(json.dumps(row) + "\n")
        f.flush()
        time.sleep(1)
SAMPLER
}
# A leader, and every follower within a few entries of it.
berth_healthy() {
  local n
  for n in n1 n2 n3; do
    curl -sf -u guest:guest "http://127.0.0.1:${b_http[$n]}/api/berth/cluster" 2>/dev/null |
      python3 -c 'import json, sys
s = json.load(sys.stdin)
sys.exit(0 if s.get("role") == "leader" and all((m["lag_entries"] or 0) <= 2 and m["running"] for m in s["members"]) else 1)' 2>/dev/null &&
      return 0
  done
  return 1
}
for _ in $(seq 1 300); do berth_leader >/dev/null && break; sleep 0.1; done
berth_leader >/dev/null || { say "no berth leader; see $bdir/*.log"; exit 1; }
say "berth cluster up, leader $(berth_leader)"

declare -A r_amqp r_http r_name
brokers="berth"
if [ $rabbit = 1 ]; then
  brokers="berth rabbitmq"
  say "starting the RabbitMQ cluster (scripts/rabbitmq-cluster.sh start $rdir)"
  "$root/scripts/rabbitmq-cluster.sh" start "$rdir" >>"$log" 2>&1 || { say "RabbitMQ cluster did not start; see $log"; exit 1; }
  while read -r n amqp http _; do
    r_amqp[$n]=$amqp r_http[$n]=$http r_name[$n]=$("$root/scripts/rabbitmq.sh" node "$rdir/$n")
  done <"$rdir/ports"
  say "RabbitMQ cluster up: ${r_name[n1]} ${r_name[n2]} ${r_name[n3]}"
fi

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null), berth binary $bin"
  echo "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "perf-test $(basename "${classpath%%:*}" .jar), rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server), erlang $(dpkg-query -W -f='${Version}' erlang-base 2>/dev/null)"
} >>"$log"

cpu_s() { awk '{ sub(/.*\) /, ""); printf "%.2f\n", ($12 + $13) / 100 }' "/proc/$1/stat"; }
cluster_cpu_s() {
  local total=0 pid
  for pid in "$@"; do total=$(awk -v a="$total" -v b="$(cpu_s "$pid")" 'BEGIN { print a + b }'); done
  echo "$total"
}

# ---- throughput: persist-2k-5q, alternating --------------------------------
printf 'run\tbroker\tconfirmed_msgs_per_s\trecv_msgs_per_s\tconfirm_latency_median_us\tbroker_cpu_us_per_msg\tbroker_cpu_cores\tleader_cpu_share\tclient_cpu_cores\tfollower_lag_max_entries\tsamples_without_leader\n' >"$out/runs.tsv"
if [ $throughput = 1 ]; then
  for run in $(seq 1 "$runs"); do
    for broker in $brokers; do
      if [ $broker = berth ]; then
        for _ in $(seq 1 120); do berth_healthy && break; sleep 1; done
        berth_healthy || say "berth cluster not healthy before run $run (no leader, or a follower behind); see $out/berth-cluster-samples.jsonl"
        leader=$(berth_leader) || { say "no berth leader"; exit 1; }
        uris=(-h "amqp://guest:guest@127.0.0.1:${b_amqp[$leader]}/%2f")
        pids=($(berth_pid n1) $(berth_pid n2) $(berth_pid n3))
        lead_pid=$(berth_pid "$leader")
        mgmt=${b_http[$leader]}
      else
        uris=(-H "amqp://guest:guest@127.0.0.1:${r_amqp[n1]}/%2f,amqp://guest:guest@127.0.0.1:${r_amqp[n2]}/%2f,amqp://guest:guest@127.0.0.1:${r_amqp[n3]}/%2f")
        pids=($(cat "$rdir/n1/node.pid") $(cat "$rdir/n2/node.pid") $(cat "$rdir/n3/node.pid"))
        lead_pid=""
        mgmt=${r_http[n1]}
      fi
      for pid in "${pids[@]}"; do alive "$pid" || { say "$broker pid $pid is gone"; exit 1; }; done
      args=(-x 5 -y 5 -s 2048 -f persistent -c "$confirms" --queue-pattern "pt$run-%d" --queue-pattern-from 1
        --queue-pattern-to 5 -qa x-queue-type=quorum -ad false -z "$time_s" -i 5)
      f="$out/$broker-$run.txt"
      say "run $run $broker: PerfTest ${uris[*]} ${args[*]}"
      sampler=""
      if [ $broker = berth ]; then
        echo "{\"run\": $run}" >>"$out/berth-cluster-samples.jsonl"
        berth_sampler "$out/berth-cluster-samples.jsonl" &
        sampler=$!
      fi
      per0=(); for pid in "${pids[@]}"; do per0+=("$(cpu_s "$pid")"); done
      timeout -k 10 $((time_s + 120)) /usr/bin/time -f 'client_cpu_s %U %S' -o "$f.time" \
        java -cp "$classpath" com.rabbitmq.perf.PerfTest "${uris[@]}" "${args[@]}" >"$f" 2>&1 ||
        { say "PerfTest failed; see $f"; exit 1; }
      per1=(); for pid in "${pids[@]}"; do per1+=("$(cpu_s "$pid")"); done
      [ -n "$sampler" ] && kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null
      for q in 1 2 3 4 5; do
        curl -s -o /dev/null -u guest:guest -X DELETE "http://127.0.0.1:$mgmt/api/queues/%2f/pt$run-$q"
      done
      python3 - "$f" "$time_s" "$run" "$broker" "${per0[*]}" "${per1[*]}" "$lead_pid" "${pids[*]}" \
        "$out/berth-cluster-samples.jsonl" >>"$out/runs.tsv" <<'PY'
import json, os, re, sys
f, time_s, run, broker = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
c0 = [float(x) for x in sys.argv[5].split()]
c1 = [float(x) for x in sys.argv[6].split()]
lead_pid, pids = sys.argv[7], sys.argv[8].split()
text = open(f).read()
# per-interval lines: "time 5.000 s, sent: N msg/s, confirmed: N msg/s, ..."
iv = re.findall(r"time (\d+\.\d+) s, sent: (\d+) msg/s, confirmed: (\d+) msg/s, nacked: \d+ msg/s, received: (\d+) msg/s", text)
prev, conf_n, recv_n = 0.0, 0.0, 0.0
for t, _sent, conf, recv in iv:
    t = float(t)
    conf_n += (t - prev) * int(conf)
    recv_n += (t - prev) * int(recv)
    prev = t
conf_rate = conf_n / prev if prev else float("nan")
recv_rate = recv_n / prev if prev else float("nan")
m = re.search(r"confirm latency min/median[^ ]* \d+/(\d+)/", text)
lat = m.group(1) if m else "nan"
cpu = sum(c1) - sum(c0)
cpu_us = cpu * 1e6 / conf_n if conf_n else float("nan")
lead_share = "nan"
if lead_pid:
    i = pids.index(lead_pid)
    lead_share = f"{(c1[i] - c0[i]) / cpu:.2f}"
client = open(f + ".time").read().split()
client_s = float(client[-2]) + float(client[-1])
lag_max, leaderless = "nan", "nan"
if broker == "berth" and os.path.exists(sys.argv[9]):
    # this run's samples: the lines after its {"run": N} marker
    samples, mine = [], False
    for line in open(sys.argv[9]):
        row = json.loads(line)
        if "run" in row:
            mine = row["run"] == int(run)
        elif mine:
            samples.append(row)
    lags = [v or 0 for r in samples if r.get("lag") for k, v in r["lag"].items() if k != r["leader"]]
    lag_max = max(lags) if lags else "nan"
    leaderless = sum(1 for r in samples if not r["leader"])
print(f"{run}\t{broker}\t{conf_rate:.0f}\t{recv_rate:.0f}\t{lat}\t{cpu_us:.1f}\t{cpu / time_s:.2f}\t{lead_share}\t{client_s / time_s:.2f}\t{lag_max}\t{leaderless}")
PY
      tail -1 "$out/runs.tsv" | tee -a "$log" >&2
    done
  done
fi

# ---- backlog: fill, fail over with it in place, drain while publishing ------
peak_rss_mib() { awk '/^VmHWM:/ { printf "%d", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo nan; }
perftest_rate() { # FILE FIELD: the mean of PerfTest's per-interval FIELD rate
  python3 - "$1" "$2" <<'PY'
import re, sys
text, field = open(sys.argv[1]).read(), sys.argv[2]
# "time 5.001 s, sent: N msg/s, confirmed: N msg/s, nacked: N msg/s[, received: N msg/s], ..."
# (a run without consumers prints no "received")
prev, n = 0.0, 0.0
for line in re.findall(r"time (\d+\.\d+) s, (.*)", text):
    m = re.search(field + r": (\d+) msg/s", line[1])
    t = float(line[0]); n += (t - prev) * (int(m.group(1)) if m else 0); prev = t
print(f"{n / prev:.0f}" if prev else "nan", f"{n:.0f}")
PY
}
if [ "$backlog_mb" -gt 0 ]; then
  printf 'broker\tfill_msgs_per_s\tfill_nacked\tfill_s\tfailover_confirmed_s\tfailover_depth_s\tpeak_rss_mib\tdrain_confirmed_msgs_per_s\tdrain_recv_msgs_per_s\tdrain_cpu_us_per_msg\tleader_changes_during_fill\n' >"$out/backlog.tsv"
  per_producer=$((backlog_mb * 1024 / 16 / 5))
  for broker in $brokers; do
    if [ $broker = berth ]; then
      for _ in $(seq 1 120); do berth_healthy && break; sleep 1; done
      leader=$(berth_leader) || { say "no berth leader"; exit 1; }
      uris=(-h "amqp://guest:guest@127.0.0.1:${b_amqp[$leader]}/%2f")
      pidfiles=("$bdir/n1.pid" "$bdir/n2.pid" "$bdir/n3.pid")
      mgmt=${b_http[$leader]}
      nodes=(); for n in n1 n2 n3; do nodes+=(--node "$n,${b_amqp[$n]},${b_http[$n]},$bdir/$n.pid,sh $bdir/$n.start"); done
      echo '{"run": "backlog"}' >>"$out/berth-cluster-samples.jsonl"
      berth_sampler "$out/berth-cluster-samples.jsonl" &
      sampler=$!
    else
      uris=(-H "amqp://guest:guest@127.0.0.1:${r_amqp[n1]}/%2f,amqp://guest:guest@127.0.0.1:${r_amqp[n2]}/%2f,amqp://guest:guest@127.0.0.1:${r_amqp[n3]}/%2f")
      pidfiles=("$rdir/n1/node.pid" "$rdir/n2/node.pid" "$rdir/n3/node.pid")
      mgmt=${r_http[n1]}
      nodes=(); for n in n1 n2 n3; do nodes+=(--node "${r_name[$n]},${r_amqp[$n]},${r_http[$n]},$rdir/$n/node.pid,$root/scripts/rabbitmq-cluster.sh start $rdir >>$log 2>&1"); done
      sampler=""
    fi
    common=(-s 16384 -f persistent -c "$confirms" --queue-pattern "bl-%d" --queue-pattern-from 1
      --queue-pattern-to 5 -qa x-queue-type=quorum -ad false -i 5)
    f="$out/$broker-backlog-fill.txt"
    say "backlog $broker: fill ${backlog_mb} MB: PerfTest ${uris[*]} -x 5 -y 0 -C $per_producer ${common[*]}"
    t0=$SECONDS
    timeout -k 10 3600 java -cp "$classpath" com.rabbitmq.perf.PerfTest "${uris[@]}" -x 5 -y 0 -C "$per_producer" "${common[@]}" >"$f" 2>&1 ||
      say "PerfTest (fill) failed; see $f"
    fill_s=$((SECONDS - t0))
    read -r fill_rate _ <<<"$(perftest_rate "$f" confirmed)"
    read -r _ nacked <<<"$(perftest_rate "$f" nacked)"
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null
    rss=(); for pf in "${pidfiles[@]}"; do rss+=("$(peak_rss_mib "$(cat "$pf")")"); done
    say "backlog $broker: filled in ${fill_s} s, ${fill_rate} msg/s, ${nacked} nacked; peak RSS MiB ${rss[*]}"
    # the leader killed with the backlog in place
    [ $broker = berth ] && for _ in $(seq 1 120); do berth_healthy && break; sleep 1; done
    "$venv/bin/python" "$root/scripts/failover-probe.py" --kind "$broker" "${nodes[@]}" --kills 1 \
      --out "$out/backlog-failover.jsonl" 2>>"$log" | tee -a "$log" >&2 || say "failover probe failed ($broker)"
    fo=$(tail -1 "$out/backlog-failover.jsonl" 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["confirmed_s"], r["depth_s"])' 2>/dev/null || echo "nan nan")
    # then consume while publishing
    if [ $broker = berth ]; then
      for _ in $(seq 1 300); do berth_healthy && break; sleep 1; done
      leader=$(berth_leader) || { say "no berth leader"; exit 1; }
      uris=(-h "amqp://guest:guest@127.0.0.1:${b_amqp[$leader]}/%2f")
      mgmt=${b_http[$leader]}
    fi
    pids=(); for pf in "${pidfiles[@]}"; do pids+=("$(cat "$pf")"); done
    f="$out/$broker-backlog-drain.txt"
    say "backlog $broker: drain while publishing: PerfTest ${uris[*]} -x 5 -y 5 -z $backlog_s ${common[*]}"
    c0=$(cluster_cpu_s "${pids[@]}")
    timeout -k 10 $((backlog_s + 120)) java -cp "$classpath" com.rabbitmq.perf.PerfTest "${uris[@]}" -x 5 -y 5 -z "$backlog_s" "${common[@]}" >"$f" 2>&1 ||
      say "PerfTest (drain) failed; see $f"
    c1=$(cluster_cpu_s "${pids[@]}")
    read -r dconf dconf_n <<<"$(perftest_rate "$f" confirmed)"
    read -r drecv drecv_n <<<"$(perftest_rate "$f" received)"
    cpu_us=$(awk -v a="$c0" -v b="$c1" -v n="$dconf_n" -v m="$drecv_n" 'BEGIN { if (n + m > 0) printf "%.1f", (b - a) * 1e6 / (n + m); else print "nan" }')
    changes=nan
    if [ $broker = berth ]; then
      changes=$(python3 -c '
import json, sys
rows, mine = [], False
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "run" in r: mine = r["run"] == "backlog"
    elif mine and r.get("leader"): rows.append(r["leader"])
print(sum(1 for a, b in zip(rows, rows[1:]) if a != b))' "$out/berth-cluster-samples.jsonl")
    fi
    for q in 1 2 3 4 5; do curl -s -o /dev/null -u guest:guest -X DELETE "http://127.0.0.1:$mgmt/api/queues/%2f/bl-$q"; done
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$broker" "$fill_rate" "$nacked" "$fill_s" ${fo} "$(IFS=/; echo "${rss[*]}")" \
      "$dconf" "$drecv" "$cpu_us" "$changes" | tee -a "$out/backlog.tsv" "$log" >&2
  done
fi

# ---- failover: kill -9 of the queue's leader, alternating ------------------
if [ $failover = 1 ]; then
  bnodes=() rnodes=()
  for n in n1 n2 n3; do
    bnodes+=(--node "$n,${b_amqp[$n]},${b_http[$n]},$bdir/$n.pid,sh $bdir/$n.start")
    [ $rabbit = 1 ] && rnodes+=(--node "${r_name[$n]},${r_amqp[$n]},${r_http[$n]},$rdir/$n/node.pid,$root/scripts/rabbitmq-cluster.sh start $rdir >>$log 2>&1")
  done
  for k in $(seq 1 "$kills"); do
    for _ in $(seq 1 120); do berth_healthy && break; sleep 1; done
    berth_healthy || say "berth cluster not healthy before kill $k (no leader, or a follower behind)"
    say "failover $k: berth"
    "$venv/bin/python" "$root/scripts/failover-probe.py" --kind berth "${bnodes[@]}" --kills 1 \
      --out "$out/failover.jsonl" 2>>"$log" | tee -a "$log" >&2 || { say "failover probe failed (berth)"; exit 1; }
    [ $rabbit = 1 ] || continue
    say "failover $k: rabbitmq"
    "$venv/bin/python" "$root/scripts/failover-probe.py" --kind rabbitmq "${rnodes[@]}" --kills 1 \
      --out "$out/failover.jsonl" 2>>"$log" | tee -a "$log" >&2 || { say "failover probe failed (rabbitmq)"; exit 1; }
  done
fi

# ---- summary ----------------------------------------------------------------
python3 - "$out/runs.tsv" "$out/failover.jsonl" >"$out/summary.txt" <<'PY'
import csv, json, os, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def mmm(v):
    v = sorted(v)
    return (v[0], statistics.median(v), v[-1]) if v else None
def line(label, unit, b, r, fmt="{:,.0f}"):
    if not b:
        return
    cell = lambda t: " / ".join((fmt.format(t[0]), "**" + fmt.format(t[1]) + "**", fmt.format(t[2]))) if t else "not run"
    ratio = f"{b[1] / r[1]:.2f}" if r and r[1] else "n/a"
    print(f"| {label} | {unit} | {cell(r)} | {cell(b)} | {ratio} |")
print("| figure | unit | RabbitMQ 3 nodes min / **median** / max | berth 3 members min / **median** / max | berth / RabbitMQ (medians) |")
print("|---|---|---|---|---|")
for col, label, unit, fmt in [
    ("confirmed_msgs_per_s", "persist-2k-5q confirmed", "msg/s", "{:,.0f}"),
    ("recv_msgs_per_s", "persist-2k-5q received", "msg/s", "{:,.0f}"),
    ("confirm_latency_median_us", "confirm latency, median", "µs", "{:,.0f}"),
    ("broker_cpu_us_per_msg", "broker CPU per confirmed message, 3 nodes", "µs", "{:.1f}"),
    ("broker_cpu_cores", "broker CPU, 3 nodes", "cores", "{:.2f}"),
    ("client_cpu_cores", "PerfTest CPU", "cores", "{:.2f}"),
]:
    get = lambda b: [float(r[col]) for r in rows if r["broker"] == b and r[col] != "nan"]
    line(label, unit, mmm(get("berth")), mmm(get("rabbitmq")), fmt)
fo = [json.loads(l) for l in open(sys.argv[2])] if os.path.exists(sys.argv[2]) else []
for key, label in [("confirmed_s", "kill -9 of the leader → publish confirmed again"),
                   ("depth_s", "kill -9 of the leader → depth readable again")]:
    get = lambda b: [r[key] for r in fo if r["kind"] == b and r[key] is not None]
    line(label, "s", mmm(get("berth")), mmm(get("rabbitmq")), "{:.3f}")
timeouts = [r for r in fo if r["confirmed_s"] is None or r["depth_s"] is None]
if timeouts:
    print(f"\n{len(timeouts)} kill(s) without recovery within the probe's timeout: {timeouts}")
if fo:
    print(f"\nkills: {sum(r['kind'] == 'berth' for r in fo)} berth, {sum(r['kind'] == 'rabbitmq' for r in fo)} RabbitMQ")
PY
if [ -f "$out/backlog.tsv" ]; then
  { echo; echo "backlog ${backlog_mb} MB (16 KB messages; drain: ${backlog_s} s consuming while publishing; CPU per message counts both confirmed and received):"
    column -t -s $'\t' "$out/backlog.tsv"; } >>"$out/summary.txt"
fi
cat "$out/summary.txt" | tee -a "$log"
