"""Adversarial review of b5ec3c6 (issue 32): the versions a running client holds, at the wire. kafka-python picks each
request's version from the versions its connection holds, silently below the ``max_version`` asked; b5ec3c6 reads
them again only inside a producer's initialisation. Each test fails on b5ec3c6."""

import asyncio
import types

import kafka.errors as kafka_errors
from kafka.protocol.broker_version_data import BROKER_API_VERSIONS, BrokerVersionData
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer.transaction import EndTxnRequest, InitProducerIdRequest

from kafka2pc._core.driver import drive
from kafka2pc._core.initialization import Initialization
from kafka2pc._core.messages import EndAnswer, EndTxn, ProducerIdentity
from kafka2pc._wire.kafka_transport import KafkaTransport
from kafka2pc.errors import BrokerUnavailableError, UnsupportedByBrokerError

#: what a client that connected to Apache Kafka 3.9 learnt (EndTxn up to v4, InitProducerId up to v5), and what the
#: brokers speak after an in-place upgrade to 4.x (EndTxn v5: transaction protocol 2)
LEARNT_ON_39 = dict(BROKER_API_VERSIONS[(3, 9)])
SPOKEN_ON_4X = dict(BROKER_API_VERSIONS[(4, 3)])


class Client:
    """A ClusterClient as the transport and api_versions see it: kafka-python's manager holding the versions it
    learnt when it connected (and that every request is versioned by), brokers answering ApiVersions with what they
    speak now (``down``: these do not answer), one coordinator."""

    def __init__(self, learnt, spoken, *, down=()):
        self._manager = types.SimpleNamespace(broker_version_data=BrokerVersionData(api_versions=dict(learnt)),
                                              run=lambda call: asyncio.run(call()), _conns={})
        self._lanes = types.SimpleNamespace(_lanes={})
        self.spoken, self.down = spoken, set(down)
        self.sent = []  # (request name, version) of every coordinator request sent
        self.api_versions_asked = []

    # -- what api_versions.read_again uses
    def broker_ids(self):
        return [1, 2, 3]

    def send_idempotent(self, factory, node_id, *, what, timeout_s):
        assert isinstance(factory(), ApiVersionsRequest)
        self.api_versions_asked.append(node_id)
        if node_id in self.down:
            raise BrokerUnavailableError(f"broker {node_id} did not answer ApiVersions within {timeout_s} s")
        return types.SimpleNamespace(error_code=0, api_keys=[
            types.SimpleNamespace(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in self.spoken.items()])

    # -- what KafkaTransport uses
    def broker_max_version(self, request_class):
        found = (self._manager.broker_version_data.api_versions or {}).get(request_class.API_KEY)
        return -1 if found is None else found[1]

    def finalized_feature_level(self, feature):
        return 2

    def broker_configs(self, names):
        return dict.fromkeys(names, "900000")

    def transaction_coordinator(self, transactional_id, refresh=False):
        return 1

    def forget_coordinator(self, transactional_id):
        pass

    def send(self, request, node_id=None):
        try:  # as kafka-python's connection does: the highest version both sides have, within the request's range
            version = self._manager.broker_version_data.api_version(request)
        except kafka_errors.IncompatibleBrokerVersion as exc:
            raise UnsupportedByBrokerError(str(exc)) from exc
        self.sent.append((type(request).__name__, version))
        if isinstance(request, EndTxnRequest):
            return types.SimpleNamespace(error_code=0, producer_id=7, producer_epoch=4 if version >= 5 else -1)
        assert isinstance(request, InitProducerIdRequest)
        return types.SimpleNamespace(error_code=0, producer_id=7, producer_epoch=0)


def test_a_transaction_protocol_2_commit_is_never_sent_as_endtxn_v4():
    """The Spark driver's client (and TransactionControl's, `kafka2pc recover`'s) never initialises a producer, so
    b5ec3c6 never reads its versions again: after an in-place upgrade 3.9 -> 4.x and transaction.version 1 -> 2,
    executors (whose clients did read them again) prepare protocol-2 transactions, and the driver commits them with
    EndTxn max_version=5, which a connection that learnt 3.9's versions silently sends as v4. Measured on 4.4.0: the
    coordinator then commits without bumping the epoch (CompleteCommit at the transaction's own epoch), so every
    later look judges that committed transaction NEVER_STARTED (outcome ABORTED), and a v4 abort fences nothing.
    A protocol-2 end must go out at v5 (reading the versions again first), or not at all."""
    client = Client(LEARNT_ON_39, SPOKEN_ON_4X)
    transport = KafkaTransport(client, timeout_s=1.0)
    answer = transport.execute("t", EndTxn(ProducerIdentity(7, 3), True, 2))
    versions = [version for name, version in client.sent if name == "EndTxnRequest"]
    assert 4 not in versions, f"a transaction protocol 2 commit went out as EndTxn v{versions}"
    assert versions == [5] and answer == EndAnswer(0, ProducerIdentity(7, 4))


def test_a_read_of_the_versions_that_failed_is_not_repeated_at_every_initialisation():
    """VERSIONS_MAX_AGE_S says the versions are read again "at most once per this long per client". A read that
    fails (a broker in the client's metadata that does not answer: killed, partitioned, not yet fenced) records
    nothing, so every fallback initialisation reads again, each waiting up to 5 s for that broker (_READ_AGAIN_S):
    on a 3.x cluster every Spark task, and every dual writer's 30 s re-initialisation, pays it."""
    client = Client(LEARNT_ON_39, LEARNT_ON_39, down={2})
    transport = KafkaTransport(client, timeout_s=1.0)
    for n in range(3):  # three producers of one client initialising within a second
        facts = transport.cluster_facts()
        plan = Initialization(f"t-{n}", keep_prepared=False, two_phase_wanted=True,
                              init_producer_id_max_version=facts.init_producer_id_max_version,
                              transaction_version=facts.transaction_version, timeout_ms=None,
                              versions_age_s=facts.versions_age_s)
        drive(transport, f"t-{n}", plan)
        assert plan.fallback_reason is not None
    tries = client.api_versions_asked.count(2)
    assert tries == 1, f"the unanswering broker was asked for its ApiVersions {tries} times in one second"
