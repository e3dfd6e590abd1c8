# Sourced by the client smoke-test scripts: gives them a broker to talk to.
#
#   . tests/clients/broker.sh
#   broker_start     # exports BERTH_TEST_URI; returns non-zero if no broker
#   broker_stop      # stops what broker_start started and removes its
#                    # directory (safe to call twice); `broker_stop --show-log`
#                    # (a failed run) prints the log's tail and, with
#                    # BERTH_KEEP_TEST_DIRS=1, keeps the directory
#
# If BERTH_TEST_URI is already set, that broker is used and nothing is
# started. Otherwise the berth binary ($BERTH_BIN, default
# target/release/berth) is started on a free loopback port with a fresh data
# directory, and its `berth ready amqp=ADDR[,ADDR...]` log line tells the port.

# Seconds to wait for the ready line before giving up.
BROKER_READY_TIMEOUT_S=${BROKER_READY_TIMEOUT_S:-30}

_broker_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
_broker_pid=""
_broker_dir=""

broker_start() {
  if [ -n "${BERTH_TEST_URI:-}" ]; then
    echo "broker: using BERTH_TEST_URI=$BERTH_TEST_URI"
    return 0
  fi
  local bin=${BERTH_BIN:-$_broker_root/target/release/berth}
  if [ ! -x "$bin" ]; then
    echo "broker: $bin not found or not executable (build it with cargo build --release, or set BERTH_TEST_URI)" >&2
    return 1
  fi
  _broker_dir=$(mktemp -d "${TMPDIR:-/tmp}/berth-clients.XXXXXX")
  # AMQPS too, when the openssl CLI can make a CA, a server certificate and
  # a client certificate for guest (EXTERNAL, listed in auth.mechanisms
  # here since it is not offered by default, logs in by the CN).
  local tls_args=()
  if _broker_make_certs "$_broker_dir/tls"; then
    tls_args=(--amqps-listen 127.0.0.1:0
      --tls-cert-file "$_broker_dir/tls/server.crt" --tls-key-file "$_broker_dir/tls/server.key"
      --tls-ca-file "$_broker_dir/tls/ca.crt" --tls-verify-peer true
      --mechanism PLAIN --mechanism AMQPLAIN --mechanism EXTERNAL)
  fi
  NO_COLOR=1 RUST_LOG=${RUST_LOG:-info} "$bin" serve \
    --amqp-listen 127.0.0.1:0 --data-dir "$_broker_dir/data" "${tls_args[@]}" \
    2>"$_broker_dir/berth.log" >/dev/null &
  _broker_pid=$!

  local deadline=$((SECONDS + BROKER_READY_TIMEOUT_S)) addr=""
  while [ -z "$addr" ]; do
    # Strip colour codes in case the log ignores NO_COLOR; keep the first address.
    addr=$(sed 's/\x1b\[[0-9;]*m//g' "$_broker_dir/berth.log" |
      sed -n 's/.*berth ready amqp=\([^ ,]*\).*/\1/p' | head -n 1)
    [ -n "$addr" ] && break
    if ! kill -0 "$_broker_pid" 2>/dev/null; then
      echo "broker: berth exited before it was ready; its log:" >&2
      cat "$_broker_dir/berth.log" >&2
      _broker_pid=""
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "broker: no 'berth ready' line after ${BROKER_READY_TIMEOUT_S}s; its log:" >&2
      cat "$_broker_dir/berth.log" >&2
      return 1
    fi
    sleep 0.1
  done
  export BERTH_TEST_URI="amqp://guest:guest@$addr/"
  local tls_addr
  tls_addr=$(sed 's/\x1b\[[0-9;]*m//g' "$_broker_dir/berth.log" |
    sed -n 's/.*berth ready .*amqps=\([^ ,]*\).*/\1/p' | head -n 1)
  if [ -n "$tls_addr" ]; then
    export BERTH_TEST_AMQPS_URI="amqps://127.0.0.1:${tls_addr##*:}/"
    export BERTH_TEST_TLS_DIR="$_broker_dir/tls"
  fi
  echo "broker: started berth pid $_broker_pid at $BERTH_TEST_URI"
}

# A CA, a server certificate for localhost and a client certificate with
# CN=guest in DIR (ca.crt, server.crt/key, client.crt/key). Fails quietly
# without openssl.
_broker_make_certs() {
  local d=$1
  command -v openssl >/dev/null 2>&1 || return 1
  mkdir -p "$d" && (
    cd "$d" &&
      openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
        -subj /CN=berth-clients-ca &&
      for who in server:localhost client:guest; do
        n=${who%%:*}; cn=${who#*:}
        openssl req -new -newkey rsa:2048 -nodes -keyout "$n.key" -out "$n.csr" -subj "/CN=$cn" &&
          printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >"$n.ext" &&
          openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
            -out "$n.crt" -days 2 -extfile "$n.ext" || exit 1
      done
  ) >/dev/null 2>&1
}

# SIGTERM, up to 10 s of grace, then SIGKILL; prints the log if asked to.
broker_stop() {
  if [ -n "$_broker_pid" ]; then
    kill -TERM "$_broker_pid" 2>/dev/null
    local i
    for i in $(seq 1 100); do
      kill -0 "$_broker_pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$_broker_pid" 2>/dev/null; then
      echo "broker: berth did not stop on SIGTERM within 10 s; sending SIGKILL" >&2
      kill -KILL "$_broker_pid" 2>/dev/null
    fi
    wait "$_broker_pid" 2>/dev/null
    _broker_pid=""
  fi
  if [ -n "$_broker_dir" ]; then
    if [ "${1:-}" = "--show-log" ] && [ -s "$_broker_dir/berth.log" ]; then
      echo "---- berth log (last 50 lines) ----" >&2
      tail -n 50 "$_broker_dir/berth.log" >&2
    fi
    # --show-log is the failure path: BERTH_KEEP_TEST_DIRS=1 keeps the
    # data directory and log to look at.
    if [ "${1:-}" = "--show-log" ] && [ "${BERTH_KEEP_TEST_DIRS:-}" = 1 ]; then
      echo "BERTH_KEEP_TEST_DIRS: kept $_broker_dir" >&2
    else
      rm -rf "$_broker_dir"
    fi
    _broker_dir=""
  fi
  return 0
}
