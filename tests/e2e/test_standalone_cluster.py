"""The job on a Spark standalone cluster (a master and two workers on 127.0.0.1) through spark-submit,
both ways of shipping the code: installed on every node (a continuous run through the container
entry point, stopped by SIGTERM) and a zip passed with --py-files to an interpreter that has the
dependencies but not ipcount (an --available-now run resuming from the same checkpoint); and
executors and a whole worker killed while the job runs."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from confluent_kafka import Producer

from ipcount.childproc import session_processes
from ipcount.config import Settings
from ipcount.formats.accesslog import format_record
from ipcount.formats.avro import make_codec
from ipcount.kafka.records import decode_records
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.local.cluster import StandaloneCluster, spark_home
from ipcount.verify.compare import verify_sink
from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_795_341_600_000  # a multiple of 5000
RUN_TIMEOUT = 240  # a guard for loaded machines; a run takes ~60-120 s on 2 busy cores
IPS = [f"172.16.0.{i}" for i in range(1, 13)] + ["fd00::a", "fd00::b"]


def _produce(settings: Settings, ledger: Ledger, start_ms: int, n: int) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})
    for i in range(n):
        ip = IPS[i % len(IPS)]
        ms = T0 + start_ms + (i * 53) % 25_000
        value = format_record(ip, ms).encode()
        producer.produce(settings.topics.source, value=value, partition=i % 3, timestamp=ms)
        ledger.add(ms, ip)
    assert producer.flush(10) == 0


def _settings_env(settings: Settings) -> dict[str, str]:
    return {
        "IPCOUNT_KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "IPCOUNT_TOPICS_SOURCE": settings.topics.source,
        "IPCOUNT_TOPICS_SINK": settings.topics.sink,
        "IPCOUNT_TOPICS_PROGRESS": settings.topics.progress,
        "IPCOUNT_TOPICS_LATE": settings.topics.late,
        "IPCOUNT_TOPICS_DEAD_LETTER": settings.topics.dead_letter,
        "IPCOUNT_JOB_CHECKPOINT_LOCATION": settings.job.checkpoint_location,
        # 2 executor cores in all: one stateful task each per micro-batch.
        "IPCOUNT_SPARK_SHUFFLE_PARTITIONS": "2",
    }


def _spark_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a spark-submit against the test's cluster, its settings by env vars."""
    env = {
        **os.environ,
        **_settings_env(settings),
        "SPARK_CONF_DIR": str(ROOT / "conf"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **extra,
    }
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    return env


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A started master and two workers of one core each, shared by this module's tests (each
    runs its own applications on it, each application its own executors and event log): the
    cluster's three JVMs start once, not once per test."""
    cluster = StandaloneCluster(
        tmp_path_factory.mktemp("cluster"), workers=2, cores=1, memory="1g", conf_dir=ROOT / "conf"
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _start(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start a spark-submit in its own process group, output (driver logs included) to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop_left(runs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL the process group of every run still going (a failed test's driver): nothing of
    one test keeps the shared cluster's cores from the next."""
    for proc in runs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _finish(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> str:
    """Wait for a started run (killing its group on timeout); assert it exited 0; its output."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("at ")]
    assert proc.returncode == 0, f"exit {proc.returncode} ({log}):\n" + "\n".join(lines[-60:])
    return text


def _verify(env: dict[str, str], ledger: Ledger, tmp_path: Path) -> str:
    """`ipcount verify` against `ledger` (saved under tmp_path); asserts it exited 0; its last
    line."""
    ledger.save(tmp_path / "ledger.jsonl")
    verify = subprocess.run(
        [sys.executable, "-m", "ipcount", "verify", "--ledger", str(tmp_path / "ledger.jsonl")],
        env={**env, "IPCOUNT_CONFIG": str(ROOT / "conf" / "ipcount.toml")},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    return verify.stdout.strip().splitlines()[-1]


def _committed_results(settings: Settings) -> int:
    """How many (window, ip) counts a read_committed reader sees in the sink topic."""
    codec = make_codec(settings.sink.wire_format)
    with TopicReader(settings.kafka.to_librdkafka("consumer"), settings.topics.sink) as reader:
        return sum(1 for _ in decode_records(reader.read_to_end(30), codec))


def _bare_interpreter(where: Path) -> Path:
    """A venv that sees this venv's packages (pyspark, confluent-kafka, ...) but not ipcount: a node
    with the dependencies installed and the job's code shipped by --py-files only."""
    subprocess.run(
        [
            getattr(sys, "_base_executable", sys.executable),
            "-m",
            "venv",
            "--without-pip",
            str(where),
        ],
        check=True,
        timeout=60,
    )
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # A plain path line: the editable-install hook in this venv's site-packages is not run.
    Path(purelib, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _event_log(events: Path, app_id: str) -> list[dict]:
    files = [p for p in events.iterdir() if p.name.startswith(app_id)]
    assert len(files) == 1, files
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


def _app_ids(events: Path) -> set[str]:
    return {p.name.split(".")[0] for p in events.iterdir()}


def _check_ran_on_workers(events: list[dict], cluster: StandaloneCluster) -> dict[str, int]:
    """Executors ran on both workers and every task ran on an executor; returns tasks per worker."""
    worker_of = {}  # executor id -> worker index, from the executor's log URL (worker web UI port)
    ports = {w.webui_port: i for i, w in enumerate(cluster.workers)}
    for e in events:
        if e["Event"] == "SparkListenerExecutorAdded":
            url = urlparse(e["Executor Info"]["Log Urls"]["stderr"])
            assert url.hostname == "127.0.0.1", url
            assert parse_qs(url.query)["executorId"] == [e["Executor ID"]]
            worker_of[e["Executor ID"]] = ports[url.port]
    assert sorted(worker_of.values()) == [0, 1], worker_of
    tasks: Counter[int] = Counter()
    for e in events:
        if e["Event"] == "SparkListenerTaskEnd":
            executor = e["Task Info"]["Executor ID"]
            assert executor in worker_of, f"task ran on {executor!r}, not on a worker's executor"
            tasks[worker_of[executor]] += 1
    assert tasks[0] > 0 and tasks[1] > 0, tasks
    return dict(tasks)


def test_job_on_standalone_cluster_both_shipping_routes(  # type: ignore[no-untyped-def]
    make_settings, tmp_path: Path, two_workers: StandaloneCluster
) -> None:
    started = time.monotonic()
    settings = make_settings()
    ensure_topics(settings)
    ledger = Ledger()
    _produce(settings, ledger, 0, 3_000)

    bare = _bare_interpreter(tmp_path / "bare")
    no_ipcount = subprocess.run(
        [str(bare), "-c", "import confluent_kafka, fastavro, pyarrow, pyspark, ipcount"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert "No module named 'ipcount'" in no_ipcount.stderr, no_ipcount.stderr
    # The build command of docs/deployment.md for the --py-files archive.
    dist = tmp_path / "dist"
    dist.mkdir()
    subprocess.run(
        [sys.executable, "-m", "zipfile", "-c", str(dist / "ipcount.zip"), "ipcount"],
        cwd=ROOT,
        check=True,
        timeout=60,
    )

    events = tmp_path / "events"
    events.mkdir()
    common = [
        "--conf", "spark.executor.memory=512m",
        "--conf", "spark.executor.cores=1",
        "--conf", "spark.cores.max=2",
        "--conf", "spark.eventLog.enabled=true",
        # One plain JSON-lines file per application (Spark 4 rolls and zstd-compresses by default).
        "--conf", "spark.eventLog.rolling.enabled=false",
        "--conf", "spark.eventLog.compress=false",
        "--conf", f"spark.eventLog.dir=file://{events}",
    ]  # fmt: skip
    env = _spark_env(settings)
    cluster = two_workers
    started_runs: list[subprocess.Popen[bytes]] = []
    try:
        # 1. Installed on every node (same interpreter path), through the container entry point,
        # running continuously until every window of the first round is committed; then SIGTERM,
        # as `docker stop` sends it: the entry point hands it to the Python driver, which stops
        # the query cleanly.
        job = _start(
            [str(ROOT / "conf" / "docker-entrypoint.sh"), "job"],
            {
                **env,
                "PYSPARK_PYTHON": sys.executable,
                "APP_DIR": str(ROOT),
                "IPCOUNT_CONFIG": str(ROOT / "conf" / "ipcount.toml"),
                "SPARK_MASTER_URL": cluster.master_url,
                "SPARK_SUBMIT_EXTRA_ARGS": " ".join(common),
            },
            tmp_path,
            tmp_path / "first.log",
        )
        started_runs.append(job)
        deadline = time.monotonic() + RUN_TIMEOUT
        while _committed_results(settings) < len(ledger.counts):
            assert job.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "first round not committed in time"
            time.sleep(2)
        job.send_signal(signal.SIGTERM)
        first_log = _finish(job, tmp_path / "first.log", 60)
        assert "entrypoint: stopping the job (driver pid " in first_log
        assert "received SIGTERM: stopping the queries" in first_log
        first_app = _app_ids(events)
        print(f"installed route stopped after {time.monotonic() - started:.1f}s")
        # Every window so far is closed: the next records are later in event time.
        _produce(settings, ledger, 60_000, 3_000)
        # 2. The code shipped with --py-files to nodes that only have the dependencies.
        second = _start(
            [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url]
            + ["--py-files", str(dist / "ipcount.zip"), *common]
            + [
                str(ROOT / "ipcount" / "__main__.py"),
                "--config",
                str(ROOT / "conf" / "ipcount.toml"),
            ]
            # The last run: the input is finished, every window is emitted.
            + ["run", "--available-now", "--close-all-windows"],
            # PYTHONPATH too: the driver JVM's Python data source processes do not get --py-files.
            {**env, "PYSPARK_PYTHON": str(bare), "PYTHONPATH": str(dist / "ipcount.zip")},
            tmp_path,
            tmp_path / "second.log",
        )
        started_runs.append(second)
        _finish(second, tmp_path / "second.log", RUN_TIMEOUT)
        second_app = _app_ids(events) - first_app
        print(f"--py-files route done after {time.monotonic() - started:.1f}s")
    finally:
        _stop_left(started_runs)

    last = _verify(env, ledger, tmp_path)
    assert last.endswith("missing=0 duplicates=0 wrong=0 exact=true"), last
    assert f"results={len(ledger.counts)}" in last

    # Both applications really ran their tasks on the two workers' executors.
    assert len(first_app) == 1 and len(second_app) == 1, (first_app, second_app)
    for app in (*first_app, *second_app):
        tasks = _check_ran_on_workers(_event_log(events, app), cluster)
        print(f"{app}: tasks per worker {tasks}")
        for work_dir in cluster.work_dirs:
            executors = list((work_dir / app).iterdir())
            assert len(executors) == 1, executors
            stderr = (executors[0] / "stderr").read_text()
            # The workers' SPARK_CONF_DIR gives their executors conf/log4j2.properties: no INFO
            # line of Spark's. (ipcount's own lines from the Python workers follow the job's
            # level, which the sink passes to them.)
            spark_info = [
                ln for ln in stderr.splitlines() if " INFO " in ln and " ipcount." not in ln
            ]
            assert not spark_info, spark_info[:20]
            # --py-files: the archive was fetched into the executor's working dir.
            shipped = (executors[0] / "ipcount.zip").is_file()
            assert shipped == (app in second_app), (app, list(executors[0].iterdir()))
    print(f"standalone cluster test: {time.monotonic() - started:.1f}s")


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _kill_executor(worker_pid: int) -> list[int]:
    """SIGKILL a worker's executor: its JVM and its Python workers (everything in the worker's
    session but the worker JVM itself, which stays and reports the executor lost)."""
    victims = [p for p in session_processes(worker_pid) if p != worker_pid]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return victims


def _batches(checkpoint: Path, log: str) -> int:
    d = checkpoint / log
    return (
        max((int(p.name) for p in d.iterdir() if p.name.isdigit()), default=-1)
        if d.is_dir()
        else -1
    )


def test_executor_and_worker_kills_cost_task_retries_and_stay_exact(  # type: ignore[no-untyped-def]
    make_settings, tmp_path: Path, two_workers: StandaloneCluster
) -> None:
    """Five SIGKILLs of one worker's executor (its JVM and Python workers) at random moments of a
    running micro-batch, then a SIGKILL of a whole worker (restarted after), while records flow:
    the output is exact, and the job says what each loss cost (a task retry inside the batch, or
    a query restart)."""
    rng = random.Random(39)
    settings = make_settings()
    ensure_topics(settings)
    checkpoint = Path(settings.job.checkpoint_location)
    ledger = Ledger()
    env = _spark_env(
        settings,
        PYSPARK_PYTHON=sys.executable,
        IPCOUNT_JOB_TRIGGER_INTERVAL_SECONDS="1",
        IPCOUNT_JOB_RESTART_DELAY_SECONDS="2",
    )
    cluster = two_workers
    log = tmp_path / "job.log"
    lines = []
    job: subprocess.Popen[bytes] | None = None
    try:
        _produce(settings, ledger, 0, 2_000)
        # Through the container entry point, which hands SIGTERM to the Python driver (a plain
        # spark-submit would die of it with 143).
        job = _start(
            [str(ROOT / "conf" / "docker-entrypoint.sh"), "job"],
            {
                **env,
                "APP_DIR": str(ROOT),
                "IPCOUNT_CONFIG": str(ROOT / "conf" / "ipcount.toml"),
                "SPARK_MASTER_URL": cluster.master_url,
                "SPARK_SUBMIT_EXTRA_ARGS": "--conf spark.executor.memory=512m "
                "--conf spark.executor.cores=1 --conf spark.cores.max=2",
            },
            tmp_path,
            log,
        )
        deadline = time.monotonic() + RUN_TIMEOUT
        while _batches(checkpoint, "commits") < 0:
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no first batch in time"
            time.sleep(0.5)
        for i in range(6):
            whole_worker = i == 5
            _produce(settings, ledger, 30_000 * (i + 1), 2_000)
            planned = _batches(checkpoint, "offsets")
            deadline = time.monotonic() + RUN_TIMEOUT
            # A batch with the new records is running: strike at a random moment inside it.
            while _batches(checkpoint, "offsets") <= planned:
                assert time.monotonic() < deadline, "no new batch planned"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.5))
            mid = _batches(checkpoint, "offsets") > _batches(checkpoint, "commits")
            restarts = log.read_text(errors="replace").count("restarting the query")
            worker = cluster.workers[i % 2]
            t0 = time.monotonic()
            if whole_worker:
                worker.child.signal_group(signal.SIGKILL)
                _kill_executor(worker.child.pid)
                cluster.restart_worker(i % 2)
            else:
                assert _kill_executor(worker.child.pid), f"no executor on {worker.name}"
            target = _batches(checkpoint, "offsets") + 1
            while _batches(checkpoint, "commits") < target:
                assert job.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no batch committed after the kill"
                time.sleep(0.2)
            cost = log.read_text(errors="replace").count("restarting the query") - restarts
            lines.append(
                f"{'worker' if whole_worker else 'executor'} kill {i + 1} on {worker.name} "
                f"({'mid-batch' if mid else 'between batches'}): next batch committed "
                f"{time.monotonic() - t0:.1f}s after, query restarts {cost}"
            )
        # The last windows: the input is finished, and the job on the cluster closes them with
        # its idle heartbeats (as the first round's in the routes test), then stops on SIGTERM.
        deadline = time.monotonic() + RUN_TIMEOUT
        while not verify_sink(settings, ledger, deadline_seconds=30).exact:
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the last windows not committed in time"
            time.sleep(2)
        job.send_signal(signal.SIGTERM)
        _finish(job, log, 90)
    finally:
        if job is not None:
            _stop_left([job])
        print("\n".join(lines))
    summary = _verify(env, ledger, tmp_path)
    assert summary.endswith("exact=true"), summary
    assert len(lines) == 6, lines
