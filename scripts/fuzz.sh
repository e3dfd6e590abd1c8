#!/usr/bin/env bash
# Bounded fuzzing of berth's decoders (the targets in fuzz/): each target
# runs for FUZZ_SECONDS_PER_TARGET seconds (default 20) starting from the
# committed seed corpus (fuzz/corpus/<target>) plus what earlier runs on
# this machine found (fuzz/target/corpus/<target>, not committed). Any
# panic or failed check fails the run; libFuzzer keeps the input in
# fuzz/artifacts/<target>/ and the log says how to replay it.
#
#   scripts/fuzz.sh                                  # every target, 20 s each
#   FUZZ_SECONDS_PER_TARGET=600 scripts/fuzz.sh record   # one target, longer
#
# Installs cargo-fuzz (pinned) into .cache/tools on first use. Runs on the
# stable toolchain without a sanitizer: berth has no unsafe code, so the
# fuzzer's job is to find panics, which need no sanitizer.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
targets=${*:-frame content record checkpoint payload certname cluster delay mqtt stream}
seconds=${FUZZ_SECONDS_PER_TARGET:-20}
cargo_fuzz_version=0.13.2
tools="$root/.cache/tools"

if ! "$tools/bin/cargo-fuzz" --version 2>/dev/null | grep -q "$cargo_fuzz_version"; then
  echo "installing cargo-fuzz $cargo_fuzz_version into $tools"
  cargo install --locked --quiet --root "$tools" --version "$cargo_fuzz_version" cargo-fuzz || {
    echo "could not install cargo-fuzz" >&2
    exit 1
  }
fi
export PATH="$tools/bin:$PATH"

echo "building fuzz targets"
cargo fuzz build --sanitizer none >fuzz/target-build.log 2>&1 || {
  tail -40 fuzz/target-build.log
  echo "fuzz targets failed to build" >&2
  exit 1
}
rm -f fuzz/target-build.log

failed=0
for t in $targets; do
  scratch="fuzz/target/corpus/$t"
  mkdir -p "$scratch" "fuzz/artifacts/$t"
  log="fuzz/target/fuzz-$t.log"
  cargo fuzz run --sanitizer none "$t" "$scratch" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1 | awk '{print $2}')
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $t: ${runs:-?} executions in ${seconds} s, 0 failures"
  else
    echo "fuzz $t: FAILED (exit $rc); last lines of $log:"
    tail -40 "$log"
    echo "replay: cargo fuzz run --sanitizer none $t fuzz/artifacts/$t/<file>"
    failed=1
  fi
done
exit "$failed"
