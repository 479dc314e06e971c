"""What every child of a local pipeline run is given: topics named by the run's tag, the
checkpoint under its work dir, the settings file it came from; and a clear error for a cluster
of a broker kind that has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipcount.config import load_settings
from ipcount.errors import ConfigError
from ipcount.local_pipeline.steps import LocalPipeline


def test_children_get_topics_named_by_the_tag_and_the_checkpoint_under_the_work_dir(
    tmp_path: Path,
) -> None:
    base = load_settings(None, use_default_path=False)
    run = LocalPipeline(base, tmp_path, "chaos-ab12", sets=["job.trigger_interval_seconds=0.5"])
    run.bootstrap = "127.0.0.1:9"
    sets = run.overrides
    assert "kafka.bootstrap_servers=127.0.0.1:9" in sets
    for role in ("source", "sink", "progress", "late", "dead_letter"):
        assert f"topics.{role}=chaos-ab12-{role.replace('_', '-')}" in sets
    assert f"job.checkpoint_location={tmp_path / 'checkpoint'}" in sets
    # The caller's own settings come last: they win.
    assert sets[-1] == "job.trigger_interval_seconds=0.5"
    assert run.cli == [a for s in sets for a in ("--set", s)]
    settings = run.load()
    assert settings.topics.sink == "chaos-ab12-sink"
    assert settings.job.trigger_interval_seconds == 0.5


def test_without_a_tag_the_configured_topics_stay(tmp_path: Path) -> None:
    conf = tmp_path / "ipcount.toml"
    conf.write_text('[topics]\nsource = "mine"\n')
    base = load_settings(str(conf), use_default_path=False)
    run = LocalPipeline(base, tmp_path, None)
    run.bootstrap = "127.0.0.1:9"
    assert run.cli[:2] == ["--config", str(conf)]
    assert not any(s.startswith("topics.") for s in run.overrides)
    assert run.load().topics.source == "mine"


def test_a_cluster_needs_apache_kafka(tmp_path: Path) -> None:
    base = load_settings(None, overrides=["broker.kind=noida-db"], use_default_path=False)
    with pytest.raises(ConfigError, match='broker.kind = "kafka"'):
        LocalPipeline(base, tmp_path, "t").open_broker(nodes=3)
