#!/usr/bin/env bash
# Three private nodes of Debian's rabbitmq-server on one host, joined into
# one cluster (the yardstick of issue 17's "Measure"; never the system
# service, never the well-known ports). Each node is a scripts/rabbitmq.sh
# node in DIR/n1, DIR/n2, DIR/n3 with its own name, AMQP, HTTP and
# distribution ports and data directory; all three share one Erlang cookie
# and one epmd port, which is what lets them see each other.
#
#   scripts/rabbitmq-cluster.sh start DIR [BASEPORT]
#   scripts/rabbitmq-cluster.sh stop DIR
#
# start picks free ports (or, with BASEPORT, node i gets AMQP BASEPORT+10i,
# HTTP +1, distribution +2, and epmd is BASEPORT), starts the nodes that are
# not running, joins n2 and n3 to n1 with `rabbitmqctl join_cluster` unless
# they are members already, and returns once every node accepts AMQP and
# HTTP. It is idempotent: run it again after a node was killed to bring that
# node back (it rejoins from its own data directory). DIR/ports lists per
# node "name amqp http dist"; DIR/nI/node.pid holds each node's OS pid.
#
# stop sends SIGTERM to each node by pid (checked against its command line),
# SIGKILL after 10 s, then stops the shared epmd. Installs rabbitmq-server
# if missing (through scripts/rabbitmq.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rmq="$root/scripts/rabbitmq.sh"
cmd=${1:?usage: rabbitmq-cluster.sh start|stop DIR [BASEPORT]}
dir=$(mkdir -p "${2:?DIR}" && cd "$2" && pwd)
nodes=(n1 n2 n3)

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# The node's pid, if it runs. rabbitmq-server removes rabbit.pid when a
# second start of the same node fails, so the pid is kept in node.pid too;
# either may be stale and name a pid that now belongs to someone else, so
# the process's environment must name this node's directory.
node_pid() {
  local f pid
  for f in rabbit.pid node.pid; do
    pid=$(cat "$dir/$1/$f" 2>/dev/null || true)
    if [ -n "$pid" ] && tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "RABBITMQ_MNESIA_BASE=$dir/$1/mnesia"; then
      echo "$pid"
      return 0
    fi
  done
}

case "$cmd" in
start)
  if [ ! -s "$dir/ports" ]; then
    if [ -n "${3:-}" ]; then
      base=$3
      ports=($base)
      for i in 1 2 3; do ports+=($((base + 10 * i)) $((base + 10 * i + 1)) $((base + 10 * i + 2))); done
    else
      # bound all at once to port 0, so they are free and distinct
      read -r -a ports <<<"$(python3 -c '
import socket
socks = [socket.socket() for _ in range(10)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
    fi
    echo "${ports[0]}" >"$dir/epmd_port"
    for i in 0 1 2; do
      echo "${nodes[$i]} ${ports[$((1 + 3 * i))]} ${ports[$((2 + 3 * i))]} ${ports[$((3 + 3 * i))]}"
    done >"$dir/ports"
  fi
  epmd_port=$(cat "$dir/epmd_port")
  if [ ! -s "$dir/cookie" ]; then
    (umask 077 && head -c 64 /dev/urandom | base64 | tr -dc 'A-Z' | head -c 20 >"$dir/cookie")
  fi
  while read -r name amqp http dist; do
    mkdir -p "$dir/$name"
    if [ ! -s "$dir/$name/.erlang.cookie" ]; then
      install -m 400 "$dir/cookie" "$dir/$name/.erlang.cookie"
    fi
    if [ -z "$(node_pid "$name")" ]; then
      "$rmq" start "$dir/$name" "$amqp" "$http" "$dist" "$epmd_port"
      for _ in $(seq 1 100); do [ -s "$dir/$name/rabbit.pid" ] && break; sleep 0.1; done
      cp "$dir/$name/rabbit.pid" "$dir/$name/node.pid"
    fi
  done <"$dir/ports"
  first=$("$rmq" node "$dir/n1")
  for name in n2 n3; do
    # cluster_status lists the members known to this node (from its disk)
    if "$rmq" ctl "$dir/$name" -q cluster_status --formatter json | grep -q "\"$first\""; then
      continue
    fi
    {
      "$rmq" ctl "$dir/$name" -q stop_app
      "$rmq" ctl "$dir/$name" -q reset
      "$rmq" ctl "$dir/$name" -q join_cluster "$first"
      "$rmq" ctl "$dir/$name" -q start_app
    } >>"$dir/$name/join.log" 2>&1 || { echo "joining $name to $first failed; see $dir/$name/join.log" >&2; exit 1; }
  done
  while read -r name amqp http dist; do
    for _ in $(seq 1 600); do
      listening "$amqp" && listening "$http" && break
      sleep 0.1
    done
    listening "$amqp" || { echo "node $name does not listen on $amqp; see $dir/$name/log" >&2; exit 1; }
  done <"$dir/ports"
  ;;
stop)
  pids=()
  for name in "${nodes[@]}"; do
    pid=$(node_pid "$name")
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  # launchers left behind (a node that never wrote its pid file)
  for name in "${nodes[@]}"; do
    pid=$(cat "$dir/$name/launcher.pid" 2>/dev/null || true)
    [ -n "$pid" ] && tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "RABBITMQ_MNESIA_BASE=$dir/$name/mnesia" &&
      kill -KILL "$pid" 2>/dev/null || true
  done
  if [ -s "$dir/epmd_port" ]; then
    epmd -port "$(cat "$dir/epmd_port")" -kill >/dev/null 2>&1 || true
  fi
  ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
