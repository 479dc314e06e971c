"""Python processes of the session `ipcount run` builds import PySpark from the installed package
(bytecode cached), not from pyspark.zip (compiled anew in every process: see job.spark_home)."""

from __future__ import annotations

from typing import Any


def test_python_workers_import_pyspark_from_site_packages(spark: Any) -> None:
    import os

    from pyspark.sql.functions import udf

    @udf("string")
    def where(_: int) -> str:
        import pyspark

        return pyspark.__file__ or ""

    found = spark.range(1).select(where("id").alias("file")).collect()[0]["file"]
    assert ".zip" not in found, found
    assert os.path.isfile(found)
