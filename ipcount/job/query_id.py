"""The streaming query's stable id, read from (or written to) the checkpoint before the query
starts (driver): the sink's transactional.id derives from it."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ipcount.checkpoint.offset_log import local_path
from ipcount.errors import ConfigError

__all__ = ["checkpoint_query_id"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def checkpoint_query_id(spark: SparkSession | None, location: str) -> str:
    """Return the query id stored in the checkpoint at `location`, creating it on first use.

    Spark keeps a query's id in `<checkpoint>/metadata` as {"id": "<uuid>"}; on a first start this
    writes the file in Spark's format, and Spark then adopts that id. A local checkpoint is read
    and written from Python, so the id is known before the JVM runs (the job prepares the sink
    while Spark starts); other schemes (hdfs://, s3a://) go through Hadoop's FileSystem API and
    need `spark`.

    Raises:
        ConfigError: the checkpoint's metadata file is unreadable or not Spark's format, or a
            non-local checkpoint without a Spark session.
    """
    local = local_path(location)
    if local is not None:
        return _local_query_id(location, Path(local))
    if spark is None or spark._jvm is None:
        raise ConfigError(
            f"the checkpoint {location} is not local: its query id is read through Spark's "
            "Hadoop file system, which needs a classic Spark session (not Spark Connect)"
        )
    jvm = spark._jvm
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
        return _parse(text, location)
    query_id = str(uuid.uuid4())
    fs.mkdirs(base)
    out = fs.create(meta, False)
    try:
        out.write(_metadata(query_id))
    finally:
        out.close()
    logger.info("new checkpoint %s with query id %s", location, query_id)
    return query_id


def _local_query_id(location: str, base: Path) -> str:
    meta = base / "metadata"
    try:
        return _parse(meta.read_text(encoding="utf-8"), location)
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {meta}: {exc}") from None
    query_id = str(uuid.uuid4())
    try:
        base.mkdir(parents=True, exist_ok=True)
        # Like Hadoop's create(overwrite=false): a concurrent first start loses, then reads.
        with open(meta, "xb") as out:
            out.write(_metadata(query_id))
    except FileExistsError:
        return _parse(meta.read_text(encoding="utf-8"), location)
    except OSError as exc:
        raise ConfigError(f"cannot create the checkpoint {location}: {exc}") from None
    logger.info("new checkpoint %s with query id %s", location, query_id)
    return query_id


def _metadata(query_id: str) -> bytes:
    return json.dumps({"id": query_id}).encode("utf-8")


def _parse(text: str, location: str) -> str:
    try:
        query_id = str(json.loads(text.splitlines()[0])["id"])
        uuid.UUID(query_id)
    except (ValueError, KeyError, IndexError, TypeError):
        raise ConfigError(
            f"{location}/metadata is not a Spark checkpoint metadata file; "
            "point job.checkpoint_location at an ipcount checkpoint or an empty directory"
        ) from None
    return query_id
