"""The harness provides a real broker whose transactions behave as Kafka's do, seen by a read_committed consumer."""

import pytest

from kafka2pc.testing.verify import end_offsets, read_records, values
from tests.integration.txn_helpers import produce_all, transactional_producer

pytestmark = pytest.mark.integration


def test_committed_transaction_is_visible_exactly(kafka, topic_factory):
    topic = topic_factory(kafka)
    payloads = [f"commit-{i}".encode() for i in range(50)]
    producer = transactional_producer(kafka.bootstrap_servers)
    producer.begin_transaction()
    produce_all(producer, topic, payloads)
    producer.commit_transaction(30)

    assert values(read_records(kafka.bootstrap_servers, topic)) == payloads


def test_aborted_transaction_is_invisible_to_read_committed(kafka, topic_factory):
    topic = topic_factory(kafka)
    producer = transactional_producer(kafka.bootstrap_servers)
    producer.begin_transaction()
    produce_all(producer, topic, [f"abort-{i}".encode() for i in range(20)])
    producer.abort_transaction(30)

    assert read_records(kafka.bootstrap_servers, topic) == []
    # The records did reach the log: read_uncommitted sees them, so "nothing visible" is the abort's doing.
    assert len(read_records(kafka.bootstrap_servers, topic, isolation="read_uncommitted")) == 20


def test_open_transaction_holds_back_the_last_stable_offset(kafka, topic_factory):
    topic = topic_factory(kafka)
    producer = transactional_producer(kafka.bootstrap_servers)
    producer.begin_transaction()
    produce_all(producer, topic, [b"a", b"b", b"c"])

    assert end_offsets(kafka.bootstrap_servers, topic) == {0: 0}
    assert end_offsets(kafka.bootstrap_servers, topic, isolation="read_uncommitted") == {0: 3}

    producer.commit_transaction(30)
    assert end_offsets(kafka.bootstrap_servers, topic) == {0: 4}  # 3 records + the commit marker
    assert values(read_records(kafka.bootstrap_servers, topic)) == [b"a", b"b", b"c"]


def test_pre_2pc_broker_runs_transactions_too(kafka_pre2pc, topic_factory):
    topic = topic_factory(kafka_pre2pc)
    producer = transactional_producer(kafka_pre2pc.bootstrap_servers)
    producer.begin_transaction()
    produce_all(producer, topic, [b"x"])
    producer.commit_transaction(30)
    producer.begin_transaction()
    produce_all(producer, topic, [b"y"])
    producer.abort_transaction(30)
    assert values(read_records(kafka_pre2pc.bootstrap_servers, topic)) == [b"x"]
