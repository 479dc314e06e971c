"""Loading settings: conf/ipcount.toml, then IPCOUNT_* env overrides, then CLI --set overrides;
every error names the setting and where its value came from."""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from ipcount.config.settings import PASSTHROUGH, SECTIONS, Settings, validate
from ipcount.errors import ConfigError

__all__ = ["ENV_PREFIX", "default_config_path", "load_settings"]

ENV_PREFIX = "IPCOUNT_"
# IPCOUNT_* env vars that are not settings: the config file, log levels, fault injection
# (ipcount.faults; the chaos suite sets them for `ipcount run`).
_NOT_SETTINGS = frozenset(
    {
        "IPCOUNT_CONFIG",
        "IPCOUNT_LOG_LEVEL",
        "IPCOUNT_LOG_FORMAT",
        "IPCOUNT_SPARK_LOG_LEVEL",
        "IPCOUNT_FAULTS",
        "IPCOUNT_FAULTS_PGID",
        "IPCOUNT_FAULTS_LOG",
        "IPCOUNT_FAULTS_STATE",
        # Where the local Apache Kafka broker's jars come from (ipcount.local.kafka_jars).
        "IPCOUNT_KAFKA_JARS",
        "IPCOUNT_KAFKA_RESOLVER",
    }
)


def default_config_path() -> Path | None:
    """The config file when none is named: env IPCOUNT_CONFIG, else ./conf/ipcount.toml, if any."""
    env = os.environ.get("IPCOUNT_CONFIG")
    if env:
        return Path(env)
    local = Path("conf/ipcount.toml")
    return local if local.is_file() else None


def load_settings(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Iterable[str] = (),
    use_default_path: bool = True,
) -> Settings:
    """Load, override and validate the settings.

    Args:
        path: a TOML file; None uses `default_config_path()` (or pure defaults).
        env: the environment to read IPCOUNT_* overrides from (default: os.environ).
        overrides: CLI overrides, each 'section.key=value' (e.g. 'job.window_seconds=10',
            'kafka.client.security.protocol=SASL_SSL').
        use_default_path: when path is None, look for the default file.

    Returns:
        A validated, frozen Settings.

    Raises:
        ConfigError: naming the file, env var or override and the setting to fix.
    """
    raw: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    origin: dict[tuple[str, ...], str] = {}
    chosen = (
        Path(path) if path is not None else (default_config_path() if use_default_path else None)
    )
    if chosen is not None:
        _read_file(chosen, raw, origin)
    _read_env(os.environ if env is None else env, raw, origin)
    _read_overrides(overrides, raw, origin)
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        sections[name] = _build(cls, name, raw[name], origin)
    settings = Settings(**sections, source_path="defaults" if chosen is None else str(chosen))
    validate(settings, origin)
    return settings


_Raw = dict[str, dict[str, Any]]
_Origin = dict[tuple[str, ...], str]


def _read_file(chosen: Path, raw: _Raw, origin: _Origin) -> None:
    """The TOML file's settings, each remembered as coming from its section of the file."""
    try:
        data = tomllib.loads(chosen.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"config file {chosen} does not exist (set --config or IPCOUNT_CONFIG)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {chosen} is not valid TOML: {exc}") from None
    for section, table in data.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"unknown section [{section}] in {chosen}{_suggest(section, SECTIONS)}"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"[{section}] in {chosen} must be a table")
        for key, value in table.items():
            _put(raw, origin, section, key, value, f"{chosen} [{section}]", from_text=False)


def _read_env(environ: Mapping[str, str], raw: _Raw, origin: _Origin) -> None:
    """IPCOUNT_<SECTION>_<KEY> overrides (not the IPCOUNT_* variables that are no settings)."""
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in _NOT_SETTINGS:
            continue
        if name.startswith("IPCOUNT_TEST_"):
            continue
        section, key = _parse_env_name(name)
        _put(raw, origin, section, key, value, f"env {name}", from_text=True)


def _read_overrides(overrides: Iterable[str], raw: _Raw, origin: _Origin) -> None:
    """--set section.key=value overrides; a passthrough table's keys keep their dots."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        dotted, value = item.split("=", 1)
        parts = dotted.strip().split(".")
        if len(parts) < 2 or parts[0] not in SECTIONS:
            raise ConfigError(
                f"override {item!r}: the name must start with a section "
                f"({', '.join(SECTIONS)}), e.g. job.window_seconds=10"
            )
        section, rest = parts[0], parts[1:]
        where = f"override {dotted}"
        if section in PASSTHROUGH and rest[0] in PASSTHROUGH[section] and len(rest) > 1:
            table = {".".join(rest[1:]): value}
            _put(raw, origin, section, rest[0], table, where, from_text=True)
        else:
            _put(raw, origin, section, ".".join(rest), value, where, from_text=True)


def _parse_env_name(name: str) -> tuple[str, str]:
    """IPCOUNT_KAFKA_BOOTSTRAP_SERVERS -> (kafka, bootstrap_servers);
    IPCOUNT_KAFKA_CLIENT__SASL_PASSWORD -> (kafka, client.sasl.password)."""
    rest = name[len(ENV_PREFIX) :].lower()
    for section in sorted(SECTIONS, key=len, reverse=True):
        if rest.startswith(section + "_"):
            key = rest[len(section) :].lstrip("_")
            for table in PASSTHROUGH.get(section, ()):
                if key.startswith(table + "__"):
                    return section, f"{table}.{key[len(table) + 2 :].replace('_', '.')}"
            return section, key
    raise ConfigError(
        f"env {name} does not name a section: use IPCOUNT_<SECTION>_<KEY> with a section of "
        f"{', '.join(s.upper() for s in SECTIONS)} (e.g. IPCOUNT_KAFKA_BOOTSTRAP_SERVERS)"
    )


def _put(
    raw: dict[str, dict[str, Any]],
    origin: dict[tuple[str, ...], str],
    section: str,
    key: str,
    value: Any,
    where: str,
    *,
    from_text: bool,
) -> None:
    tables = PASSTHROUGH.get(section, ())
    table, _, subkey = key.partition(".")
    if table in tables and subkey:
        value = {subkey: value}
        key = table
    if key in tables:
        if not isinstance(value, dict):
            raise ConfigError(
                f"{where}: {section}.{key} must be a table of settings, got {value!r}"
            )
        merged = dict(raw[section].get(key, {}))
        for sub, subval in value.items():
            if isinstance(subval, dict):
                raise ConfigError(
                    f"{where}: {section}.{key}.{sub} must be a plain value; quote dotted keys, "
                    f'e.g. "security.protocol" = "SASL_SSL"'
                )
            merged[str(sub)] = _as_client_value(subval)
            origin[(section, key, str(sub))] = where
        raw[section][key] = merged
        return
    raw[section][key] = (value, from_text)
    origin[(section, key)] = where


def _as_client_value(value: Any) -> str:
    # librdkafka and Spark take every setting as a string.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _build(
    cls: type, section: str, values: dict[str, Any], origin: dict[tuple[str, ...], str]
) -> Any:
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, item in values.items():
        if key not in known:
            where = origin.get((section, key), "config")
            raise ConfigError(
                f"{where}: unknown setting {section}.{key}{_suggest(key, known, section)}"
            )
        if key in PASSTHROUGH.get(section, ()):
            kwargs[key] = item
            continue
        value, from_text = item
        kwargs[key] = _coerce(
            value, known[key], f"{section}.{key}", origin.get((section, key), "config"), from_text
        )
    return cls(**kwargs)


def _coerce(
    value: Any, spec: dataclasses.Field[Any], name: str, where: str, from_text: bool
) -> Any:
    default = spec.default
    kind = type(default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if (
            from_text
            and isinstance(value, str)
            and value.strip().lower() in ("true", "false", "1", "0", "yes", "no")
        ):
            return value.strip().lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: {name} must be true or false, got {value!r}")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_text and isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{where}: {name} must be a whole number, got {value!r}")
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if from_text and isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{where}: {name} must be a number, got {value!r}")
    if kind is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: {name} must be a string, got {value!r}")
    raise ConfigError(f"{where}: {name} has unsupported type")  # pragma: no cover


def _suggest(word: str, choices: Iterable[str], section: str | None = None) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    if not close:
        return ""
    return f" (did you mean {section + '.' if section else ''}{close[0]}?)"
