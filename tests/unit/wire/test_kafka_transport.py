"""KafkaTransport: what it reports for a round of coordinator requests that is not answered in time (it never sends
anything again by itself: the machines decide that)."""

from concurrent.futures import Future

from kafka2pc._core.messages import DescribeTransaction, NoAnswer
from kafka2pc._wire.kafka_transport import WAVE, KafkaTransport


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
