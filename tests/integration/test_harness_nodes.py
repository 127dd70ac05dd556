"""Node control: a stopped node comes back with its data, and the harness says where logs are."""

import pytest

from kafka2pc.testing import HarnessSetupError, LocalKafkaCluster
from kafka2pc.testing.verify import read_records, values
from tests.integration.txn_helpers import produce_all, transactional_producer

pytestmark = pytest.mark.integration


# the harness's own behaviour, not kafka2pc's: make chaos runs it (-m slow), out of the default suite's time budget
@pytest.mark.slow
def test_restarted_node_keeps_committed_data(kafka_3node, topic_factory):
    topic = topic_factory(kafka_3node, partitions=1, replication_factor=3)
    producer = transactional_producer(kafka_3node.bootstrap_servers, acks="all")
    producer.begin_transaction()
    produce_all(producer, topic, [b"kept"])
    producer.commit_transaction(30)

    for node_id in kafka_3node.node_ids:  # every node restarted once, one after another
        kafka_3node.restart_node(node_id)
        kafka_3node.wait_ready()
    assert values(read_records(kafka_3node.bootstrap_servers, topic, timeout_s=60)) == [b"kept"]


def test_running_node_cannot_be_started_twice(kafka_3node):
    if not isinstance(kafka_3node, LocalKafkaCluster):
        pytest.skip("local backend only")
    with pytest.raises(HarnessSetupError, match="already running"):
        kafka_3node.start_node(kafka_3node.node_ids[0])
