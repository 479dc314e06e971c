"""No secret reaches a log: a password planted in the Kafka client settings appears in no line the
job prints (DEBUG logs, Spark's own logs included) and in no file it leaves behind."""

from __future__ import annotations

from pathlib import Path

from ipcount.kafka.topics import ensure_topics

PLANTED = "planted-Secret-4711"


def test_a_planted_password_is_in_no_log(make_settings, tmp_path, ipcount_cli, Feed) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    Feed(settings).round(0, 10)
    env = {
        # Plaintext listener: librdkafka carries the SASL settings without using them.
        "IPCOUNT_KAFKA_CLIENT__SASL_PASSWORD": PLANTED,
        "IPCOUNT_KAFKA_CLIENT__SASL_OAUTHBEARER_CONFIG": f"principal=ipcount secret={PLANTED}",
        "IPCOUNT_LOG_LEVEL": "DEBUG",
        "IPCOUNT_SPARK_LOG_LEVEL": "INFO",
        "IPCOUNT_JOB_DEAD_LETTER": "true",
    }
    done = ipcount_cli(settings, "run", "--available-now", "--close-all-windows", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batch" in done.stderr  # the logs are there to be searched
    leaks = [line for line in (done.stdout + done.stderr).splitlines() if PLANTED in line]
    assert not leaks, leaks[:5]
    checkpoint = Path(settings.job.checkpoint_location)
    for root in (checkpoint, checkpoint.with_name(checkpoint.name + "-dead-letter"), tmp_path):
        for path in root.rglob("*"):
            if path.is_file():
                assert PLANTED.encode() not in path.read_bytes(), path
