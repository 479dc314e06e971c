"""/healthz: what an operator's probe sees in each state of the job."""

from __future__ import annotations

import pytest

from ipcount.observe.health import HealthFacts, judge_health

STALL = 60.0


@pytest.mark.parametrize(
    ("facts", "status", "says"),
    [
        # Batches finish: healthy, whatever the lag.
        (HealthFacts(now=100, running=True, since=90, lag=5000), 200, "ok: running, lag 5000"),
        # Idle for an hour with nothing waiting: healthy.
        (HealthFacts(now=3700, running=True, since=100, lag=0), 200, "ok: idle"),
        # Records wait, but not yet for longer than the limit (a long first batch).
        (HealthFacts(now=150, running=True, since=100, lag=10), 200, "ok: running"),
        # Records wait and nothing finished for longer than the limit: stalled.
        (
            HealthFacts(now=161, running=True, since=100, lag=10),
            503,
            "stalled: no micro-batch finished for 61s while 10 records wait",
        ),
        # Nothing finished and the brokers do not say what waits: not provably idle.
        (
            HealthFacts(now=200, running=True, since=100, lag=None, lag_error="timed out"),
            503,
            "source lag is unknown (timed out)",
        ),
        # A failed query waiting for its restart is down.
        (
            HealthFacts(
                now=10, running=False, failure="TransactionAbortedError: x", restarting_in=7
            ),
            503,
            "query failed: TransactionAbortedError: x (restarting in 7s)",
        ),
        (HealthFacts(now=10, running=False, failure="boom"), 503, "query failed: boom"),
        # Before the queries started (Spark starting up): not yet serving.
        (HealthFacts(now=10, running=False), 503, "starting: the queries are not running yet"),
        # Asked to stop (SIGTERM): no longer serving, even if the queries still run.
        (HealthFacts(now=10, running=True, stopping=True), 503, "stopped"),
    ],
)
def test_health_answers(facts: HealthFacts, status: int, says: str) -> None:
    health = judge_health(facts, STALL)
    assert health.status == status
    assert says in health.reason
    assert "\n" not in health.reason


def test_a_degraded_job_says_why_unless_a_stall_says_more() -> None:
    why = "state snapshots are not being written: store 0/1 has 432 versions"
    running = HealthFacts(now=100.0, running=True, since=95.0, lag=10, degraded=why)
    health = judge_health(running, stall_seconds=60.0)
    assert (health.status, health.reason) == (503, f"degraded: {why}")
    stalled = HealthFacts(now=500.0, running=True, since=95.0, lag=10, degraded=why)
    assert judge_health(stalled, stall_seconds=60.0).reason.startswith("stalled:")
    fine = HealthFacts(now=100.0, running=True, since=95.0, lag=10)
    assert judge_health(fine, stall_seconds=60.0).status == 200


def test_a_failed_query_says_that_the_brokers_do_not_answer() -> None:
    # The failure's own text may blame something else (a lookup's "unknown partition"): the
    # lag poller's reason says what the network does.
    why = "Kafka at 127.0.0.1:9092 has not answered for 9s"
    facts = HealthFacts(
        now=100,
        running=False,
        failure="BrokerError: unknown partition",
        restarting_in=2.0,
        lag=None,
        lag_error=why,
    )
    health = judge_health(facts, STALL)
    assert health.status == 503
    assert health.reason == (
        "query failed: BrokerError: unknown partition (restarting in 2s); source lag unknown: "
        + why
    )
    no_restart = judge_health(
        HealthFacts(now=100, running=False, failure="boom", lag=None, lag_error=why), STALL
    )
    assert no_restart.reason == f"query failed: boom; source lag unknown: {why}"
    known = judge_health(HealthFacts(now=100, running=False, failure="boom", lag=3), STALL)
    assert known.reason == "query failed: boom"
    # The same error twice (the lag poller met what failed the query) is said once.
    same = HealthFacts(
        now=100, running=False, failure="SourceError: no leaders", lag=None, lag_error="no leaders"
    )
    assert judge_health(same, STALL).reason == "query failed: SourceError: no leaders"
