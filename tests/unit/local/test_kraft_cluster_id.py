"""The local Apache Kafka broker's storage is formatted with a usable cluster id."""

import base64
import uuid

from ipcount.local import kraft


def test_cluster_id_never_starts_with_a_dash(monkeypatch):
    # 0xF8 as the first byte encodes to '-' in base64url: the storage tool
    # would take such an id for an option ("--cluster-id: expected one argument").
    drawn = iter([uuid.UUID(bytes=b"\xf8" + b"\x01" * 15), uuid.UUID(bytes=b"\x10" * 16)])
    monkeypatch.setattr(kraft.uuid, "uuid4", lambda: next(drawn))
    cluster_id = kraft.new_cluster_id()
    assert cluster_id == base64.urlsafe_b64encode(b"\x10" * 16).decode().rstrip("=")


def test_cluster_id_is_a_22_character_base64url_uuid():
    for _ in range(500):
        cluster_id = kraft.new_cluster_id()
        assert len(cluster_id) == 22 and not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
