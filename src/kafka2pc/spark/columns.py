"""The columns of Spark's Kafka sink — ``value`` (required), ``key``, ``topic``, ``partition``, ``headers`` — checked
against the DataFrame's schema on the driver, and turned into records from Arrow batches on the executors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs

from kafka2pc.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

#: Spark SQL type names each column accepts
_ALLOWED = {
    "value": ("string", "binary"),
    "key": ("string", "binary"),
    "topic": ("string",),
    "partition": ("int",),
    "headers": ("array<struct<key:string,value:binary>>",),
}


@attrs.frozen
class Columns:
    """Which of the sink's columns the DataFrame has (``value`` always)."""

    key: bool = False
    topic: bool = False
    partition: bool = False
    headers: bool = False

    @classmethod
    def of_schema(cls, schema: Any, *, topic_option: str | None) -> Columns:
        """Check a Spark ``StructType``: a missing ``value``, a column of the wrong type, or no topic at all raise a
        :class:`~kafka2pc.errors.ConfigError` naming it. Other columns are ignored, as by Spark's Kafka sink."""
        types = {field.name: field.dataType.simpleString() for field in schema.fields}
        if "value" not in types:
            raise ConfigError("value", f"the DataFrame needs a 'value' column (string or binary); it has "
                                       f"{sorted(types)}")
        for name, allowed in _ALLOWED.items():
            if name in types and types[name] not in allowed:
                raise ConfigError(name, f"column '{name}' must be {' or '.join(allowed)}, not {types[name]}")
        if "topic" not in types and topic_option is None:
            raise ConfigError("topic", "no 'topic' option and no 'topic' column: say where to write")
        return cls(key="key" in types, topic="topic" in types, partition="partition" in types,
                   headers="headers" in types)


@attrs.frozen
class RecordBatch:
    """Records of one Arrow batch, for one topic, ready for ``produce_batch``: the fast path."""

    topic: str
    values: list[bytes]
    keys: list[bytes | None] | None


@attrs.frozen
class Record:
    """One record, for the general path (per-row topic, partition, headers, or null values)."""

    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    headers: list[tuple[str, bytes | None]] | None


def _as_binary(column: pa.Array) -> list[Any]:
    import pyarrow as pa  # noqa: PLC0415 - executors only; the driver checks schemas without pyarrow

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())  # same buffers: no copy, no per-row encoding in Python
    return list(column.to_pylist())


def records(batch: pa.RecordBatch, columns: Columns, topic_option: str | None) -> Iterator[RecordBatch | Record]:
    """The records of an Arrow batch: one :class:`RecordBatch` when every row goes the same way with a value, else
    one :class:`Record` per row. The ``topic`` option, when given, overrides the ``topic`` column; a row without a
    topic raises a ConfigError naming it."""
    names = batch.schema.names
    value_column = batch.column(names.index("value"))
    values = _as_binary(value_column)
    keys = _as_binary(batch.column(names.index("key"))) if columns.key else None
    # the topic option overrides the topic column, as in Spark's Kafka sink (a job that read with format("kafka")
    # carries its source topic in that column: letting it win would write back into the source)
    per_row_topic = columns.topic and topic_option is None
    general = per_row_topic or columns.partition or columns.headers or value_column.null_count > 0
    if not general:
        assert topic_option is not None
        yield RecordBatch(topic_option, values, keys)
        return
    topics = batch.column(names.index("topic")).to_pylist() if per_row_topic else None
    partitions = batch.column(names.index("partition")).to_pylist() if columns.partition else None
    headers = batch.column(names.index("headers")).to_pylist() if columns.headers else None
    for row, value in enumerate(values):
        topic = (topics[row] if topics is not None else None) or topic_option
        if topic is None:
            raise ConfigError("topic", f"row {row} of a batch has a null 'topic' and there is no 'topic' option")
        row_headers = None
        if headers is not None and headers[row] is not None:
            row_headers = [(h["key"], h["value"]) for h in headers[row]]
        yield Record(topic, value, keys[row] if keys is not None else None,
                     partitions[row] if partitions is not None else None, row_headers)
