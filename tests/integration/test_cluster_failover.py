"""On a 3-node cluster, an open transaction survives the SIGKILL of its transaction coordinator."""

import pytest

from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.testing.verify import read_records, values
from tests.integration.txn_helpers import produce_all, transactional_producer

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def test_transaction_commits_after_its_coordinator_is_killed(kafka_3node, topic_factory):
    bootstrap = kafka_3node.bootstrap_servers
    topic = topic_factory(kafka_3node, partitions=3, replication_factor=3)
    txn_id = "failover-txn"
    producer = transactional_producer(bootstrap, txn_id, acks="all")
    producer.begin_transaction()
    payloads = [f"rec-{i}".encode() for i in range(300)]
    produce_all(producer, topic, payloads)

    with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
        coordinator = client.transaction_coordinator(txn_id)
    assert coordinator in kafka_3node.node_ids
    kafka_3node.kill_node(coordinator)
    try:
        producer.commit_transaction(90)
        with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
            assert client.transaction_coordinator(txn_id, refresh=True) != coordinator
        assert sorted(values(read_records(bootstrap, topic, timeout_s=60))) == sorted(payloads)
    finally:
        kafka_3node.start_node(coordinator)
        kafka_3node.wait_ready()


def test_prepared_two_phase_transaction_commits_after_coordinator_failover(kafka_3node, topic_factory):
    from kafka2pc import TransactionOutcome, TwoPhaseProducer  # noqa: PLC0415

    bootstrap = kafka_3node.bootstrap_servers
    topic = topic_factory(kafka_3node, partitions=3, replication_factor=3)
    txn_id = "failover-2pc"
    with TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id},
                          two_phase_commit=True) as producer:
        producer.init_transactions()
        assert producer.two_phase_commit_active
        producer.begin_transaction()
        payloads = [f"p-{i}".encode() for i in range(3000)]
        producer.produce_batch(topic, payloads[:1500])
        producer.produce_batch(topic, payloads[1500:], keys=[str(i).encode() for i in range(1500)])
        state = producer.prepare_transaction()
        with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
            coordinator = client.transaction_coordinator(txn_id)
        kafka_3node.kill_node(coordinator)
        try:
            assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
            assert sorted(values(read_records(bootstrap, topic, timeout_s=60))) == sorted(payloads)
            producer.begin_transaction()  # and it goes on writing with the new coordinator
            producer.produce(topic, value=b"after-failover", partition=0)
            producer.commit_transaction()
        finally:
            kafka_3node.start_node(coordinator)
            kafka_3node.wait_ready()
    assert b"after-failover" in values(read_records(bootstrap, topic, timeout_s=60))


def test_writes_survive_a_partition_leader_kill(kafka_3node, topic_factory):
    from kafka2pc import TransactionOutcome, TwoPhaseProducer  # noqa: PLC0415

    bootstrap = kafka_3node.bootstrap_servers
    topic = topic_factory(kafka_3node, partitions=3, replication_factor=3)
    with TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": "leader-kill"},
                          two_phase_commit=True) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        first = [f"a-{i}".encode() for i in range(2000)]
        producer.produce_batch(topic, first, partition=0)
        producer.flush()
        with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
            leader = client.partition_leaders(topic)[0]
        kafka_3node.kill_node(leader)
        try:
            second = [f"b-{i}".encode() for i in range(2000)]
            producer.produce_batch(topic, second, partition=0)  # the leader of partition 0 is gone
            state = producer.prepare_transaction()
            assert producer.complete_transaction(state) is TransactionOutcome.COMMITTED
            seen = [r.value for r in read_records(bootstrap, topic, timeout_s=60) if r.partition == 0]
            assert seen == first + second  # in order, exactly once, despite the retries
        finally:
            kafka_3node.start_node(leader)
            kafka_3node.wait_ready()
