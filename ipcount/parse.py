"""Spark SQL (JVM-side) parsing of access records into (event_time, ip) plus a validity verdict
(driver plan)."""

from __future__ import annotations

from typing import Any

from ipcount.accesslog import GROUP_IP, IP_PATTERN, LINE_PATTERN, TIME_FORMAT_SPARK

__all__ = ["parse_access_records"]


def parse_access_records(source: Any, max_record_bytes: int) -> Any:
    """Add columns `ip`, `event_time`, `malformed` (and keep `heartbeat`) to the source DataFrame.

    Every check is a built-in expression: no Python runs per row. A record is malformed when it is
    not valid UTF-8, longer than `max_record_bytes`, not in the combined format, or has a bad IP or
    timestamp. Heartbeat rows take their event time from the source's `timestamp` column.
    """
    from pyspark.sql import functions as F

    value = F.col("value")
    line = value.cast("string")
    ip_raw = F.regexp_extract(line, LINE_PATTERN, GROUP_IP)
    # The bracketed $time_local, cut out with cheap string functions once the line matched.
    time_text = F.substring_index(F.substring_index(line, "]", 1), "[", -1)
    parsed_time = F.try_to_timestamp(time_text, F.lit(TIME_FORMAT_SPARK))
    size_ok = F.octet_length(value) <= F.lit(max_record_bytes)
    heartbeat = F.coalesce(F.col("heartbeat"), F.lit(False))
    # CASE evaluates branches in order: oversized or non-UTF-8 records never reach the regex.
    valid = (
        F.when(heartbeat, F.lit(False))
        .when(value.isNull() | ~size_ok, F.lit(False))
        .when(~F.is_valid_utf8(value), F.lit(False))
        .otherwise(
            F.coalesce(
                (ip_raw != "") & ip_raw.rlike(IP_PATTERN) & parsed_time.isNotNull(), F.lit(False)
            )
        )
    )
    return source.select(
        F.col("partition"),
        F.col("offset"),
        F.col("key"),
        value,
        heartbeat.alias("heartbeat"),
        F.when(valid, F.lower(ip_raw)).alias("ip"),
        F.when(heartbeat, F.col("timestamp")).when(valid, parsed_time).alias("event_time"),
        (~heartbeat & ~valid).alias("malformed"),
    )
