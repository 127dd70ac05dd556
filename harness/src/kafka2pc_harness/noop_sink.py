"""A pyspark Python data source that writes nowhere (``format("noop_arrow")``): it reads its Arrow batches and counts
the rows. Benchmarks use it as the floor of what any Python sink costs in Spark (a Python worker per task, the
pickled writer, Arrow transfer, the driver's commit call), next to Spark's own JVM sinks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

if TYPE_CHECKING:
    import pyarrow as pa


class RowsSeen(WriterCommitMessage):
    """How many rows a task read."""

    def __init__(self, rows: int):
        self.rows = rows


class NoopArrowWriter(DataSourceArrowWriter):
    """Reads every batch, writes nothing."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Count the task's rows."""
        return RowsSeen(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to commit."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to abort."""


class NoopArrowStreamWriter(DataSourceStreamArrowWriter):
    """The streaming form: reads every batch of every micro-batch, writes nothing."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Count the task's rows."""
        return RowsSeen(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to commit."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to abort."""


class NoopArrowSink(DataSource):
    """``df.write.format("noop_arrow")`` (or ``writeStream``) after ``spark.dataSource.register(NoopArrowSink)``."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "noop_arrow"

    def writer(self, schema: Any, overwrite: bool) -> NoopArrowWriter:
        """A writer for one write."""
        return NoopArrowWriter()

    def streamWriter(self, schema: Any, overwrite: bool) -> NoopArrowStreamWriter:
        """A writer for a streaming query."""
        return NoopArrowStreamWriter()
