"""The kafka2pc data source's options, checked on the driver before anything is written."""

import pytest

pytest.importorskip("pyspark")


from kafka2pc.errors import ConfigError
from kafka2pc.sink.naming import TransactionNamingStrategy
from kafka2pc.sink.write_keys import WriteKey
from kafka2pc.spark.options import SinkOptions, checkpoint_location

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
    ({**BASE, "startingOffsets": "earliest"}, "startingOffsets", "unknown option"),
    ({**BASE, "kafka.sasl.jass.config": "x"}, "kafka.sasl.jass.config", "did you mean 'kafka.sasl.jaas.config'"),
    ({**BASE, "spark.kafka.producer.cache.timeout": "5m"}, "spark.kafka.producer.cache.timeout",
     "this sink's is the option producerCacheTimeout"),
    ({**BASE, "kafka.producer.cache.timeout": "5m"}, "kafka.producer.cache.timeout", "producerCacheTimeout"),
    ({**BASE, "producerCacheTimeout": "-1"}, "producerCacheTimeout", "0 keeps no producers"),
    ({**BASE, "producerCacheTimeout": "\uff15"}, "producerCacheTimeout", "expected a duration"),
    ({**BASE, "transactionnamingstrategy": "probing"}, "transactionNamingStrategy", "pooling or incrementing"),
    ({**BASE, "twophasecommit": "maybe"}, "twoPhaseCommit", "true or false"),
    ({**BASE, "transactionalidprefix": "-bad"}, "transactional.id.prefix", "must be 1-200 characters"),
    ({**BASE, "asyncprogresstrackingenabled": "true"}, "asyncProgressTrackingEnabled", "exactly-once"),
    ({k: v for k, v in BASE.items() if k != "checkpointlocation"}, "checkpointLocation", "is required"),
    ({**BASE, "checkpointlocation": "wasbs://c@a/ck"}, "checkpointLocation", "wasbs: is not supported"),
    ({**BASE, "checkpointlocation": "s3a:///ck"}, "checkpointLocation", "names no bucket"),
])
def test_bad_options_are_refused_naming_the_option(options, key, problem):
    with pytest.raises(ConfigError, match=problem) as info:
        SinkOptions.from_options(options, streaming=True)
    assert info.value.key == key


def test_checkpoint_locations_may_be_file_uris():
    assert checkpoint_location("k", "file:/tmp/a/b") == "/tmp/a/b"
    assert checkpoint_location("k", "file:///tmp/a/b") == "/tmp/a/b"


@pytest.mark.parametrize(("extra", "streaming", "key", "problem"), [
    ({"txnAppId": "job"}, False, "txnVersion", "go together"),
    ({"txnVersion": "3"}, False, "txnAppId", "go together"),
    ({"txnAppId": "job", "txnVersion": "three"}, False, "txnVersion", "integer"),
    ({"txnAppId": "job", "txnVersion": "-1"}, False, "txnVersion", "integer"),
    ({"txnAppId": "job", "txnVersion": "3"}, True, "txnAppId", "batch writes"),
])
def test_write_key_options_are_checked(tmp_path, extra, streaming, key, problem):
    options = {"kafka.bootstrap.servers": "b:9092", "topic": "t", "checkpointLocation": str(tmp_path), **extra}
    with pytest.raises(ConfigError, match=problem) as raised:
        SinkOptions.from_options(options, streaming=streaming)
    assert raised.value.key == key


def test_write_key_options_make_a_key(tmp_path):
    options = {"kafka.bootstrap.servers": "b:9092", "topic": "t", "checkpointLocation": str(tmp_path),
               "TXNAPPID": "job", "txnversion": " 12 "}
    assert SinkOptions.from_options(options, streaming=False).write_key == WriteKey("job", 12)
    del options["TXNAPPID"], options["txnversion"]
    assert SinkOptions.from_options(options, streaming=False).write_key is None


def test_a_scheme_less_path_is_refused_where_spark_resolves_it_elsewhere(tmp_path):
    (tmp_path / "core-site.xml").write_text(
        "<configuration><property><name>fs.defaultFS</name><value>hdfs://nn:8020</value></property></configuration>")
    with pytest.raises(ConfigError, match=r"resolves it against hdfs://nn:8020"):
        checkpoint_location("checkpointLocation", "/ck", {"HADOOP_CONF_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="dbfs:/"):
        checkpoint_location("checkpointLocation", "ck", {"DATABRICKS_RUNTIME_VERSION": "16.4"})
    # a full URI says where, whatever the default; a local default, or none known, keeps local paths
    assert checkpoint_location("k", "file:///ck", {"HADOOP_CONF_DIR": str(tmp_path)}) == "/ck"
    (tmp_path / "core-site.xml").write_text(
        "<configuration><property><name>fs.defaultFS</name><value>file:///</value></property></configuration>")
    assert checkpoint_location("k", "/ck", {"HADOOP_CONF_DIR": str(tmp_path)}) == "/ck"
    assert checkpoint_location("k", "/ck", {}) == "/ck"


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600.0), ("30s", 30.0), ("1500", 1.5), ("500ms", 0.5),
                                                ("2h", 7200.0), ("0", 0.0), (" 5 min ", 300.0)])
def test_producer_cache_timeout_takes_spark_durations(text, seconds):
    options = SinkOptions.from_options({**BASE, "producercachetimeout": text}, streaming=True)
    assert options.producer_cache_timeout_s == seconds


def test_producer_cache_timeout_defaults_to_sparks_ten_minutes_and_refuses_nonsense():
    assert SinkOptions.from_options(BASE, streaming=True).producer_cache_timeout_s == 600.0
    with pytest.raises(ConfigError, match=r"producerCacheTimeout.*duration such as 10m"):
        SinkOptions.from_options({**BASE, "producercachetimeout": "ten minutes"}, streaming=True)
    with pytest.raises(ConfigError, match="producerCacheTimeout"):
        SinkOptions.from_options({**BASE, "producercachetimeout": "5 weeks"}, streaming=True)


def test_the_metadata_broker_list_alias_is_enough():
    options = SinkOptions.from_options({"kafka.metadata.broker.list": "127.0.0.1:9092", "checkpointlocation": "/c"},
                                       streaming=False)
    assert options.producer_config == {"metadata.broker.list": "127.0.0.1:9092"}
