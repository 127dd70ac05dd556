"""Adversarial review of b200547 (issue 32): the transaction protocol 2 EndTxn pinned to v5, when v5 cannot be sent.

``_request`` pins a protocol-2 EndTxn to ``min_version=5``; ``_versions_for`` reads every broker's ApiVersions again
first when the client's versions lack v5, and ``api_versions._adopt`` then gives every connection the range ALL
brokers speak. Where that range still lacks EndTxn v5 (a broker of the cluster, not necessarily the coordinator,
that does not speak it: software rolled back after ``transaction.version`` was lowered to 1 with protocol-2
transactions still prepared, a broker added on older software), kafka-python refuses the request on the client
(IncompatibleBrokerVersion). The single path (``execute``) raises UnsupportedByBrokerError; the concurrent path
(``execute_all``: the sink committer's and recovery's ``commit_all``, every ``abort_all``) reports it as a lost answer
("may or may not have been processed"), so the machine resends it for the whole budget, reading every broker's
ApiVersions again before each resend (the 10 s back-off covers only failed reads), and the decision ends as
TransactionNotSettledError ("retriable, says nothing") for ever. Strict xfail: each fails on the current code."""

from __future__ import annotations

import asyncio
import types
from concurrent.futures import Future

import kafka.errors as kafka_errors
from kafka.protocol.admin.transactions import DescribeTransactionsRequest
from kafka.protocol.broker_version_data import BROKER_API_VERSIONS, BrokerVersionData
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer.transaction import EndTxnRequest

from kafka2pc._wire.kafka_transport import KafkaTransport
from kafka2pc.errors import TransactionNotSettledError, UnsupportedByBrokerError
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.transaction_control import TransactionControl

NEW = dict(BROKER_API_VERSIONS[(4, 3)])  # EndTxn up to v5
OLD = dict(BROKER_API_VERSIONS[(3, 9)])  # EndTxn up to v4


class MixedClient:
    """A ClusterClient on a cluster whose brokers 1 and 2 speak 4.x and broker 3 3.9 (EndTxn up to v4); the
    coordinator (broker 1) would take v5. Requests are versioned as kafka-python's connection versions them."""

    def __init__(self):
        self._manager = types.SimpleNamespace(broker_version_data=BrokerVersionData(api_versions=dict(OLD)),
                                              run=lambda call: asyncio.run(call()), _conns={})
        self._lanes = types.SimpleNamespace(_lanes={})
        self.spoken = {1: NEW, 2: NEW, 3: OLD}
        self.api_versions_asked = 0
        self.end_versions = []

    def broker_ids(self):
        return [1, 2, 3]

    def send_idempotent(self, factory, node_id, *, what, timeout_s):
        assert isinstance(factory(), ApiVersionsRequest)
        self.api_versions_asked += 1
        return types.SimpleNamespace(error_code=0, api_keys=[
            types.SimpleNamespace(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in self.spoken[node_id].items()])

    def broker_max_version(self, request_class):
        found = (self._manager.broker_version_data.api_versions or {}).get(request_class.API_KEY)
        return -1 if found is None else found[1]

    def finalized_feature_level(self, feature):
        return 1

    def look_up_transaction_coordinators(self, ids):
        pass

    def transaction_coordinator(self, transactional_id, refresh=False):
        return 1

    def forget_coordinator(self, transactional_id):
        pass

    def abandon_spread_requests(self):
        pass

    def _reply(self, request):
        try:
            version = self._manager.broker_version_data.api_version(request)
        except kafka_errors.IncompatibleBrokerVersion as exc:
            return exc  # refused on the client: never sent
        if isinstance(request, EndTxnRequest):
            self.end_versions.append(version)
            return types.SimpleNamespace(error_code=0, producer_id=7, producer_epoch=4)
        assert isinstance(request, DescribeTransactionsRequest)
        return types.SimpleNamespace(transaction_states=[types.SimpleNamespace(
            error_code=0, transaction_state="Ongoing", producer_id=7, producer_epoch=3, transaction_timeout_ms=60000,
            transaction_start_time_ms=1, topics=[])])

    def send_concurrently(self, requests, keys=None):
        future = Future()
        future.set_result([self._reply(request) for request, _ in requests])
        return future

    def send(self, request, node_id=None):
        reply = self._reply(request)
        if isinstance(reply, Exception):
            raise UnsupportedByBrokerError(str(reply)) from reply
        return reply


def commit_prepared_v2(client: MixedClient):
    control = TransactionControl(KafkaTransport(client, timeout_s=1.0), transaction_version=2, timeout_s=1.0)
    return control.commit_all([("sink-0-0", PreparedTxnState(7, 3, 2))])[0]


def test_a_protocol_2_end_the_client_cannot_send_is_reported_unsupported_not_as_not_settled():
    """Scenario: a sink decision of protocol-2 transactions (recorded with transaction_version=2) is rolled forward
    (the committer after a crash, `kafka2pc recover`, the next planning) while one broker of the cluster speaks
    EndTxn only up to v4. Step by step: _versions_for reads every broker again (ok), adopts the common range
    (EndTxn max 4); the pinned request is refused by kafka-python (IncompatibleBrokerVersion, nothing sent);
    execute_all's _lost calls it an answer that 'may or may not have been processed'; Resending sends it again for
    the whole budget; the decision ends TransactionNotSettledError, which the sink treats as 'will settle by
    itself', for as long as the cluster stays mixed. It should be the loud UnsupportedByBrokerError execute() gives."""
    client = MixedClient()
    result = commit_prepared_v2(client)
    assert client.end_versions == []  # nothing was sent (no v4 either: that part of b200547 holds)
    assert not isinstance(result, TransactionNotSettledError), f"reported as not settled yet: {result}"
    assert isinstance(result, UnsupportedByBrokerError), result


def test_a_refused_protocol_2_end_does_not_read_every_brokers_versions_at_each_resend():
    """The same scenario: the re-read succeeds each time (every broker answers) but still gives EndTxn max 4, so
    _FAILED_AT is never set and each resend (every 0.1-1 s for max.block.ms) asks every broker for ApiVersions."""
    client = MixedClient()
    commit_prepared_v2(client)
    assert client.api_versions_asked <= len(client.broker_ids()), \
        f"{client.api_versions_asked} ApiVersions requests for one end on a {len(client.broker_ids())}-broker cluster"
