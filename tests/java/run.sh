#!/usr/bin/env bash
# Java smoke test: com.rabbitmq:amqp-client against berth (or BERTH_TEST_URI).
# Maven only resolves the jars pinned in pom.xml into the repo-local cache
# .cache/m2 (and only when target/classpath.txt is missing or stale); then
# plain javac/java compile and run SmokeTest.java. Warm runs start no Maven
# and need no network.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$here"
. ../clients/broker.sh

need=()
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
if [ ${#need[@]} -gt 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null) ||
    { echo "java: cannot install ${need[*]}" >&2; exit 1; }
fi

classpath_file=target/classpath.txt
classpath_ok() {
  [ -s "$classpath_file" ] && [ "$classpath_file" -nt pom.xml ] || return 1
  local jar
  for jar in $(tr ':' ' ' <"$classpath_file"); do [ -f "$jar" ] || return 1; done
}
if ! classpath_ok; then
  mkdir -p target
  resolve() {
    mvn -B -q --no-transfer-progress -Dstyle.color=never -Dmaven.repo.local="$root/.cache/m2" "$@" \
      dependency:build-classpath -Dmdep.outputFile="$classpath_file"
  }
  # Offline first: the cache may already hold everything.
  resolve -o >/dev/null 2>&1 || resolve || { echo "java: resolving amqp-client failed" >&2; exit 1; }
fi

if [ ! -f target/classes/SmokeTest.class ] || [ SmokeTest.java -nt target/classes/SmokeTest.class ] ||
  [ "$classpath_file" -nt target/classes/SmokeTest.class ]; then
  rm -rf target/classes
  javac -Xlint:all -Werror -d target/classes -cp "$(cat "$classpath_file")" SmokeTest.java ||
    { echo "java: compile failed" >&2; exit 1; }
fi

trap 'broker_stop' EXIT
trap 'exit 130' INT TERM
broker_start || exit 1
# Short-lived JVM: skip tiered compilation past C1 for a quicker start.
timeout -k 5 180 java -XX:TieredStopAtLevel=1 -Xshare:auto \
  -cp "target/classes:$(cat "$classpath_file")" SmokeTest
rc=$?
[ $rc -ne 0 ] && broker_stop --show-log
exit $rc
