#!/usr/bin/env bash
# Runs every test berth has: formatting, lints, unit and property tests,
# and black-box tests that start the real binary and drive it with real
# client libraries (Rust lapin, Python pika, Node amqplib, Go amqp091-go,
# Java amqp-client), the kill -9 loop (75 s), the cluster fault checker
# (three berth processes, 120 s of faults), a bounded fuzzing run of
# every decoder (scripts/fuzz.sh) and the packaging suite (the container
# image built with podman and tested black-box, the systemd unit, the
# Kubernetes manifests, a cluster whose peers are DNS names:
# tests/package/run.sh). Installs what it needs (idempotent) inside the
# work tree.
#
#   scripts/test.sh            # everything
#   SUITES="rust python" scripts/test.sh   # a subset
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
export BERTH_BIN="$root/target/release/berth"
SUITES=${SUITES:-"lint rust python clients kill9 cluster fuzz package"}

passed=0
failed=0
failed_names=()
run_suite() {
  local name=$1; shift
  echo "=== suite: $name"
  local start=$SECONDS
  if "$@"; then
    passed=$((passed + 1))
    echo "=== suite $name: ok ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1))
    failed_names+=("$name")
    echo "=== suite $name: FAILED ($((SECONDS - start)) s)"
  fi
}

ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust (https://rustup.rs) and re-run" >&2
    return 1
  fi
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt clippy >/dev/null 2>&1 || true
}

lint() {
  # Links between the docs: every file and heading anchor they name exists.
  python3 scripts/check-doc-links.py &&
    cargo fmt --all -- --check &&
    rustfmt --edition 2021 --check fuzz/fuzz_targets/*.rs fuzz/seed_corpus.rs &&
    cargo clippy --workspace --all-targets --release -- -D warnings
}

kill9() {
  # SIGKILL cycles under load with a ledger of every confirm and commit
  # (crates/cli/tests/kill9_loop.rs); prints the cycles and messages checked.
  cargo test --release -p berth-cli --test kill9_loop -- --ignored --nocapture
}

ensure_iptables() {
  # The cluster suite cuts links between members with iptables rules on
  # the test's own loopback addresses (needs root, as in CI).
  command -v iptables >/dev/null 2>&1 && return 0
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables >/dev/null
}

cluster() {
  # Three berth processes on loopback ports under leader kill -9, SIGSTOP,
  # network partitions (iptables) and a damaged follower log
  # (crates/cli/tests/cluster_faults.rs), every member killed at once, and
  # a follower removed, wiped and added again under load; prints per fault what was
  # attempted, confirmed, delivered and lost.
  ensure_iptables || { echo "cannot install iptables (the cluster suite's partitions need it)" >&2; return 1; }
  cargo test --release -p berth-cli --test cluster_faults -- --ignored --nocapture &&
    # A backlog larger than a frame (~500 MB of confirmed messages): every
    # member killed and restarted in turn, then the leader (~30 s).
    cargo test --release -p berth-cli --test cluster_backlog -- --ignored --nocapture &&
    # A wiped member beside a lagging one: refused, no leader without
    # the confirmed messages; then removed and added again (~20 s).
    cargo test --release -p berth-cli --test cluster_rejoin -- --ignored --nocapture &&
    # A follower whose disk (a tmpfs the test mounts) fills: its alarms
    # say so, it restarts by itself once there is room, and it takes over
    # with every confirmed message (~35 s).
    cargo test --release -p berth-cli --test cluster_disk_full -- --ignored --nocapture &&
    # A message's TTL keeps its original expiry when the leader is killed
    # (it expires on the new leader when it was due, ~15 s).
    cargo test --release -p berth-cli --test cluster_ttl -- --ignored --nocapture &&
    # Power loss of one member (its page cache lost: an ext4 loop device
    # copied while it is frozen) when its disk decides what survives (~25 s).
    ensure_loop_tools &&
    cargo test --release -p berth-cli --test cluster_power_loss -- --ignored --nocapture
}

ensure_loop_tools() {
  command -v mkfs.ext4 >/dev/null 2>&1 && command -v losetup >/dev/null 2>&1 && return 0
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq e2fsprogs mount >/dev/null ||
    { echo "cannot install e2fsprogs and losetup (the power-loss test needs them)" >&2; return 1; }
}

rust() {
  # The cluster TLS test makes its CA and certificates with the openssl CLI.
  command -v openssl >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
  } || { echo "cannot install openssl (the cluster TLS test needs it)" >&2; return 1; }
  # The MQTT tests (crates/cli/tests/mqtt.rs) drive berth with Debian's
  # mosquitto_pub and mosquitto_sub.
  command -v mosquitto_sub >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto-clients >/dev/null
  } || { echo "cannot install mosquitto-clients (the MQTT tests need it)" >&2; return 1; }
  # One release build shared by the binary and every test.
  cargo build --release --workspace --bins && cargo test --release --workspace
}

ensure_rust || exit 1
echo "=== building release binary"
cargo build --release -p berth-cli || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }

for s in $SUITES; do
  case $s in
    lint) run_suite lint lint ;;
    rust) run_suite rust rust ;;
    python) run_suite python tests/python/run.sh ;;
    clients) run_suite clients tests/clients/run.sh ;;
    kill9) run_suite kill9 kill9 ;;
    cluster) run_suite cluster cluster ;;
    # 10 decoders x 15 s: the whole run stays within its 45-minute budget.
    fuzz) FUZZ_SECONDS_PER_TARGET=${FUZZ_SECONDS_PER_TARGET:-15} run_suite fuzz scripts/fuzz.sh ;;
    package) run_suite package tests/package/run.sh ;;
    *) echo "unknown suite $s"; failed=$((failed + 1)) ;;
  esac
done

echo
[ ${#failed_names[@]} -gt 0 ] && echo "failed suites: ${failed_names[*]}"
echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
