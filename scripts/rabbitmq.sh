#!/usr/bin/env bash
# Run Debian's rabbitmq-server as a private process of our own (never the
# system service): own ports, own data directory, stopped by its own command.
#
#   scripts/rabbitmq.sh start DIR AMQP_PORT HTTP_PORT   # prints nothing on success
#   scripts/rabbitmq.sh stop DIR
#
# Installs rabbitmq-server if it is missing (idempotent).
set -euo pipefail
cmd=${1:?usage: rabbitmq.sh start|stop DIR [AMQP_PORT HTTP_PORT]}
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
}

case "$cmd" in
start)
  amqp=${3:?AMQP_PORT}; http=${4:?HTTP_PORT}
  echo $((amqp + 3)) >"$dir/epmd_port"
  env_for
  export RABBITMQ_NODE_PORT=$amqp RABBITMQ_DIST_PORT=$((amqp + 2))
  echo '[rabbitmq_management].' >"$RABBITMQ_ENABLED_PLUGINS_FILE"
  cat >"$dir/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$amqp
management.tcp.port = $http
management.tcp.ip = 127.0.0.1
loopback_users = none
CONF
  mkdir -p "$RABBITMQ_LOG_BASE"
  nohup /usr/lib/rabbitmq/bin/rabbitmq-server >"$dir/server.out" 2>&1 &
  echo $! >"$dir/launcher.pid"
  for _ in $(seq 1 120); do
    if /usr/lib/rabbitmq/bin/rabbitmqctl -q status >/dev/null 2>&1 \
      && /usr/lib/rabbitmq/bin/rabbitmqctl -q await_startup >/dev/null 2>&1; then
      exit 0
    fi
    sleep 1
  done
  echo "rabbitmq did not start; see $dir/server.out and $dir/log" >&2
  exit 1
  ;;
stop)
  env_for
  /usr/lib/rabbitmq/bin/rabbitmqctl -q stop >/dev/null 2>&1 || true
  epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
  ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
