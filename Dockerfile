# ipcount in one image: the Spark job (spark-submit, local[*] or a standalone cluster), the load
# generator and the consumer/verifier. Build: docker build -t ipcount .
#   docker run ipcount                        # the job (SPARK_MASTER_URL, default local[*])
#   docker run ipcount loadgen synth ...      # the generator;  docker run ipcount ipcount consume
# Config: mount a settings file at /etc/ipcount/ipcount.toml and/or pass IPCOUNT_* env vars.
# bookworm (Debian 12) is pinned because it packages Java 17, which Spark 4.3 runs on.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# openjdk's post-install links its man pages and fails on slim images without this directory.
# tini is PID 1: it reaps zombies and hands SIGTERM to the entry point, which stops the job cleanly.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
    && rm -rf /var/lib/apt/lists/*

# The source tree stays in /opt/ipcount: spark-submit runs /opt/ipcount/ipcount/__main__.py and
# conf/ is the Spark conf dir (spark-defaults.conf, log4j2.properties).
WORKDIR /opt/ipcount
COPY pyproject.toml setup.py README.md ./
COPY ipcount ./ipcount
COPY loadgen ./loadgen
COPY conf ./conf
# The job's dependencies and the [loadgen] extra (`loadgen serve`, Locust); not [bench] or [dev].
# gcc builds ipcount's two compiled helpers (setup.py: the read tasks' native reader and prefix
# scan, ~2 us less CPU per record) and is removed again; the check fails the build without them.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install '/opt/ipcount[loadgen]' \
    && /opt/venv/bin/python -c 'import ipcount.source._fastread, ipcount.formats._prefix_scan' \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && chmod 0755 /opt/ipcount/conf/docker-entrypoint.sh /opt/ipcount/conf/docker-healthcheck.sh
# The default settings; mount your own file over it (or point IPCOUNT_CONFIG elsewhere).
COPY conf/ipcount.toml /etc/ipcount/ipcount.toml

# IPCOUNT_METRICS_*: the job serves /metrics and /healthz on 9464. They listen on 127.0.0.1 by
# default; the image opts in to every interface (0.0.0.0) so that they are reachable from outside the
# container (Prometheus, the HEALTHCHECK below, Kubernetes probes).
# PYSPARK_PYTHON: driver and executors run the venv's interpreter (a cluster's workers built from
# this image have it at the same path).
ENV PATH=/opt/venv/bin:$PATH \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    SPARK_CONF_DIR=/opt/ipcount/conf \
    APP_DIR=/opt/ipcount \
    IPCOUNT_CONFIG=/etc/ipcount/ipcount.toml \
    SPARK_MASTER_URL=local[*] \
    IPCOUNT_METRICS_PORT=9464 \
    IPCOUNT_METRICS_HOST=0.0.0.0

RUN useradd --create-home --uid 10001 --user-group ipcount \
    && mkdir -p /var/lib/ipcount \
    && chown ipcount:ipcount /var/lib/ipcount
USER ipcount
# The job's relative checkpoint (job.checkpoint_location) lands here; on a cluster use shared storage.
WORKDIR /var/lib/ipcount
VOLUME ["/var/lib/ipcount"]

# 4040 Spark UI (when spark.ui.enabled), 7078/7079 driver and block manager ports for executors on
# a cluster (set spark.driver.port / spark.blockManager.port to them), 8080 `loadgen serve`,
# 9464 the job's /metrics and /healthz.
EXPOSE 4040 7078 7079 8080 9464

# The job's /healthz (503 when its query stopped, failed or stalls with records waiting); other
# commands run in this image are always healthy. The start period covers the JVM's start-up.
HEALTHCHECK --interval=30s --timeout=10s --start-period=180s --retries=3 \
    CMD ["/opt/ipcount/conf/docker-healthcheck.sh"]

ENTRYPOINT ["/usr/bin/tini", "--", "/opt/ipcount/conf/docker-entrypoint.sh"]
CMD ["job"]
