"""The /healthz decision (driver): is the job making progress? Pure, so every case is testable."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HealthFacts", "Health", "judge_health"]


@dataclass(frozen=True)
class HealthFacts:
    """What the driver knows at one moment; times are seconds on one monotonic clock.

    Attributes:
        now: the time of the question.
        running: every query of the job is active.
        stopping: the job was asked to stop (SIGTERM, --timeout) or has stopped.
        failure: why the last query failure happened, while the job is down because of it.
        restarting_in: seconds until the restart strategy restarts a failed query (None: no
            restart is coming).
        since: when progress was last seen: the last finished micro-batch, the (re)start of the
            queries, or the moment input started to wait, whichever is latest.
        lag: records waiting in the source (None: unknown, e.g. the brokers do not answer).
        lag_error: why the lag is unknown.
        degraded: why the job, though making progress, cannot go on like this for long (e.g.
            its state snapshots have stopped); "" when nothing is wrong.
    """

    now: float
    running: bool
    stopping: bool = False
    failure: str | None = None
    restarting_in: float | None = None
    since: float = 0.0
    lag: int | None = 0
    lag_error: str = ""
    degraded: str = ""


@dataclass(frozen=True)
class Health:
    """The answer: healthy or not, and one line saying why (the body of /healthz)."""

    ok: bool
    reason: str

    @property
    def status(self) -> int:
        return 200 if self.ok else 503


def judge_health(facts: HealthFacts, stall_seconds: float) -> Health:
    """Healthy while the queries run and either finish micro-batches or have nothing to do.

    Args:
        facts: the driver's view now.
        stall_seconds: how long records may wait without a finished micro-batch
            (metrics.stall_triggers x the trigger interval).

    Returns:
        503 when the job stopped, a query failed (also while a restart is pending), records
        have waited longer than `stall_seconds` without a finished micro-batch, or the job is
        degraded (its reason follows "degraded: "); 200 otherwise.
    """
    if facts.stopping:
        return Health(False, "stopped: the job was asked to stop")
    if not facts.running:
        why = facts.failure or "not running"
        # A failure's own text may blame something else (an "unknown partition" from a lookup
        # that had no metadata): say also what the lag poller found, when it found nothing.
        unknown = (
            f"; source lag unknown: {facts.lag_error}"
            if facts.lag is None and facts.lag_error and facts.lag_error not in why
            else ""
        )
        if facts.restarting_in is not None:
            return Health(
                False,
                f"query failed: {why} (restarting in {max(0.0, facts.restarting_in):.0f}s)"
                + unknown,
            )
        if facts.failure:
            return Health(False, f"query failed: {why}{unknown}")
        return Health(False, "starting: the queries are not running yet")
    quiet = max(0.0, facts.now - facts.since)
    if facts.degraded and (quiet <= stall_seconds or facts.lag == 0):
        return Health(False, f"degraded: {facts.degraded}")
    if quiet <= stall_seconds:
        return Health(True, f"ok: running, lag {_lag_text(facts)}")
    if facts.lag is None:
        return Health(
            False,
            f"stalled: no micro-batch finished for {quiet:.0f}s and the source lag is unknown"
            + (f" ({facts.lag_error})" if facts.lag_error else ""),
        )
    if facts.lag > 0:
        return Health(
            False,
            f"stalled: no micro-batch finished for {quiet:.0f}s while {facts.lag} records wait "
            f"(limit {stall_seconds:.0f}s, metrics.stall_triggers)",
        )
    return Health(True, "ok: idle, no records waiting")


def _lag_text(facts: HealthFacts) -> str:
    return "unknown" if facts.lag is None else str(facts.lag)
