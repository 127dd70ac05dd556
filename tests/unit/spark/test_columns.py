"""The columns of Spark's Kafka sink, checked on the driver and turned into records on the executors."""

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from kafka2pc.errors import ConfigError
from kafka2pc.spark.columns import Columns


def schema(**fields):
    return StructType([StructField(name, kind) for name, kind in fields.items()])


HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def test_the_columns_of_sparks_kafka_sink():
    columns = Columns.of_schema(schema(value=BinaryType(), key=StringType(), topic=StringType(),
                                       partition=IntegerType(), headers=HEADERS, other=LongType()),
                                topic_option=None)
    assert columns == Columns(key=True, topic=True, partition=True, headers=True)
    assert Columns.of_schema(schema(value=StringType()), topic_option="t") == Columns()


@pytest.mark.parametrize(("fields", "topic", "problem"), [
    ({"key": StringType()}, "t", "needs a 'value' column"),
    ({"value": LongType()}, "t", "column 'value' must be string or binary, not bigint"),
    ({"value": StringType(), "partition": LongType()}, "t", "column 'partition' must be int"),
    ({"value": StringType(), "headers": ArrayType(StringType())}, "t", "column 'headers' must be"),
    ({"value": StringType()}, None, "no 'topic' option and no 'topic' column"),
])
def test_wrong_columns_are_refused(fields, topic, problem):
    with pytest.raises(ConfigError, match=problem):
        Columns.of_schema(schema(**fields), topic_option=topic)


def test_arrow_batches_become_records():
    import pyarrow as pa  # noqa: PLC0415

    from kafka2pc.spark.columns import Record, RecordBatch, records  # noqa: PLC0415

    fast = pa.record_batch({"value": pa.array(["a", "bé"]), "key": pa.array([b"k", None])})
    assert list(records(fast, Columns(key=True), "out")) == [RecordBatch("out", [b"a", "bé".encode()], [b"k", None])]
    headers = pa.array([[{"key": "h", "value": b"1"}], None],
                       type=pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    general = pa.record_batch({"value": pa.array([b"x", None]), "topic": pa.array(["t1", None]),
                               "partition": pa.array([3, None], type=pa.int32()), "headers": headers})
    assert list(records(general, Columns(topic=True, partition=True, headers=True), "dflt")) == [
        Record("dflt", b"x", None, 3, [("h", b"1")]), Record("dflt", None, None, None, None)]
    assert next(records(general, Columns(topic=True, partition=True, headers=True), None)) == Record(
        "t1", b"x", None, 3, [("h", b"1")])
    with pytest.raises(ConfigError, match="null 'topic'"):
        list(records(general, Columns(topic=True, partition=True, headers=True), None))


def test_the_topic_option_overrides_the_topic_column_as_in_sparks_kafka_sink():
    import pyarrow as pa  # noqa: PLC0415

    from kafka2pc.spark.columns import Record, RecordBatch, records  # noqa: PLC0415

    # rows read with format("kafka") carry their source topic; .option("topic", ...) must send them elsewhere
    read_from_kafka = pa.record_batch({"value": pa.array([b"a", b"b"]), "topic": pa.array(["source", None])})
    assert list(records(read_from_kafka, Columns(topic=True), "enriched")) == [
        RecordBatch("enriched", [b"a", b"b"], None)]
    with_partitions = pa.record_batch({"value": pa.array([b"a"]), "topic": pa.array(["source"]),
                                       "partition": pa.array([1], type=pa.int32())})
    assert list(records(with_partitions, Columns(topic=True, partition=True), "enriched")) == [
        Record("enriched", b"a", None, 1, None)]
    assert list(records(read_from_kafka.slice(0, 1), Columns(topic=True), None)) == [
        Record("source", b"a", None, None, None)]
