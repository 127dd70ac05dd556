"""A round of coordinator requests for many transactional ids (the committer's checks and completions) is answered
in one round trip on a real broker: none falls back to being sent on its own. A broker works on one request per
connection at a time and kafka-python keeps at most 5 in flight on one, so eight ids on one connection meant three
sent again one by one (correct, but three more round trips after the round)."""

import pytest

from kafka2pc._core.messages import Described, DescribeTransaction, EndTxn, ProducerIdentity
from kafka2pc._wire.kafka_transport import KafkaTransport
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.transaction_control import TransactionControl
from tests.integration.producer_support import new_txn_id, producer

pytestmark = pytest.mark.integration


class CountingTransport(KafkaTransport):
    """Counts the commands that had to be sent one by one."""

    alone = 0

    def execute(self, transactional_id, command):
        self.alone += 1
        return super().execute(transactional_id, command)


def test_a_round_for_eight_ids_is_answered_without_one_by_one_retries(kafka, topic_factory):
    topic = topic_factory(kafka, partitions=8)
    ids = [new_txn_id("round") for _ in range(8)]
    prepared = []
    for partition, txn_id in enumerate(ids):
        with producer(kafka.bootstrap_servers, txn_id) as p:
            p.init_transactions()
            p.begin_transaction()
            p.produce(topic, b"x", partition=partition)
            prepared.append(p.prepare_transaction())
    with ClusterClient(ClientConfig.for_bootstrap(kafka.bootstrap_servers)) as client:
        transport = CountingTransport(client, timeout_s=30)
        for _ in range(3):  # the first round opens the connections; all must be answered in the round each time
            answers = transport.execute_all([(txn_id, DescribeTransaction()) for txn_id in ids])
            assert all(isinstance(a, Described) and a.observed.state == "Ongoing" for a in answers), answers
        answers = transport.execute_all([(txn_id, EndTxn(ProducerIdentity(s.producer_id, s.epoch), True,
                                                         s.transaction_version or 2))
                                         for txn_id, s in zip(ids, prepared, strict=True)])
        assert all(a.error == 0 for a in answers), answers
        assert transport.alone == 0
        states = {TransactionControl(client).describe(txn_id).state for txn_id in ids}
    assert states <= {"PrepareCommit", "CompleteCommit"}
