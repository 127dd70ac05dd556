"""kafka2pc's PySpark data source: ``df.writeStream.format("kafka2pc")`` and ``df.write.format("kafka2pc")``.

Installed with ``pip install kafka2pc[spark]``, it is registered automatically (the ``pyspark_kafka2pc`` module);
:func:`register` registers it explicitly (the data source class itself is
:class:`kafka2pc.spark.source.Kafka2pcDataSource`). docs/spark.md has the options, guarantees and failure matrix.
"""

from __future__ import annotations

from typing import Any

try:
    import pyspark  # noqa: F401
except ModuleNotFoundError as exc:  # say what to install, as `kafka2pc audit` does for its extra
    raise ModuleNotFoundError("kafka2pc.spark needs PySpark: pip install 'kafka2pc[spark]'", name="pyspark") from exc

from kafka2pc.errors import (
    BatchOverError,
    IdInUseError,
    SinkStateMissingError,
    StaleWriteVersionError,
    WriteConflictError,
    WriteDecidedError,
)
from kafka2pc.spark.source import Kafka2pcDataSource

__all__ = [
    "BatchOverError",
    "IdInUseError",
    "SinkStateMissingError",
    "StaleWriteVersionError",
    "WriteConflictError",
    "WriteDecidedError",
    "register",
]


def register(spark: Any) -> None:
    """Register the ``kafka2pc`` format with a SparkSession."""
    spark.dataSource.register(Kafka2pcDataSource)
