"""A partition's offsets across a leader move: a stale-metadata answer costs a metadata refresh and
a retry, not a failed lookup (stub consumer; the leader moves themselves are in the cluster tests)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from ipcount.errors import BrokerError
from ipcount.kafka.watermarks import partition_offsets


class _MovingLeader:
    """A consumer whose partition leader just moved: it answers `errors` (one per request), then
    the offsets; counts the metadata refreshes asked of it in between."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.asked = 0
        self.refreshes: list[str | None] = []

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.asked += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 3, 42

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        self.refreshes.append(topic)
        return object()


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.FENCED_LEADER_EPOCH,  # 74: the client's leader epoch is older than the broker's
        KafkaError.UNKNOWN_LEADER_EPOCH,  # 75: the client's is newer than the broker's
        KafkaError.NOT_LEADER_FOR_PARTITION,  # 6, NOT_LEADER_OR_FOLLOWER
        KafkaError.LEADER_NOT_AVAILABLE,  # 5: an election under way
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError._TRANSPORT,  # the old leader's connection died with it (SIGKILL)
        # The dead broker left the cluster's metadata while the request waited on its handle
        # (seen on a three-node cluster: the dead-letter query's start failed on it).
        KafkaError._DESTROY_BROKER,
        KafkaError.UNKNOWN_TOPIC_OR_PART,  # a topic just created, not yet known everywhere
    ],
)
def test_a_leader_move_costs_a_metadata_refresh_and_a_retry(code: int) -> None:
    probe = _MovingLeader(code, code)
    assert partition_offsets(probe, "sink", 0, timeout=5) == (3, 42)  # type: ignore[arg-type]
    assert probe.asked == 3
    assert probe.refreshes == ["sink", "sink"]  # each retry after a fresh look at the leaders


def test_a_leader_that_never_comes_back_is_a_clear_error_after_the_timeout() -> None:
    probe = _MovingLeader(*[KafkaError.FENCED_LEADER_EPOCH] * 1000)
    with pytest.raises(
        BrokerError, match=r"cannot query the end of sink\[0\].*FENCED_LEADER_EPOCH"
    ):
        partition_offsets(probe, "sink", 0, timeout=0.5)  # type: ignore[arg-type]


def test_a_topic_that_does_not_exist_is_said_soon() -> None:
    """UNKNOWN_TOPIC_OR_PART is retried only for the moment a new topic needs: a missing topic is
    reported in ~2 s, not after the whole timeout."""
    import time

    probe = _MovingLeader(*[KafkaError.UNKNOWN_TOPIC_OR_PART] * 1000)
    t0 = time.monotonic()
    with pytest.raises(BrokerError, match="does not exist"):
        partition_offsets(probe, "sink", 0, timeout=30)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 5


def test_an_error_no_retry_can_cure_fails_at_once() -> None:
    probe = _MovingLeader(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(BrokerError, match="TOPIC_AUTHORIZATION_FAILED"):
        partition_offsets(probe, "sink", 0, timeout=30)  # type: ignore[arg-type]
    assert probe.asked == 1


def test_a_request_that_timed_out_on_a_dead_leader_is_asked_again_of_the_new_one() -> None:
    """SIGKILLed, the leader answers nothing: the request times out. The one more request made
    after a timeout goes out after a metadata refresh, to the leader elected meanwhile (seen on a
    three-node cluster: the dead-letter query's start failed on the progress topic)."""
    probe = _MovingLeader(KafkaError._TIMED_OUT)
    assert partition_offsets(probe, "sink", 0, timeout=5) == (3, 42)  # type: ignore[arg-type]
    assert probe.asked == 2
    assert probe.refreshes == ["sink"]
