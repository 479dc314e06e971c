#!/usr/bin/env bash
# The image's HEALTHCHECK. In a container running the job (the entry point's `job` subcommand
# wrote JOB_MARKER), healthy means the driver's /healthz answers 200 (metrics.port and
# metrics.host, which the image sets with IPCOUNT_METRICS_PORT and IPCOUNT_METRICS_HOST: a
# specific address is probed there, every interface (0.0.0.0, ::) on 127.0.0.1); its one-line
# reason is printed either way (docker inspect shows it). Containers running other commands
# (loadgen, ipcount consume, bash) are always healthy.
set -uo pipefail

[ -e "${JOB_MARKER:-/tmp/ipcount-job}" ] || { echo "not the job: nothing to check"; exit 0; }
port="${IPCOUNT_METRICS_PORT:-0}"
[ "$port" != "0" ] || { echo "metrics.port is 0: /healthz is off"; exit 0; }
host="${IPCOUNT_METRICS_HOST:-127.0.0.1}"
host="${host#[}" && host="${host%]}"
case "$host" in
  "" | 0.0.0.0 | ::) host=127.0.0.1 ;;
  *:*) host="[$host]" ;; # an IPv6 address, bracketed in the URL
esac
exec "${PYTHON:-python}" - "http://$host:$port/healthz" <<'PY'
import sys, urllib.error, urllib.request

try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as resp:
        print(resp.read().decode().strip())
        sys.exit(0)
except urllib.error.HTTPError as err:
    print(err.read().decode().strip() or f"HTTP {err.code}")
except OSError as exc:
    print(f"no answer from {sys.argv[1]}: {exc}")
sys.exit(1)
PY
