#!/usr/bin/env bash
# What writing into the page cache costs this machine, GiB after GiB
# (docs/BENCHMARKS.md, "What slows a deep fill"): dd appends 1 GiB at a
# time (1 MiB writes, no sync) to one file and prints each GiB's system
# CPU and the free memory left. On a VM whose freed memory goes back to
# the host (virtio-balloon free page reporting), a page the host no longer
# backs costs far more to fill than one it still does, whoever writes it.
#
#   scripts/page-cache-cost.sh [GIB] [DIR]      # default 18 GiB under /var/tmp
#
# Needs GIB GiB free in DIR; the file is removed on exit. Not part of
# scripts/test.sh; run it under `flock /tmp/berth-bench.lock` on a shared
# machine.
set -euo pipefail
gib=${1:-18}
dir=${2:-/var/tmp}
f=$(mktemp "$dir/berth-page-cache-cost-XXXXXX")
trap 'rm -f "$f"' EXIT
echo "# $(uname -r); page_reporting_order $(cat /sys/module/page_reporting/parameters/page_reporting_order 2>/dev/null || echo none); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# GiB  sys_s  elapsed_s  free_MiB_after"
for i in $(seq 1 "$gib"); do
  t=$( { /usr/bin/time -f "%S %e" dd if=/dev/zero of="$f" bs=1M count=1024 oflag=append conv=notrunc status=none; } 2>&1 )
  echo "$i $t $(free -m | awk '/^Mem/{print $4}')"
done
