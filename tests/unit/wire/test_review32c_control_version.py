"""Review 32c: a TransactionControl on a cluster that finalized ``transaction.version`` 2, whose client connected
before the upgrade and could not read the brokers' ApiVersions again (a broker did not answer), takes the cluster
for protocol 1 and keeps that for its whole life: ``cluster_facts`` folds "this client cannot send v5 yet" into
"the cluster's protocol", and ``TransactionControl.transaction_version`` caches it. ``_recorded`` then fills v1 into
bare ``pid:epoch`` handles ("a v1 cluster never ran a v2 one"), so a commit whose first answer was lost is judged
UNKNOWN instead of COMMITTED (CompleteCommit at e + 1 is never a v1 commit)."""

import asyncio
import types

import kafka.errors as kafka_errors
from kafka.protocol.broker_version_data import BROKER_API_VERSIONS, BrokerVersionData

from kafka2pc._wire.kafka_transport import KafkaTransport
from kafka2pc.transaction_control import TransactionControl

LEARNT_ON_39 = dict(BROKER_API_VERSIONS[(3, 9)])


class Client:
    """A ClusterClient as KafkaTransport and api_versions see it: versions learnt on 3.9, level 2 finalized, and a
    broker that does not answer ApiVersions (restarting)."""

    def __init__(self):
        self._manager = types.SimpleNamespace(broker_version_data=BrokerVersionData(api_versions=dict(LEARNT_ON_39)),
                                              run=lambda call: asyncio.run(call()), _conns={})
        self._lanes = types.SimpleNamespace(_lanes={})

    def broker_ids(self):
        return [1]

    def send_idempotent(self, factory, node_id, *, what, timeout_s):
        raise kafka_errors.KafkaConnectionError("broker 1 restarting")

    def broker_max_version(self, request_class):
        found = (self._manager.broker_version_data.api_versions or {}).get(request_class.API_KEY)
        return -1 if found is None else found[1]

    def finalized_feature_level(self, feature):
        return 2


def test_a_control_on_a_level_2_cluster_does_not_take_it_for_protocol_1_when_a_versions_read_failed():
    control = TransactionControl(KafkaTransport(Client(), timeout_s=1.0))
    # the cluster's protocol is 2 (finalized): a transaction with a bare handle may have run under it
    assert control.transaction_version == 2
