"""The progress marker on the wire (sink.marker): records written by earlier versions of ipcount
decode, new ones are byte for byte what those versions wrote, and a record that is not a marker
is refused with where it lies and what to fix."""

from __future__ import annotations

import pytest

from ipcount.errors import SinkError
from ipcount.sink.marker import ProgressMarker
from ipcount.sink.runs import ProgressView

# A commit's marker as the sink wrote it before the marker was typed (one JSON object, no spaces).
TODAY_COMMIT = (
    b'{"queryId":"q1","batchId":7,"runId":"r9","records":12,"lateRecords":2,"topic":"sink",'
    b'"sourceEnd":{"offsets":{"src":{"0":40,"1":38}},"heartbeat":{"seq":3}},'
    b'"transactionalId":"ipcount-q1","committedAtMs":1700000000123,"watermarkMs":1699999990000}'
)
# `--new-query`'s marker of batch -1, adopted from another query's output.
TODAY_ADOPTED = (
    b'{"queryId":"q2","batchId":-1,"runId":"r1","records":0,"topic":"sink",'
    b'"sourceEnd":{"offsets":{"src":{"0":40}}},"adoptedFrom":"q1","committedAtMs":1700000000999}'
)


def test_a_marker_in_todays_format_decodes_and_encodes_to_the_same_bytes() -> None:
    marker = ProgressMarker.decode(TODAY_COMMIT, where="progress[0]@5")
    assert marker.query_id == "q1" and marker.batch_id == 7 and marker.run_id == "r9"
    assert (marker.records, marker.late_records, marker.topic) == (12, 2, "sink")
    assert marker.source_end == {"offsets": {"src": {"0": 40, "1": 38}}, "heartbeat": {"seq": 3}}
    assert marker.transactional_id == "ipcount-q1"
    assert (marker.committed_at_ms, marker.watermark_ms) == (1700000000123, 1699999990000)
    assert marker.encode() == TODAY_COMMIT
    adopted = ProgressMarker.decode(TODAY_ADOPTED, where="progress[0]@6")
    assert adopted.batch_id == -1 and adopted.adopted_from == "q1"
    assert adopted.late_records is None and adopted.watermark_ms is None
    assert adopted.encode() == TODAY_ADOPTED


def test_a_commit_without_source_offsets_or_watermark_keeps_todays_nulls() -> None:
    # A sink without a readable checkpoint wrote "sourceEnd": null and no "watermarkMs".
    marker = ProgressMarker(
        query_id="q",
        batch_id=0,
        run_id="",
        records=1,
        late_records=0,
        topic="sink",
        source_end=None,
        transactional_id="t",
        committed_at_ms=5,
    )
    expected = (
        b'{"queryId":"q","batchId":0,"runId":"","records":1,"lateRecords":0,"topic":"sink",'
        b'"sourceEnd":null,"transactionalId":"t","committedAtMs":5}'
    )
    assert marker.encode() == expected
    assert ProgressMarker.decode(expected, where="p[0]@0") == marker


def test_a_marker_of_an_older_ipcount_with_few_fields_decodes() -> None:
    old = ProgressMarker.decode(b'{"queryId": "old", "batchId": 1}', where="p[0]@0")
    assert (old.query_id, old.batch_id, old.run_id, old.records) == ("old", 1, "", 0)
    assert old.topic is None and old.source_end is None and old.committed_at_ms is None


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"[1, 2]",
        b'{"queryId": "q"}',
        b'{"queryId": "q", "batchId": "seven"}',
        b'{"queryId": 3, "batchId": 1}',
        b'{"queryId": "q", "batchId": 1, "records": "many"}',
        None,
    ],
)
def test_a_record_that_is_not_a_marker_names_where_it_lies(value: bytes | None) -> None:
    with pytest.raises(SinkError) as refused:
        ProgressMarker.decode(value, where="progress[2]@41 (key 'q')")
    text = str(refused.value)
    assert "progress[2]@41 (key 'q')" in text and "topics.progress" in text, text


def test_one_read_of_the_topic_keeps_the_newest_marker_and_where_it_was_read() -> None:
    view = ProgressView()
    view.add(b"q1", TODAY_COMMIT, (0, 5, "progress[0]@5"))
    view.add(b"q1", TODAY_COMMIT.replace(b'"batchId":7', b'"batchId":6'), (1, 9, "progress[1]@9"))
    assert view.markers["q1"].batch_id == 7 and view.markers["q1"].position == (0, 5)
    with pytest.raises(SinkError, match=r"progress\[0\]@6.*key 'q1'"):
        view.add(b"q1", b"{}", (0, 6, "progress[0]@6"))


def test_a_sink_tasks_marker_has_its_own_key_and_is_kept_apart_from_the_querys() -> None:
    """A sink task's marker names its sink partition, is keyed by it (so
    compaction keeps every partition's newest), and never stands in for the query's marker."""
    task = ProgressMarker(query_id="q1", batch_id=8, records=3, sink_partition=1)
    assert task.key == b"q1#p1"
    assert ProgressMarker.decode(task.encode(), where="") == task
    assert b"sinkPartition" not in ProgressMarker(query_id="q1", batch_id=8).encode()
    view = ProgressView()
    view.add(b"q1", TODAY_COMMIT, (0, 5, "progress[0]@5"))
    view.add(task.key, task.encode(), (0, 6, "progress[0]@6"))
    view.add(b"q1#p0", ProgressMarker("q1", 6, sink_partition=0).encode(), (0, 7, "@7"))
    assert view.markers["q1"].batch_id == 7 and view.newest("q1") == view.markers["q1"]
    assert view.newest("q1", 1) == task and view.newest("q1", 1).position == (0, 6)  # type: ignore[union-attr]
    assert view.newest("q1", 0).batch_id == 6  # type: ignore[union-attr]
    assert view.newest("q1", 2) is None
