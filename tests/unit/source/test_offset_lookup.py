"""The driver's offset lookups while a partition's leader is away (issue #39): an answer of
"unknown" (-1001, librdkafka's OFFSET_INVALID) is retried, never taken for the log's end."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from ipcount.errors import SourceError
from ipcount.source import offset_reader
from ipcount.source.offset_reader import KafkaOffsetReader
from ipcount.source.options import parse_options


class _Admin:
    """list_offsets answers each partition with the next of `answers` (then the last again)."""

    def __init__(self, answers: list[int]) -> None:
        self.answers, self.calls = answers, 0

    def list_offsets(self, request: dict[Any, Any], **_: Any) -> dict[Any, Future[Any]]:
        offset = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        out: dict[Any, Future[Any]] = {}
        for tp in request:
            fut: Future[Any] = Future()
            fut.set_result(SimpleNamespace(offset=offset))
            out[tp] = fut
        return out


# The admin client a reader makes when it replaces one (see _fresh_admins): the test's fake.
_NEXT_ADMIN: list[Any] = []


@pytest.fixture(autouse=True)
def _fresh_admins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that drops its admin client gets the test's fake again, never a real client."""
    monkeypatch.setattr(offset_reader, "AdminClient", lambda conf: _NEXT_ADMIN[-1])


def _reader(admin: _Admin) -> KafkaOffsetReader:
    reader = KafkaOffsetReader(
        parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "src"})
    )
    reader._admin = admin  # type: ignore[assignment]
    _NEXT_ADMIN.append(admin)
    return reader


def test_an_unknown_offset_from_a_partition_without_leader_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(offset_reader.time, "sleep", lambda s: None)
    admin = _Admin([-1001, -1001, 355])
    assert _reader(admin).offsets([("src", 2)], "latest") == {("src", 2): 355}
    assert admin.calls == 3


def test_an_offset_that_stays_unknown_fails_with_the_partition_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(offset_reader.time, "sleep", lambda s: None)
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(offset_reader.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(SourceError, match=r"latest offsets of src/2: .*unknown"):
        _reader(_Admin([-1001])).offsets([("src", 2)], "latest")


class _RaisingAdmin:
    """list_offsets raises `error` (a KafkaError code) every time."""

    def __init__(self, code: int) -> None:
        self.code, self.calls = code, 0

    def list_offsets(self, request: dict[Any, Any], **_: Any) -> dict[Any, Future[Any]]:
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        raise KafkaException(KafkaError(self.code, "No leaders found"))


@pytest.mark.parametrize(
    "code",
    [
        "_NOENT",
        "FENCED_LEADER_EPOCH",
        "NOT_LEADER_FOR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "OFFSET_NOT_AVAILABLE",
    ],
)
def test_a_stale_leader_answer_is_asked_again_by_a_client_with_fresh_metadata(
    monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """After connections were reset (_NOENT: librdkafka's metadata holds no leader) or a leader
    moved, the lookup is retried by a new admin client, which fetches metadata anew."""
    from confluent_kafka import KafkaError

    monkeypatch.setattr(offset_reader.time, "sleep", lambda s: None)
    stale = _RaisingAdmin(getattr(KafkaError, code))
    fresh = _Admin([355])
    reader = _reader(stale)  # type: ignore[arg-type]
    _NEXT_ADMIN.append(fresh)
    assert reader.offsets([("src", 2)], "latest") == {("src", 2): 355}
    assert (stale.calls, fresh.calls) == (1, 1)


class _DeadLeaderAdmin:
    """librdkafka's ListOffsets towards a leader whose node was killed: the request waits for the
    node to come back for its whole request_timeout, then the partition is answered as unknown
    (-1001) without an error. A client made after the new leader's election answers `offset`."""

    def __init__(self, clock: list[float], offset: int | None) -> None:
        self.clock, self.offset, self.calls = clock, offset, 0

    def list_offsets(self, request: dict[Any, Any], **kwargs: Any) -> dict[Any, Future[Any]]:
        self.calls += 1
        if self.offset is None:
            self.clock[0] += kwargs["request_timeout"]
        out: dict[Any, Future[Any]] = {}
        for tp in request:
            fut: Future[Any] = Future()
            fut.set_result(SimpleNamespace(offset=-1001 if self.offset is None else self.offset))
            out[tp] = fut
        return out


def test_a_killed_leader_costs_one_short_attempt_not_the_whole_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node leading the partition was killed: the first attempt goes to it and waits; the
    lookup must leave time to ask again (a new client, the new leader) within its deadline."""
    clock = [0.0]
    monkeypatch.setattr(offset_reader.time, "monotonic", lambda: clock[0])

    def sleep(s: float) -> None:
        clock[0] += s

    monkeypatch.setattr(offset_reader.time, "sleep", sleep)
    dead = _DeadLeaderAdmin(clock, None)
    reader = _reader(dead)  # type: ignore[arg-type]
    _NEXT_ADMIN.append(_DeadLeaderAdmin(clock, 355))
    assert reader.offsets([("src", 2)], "latest") == {("src", 2): 355}
    assert dead.calls == 1
    assert clock[0] <= 10.0


class _OnceRaisingAdmin(_Admin):
    """list_offsets raises `code` (a KafkaError code) once, then answers `offset`."""

    def __init__(self, code: int, offset: int) -> None:
        super().__init__([offset])
        self.code, self.raised = code, 0

    def list_offsets(self, request: dict[Any, Any], **kwargs: Any) -> dict[Any, Future[Any]]:
        from confluent_kafka import KafkaError, KafkaException

        if not self.raised:
            self.raised += 1
            raise KafkaException(KafkaError(self.code, "leader gone"))
        return super().list_offsets(request, **kwargs)


@pytest.mark.parametrize(
    "code", ["_DESTROY_BROKER", "_ALL_BROKERS_DOWN", "REPLICA_NOT_AVAILABLE", "_TRANSPORT"]
)
def test_a_leader_moving_answer_is_asked_again_as_the_sink_s_lookups_do(
    monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """A killed leader's broker leaves the client's metadata while the request waits on it
    (_DESTROY_BROKER): the source's lookup retries it as kafka/watermarks.py's lookups do."""
    from confluent_kafka import KafkaError

    monkeypatch.setattr(offset_reader.time, "sleep", lambda s: None)
    admin = _OnceRaisingAdmin(getattr(KafkaError, code), 355)
    assert _reader(admin).offsets([("src", 2)], "latest") == {("src", 2): 355}
    assert admin.raised == 1
