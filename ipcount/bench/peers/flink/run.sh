#!/usr/bin/env bash
# Run the Flink peer (a local MiniCluster in this JVM), e.g.
#   run.sh --bootstrap 127.0.0.1:PORT --checkpoint-dir DIR --parallelism 2 --checkpoint-interval-ms 5000
# Other options: --in-topic access-log --out-topic ip-counts --group --txn-prefix --out-of-orderness-ms 0
# --idleness-ms 10000. Log: <checkpoint-dir>.flink.log (or $FLINK_LOG). SIGTERM cancels the job, exit 0.
set -euo pipefail
B=${FLINK_PEER_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/ipcount/flink-peer}
ckpt=/tmp/flink-ckpt; args=("$@")
for ((i = 0; i < ${#args[@]} - 1; i++)); do [ "${args[$i]}" = --checkpoint-dir ] && ckpt=${args[$((i + 1))]}; done
LOG=${FLINK_LOG:-${ckpt%/}.flink.log}; mkdir -p "$(dirname "$LOG")"
[ -f "$B/target/.built" ] || { echo "run $(dirname "$0")/build.sh first" >&2; exit 2; }
# shellcheck disable=SC2086
exec java ${JAVA_OPTS:--Xms512m -Xmx1g} -Dlog.file="$LOG" -cp "$B/target/classes:$B/target/lib/*" peerbench.ExactlyOnceIpCount "$@"
