"""The streaming query's stable id, read from (or written to) the checkpoint before the query
starts (driver): the sink's transactional.id derives from it."""

from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING

from ipcount.errors import ConfigError

__all__ = ["checkpoint_query_id"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def checkpoint_query_id(spark: SparkSession, location: str) -> str:
    """Return the query id stored in the checkpoint at `location`, creating it on first use.

    Spark keeps a query's id in `<checkpoint>/metadata` as {"id": "<uuid>"}; on a first start this
    writes the file in Spark's format, and Spark then adopts that id. Hadoop's FileSystem API is
    used, so local paths, hdfs:// and s3a:// checkpoints all work.

    Raises:
        ConfigError: the checkpoint's metadata file is unreadable or not Spark's format.
    """
    jvm = spark._jvm
    if jvm is None:
        raise ConfigError(
            "the Spark session has no JVM (a Spark Connect session?): ipcount needs a classic one"
        )
    hadoop_conf = spark._jsc.hadoopConfiguration()
    base = jvm.org.apache.hadoop.fs.Path(location)
    fs = base.getFileSystem(hadoop_conf)
    meta = jvm.org.apache.hadoop.fs.Path(base, "metadata")
    if fs.exists(meta):
        stream = fs.open(meta)
        try:
            text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        try:
            query_id = str(json.loads(text.splitlines()[0])["id"])
            uuid.UUID(query_id)
        except (ValueError, KeyError, IndexError, TypeError):
            raise ConfigError(
                f"{location}/metadata is not a Spark checkpoint metadata file; "
                "point job.checkpoint_location at an ipcount checkpoint or an empty directory"
            ) from None
        return query_id
    query_id = str(uuid.uuid4())
    fs.mkdirs(base)
    out = fs.create(meta, False)
    try:
        out.write(json.dumps({"id": query_id}).encode("utf-8"))
    finally:
        out.close()
    logger.info("new checkpoint %s with query id %s", location, query_id)
    return query_id
