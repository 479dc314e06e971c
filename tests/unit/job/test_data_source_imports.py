"""What Spark's Python planner processes import to create ipcount's data sources.

Spark creates each Python data source in a fresh process forked from its planner daemon: it
unpickles the class (importing its module) and asks it for its name and schema. Every start of
the job pays that import before its first batch, on the driver's critical path, so a data
source's module must not pull in the Kafka client, Arrow or Avro, which only the readers and
writers need.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ipcount.job.session import DATA_SOURCES

_HEAVY = ("pyarrow", "numpy", "confluent_kafka", "fastavro")


def _modules_after_import(module: str) -> list[str]:
    """The heavy modules a fresh Python has loaded after importing `module` (as a Spark planner
    process does: its own modules first)."""
    code = (
        "import json, sys\n"
        "import pyspark.sql.datasource\n"
        "before = set(sys.modules)\n"
        f"import {module}\n"
        f"print(json.dumps(sorted(m for m in set(sys.modules) - before "
        f"if m.split('.')[0] in {list(_HEAVY)!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize(("module", "class_name"), DATA_SOURCES)
def test_creating_a_data_source_loads_no_kafka_client_arrow_or_avro(
    module: str, class_name: str
) -> None:
    loaded = _modules_after_import(module)
    heavy = sorted({name.split(".")[0] for name in loaded})
    assert not heavy, f"{module} (home of {class_name}) imports {heavy}"
