"""On a 3-node cluster, an open transaction survives the SIGKILL of its transaction coordinator."""

import pytest

from kafka2pc.cluster_client import ClusterClient
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
