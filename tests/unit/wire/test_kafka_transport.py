"""KafkaTransport: what it reports for a round of coordinator requests that is not answered in time (it never sends
anything again by itself: the machines decide that)."""

from concurrent.futures import Future

import kafka.errors as kafka_errors
import pytest

from kafka2pc._core import codes
from kafka2pc._core.messages import DescribeTransaction, EndTxn, NoAnswer, ProducerIdentity
from kafka2pc._wire.kafka_transport import WAVE, KafkaTransport
from kafka2pc.errors import BrokerUnavailableError, KafkaProtocolError


class Silent:
    """A cluster client whose concurrent round never completes; records what the transport does after."""

    def __init__(self):
        self.events = []

    def look_up_transaction_coordinators(self, ids):
        pass

    def transaction_coordinator(self, transactional_id, refresh=False):
        return 1

    def send_concurrently(self, requests, keys=None):
        self.events.append(("round", tuple(keys)))
        return Future()  # never answered

    def abandon_spread_requests(self):
        self.events.append(("abandon",))

    def forget_coordinator(self, transactional_id):
        self.events.append(("forget", transactional_id))

    def broker_max_version(self, request_class):
        return 5  # a 4.x cluster: no ApiVersions read before a transaction protocol 2 end


def test_a_round_given_up_on_is_abandoned_and_reported_lost_never_sent_again_here():
    """The lanes are closed before anything is answered, so nothing of the round can go out after a resend."""
    client = Silent()
    answers = KafkaTransport(client, timeout_s=0.05).execute_all([("a", DescribeTransaction()),
                                                                  ("b", DescribeTransaction())])
    assert [type(a) for a in answers] == [NoAnswer, NoAnswer]
    assert all(a.sent for a in answers)  # it may have reached the coordinator
    assert client.events == [("round", ("a", "b")), ("abandon",), ("forget", "a"), ("forget", "b")]


class Answering(Silent):
    """Completes every round at once (each request failed: what the answers are does not matter here)."""

    def send_concurrently(self, requests, keys=None):
        self.events.append(("round", tuple(keys)))
        done = Future()
        done.set_result([ConnectionError("no matter") for _ in requests])
        return done


def test_a_large_round_goes_out_in_waves_a_connection_can_take():
    """256 requests at once overflowed the lanes' in-flight limit ("Node paused: max_in_flight"), and the refused
    ones, resent together, starved; now no wave is larger than the lanes can carry."""
    client = Answering()
    ids = [f"t-{n}" for n in range(2 * WAVE + 3)]
    KafkaTransport(client, timeout_s=1).execute_all([(txn_id, DescribeTransaction()) for txn_id in ids])
    rounds = [keys for kind, *rest in client.events if kind == "round" for keys in rest]
    assert [len(keys) for keys in rounds] == [WAVE, WAVE, 3]
    assert [txn_id for keys in rounds for txn_id in keys] == ids


class Failing(Silent):
    """A cluster client whose single request fails with ``error`` (or whose coordinator cannot be found)."""

    def __init__(self, error=None, lookup_error=None):
        super().__init__()
        self.error, self.lookup_error = error, lookup_error

    def transaction_coordinator(self, transactional_id, refresh=False):
        if self.lookup_error is not None:
            raise self.lookup_error
        return 1

    def send(self, request, node_id=None):
        raise self.error


@pytest.mark.parametrize(("client", "sent"), [
    (Failing(kafka_errors.KafkaConnectionError("reset by peer")), True),
    (Failing(kafka_errors.NodeNotReadyError("not ready")), False),
    (Failing(lookup_error=KafkaProtocolError("FindCoordinator", "COORDINATOR_NOT_AVAILABLE",
                                             codes.COORDINATOR_NOT_AVAILABLE)), False),
    (Failing(lookup_error=BrokerUnavailableError("no broker")), False),
])
def test_a_lost_answer_carries_the_exception_the_edge_saw(client, sent):
    """NoAnswer kept only a string; the machine that raises on it now chains the exception itself."""
    answer = KafkaTransport(client, timeout_s=1).execute("t", EndTxn(ProducerIdentity(5, 3), True, 2))
    assert isinstance(answer, NoAnswer) and answer.sent is sent
    assert answer.cause is (client.error or client.lookup_error)


def test_a_find_coordinator_error_that_is_not_busy_is_raised_for_the_core():
    refused = KafkaProtocolError("FindCoordinator", "UNKNOWN_SERVER_ERROR", -1)
    with pytest.raises(KafkaProtocolError) as raised:
        KafkaTransport(Failing(lookup_error=refused), timeout_s=1).execute("t", DescribeTransaction())
    assert raised.value is refused
