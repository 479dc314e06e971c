#!/usr/bin/env bash
# One run, identical input, one clock: the seed's Flink job (Flink 2.2, EXACTLY_ONCE, 5 s checkpoints)
# against ipcount, N records keyed by client IP, each on a fresh single-node Apache Kafka started by
# ipcount's own CLI. Clock: from the job's launch to the last expected (window, IP) result visible
# to a read_committed reader (time_job.py); exactness against the generator's truth (load_input.py).
#
#   ipcount/bench/peers/compare.sh [N]     from anywhere; uses this checkout and its .venv
#   IPC_VENV=<venv> (default <repo>/.venv), CASES="flink-keyed ipcount-keyed" (default; also
#   flink-nullkey ipcount-nullkey), PORT (49393), WORK (~/.cache/ipcount/peer-compare), QUIET_WAIT
# Needs Java 17 and Maven (the Flink peer is built once into ~/.cache/ipcount/flink-peer by
# flink/build.sh). Run it on a quiet machine: it waits up to QUIET_WAIT s (600) for the load to
# drop before each case. An ipcount run that trained the install's JVM class archive (its first,
# a one-time cost like the Flink build) is reported on a line of its own and timed again.
# Last line: compare: N=.. flink_keyed=events/s ipcount_keyed=events/s ratio=ipcount/flink exact=..
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
H=$HERE
N=${1:-1000000}
PROJECT=${PROJECT:-$(cd "$HERE/../../.." && pwd)}
IPC_VENV=${IPC_VENV:-$PROJECT/.venv}
PY=$IPC_VENV/bin/python
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/ipcount
WORK=${WORK:-$CACHE/peer-compare}
PORT=${PORT:-49393}
CASES=${CASES:-"flink-keyed ipcount-keyed"}
[ -x "$IPC_VENV/bin/ipcount" ] || { echo "no ipcount in $IPC_VENV: make the venv (README: Development) or set IPC_VENV" >&2; exit 2; }
START=$(date -u -d '-2 hours' +%Y-%m-%dT%H:00:00Z)   # Kafka 4 refuses timestamps > 1 h ahead
BS=127.0.0.1:$PORT
mkdir -p "$WORK"
export FLINK_PEER_HOME=${FLINK_PEER_HOME:-$CACHE/flink-peer}
"$HERE/flink/build.sh" >&2 || exit 2
BROKER_DIR=""; BROKER_PID=""
kenv() { env IPCOUNT_BROKER_KIND=kafka IPCOUNT_BROKER_PORT="$PORT" IPCOUNT_BROKER_DATA_DIR="$BROKER_DIR" "$@"; }
stop_broker() { [ -n "$BROKER_DIR" ] && (cd "$PROJECT" && kenv "$IPC_VENV/bin/ipcount" broker stop) >/dev/null 2>&1; BROKER_DIR=""; }
trap stop_broker EXIT
start_broker() {
  BROKER_DIR=$1
  out=$(cd "$PROJECT" && kenv "$IPC_VENV/bin/ipcount" broker start 2>&1) || { echo "broker did not start: $out" >&2; exit 2; }
  BROKER_PID=$(sed -n 's/.*pid \([0-9]*\).*/\1/p' <<<"$out" | tail -1)
}
busy() { local a b; a=$(head -1 /proc/stat); sleep 3; b=$(head -1 /proc/stat)
  awk -v a="$a" -v b="$b" -v n="$(nproc)" 'BEGIN{split(a,x);split(b,y);t=0;for(i=2;i<=9;i++)t+=y[i]-x[i];printf "%.2f",(t-(y[5]-x[5])-(y[6]-x[6]))*n/t}'; }
wait_quiet() { local end=$(( $(date +%s) + ${QUIET_WAIT:-600} ))
  while awk -v b="$(busy)" 'BEGIN{exit !(b>=0.3)}'; do
    [ "$(date +%s)" -ge "$end" ] && { echo "WARNING: machine busy, timing skewed" >&2; return; }
    sleep 10; done; }
declare -A RATE EXACT
# One case on a fresh broker with freshly loaded input; sets RUN (its directory).
run_case() {
  local c=$1 km=ip
  wait_quiet
  RUN=$WORK/$c-$(date +%H%M%S); mkdir -p "$RUN"
  start_broker "$RUN/broker"
  case "$c" in *-nullkey) km=none;; esac
  "$PY" "$H/load_input.py" load --bootstrap "$BS" --workdir "$RUN" --n "$N" --key-mode $km --start "$START" >"$RUN/gen.log" 2>&1 || { echo "gen failed" >&2; exit 2; }
  if [ "${c%%-*}" = flink ]; then
    "$PY" "$H/time_job.py" --workdir "$RUN" --name "$c" --bootstrap "$BS" --tail preload --broker-pid "$BROKER_PID" -- \
      "$HERE/flink/run.sh" --bootstrap "$BS" --checkpoint-dir "$RUN/ckpt" --parallelism 2 \
      --checkpoint-interval-ms "${FLINK_CKPT_MS:-5000}" >"$RUN/bench.out" 2>&1
  else
    SET=(--set "kafka.bootstrap_servers=$BS" --set topics.source=access-log --set topics.sink=ip-counts
         --set "topics.progress=ipc-progress" --set "job.checkpoint_location=$RUN/ckpt")
    (cd "$PROJECT" && "$IPC_VENV/bin/ipcount" "${SET[@]}" topics create) >"$RUN/topics.log" 2>&1 || { echo "topics failed" >&2; exit 2; }
    (cd "$PROJECT" && "$PY" "$H/time_job.py" --workdir "$RUN" --name "$c" --bootstrap "$BS" --tail preload --tail-results-ok \
      --broker-pid "$BROKER_PID" -- "$IPC_VENV/bin/ipcount" "${SET[@]}" run) >"$RUN/bench.out" 2>&1
  fi
  stop_broker; rm -rf "$RUN/broker" "$RUN/ckpt"
}
for c in $CASES; do
  run_case "$c"
  # The first `ipcount run` of an install (or after an upgrade) trains its JVM class archive: a
  # one-time cost, like the Flink peer's Maven build above, so that run is not the figure.
  if [ "${c%%-*}" = ipcount ] && grep -q "writing the JVM class archive" "$RUN/$c.log"; then
    echo "$c: $(tail -1 "$RUN/bench.out" | sed 's/^[^:]*: //') (the install's first run: it trained the JVM class archive; timed again)"
    run_case "$c"
  fi
  line=$(tail -1 "$RUN/bench.out"); echo "$line"
  RATE[$c]=$(sed -n 's/.*events_per_s=\([0-9]*\).*/\1/p' <<<"$line"); RATE[$c]=${RATE[$c]:-0}
  EXACT[$c]=$(sed -n 's/.*exact=\([a-z]*\).*/\1/p' <<<"$line"); EXACT[$c]=${EXACT[$c]:-false}
done
ex=true; for c in $CASES; do [ "${EXACT[$c]}" = true ] || ex=false; done
ratio=$(awk -v a="${RATE[ipcount-keyed]:-0}" -v b="${RATE[flink-keyed]:-0}" 'BEGIN{printf "%.2f", b ? a/b : 0}')
all=""; for c in $CASES; do all="$all ${c//-/_}=${RATE[$c]}"; done
echo "compare: N=$N$all ratio=$ratio exact=$ex"
[ "$ex" = true ]
