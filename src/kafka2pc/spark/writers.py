"""The pyspark writers of the ``kafka2pc`` data source (Arrow writers: rows arrive as ``pyarrow.RecordBatch``es).

Spark creates a writer on the driver for every batch, pickles it to the tasks, and creates another one on the driver
for ``commit``/``abort``. The driver's work before the tasks run happens when the writer is pickled
(:meth:`__getstate__`), which Spark does only to ship it to them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from kafka2pc.spark.columns import Columns
from kafka2pc.spark.driver import SinkDriver, batch_checkpoint
from kafka2pc.spark.options import SinkOptions
from kafka2pc.spark.task import TaskMessage, TaskPlan, skipped_partition, write_partition
from kafka2pc.spark.worker_gc import freeze_once

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)
#: Spark's Python workers configure no logging: ``KAFKA2PC_LOG_LEVEL=INFO`` in their environment makes kafka2pc log
#: to their stderr (in Spark's executor and driver logs), e.g. one line per committed batch with its driver timings
LOG_LEVEL_VARIABLE = "KAFKA2PC_LOG_LEVEL"


def _log_to_stderr_if_asked() -> None:
    level = os.environ.get(LOG_LEVEL_VARIABLE)
    root = logging.getLogger("kafka2pc")
    if level and not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(level.upper())


_log_to_stderr_if_asked()


class SinkCommitMessage(WriterCommitMessage):
    """A task attempt's :class:`~kafka2pc.spark.task.TaskMessage`, as pyspark carries it to the driver."""

    def __init__(self, message: TaskMessage):
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return SinkCommitMessage, (self.message,)


def _unwrap(messages: list[WriterCommitMessage | None]) -> list[TaskMessage | None]:
    return [m.message if isinstance(m, SinkCommitMessage) else None for m in messages]


class _Writer:
    """What the streaming and the batch writer share."""

    streaming = True

    def __init__(self, options: dict[str, str], schema: Any):
        freeze_once()  # a Spark Python worker's, where the driver's side runs
        self._raw_options = dict(options)
        self._options = SinkOptions.from_options(options, streaming=self.streaming)
        self._columns = Columns.of_schema(schema, topic_option=self._options.topic)
        self._plan: TaskPlan | None = None
        driver = SinkDriver(self._options)
        driver.state  # noqa: B018 - pins or checks the prefix now, so its errors come first
        driver.write_key_verdict()  # a stale txnVersion is refused before anything runs

    def __getstate__(self) -> dict[str, Any]:
        # pickled only to be shipped (to the tasks; for a batch write, also to the driver's commit): the driver's
        # planning happens here, once per writer
        if self._plan is None:
            self._plan = SinkDriver(self._options).plan(self._columns, streaming=self.streaming)
        return {"plan": attrs.asdict(self._plan, recurse=False), "options": self._raw_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        freeze_once()  # a task's worker, or the one where the driver's commit runs
        self._plan = TaskPlan(**state["plan"])
        self._raw_options = state["options"]
        self._options = SinkOptions.from_options(self._raw_options, streaming=self.streaming)
        self._columns = self._plan.columns

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        assert self._plan is not None, "a writer is planned before it is shipped to tasks"
        if self._plan.skip:
            for _ in iterator:  # a replay of a decided keyed write: its rows are in Kafka already
                pass
            return SinkCommitMessage(skipped_partition(self._plan))
        return SinkCommitMessage(write_partition(self._plan, iterator))


class StreamWriter(_Writer, DataSourceStreamArrowWriter):
    """``df.writeStream.format("kafka2pc")``: each micro-batch is a checkpoint, its batch id the checkpoint id."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Run on the executors: one transaction per task attempt, prepared."""
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Run on the driver: decide and complete the batch."""
        unwrapped = _unwrap(messages)
        settlement, timings = SinkDriver(self._options).commit(unwrapped, batchId)
        log.info("batch %d: %s %d transaction(s); check %.1f ms, record %.1f ms, complete %.1f ms, cleanup %.1f ms; "
                 "%d of %d task(s) went on with a cached producer",
                 batchId, "committed" if settlement.decided_now else "replay of a decided batch, aborted",
                 len(settlement.committed) if settlement.decided_now else len(settlement.aborted),
                 1000 * timings.check, 1000 * timings.record, 1000 * timings.complete, 1000 * timings.cleanup,
                 sum(m.continued for m in unwrapped if m is not None), sum(1 for m in unwrapped if m is not None))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Run on the driver when Spark gives up on the batch."""
        SinkDriver(self._options).abort(_unwrap(messages), batchId)


class BatchWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("kafka2pc")``: the whole write is one checkpoint, all or nothing."""

    streaming = False

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Run on the executors: one transaction per task attempt, prepared."""
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Run on the driver: decide and complete the write (a replay of a decided keyed write: check it is one)."""
        if self._plan is not None and self._plan.skip:
            SinkDriver(self._options).confirm_replay(_unwrap(messages))
            return
        SinkDriver(self._options).commit_write(_unwrap(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Run on the driver when the write failed."""
        unwrapped = _unwrap(messages)
        SinkDriver(self._options).abort(unwrapped, batch_checkpoint(unwrapped))
