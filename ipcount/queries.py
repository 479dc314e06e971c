"""The job's query names: Spark's query names, the `query` label of the metrics, the observed-
metrics name of the counting query's record counts. One home; the job, observability, the
dashboard and the bench read them here."""

from __future__ import annotations

__all__ = ["COUNTS_QUERY", "DEAD_LETTER_QUERY", "QUALITY_METRICS"]

COUNTS_QUERY = "ipcount"
DEAD_LETTER_QUERY = "ipcount-dead-letter"
QUALITY_METRICS = "ipcount_quality"
