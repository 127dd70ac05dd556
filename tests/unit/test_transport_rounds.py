"""KafkaTransport.execute_all: what happens to a round of coordinator requests that is not answered in time."""

from concurrent.futures import Future

from kafka2pc.coordinator_messages import DescribeTransaction, NoAnswer
from kafka2pc.transport import KafkaTransport


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


class OneByOne(KafkaTransport):
    def execute(self, transactional_id, command):
        self.client.events.append(("alone", transactional_id))
        return NoAnswer("test")


def test_a_round_given_up_on_is_abandoned_before_any_of_it_is_sent_again():
    client = Silent()
    answers = OneByOne(client, timeout_s=0.05).execute_all([("a", DescribeTransaction()), ("b", DescribeTransaction())])
    assert [type(a) for a in answers] == [NoAnswer, NoAnswer]
    assert client.events == [("round", ("a", "b")), ("abandon",), ("alone", "a"), ("alone", "b")]
