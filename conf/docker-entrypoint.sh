#!/usr/bin/env bash
# Container entry point. Subcommands:
#   job [run options]   spark-submit the job, exactly as docs/deployment.md documents (the default;
#                       bare options such as --available-now go to it too)
#   loadgen ...         the load generator (synth, serve)
#   ipcount ...         any ipcount command (consume, verify, topics, ...)
#   anything else       run as given (e.g. bash)
# Environment (names without the IPCOUNT_ prefix, which is reserved for settings):
#   SPARK_MASTER_URL          spark-submit --master (default local[*])
#   SPARK_SUBMIT_EXTRA_ARGS   more spark-submit options, split on spaces (e.g. --conf k=v)
#   APP_DIR                   where the ipcount source tree is (default /opt/ipcount)
#   IPCOUNT_CONFIG            the settings file; IPCOUNT_<SECTION>_<KEY> override settings
#   JOB_MARKER                file the job subcommand writes (default /tmp/ipcount-job): the
#                             image's HEALTHCHECK (conf/docker-healthcheck.sh) probes only the job
set -uo pipefail

APP_DIR="${APP_DIR:-/opt/ipcount}"
SPARK_MASTER_URL="${SPARK_MASTER_URL:-local[*]}"
IPCOUNT_CONFIG="${IPCOUNT_CONFIG:-$APP_DIR/conf/ipcount.toml}"
export IPCOUNT_CONFIG

# The Python driver is the child of the spark-submit JVM that runs ipcount/__main__.py.
driver_pid() {
    local stat pid ppid
    for stat in /proc/[0-9]*/stat; do
        read -r pid _ _ ppid _ <"$stat" 2>/dev/null || continue
        [ "$ppid" = "$1" ] || continue
        if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'ipcount/__main__.py'; then
            echo "$pid"
            return
        fi
    done
}

# SIGTERM to the JVM would stop the SparkContext under the running query; SIGTERM to the Python
# driver stops the queries cleanly (a micro-batch in flight is cancelled and replayed at the next
# start; then the JVM exits on its own).
forward() {
    local driver
    driver="$(driver_pid "$submit_pid")"
    echo "entrypoint: stopping the job (driver pid ${driver:-not started yet})" >&2
    kill -TERM "${driver:-$submit_pid}" 2>/dev/null || true
}

job() {
    local extra=()
    read -ra extra <<<"${SPARK_SUBMIT_EXTRA_ARGS:-}"  # split on spaces, no globbing
    spark-submit --master "$SPARK_MASTER_URL" "${extra[@]}" \
        "$APP_DIR/ipcount/__main__.py" --config "$IPCOUNT_CONFIG" run "$@" &
    submit_pid=$!
    echo "$submit_pid" >"${JOB_MARKER:-/tmp/ipcount-job}" 2>/dev/null || true
    trap forward TERM INT
    while kill -0 "$submit_pid" 2>/dev/null; do
        wait "$submit_pid"
    done
    wait "$submit_pid"
}

command="${1:-job}"
[ $# -gt 0 ] && shift
case "$command" in
    job) job "$@" ;;
    -*) job "$command" "$@" ;;
    loadgen | ipcount) exec "$command" "$@" ;;
    *) exec "$command" "$@" ;;
esac
