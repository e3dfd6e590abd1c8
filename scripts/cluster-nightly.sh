#!/usr/bin/env bash
# The cluster fault tests run longer than the test command's time budget
# allows ("nightly-style"; not part of scripts/test.sh):
#
#   scripts/cluster-nightly.sh [--budget S] [--backlog-mib N]
#                              [--power-rounds N] [--seed N] [--out DIR]
#
# - cluster_faults: every fault phase under load for S seconds in all
#   (default 1800; the test command gives it 150), seeded (--seed, or a
#   random one, printed);
# - cluster_backlog: a backlog of N MiB of confirmed, unconsumed 1 MiB
#   messages (default 1024), every member killed with kill -9 and started
#   again in turn, then the leader; each member's peak RSS printed;
# - cluster_power_loss: N rounds (default 10) of one member losing its
#   page cache while its disk decides what survives.
# Needs root (iptables, loop devices, mount), as the cluster suite does.
# Each test's output goes to OUT (default target/cluster-nightly/DATE) and
# the summary lines to OUT/summary.txt. Exit status: non-zero if any failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
budget=1800 backlog=1024 power=10 seed=${BERTH_TEST_SEED:-} out=""
while [ $# -gt 0 ]; do
  case $1 in
    --budget) budget=$2; shift 2 ;;
    --backlog-mib) backlog=$2; shift 2 ;;
    --power-rounds) power=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "needs root (iptables, loop devices, mount)" >&2; exit 2; }
out=${out:-target/cluster-nightly/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
[ -n "$seed" ] && export BERTH_TEST_SEED=$seed
free_gib=$(df -BG --output=avail "${TMPDIR:-/tmp}" | tail -1 | tr -dc 0-9)
need_gib=$(( backlog * 4 / 1024 + 2 ))
[ "$free_gib" -ge "$need_gib" ] ||
  { echo "${TMPDIR:-/tmp} has ${free_gib} GiB free; a ${backlog} MiB backlog needs about ${need_gib} GiB" >&2; exit 2; }

echo "commit $(git rev-parse --short HEAD), $(nproc) CPUs, $(date -u)" | tee "$out/summary.txt"
cargo build --release -p berth-cli || exit 1
failed=0
run() {
  local name=$1; shift
  echo "=== $name" | tee -a "$out/summary.txt"
  local start=$SECONDS
  if env "$@" cargo test --release -p berth-cli --test "$name" -- --ignored --nocapture > "$out/$name.log" 2>&1; then
    echo "ok ($((SECONDS - start)) s)" | tee -a "$out/summary.txt"
  else
    failed=$((failed + 1))
    echo "FAILED ($((SECONDS - start)) s): see $out/$name.log" | tee -a "$out/summary.txt"
  fi
  grep -E "seed|lost|filled|peak|power loss round|back after|attempted" "$out/$name.log" | head -60 >> "$out/summary.txt"
}
run cluster_faults BERTH_CLUSTER_BUDGET_S="$budget"
run cluster_backlog BERTH_BACKLOG_MIB="$backlog"
run cluster_power_loss BERTH_POWER_LOSS_ROUNDS="$power"
echo "failed: $failed" | tee -a "$out/summary.txt"
[ "$failed" -eq 0 ]
