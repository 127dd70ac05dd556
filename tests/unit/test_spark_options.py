"""The kafka2pc data source's options, columns and ids, checked on the driver before anything is written."""

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
from kafka2pc.sink.naming import TransactionNamingStrategy
from kafka2pc.spark.columns import Columns
from kafka2pc.spark.ids import SLOTS, counter
from kafka2pc.spark.options import SinkOptions, local_path

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "out", "checkpointlocation": "/tmp/ck"}


def test_spark_style_options_are_accepted():
    options = SinkOptions.from_options({**BASE, "kafka.linger.ms": "10", "kafka.security.protocol": "PLAINTEXT",
                                        "transactionalidprefix": "orders", "transactionnamingstrategy": "Incrementing",
                                        "twophasecommit": "false"}, streaming=True)
    assert options.producer_config == {"bootstrap.servers": "127.0.0.1:9092", "linger.ms": "10",
                                       "security.protocol": "PLAINTEXT"}
    assert options.prefix == "orders" and options.naming is TransactionNamingStrategy.INCREMENTING
    assert options.two_phase_commit is False and options.checkpoint_location == "/tmp/ck"


@pytest.mark.parametrize(("options", "key", "problem"), [
    ({"topic": "t", "checkpointlocation": "/c"}, "kafka.bootstrap.servers", "is required"),
    ({**BASE, "kafka.bootstrap.servers": "nohost"}, "kafka.bootstrap.servers", "is not host:port"),
    ({**BASE, "kafka.acks": "1"}, "kafka.acks", "must be all"),
    ({**BASE, "kafka.no.such.setting": "1"}, "kafka.no.such.setting", "unknown configuration key"),
    ({**BASE, "kafka.transactional.id": "x"}, "kafka.transactional.id", "chosen by the sink"),
    ({**BASE, "startingoffsets": "earliest"}, "startingoffsets", "unknown option"),
    ({**BASE, "transactionnamingstrategy": "probing"}, "transactionNamingStrategy", "pooling or incrementing"),
    ({**BASE, "twophasecommit": "maybe"}, "twoPhaseCommit", "true or false"),
    ({**BASE, "transactionalidprefix": "-bad"}, "transactional.id.prefix", "must be 1-200 characters"),
    ({**BASE, "asyncprogresstrackingenabled": "true"}, "asyncProgressTrackingEnabled", "exactly-once"),
    ({k: v for k, v in BASE.items() if k != "checkpointlocation"}, "checkpointLocation", "is required"),
    ({**BASE, "checkpointlocation": "hdfs://nn/ck"}, "checkpointLocation", "only local paths"),
])
def test_bad_options_are_refused_naming_the_option(options, key, problem):
    with pytest.raises(ConfigError, match=problem) as info:
        SinkOptions.from_options(options, streaming=True)
    assert info.value.key == key


def test_checkpoint_locations_may_be_file_uris():
    assert local_path("k", "file:/tmp/a/b") == "/tmp/a/b"
    assert local_path("k", "file:///tmp/a/b") == "/tmp/a/b"


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


def test_ids_of_concurrent_attempts_and_consecutive_checkpoints_differ():
    pooling = TransactionNamingStrategy.POOLING
    for checkpoint in range(4):
        ids = {counter(pooling, checkpoint, attempt) for attempt in range(SLOTS)}
        assert len(ids) == SLOTS  # attempts of one partition in one checkpoint
        assert not ids & {counter(pooling, checkpoint + 1, attempt) for attempt in range(SLOTS)}
    assert {counter(pooling, c, a) for c in range(100) for a in range(SLOTS)} == set(range(2 * SLOTS))
    incrementing = TransactionNamingStrategy.INCREMENTING
    assert len({counter(incrementing, c, a) for c in range(100) for a in range(SLOTS)}) == 100 * SLOTS


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
        Record("t1", b"x", None, 3, [("h", b"1")]), Record("dflt", None, None, None, None)]
    with pytest.raises(ConfigError, match="null 'topic'"):
        list(records(general, Columns(topic=True, partition=True, headers=True), None))
