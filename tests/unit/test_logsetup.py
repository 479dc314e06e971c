"""`--log-format json`: every log line of a command is one JSON object."""

from __future__ import annotations

import json
import logging
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from ipcount import logsetup
from ipcount.cli import build_parser
from ipcount.cli import main as ipcount_main
from loadgen.cli import build_parser as loadgen_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    logsetup.configure("INFO", "json")
    logging.getLogger("ipcount.something").info("batch %d done", 3, extra={"fields": {"n": 1}})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("ipcount.other").exception("it failed")
    lines = capsys.readouterr().err.splitlines()
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "batch 3 done" and first["n"] == 1
    assert first["logger"] == "ipcount.something" and first["time"].endswith("+00:00")
    assert second["level"] == "ERROR" and "RuntimeError: boom" in second["exception"]


def test_configuring_twice_keeps_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    logsetup.configure("INFO", "text")
    logsetup.configure("INFO", "json")
    logging.getLogger("ipcount.x").info("once")
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_both_command_lines_take_the_option() -> None:
    assert build_parser().parse_args(["--log-format", "json", "run"]).log_format == "json"
    assert loadgen_parser().parse_args(["--log-format", "json", "synth"]).log_format == "json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log-format", "xml", "run"])


def test_a_bad_env_format_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IPCOUNT_LOG_FORMAT", "xml")
    assert ipcount_main(["run"]) == 2
    assert "log format must be one of text, json" in capsys.readouterr().err


def _properties(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def test_log4j2_json_conf_uses_what_pyspark_ships() -> None:
    """conf/log4j2-json.properties: Spark's JVM logs as JSON, with a layout class and an event
    template that are in PySpark's jars, and the same levels as conf/log4j2.properties."""
    conf = ROOT / "conf"
    json_props = _properties(conf / "log4j2-json.properties")
    text_props = _properties(conf / "log4j2.properties")
    assert json_props["appender.console.layout.type"] == "JsonTemplateLayout"
    jars = Path(pyspark.__file__).parent / "jars"
    assert list(jars.glob("log4j-layout-template-json-*.jar")), "JsonTemplateLayout is not shipped"
    uri = json_props["appender.console.layout.eventTemplateUri"]
    resource = uri.removeprefix("classpath:")
    assert any(resource in zipfile.ZipFile(jar).namelist() for jar in jars.glob("spark-*.jar"))
    levels = {k: v for k, v in text_props.items() if not k.startswith("appender.")}
    assert levels == {k: v for k, v in json_props.items() if not k.startswith("appender.")}
