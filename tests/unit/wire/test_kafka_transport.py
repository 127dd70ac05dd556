"""KafkaTransport: what it reports for a round of coordinator requests that is not answered in time (it never sends
anything again by itself: the machines decide that)."""

from concurrent.futures import Future

from kafka2pc._core.messages import DescribeTransaction, NoAnswer
from kafka2pc._wire.kafka_transport import KafkaTransport


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
