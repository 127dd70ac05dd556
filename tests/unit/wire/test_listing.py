"""ListTransactions across the whole cluster: complete, or an error before anything is decided on it."""

from types import SimpleNamespace

import pytest

from kafka2pc._core import codes
from kafka2pc._core.retry import LISTING_ROUNDS, Retry
from kafka2pc._wire.kafka_transport import KafkaTransport
from kafka2pc.errors import IncompleteListingError, KafkaProtocolError


def test_a_listing_is_complete_or_fails_loudly():
    """Finding 4 of the core-correctness review: ListTransactions is asked again while a coordinator loads; one that
    never answers makes the listing fail, as do coordinators that move and partitions without a leader."""
    loading, ok = codes.COORDINATOR_LOAD_IN_PROGRESS, codes.NONE
    answers = {1: [loading, loading, ok], 2: [ok]}

    class Client:
        def broker_max_version(self, request):
            return 2

        def partition_leadership(self, topic):
            return {0: (1, 0), 1: (2, 0)}

        def broker_ids(self):
            return [1, 2]

        reads = Retry(timeout_s=1.0, backoff_s=0.01)

        def send(self, request, node_id=None):
            code = answers[node_id].pop(0) if answers[node_id] else loading
            entries = [SimpleNamespace(transactional_id=f"x-{node_id}", producer_id=node_id,
                                       transaction_state="Ongoing")]
            return SimpleNamespace(error_code=code, transaction_states=entries if code == ok else [])

    transport = KafkaTransport(Client(), timeout_s=1.0)
    assert [t.transactional_id for t in transport.list_transactions(states=["Ongoing"])] == ["x-1", "x-2"]
    answers[1] = []  # broker 1 keeps loading
    with pytest.raises(IncompleteListingError, match="broker 1 kept answering COORDINATOR_LOAD_IN_PROGRESS"):
        transport.list_transactions(states=["Ongoing"])
    answers[1], answers[2] = [ok, ok], [ok, ok]
    moves = iter([{0: (1, 0), 1: (2, 0)}, {0: (2, 1), 1: (2, 0)}, {0: (2, 1), 1: (2, 0)},
                  {0: (2, 1), 1: (2, 0)}])  # partition 0 moves mid-listing
    Client.partition_leadership = lambda self, topic: next(moves)  # type: ignore[method-assign]
    assert len(transport.list_transactions()) == 2  # listed again once the leaders held still
    with pytest.raises(StopIteration):
        next(moves)
    leaders = {0: (1, 0), 1: (3, 0)}  # a coordinator partition led by a broker not in the cluster
    Client.partition_leadership = lambda self, topic: leaders  # type: ignore[method-assign]
    with pytest.raises(IncompleteListingError, match=r"partitions \[1\] have no available leader"):
        transport.list_transactions()


class Listing:
    """One broker that lists one transaction; ``leaders`` gives the coordinators' partition leaders each time."""

    reads = Retry(timeout_s=1.0, backoff_s=0.01)

    def __init__(self, leaders):
        self.leaders, self.listings = leaders, 0

    def broker_max_version(self, request):
        return 2

    def partition_leadership(self, topic):
        return self.leaders()

    def broker_ids(self):
        return [1, 2]

    def send(self, request, node_id=None):
        self.listings += 1
        return SimpleNamespace(error_code=codes.NONE, transaction_states=[
            SimpleNamespace(transactional_id="x", producer_id=1, transaction_state="Ongoing")])


def test_coordinators_that_keep_moving_are_listed_again_under_the_listing_policy_then_fail():
    moving = iter(range(100))
    client = Listing(lambda: {0: (1 + next(moving) % 2, 0)})
    with pytest.raises(IncompleteListingError, match="kept moving"):
        KafkaTransport(client, timeout_s=1.0).list_transactions()
    assert client.listings == 2 * (LISTING_ROUNDS.total + 1)  # two brokers, each listing


def test_a_coordinator_that_moved_away_and_back_during_the_fan_out_is_listed_again():
    """Seen on a 3-node cluster (a broker killed, back, then a preferred-leader election): the partition of an open
    transaction moved from broker 1 to broker 2 after broker 2 was asked, then back to broker 1 before the listing
    compared the leaders. The same leader, a later leader epoch: the first round may have missed it."""
    reads = iter([{0: (1, 5)}, {0: (1, 7)}, {0: (1, 7)}, {0: (1, 7)}])
    client = Listing(lambda: next(reads))
    assert [t.transactional_id for t in KafkaTransport(client, timeout_s=1.0).list_transactions()] == ["x"]
    assert client.listings == 4  # two rounds over the two brokers
    with pytest.raises(StopIteration):
        next(reads)


def test_a_cluster_that_never_ran_a_transaction_lists_none():
    def no_topic():
        raise KafkaProtocolError("Metadata", "UNKNOWN_TOPIC_OR_PARTITION", codes.UNKNOWN_TOPIC_OR_PARTITION)

    client = Listing(no_topic)
    client.broker_ids = lambda: []  # type: ignore[method-assign]
    assert KafkaTransport(client, timeout_s=1.0).list_transactions() == []


def test_leaders_that_cannot_be_read_make_the_listing_incomplete():
    def refused():
        raise KafkaProtocolError("Metadata", "TOPIC_AUTHORIZATION_FAILED", codes.TOPIC_AUTHORIZATION_FAILED)

    with pytest.raises(IncompleteListingError, match="grant DESCRIBE"):
        KafkaTransport(Listing(refused), timeout_s=1.0).list_transactions()


def test_a_broker_that_left_the_cluster_mid_listing_starts_a_new_round_instead_of_waiting_for_it():
    """A broker killed while a listing waits on it is fenced within seconds and its coordinators move; the listing
    used to retry it until its whole timeout (60 s), then fail. Now, once the metadata no longer has it, the next
    round asks the coordinators' new leaders."""
    import kafka.errors as kafka_errors  # noqa: PLC0415

    reads = iter([{0: (2, 5)}, {0: (1, 6)}, {0: (1, 6)}])
    members = [[1, 2], [1]]

    class LeftClient(Listing):
        def broker_ids(self):
            return members[0]

        def send(self, request, node_id=None):
            if node_id == 2:
                if len(members) > 1:
                    members.pop(0)  # fenced: the refreshed metadata no longer has it
                raise kafka_errors.UnknownBrokerIdError(2)
            return super().send(request, node_id)

    client = LeftClient(lambda: next(reads))
    client.reads = Retry(timeout_s=3.0, backoff_s=0.01)
    assert [t.transactional_id for t in KafkaTransport(client, timeout_s=3.0).list_transactions()] == ["x"]
    assert client.listings == 2  # broker 1 in each round; broker 2 never waited on
