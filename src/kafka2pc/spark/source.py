"""The ``kafka2pc`` Python data source: exactly-once writes to Kafka from Spark, streaming and batch."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter

from kafka2pc.errors import ConfigError
from kafka2pc.spark.writers import BatchWriter, StreamWriter


class Kafka2pcDataSource(DataSource):
    """``format("kafka2pc")``: Spark's Kafka sink's options and columns, with two-phase commit. Write-only."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "kafka2pc"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        """The writer of a streaming query."""
        return StreamWriter(dict(self.options), schema)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        """The writer of a batch write (append only, as Spark's Kafka sink)."""
        if overwrite:
            raise ConfigError("mode", "Kafka topics are appended to: use mode('append')")
        return BatchWriter(dict(self.options), schema)
