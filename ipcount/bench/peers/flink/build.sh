#!/usr/bin/env bash
# Build the Flink peer with Maven once into the cache (classes + runtime jars), again only when
# its source or pom.xml changed. Maven resolves Flink's jars from Maven Central into ~/.m2 the
# first time (a few minutes, ~150 MB).
#   FLINK_PEER_HOME [${XDG_CACHE_HOME:-~/.cache}/ipcount/flink-peer]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
B=${FLINK_PEER_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/ipcount/flink-peer}
if [ -f "$B/target/.built" ] && diff -rq "$HERE/src" "$B/src" >/dev/null 2>&1 && cmp -s "$HERE/pom.xml" "$B/pom.xml"; then exit 0; fi
if ! command -v mvn >/dev/null; then
    echo "building the Flink peer needs Maven 3.8+ and Java 17 (mvn is not on the PATH):" \
        "on Debian/Ubuntu 'apt-get install maven openjdk-17-jdk-headless', else" \
        "https://maven.apache.org/install.html" >&2
    exit 2
fi
if ! command -v javac >/dev/null && [ ! -x "${JAVA_HOME:-/nonexistent}/bin/javac" ]; then
    echo "building the Flink peer needs a Java 17 JDK (javac is not on the PATH): on" \
        "Debian/Ubuntu 'apt-get install openjdk-17-jdk-headless', or set JAVA_HOME" >&2
    exit 2
fi
mkdir -p "$B"; rm -rf "$B/src"; cp -r "$HERE/src" "$HERE/pom.xml" "$B/"
cd "$B"
echo "building the Flink peer in $B (Maven; the first build downloads Flink's jars)" >&2
mvn -q -B package -DskipTests
mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=target/lib
touch target/.built
echo "built the Flink peer in $B: $(ls target/lib | wc -l) jars" >&2
