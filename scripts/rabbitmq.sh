#!/usr/bin/env bash
# Run Debian's rabbitmq-server as a private process of our own (never the
# system service): own ports, own data directory, stopped by its own command.
#
#   scripts/rabbitmq.sh start DIR AMQP_PORT HTTP_PORT [DIST_PORT EPMD_PORT]
#   scripts/rabbitmq.sh stop DIR
#   scripts/rabbitmq.sh node DIR          # prints the node's Erlang name
#   scripts/rabbitmq.sh ctl DIR ARGS...   # rabbitmqctl ARGS against this node
#
# start prints nothing on success and returns once the AMQP and HTTP ports
# accept connections (polled with bash's /dev/tcp, not rabbitmqctl: a CLI
# call boots an Erlang VM, which would compete for CPU with a broker that
# is recovering). DIST_PORT and EPMD_PORT default to AMQP_PORT+2 and +3;
# pass free ones when those may be taken. The node's OS pid is in
# DIR/rabbit.pid once it has booted (the launcher script's in
# DIR/launcher.pid). A DIR/.erlang.cookie written before the first start is
# kept (HOME is DIR), so nodes given the same cookie and the same EPMD_PORT
# can be clustered (scripts/rabbitmq-cluster.sh does that).
#
# With RABBITMQ_STREAM_PORT set, the rabbitmq_stream plugin is enabled too
# and its listener is on that port (127.0.0.1, advertised as such).
#
# Installs rabbitmq-server if it is missing (idempotent).
set -euo pipefail
cmd=${1:?usage: rabbitmq.sh start|stop|node|ctl DIR [AMQP_PORT HTTP_PORT]}
dir=$(mkdir -p "${2:?DIR}" && cd "$2" && pwd)

if ! dpkg -s rabbitmq-server >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  # the package starts the system service; we only want our own instances
  service rabbitmq-server stop >/dev/null 2>&1 || true
fi

env_for() {
  export RABBITMQ_NODENAME="berthcmp$(echo "$dir" | cksum | cut -d' ' -f1)@localhost"
  export RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
  export RABBITMQ_CONFIG_FILE="$dir/rabbitmq"
  export RABBITMQ_PID_FILE="$dir/rabbit.pid"
  export ERL_EPMD_PORT=$(cat "$dir/epmd_port" 2>/dev/null || echo 4369)
  export HOME="$dir"   # erlang cookie lives here
  export ERL_CRASH_DUMP="$dir/erl_crash.dump"   # not in the caller's directory
}

case "$cmd" in
start)
  amqp=${3:?AMQP_PORT}; http=${4:?HTTP_PORT}
  dist=${5:-$((amqp + 2))}; epmd_port=${6:-$((amqp + 3))}
  echo "$epmd_port" >"$dir/epmd_port"
  env_for
  export RABBITMQ_NODE_PORT=$amqp RABBITMQ_DIST_PORT=$dist
  echo '[rabbitmq_management].' >"$RABBITMQ_ENABLED_PLUGINS_FILE"
  cat >"$dir/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$amqp
management.tcp.port = $http
management.tcp.ip = 127.0.0.1
loopback_users = none
CONF
  if [ -n "${RABBITMQ_STREAM_PORT:-}" ]; then
    echo '[rabbitmq_management,rabbitmq_stream].' >"$RABBITMQ_ENABLED_PLUGINS_FILE"
    cat >>"$dir/rabbitmq.conf" <<CONF
stream.listeners.tcp.1 = 127.0.0.1:$RABBITMQ_STREAM_PORT
stream.advertised_host = 127.0.0.1
stream.advertised_port = $RABBITMQ_STREAM_PORT
CONF
  fi
  mkdir -p "$RABBITMQ_LOG_BASE"
  nohup /usr/lib/rabbitmq/bin/rabbitmq-server >"$dir/server.out" 2>&1 &
  echo $! >"$dir/launcher.pid"
  launcher=$!
  listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
  for _ in $(seq 1 1200); do
    if listening "$amqp" && listening "$http"; then
      exit 0
    fi
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  echo "rabbitmq did not start; see $dir/server.out and $dir/log" >&2
  exit 1
  ;;
stop)
  env_for
  /usr/lib/rabbitmq/bin/rabbitmqctl -q stop >/dev/null 2>&1 || true
  # A node that did not answer (still booting, or wedged) is killed by pid.
  for f in rabbit.pid launcher.pid; do
    pid=$(cat "$dir/$f" 2>/dev/null || true)
    [ -n "$pid" ] || continue
    # a stale file may name a pid that now belongs to someone else
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$dir" || continue
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
  ;;
node)
  env_for
  echo "$RABBITMQ_NODENAME"
  ;;
ctl)
  env_for
  shift 2
  exec /usr/lib/rabbitmq/bin/rabbitmqctl -n "$RABBITMQ_NODENAME" "$@"
  ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
