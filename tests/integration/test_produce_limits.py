"""Record and batch size limits on real brokers: a record too large for its topic (or for max.request.size) is
refused up front and the transaction carries on; a batch the broker refuses as too large is split and every record
still lands exactly once, in order."""

import logging
import time

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kafka2pc import TransactionOutcome, TwoPhaseProducer
from kafka2pc._core.states import State
from kafka2pc.errors import RecordTooLargeError, TransactionAbortableError, TransactionStateError
from kafka2pc.testing.verify import read_records, values
from tests.integration.producer_support import new_txn_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FAST = {"request.timeout.ms": 3000, "max.block.ms": 15_000}
TOPIC_LIMIT = 20_000


@pytest.fixture(params=["newest", "pre2pc"])
def broker(request):
    """Apache Kafka 4.4.0 (2PC on, transaction protocol v2) and 3.9.2 (protocol v1, no 2PC)."""
    return request.getfixturevalue("kafka" if request.param == "newest" else "kafka_pre2pc")


def two_phase_producer(bootstrap: str, **overrides) -> TwoPhaseProducer:
    return TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": new_txn_id("limits"), **FAST,
                             **overrides}, two_phase_commit=True)


# -- 1. a record larger than the topic takes -------------------------------------------------------------------------

def test_record_larger_than_the_topic_takes_is_refused_and_the_transaction_carries_on(broker, topic_factory):
    topic = topic_factory(broker, config={"max.message.bytes": str(TOPIC_LIMIT)})
    near_limit = b"n" * (TOPIC_LIMIT - 200)  # fits, with its batch header
    with two_phase_producer(broker.bootstrap_servers) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, value=b"before")
        with pytest.raises(RecordTooLargeError, match=topic):
            p.produce(topic, value=b"x" * 50_000)
        assert p.state is State.IN_TRANSACTION
        with pytest.raises(RecordTooLargeError):
            p.produce(topic, value=b"small", key=b"k" * 30_000)  # the key counts too
        with pytest.raises(RecordTooLargeError):  # all or nothing: the small ones of the call are not added
            p.produce_batch(topic, [b"batch-small-1", b"x" * 50_000, b"batch-small-2"])
        assert p.state is State.IN_TRANSACTION
        p.produce(topic, value=b"after")
        p.produce(topic, value=near_limit)
        p.produce_batch(topic, [b"batch-1", b"batch-2", near_limit])
        state = p.prepare_transaction()
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
    assert values(read_records(broker.bootstrap_servers, topic)) == [
        b"before", b"after", near_limit, b"batch-1", b"batch-2", near_limit]


def test_max_request_size_refuses_larger_records_on_a_topic_without_a_small_limit(broker, topic_factory):
    topic = topic_factory(broker)
    with two_phase_producer(broker.bootstrap_servers, **{"max.request.size": 10_000}) as p:
        p.init_transactions()
        p.begin_transaction()
        with pytest.raises(RecordTooLargeError, match="10000"):
            p.produce(topic, value=b"x" * 50_000)
        with pytest.raises(RecordTooLargeError):
            p.produce_batch(topic, [b"fine", b"y" * 12_000])
        assert p.state is State.IN_TRANSACTION
        fitting = [f"{i:04d}".encode() + b"z" * 9_000 for i in range(5)]  # each fits alone, not two together
        for value in fitting:
            p.produce(topic, value=value)
        p.produce_batch(topic, fitting)
        p.commit_transaction()
    assert values(read_records(broker.bootstrap_servers, topic)) == fitting + fitting


# -- 2. batches the broker refuses as too large are split ------------------------------------------------------------

def lower_max_message_bytes(broker, topic: str, limit: int) -> None:
    """Set the topic's max.message.bytes and wait until the broker reports it (then a moment more, for the log's
    own copy of the config)."""
    admin = AdminClient(dict(broker.client_config))
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        configs = next(iter(described.values())).result(timeout=10)
        if configs["max.message.bytes"].value == str(limit):
            time.sleep(1.0)
            return
        time.sleep(0.1)
    raise AssertionError(f"max.message.bytes of {topic} is not {limit} after 30 s")


def test_batches_over_a_lowered_max_message_bytes_are_split_and_land_exactly_once(broker, topic_factory, caplog):
    topic = topic_factory(broker, partitions=2)
    bulk = {partition: [f"bulk-{partition}-{i:05d}".encode() * 3 for i in range(4000)] for partition in range(2)}
    singles = [f"single-{i:04d}".encode() * 4 for i in range(1500)]
    assert sum(map(len, bulk[0])) > 5 * TOPIC_LIMIT
    with caplog.at_level(logging.INFO, logger="kafka2pc._data.sender"), \
            two_phase_producer(broker.bootstrap_servers) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, value=b"first", partition=0)  # the producer reads and caches the topic's limit here
        p.flush()
        lower_max_message_bytes(broker, topic, TOPIC_LIMIT)
        for partition in range(2):
            p.produce_batch(topic, bulk[partition], partition=partition)
        for value in singles:
            p.produce(topic, value=value, partition=1, headers=[("h", b"v")])
        state = p.prepare_transaction()
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
    splits = [r for r in caplog.records if "splitting it" in r.getMessage()]
    assert splits, "the broker never refused a batch as too large: the split path was not exercised"
    records = read_records(broker.bootstrap_servers, topic)
    by_partition = {partition: [r.value for r in records if r.partition == partition] for partition in range(2)}
    assert by_partition[0] == [b"first", *bulk[0]]
    assert by_partition[1] == [*bulk[1], *singles]
    assert all(r.key is None for r in records)


def test_a_single_record_over_a_lowered_limit_fails_its_transaction_loudly(broker, topic_factory):
    """The topic's limit is read once per topic (docs/producer.md), so after it is lowered a record between the new
    and the cached limit passes produce() and only the broker refuses it: one record cannot be split, so its
    transaction must abort -- loudly, and the producer carries on with the next one."""
    topic = topic_factory(broker)
    with two_phase_producer(broker.bootstrap_servers) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, value=b"cached")  # the producer reads and caches the topic's limit here
        p.commit_transaction()
        lower_max_message_bytes(broker, topic, TOPIC_LIMIT)
        p.begin_transaction()
        p.produce(topic, value=b"doomed-small")
        p.produce(topic, value=b"d" * (TOPIC_LIMIT + 10_000))
        with pytest.raises(TransactionAbortableError, match="TOO_LARGE"):
            p.prepare_transaction()
        assert p.state is State.ABORTABLE_ERROR
        with pytest.raises(TransactionStateError):
            p.commit_transaction()
        p.abort_transaction()
        p.begin_transaction()
        p.produce(topic, value=b"after")
        p.commit_transaction()
    assert values(read_records(broker.bootstrap_servers, topic)) == [b"cached", b"after"]
