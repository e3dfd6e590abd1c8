#!/usr/bin/env bash
# Runs every `berth bench` scenario against berth and a private RabbitMQ in
# one go (issue 4): both brokers on free ports, measured alternately in the
# same bench run (`--vs`), broker pids given so CPU per message is reported.
#
#   scripts/bench-vs-rabbitmq.sh [--quick] [--runs N] [--out DIR]
#                                [--scenarios "fanin pagesize ..."] [--no-build]
#                                [--no-drop-cache] [--set SCENARIO "BENCH ARGS"]
#                                [--bench-bin PATH]...
#
# Default sizes fit a 2-core machine: a full run takes ~20 minutes; --quick
# (~5 minutes) runs 2 repetitions of smaller sizes and keeps the page cache
# warm. Results: OUT/SCENARIO/{results.jsonl,summary.txt} plus OUT/run.log
# (commands, machine, timings). OUT defaults to
# bench-results/vs-rabbitmq-YYYYmmdd-HHMMSS. Broker data lives in a
# temporary directory removed at exit; both brokers are stopped on exit,
# whatever happens. --set replaces this script's size arguments for one
# scenario (e.g. --set restart "--messages 50000 --cache warm"); repeatable.
# --bench-bin runs the load generator of another build (e.g. an older
# client) against the same two brokers; repeatable: each scenario is then
# run once per bench binary, in the order given, into OUT/SCENARIO.N
# (default: this tree's berth drives the bench too, into OUT/SCENARIO).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

quick=0 runs="" out="" build=1 drop_cache=1
bench_bins=()
scenarios="fanin pagesize groupcommit spooler restart"
declare -A custom=()
while [ $# -gt 0 ]; do
  case "$1" in
  --quick) quick=1 ;;
  --runs) runs=${2:?--runs N}; shift ;;
  --out) out=${2:?--out DIR}; shift ;;
  --scenarios) scenarios=${2:?--scenarios LIST}; shift ;;
  --no-build) build=0 ;;
  --no-drop-cache) drop_cache=0 ;;
  --bench-bin) bench_bins+=("$(realpath "${2:?--bench-bin PATH}")"); shift ;;
  --set) custom[${2:?--set SCENARIO ARGS}]=${3?--set SCENARIO ARGS}; shift 2 ;;
  -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ $quick = 1 ] && drop_cache=0
runs=${runs:-$([ $quick = 1 ] && echo 2 || echo 3)}
out=${out:-bench-results/vs-rabbitmq-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out" && out=$(cd "$out" && pwd)
log="$out/run.log"
say() { echo "$*" | tee -a "$log" >&2; }

bin="$root/target/release/berth"
if [ $build = 1 ] && command -v cargo >/dev/null 2>&1; then
  say "building the release binary (cargo decides whether anything changed)"
  cargo build --release --bin berth >>"$log" 2>&1 || { say "cargo build failed; see $log"; exit 1; }
fi
[ -x "$bin" ] || { say "no $bin (build it, or drop --no-build)"; exit 1; }

# ---- free ports: bound all at once to port 0 so they are distinct -------
free_ports() {
  python3 -c '
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
' "$1"
}
read -r b_amqp b_http r_amqp r_http r_dist r_epmd <<<"$(free_ports 6)" ||
  { say "cannot pick free ports (python3 needed)"; exit 1; }

work=$(mktemp -d /var/tmp/berth-vs-rabbitmq.XXXXXX)
bdir="$work/berth" rdir="$work/rabbitmq"
mkdir -p "$bdir/data" "$rdir"

# ---- berth: one start command for the first start and the bench's restarts
# (the shell writes its own pid, then execs berth, so berth.pid is berth's pid)
berth_start_cmd="echo \$\$ >'$bdir/berth.pid'; exec '$bin' serve --amqp-listen 127.0.0.1:$b_amqp --http-listen 127.0.0.1:$b_http --data-dir '$bdir/data' >>'$bdir/berth.log' 2>&1"
rabbit_start_cmd="'$root/scripts/rabbitmq.sh' start '$rdir' $r_amqp $r_http $r_dist $r_epmd"

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
berth_pid() { cat "$bdir/berth.pid" 2>/dev/null; }
rabbit_pid() { cat "$rdir/rabbit.pid" 2>/dev/null; }

start_berth() {
  # Not in a session of its own (no setsid), as RabbitMQ is started: with the
  # kernel's scheduler autogroups a session is a CPU group, which skewed the
  # comparison (docs/BENCHMARKS.md, "The first seconds' loss was the harness").
  sh -c "$berth_start_cmd" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 300); do
    listening "$b_amqp" && listening "$b_http" && return 0
    sleep 0.1
  done
  say "berth did not start; see $bdir/berth.log"; return 1
}
start_rabbit() {
  eval "$rabbit_start_cmd" || return 1
  for _ in $(seq 1 100); do alive "$(rabbit_pid)" && return 0; sleep 0.1; done
  say "rabbitmq runs but wrote no pid file $rdir/rabbit.pid"; return 1
}
stop_berth() {
  local pid; pid=$(berth_pid)
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do alive "$pid" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
}
cleanup() {
  trap - EXIT INT TERM
  say "stopping brokers"
  stop_berth
  "$root/scripts/rabbitmq.sh" stop "$rdir" >/dev/null 2>&1
  cp "$bdir/berth.log" "$out/berth.log" 2>/dev/null
  cp -r "$rdir/log" "$out/rabbitmq-log" 2>/dev/null
  rm -rf "$work"
  say "results: $out (summaries: $out/*/summary.txt)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null)"
  echo "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), kernel $(uname -r)"
  echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB; disk: $(df -h "$work" | awk 'NR==2 {print $1, $2, $5 " used"}')"
  echo "rabbitmq: $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo 'not yet installed')"
  echo "mode: $([ $quick = 1 ] && echo quick || echo full), runs $runs, page cache drops $([ $drop_cache = 1 ] && echo on || echo off)"
  echo "ports: berth amqp $b_amqp http $b_http; rabbitmq amqp $r_amqp http $r_http dist $r_dist epmd $r_epmd"
} >>"$log"
cat "$log" >&2

say "starting berth and rabbitmq"
start_berth || exit 1
start_rabbit || { say "rabbitmq did not start; see $rdir/server.out"; exit 1; }
say "rabbitmq $(dpkg-query -W -f='${Version}' rabbitmq-server) up (pid $(rabbit_pid)); berth up (pid $(berth_pid))"

uri_b="amqp://guest:guest@127.0.0.1:$b_amqp/%2f"
uri_r="amqp://guest:guest@127.0.0.1:$r_amqp/%2f"
mgmt_b="http://guest:guest@127.0.0.1:$b_http"
mgmt_r="http://guest:guest@127.0.0.1:$r_http"

# Sizes per scenario (full / quick). Full: ~20 min in all on 2 cores.
sizes() {
  if [ -n "${custom[$1]+set}" ]; then echo "${custom[$1]}"; return; fi
  case "$1:$quick" in
  fanin:0) echo "--duration 3" ;;
  fanin:1) echo "--duration 2 --concurrency 1,10" ;;
  pagesize:0) echo "--messages 10000 $([ $drop_cache = 1 ] || echo --warm)" ;;
  pagesize:1) echo "--messages 5000 --warm" ;;
  groupcommit:0) echo "--duration 8" ;;
  groupcommit:1) echo "--duration 4 --clients 20 --stall-ms 500" ;;
  spooler:0) echo "--queues 2000 --producers 512 --backlog 20000 --duration 20" ;;
  spooler:1) echo "--queues 500 --producers 128 --backlog 5000 --duration 10" ;;
  restart:0) echo "--messages 5000 --cache $([ $drop_cache = 1 ] && echo both || echo warm)" ;;
  restart:1) echo "--messages 2000 --cache warm" ;;
  esac
}
timeout_s=$([ $quick = 1 ] && echo 600 || echo 1500)

failed=()
for s in $scenarios; do
  # A broker that died in an earlier scenario is started again (and noted).
  alive "$(berth_pid)" && listening "$b_amqp" || { say "berth was down before $s: starting it"; start_berth || exit 1; }
  alive "$(rabbit_pid)" && listening "$r_amqp" || { say "rabbitmq was down before $s: starting it"; start_rabbit || exit 1; }
  args=(bench "$s" --uri "$uri_b" --vs "$uri_r" --runs "$runs" --quiet)
  case "$s" in
  restart)
    # Pids change at every restart: kill through the pid files, no CPU figure.
    args+=(--pid-file "$bdir/berth.pid" --start-cmd "$berth_start_cmd"
      --vs-pid-file "$rdir/rabbit.pid" --vs-start-cmd "$rabbit_start_cmd"
      --broker-log "$out/restart-starts.log") ;;
  spooler)
    args+=(--pid "$(berth_pid)" --vs-pid "$(rabbit_pid)" --mgmt-url "$mgmt_b" --vs-mgmt-url "$mgmt_r") ;;
  fanin)
    # The machine's fdatasync latency is timed beside berth's data.
    args+=(--pid "$(berth_pid)" --vs-pid "$(rabbit_pid)" --limits-dir "$bdir/data") ;;
  *)
    args+=(--pid "$(berth_pid)" --vs-pid "$(rabbit_pid)") ;;
  esac
  # shellcheck disable=SC2207
  args+=($(sizes "$s"))
  clients=("${bench_bins[@]:-$bin}")
  for i in "${!clients[@]}"; do
    name=$s
    [ ${#bench_bins[@]} -gt 1 ] && name=$s.$((i + 1))
    say "== $name: ${clients[$i]} ${args[*]} --out $out/$name"
    t0=$SECONDS
    timeout -k 10 "$timeout_s" "${clients[$i]}" "${args[@]}" --out "$out/$name" >"$out/$name.out" 2>&1
    rc=$?
    say "== $name: exit $rc after $((SECONDS - t0)) s"
    if [ $rc -ne 0 ]; then
      failed+=("$name")
      tail -n 20 "$out/$name.out" | tee -a "$log" >&2
    fi
  done
  # After restart the brokers running are the ones the bench started;
  # the pid files name them, so cleanup stops them as usual.
done

say "total $SECONDS s; failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
