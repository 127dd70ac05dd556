"""The transaction protocol a running client reports (``KafkaTransport.cluster_facts``) once the cluster finalizes
``transaction.version`` 2. The level itself is read afresh at every call, but protocol 2 also needs the client's
held versions to carry Produce v12 and EndTxn v5, and kafka-python keeps the versions it learnt when it connected:
a client that connected before an in-place upgrade from 3.9 held Produce v11 for ever, so a producer that did not
want two-phase commit (nothing else read the versions again) stayed on protocol 1 after kafka-features raised the
level (measured on 3.9.2 -> 4.4.0: every new producer of the running client at 1; a new client's at 2)."""

import asyncio
import types

from kafka.protocol.broker_version_data import BROKER_API_VERSIONS, BrokerVersionData
from kafka.protocol.metadata import ApiVersionsRequest

from kafka2pc._core.initialization import VERSIONS_MAX_AGE_S
from kafka2pc._wire import api_versions
from kafka2pc._wire.kafka_transport import KafkaTransport

#: what a client that connected to Apache Kafka 3.9 learnt (Produce up to v11, EndTxn up to v4), and what the brokers
#: speak after an in-place upgrade to 4.x (Produce v12 and EndTxn v5: transaction protocol 2)
LEARNT_ON_39 = dict(BROKER_API_VERSIONS[(3, 9)])
SPOKEN_ON_4X = dict(BROKER_API_VERSIONS[(4, 3)])


class Client:
    """A ClusterClient as KafkaTransport and api_versions see it: kafka-python's manager holding the versions it
    learnt when it connected, one broker answering ApiVersions with what it speaks now, and the cluster's finalized
    ``transaction.version`` (read afresh at every call, as DescribeFeatures does)."""

    def __init__(self, learnt, spoken, level):
        self._manager = types.SimpleNamespace(broker_version_data=BrokerVersionData(api_versions=dict(learnt)),
                                              run=lambda call: asyncio.run(call()), _conns={})
        self._lanes = types.SimpleNamespace(_lanes={})
        self.spoken, self.level = spoken, level
        self.api_versions_asked = 0

    def broker_ids(self):
        return [1]

    def send_idempotent(self, factory, node_id, *, what, timeout_s):
        assert isinstance(factory(), ApiVersionsRequest)
        self.api_versions_asked += 1
        return types.SimpleNamespace(error_code=0, api_keys=[
            types.SimpleNamespace(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in self.spoken.items()])

    def broker_max_version(self, request_class):
        found = (self._manager.broker_version_data.api_versions or {}).get(request_class.API_KEY)
        return -1 if found is None else found[1]

    def finalized_feature_level(self, feature):
        assert feature == "transaction.version"
        return self.level


def test_a_client_from_before_an_upgrade_reports_protocol_2_once_the_cluster_finalizes_it():
    client = Client(LEARNT_ON_39, SPOKEN_ON_4X, level=1)  # upgraded in place; the feature not raised yet
    transport = KafkaTransport(client, timeout_s=5.0)
    assert transport.cluster_facts().transaction_version == 1
    assert client.api_versions_asked == 0  # protocol 1 finalized: the held versions are not in question
    client.level = 2  # kafka-features upgrade --feature transaction.version=2
    facts = transport.cluster_facts()
    assert facts.transaction_version == 2
    assert client.api_versions_asked == 1  # every broker's versions read again, and now held
    assert client.broker_max_version(types.SimpleNamespace(API_KEY=0)) == SPOKEN_ON_4X[0][1]
    assert facts.versions_age_s is not None and facts.versions_age_s < VERSIONS_MAX_AGE_S


def test_versions_that_still_lack_protocol_2_when_read_again_are_not_read_at_every_call():
    client = Client(LEARNT_ON_39, LEARNT_ON_39, level=2)  # a broker that does not answer with more
    transport = KafkaTransport(client, timeout_s=5.0)
    assert [transport.cluster_facts().transaction_version for _ in range(3)] == [1, 1, 1]
    assert client.api_versions_asked == 1  # once per VERSIONS_MAX_AGE_S, as before a fallback
    assert api_versions.age_s(client) is not None
