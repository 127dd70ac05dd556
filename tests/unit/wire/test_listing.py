"""ListTransactions across the whole cluster: complete, or an error before anything is decided on it."""

from types import SimpleNamespace

import pytest

from kafka2pc._core import codes
from kafka2pc._core.retry import Retry
from kafka2pc._wire.kafka_transport import KafkaTransport
from kafka2pc.errors import IncompleteListingError


def test_a_listing_is_complete_or_fails_loudly():
    """Finding 4 of the core-correctness review: ListTransactions is asked again while a coordinator loads; one that
    never answers makes the listing fail, as do coordinators that move and partitions without a leader."""
    loading, ok = codes.COORDINATOR_LOAD_IN_PROGRESS, codes.NONE
    answers = {1: [loading, loading, ok], 2: [ok]}

    class Client:
        def broker_max_version(self, request):
            return 2

        def partition_leaders(self, topic):
            return {0: 1, 1: 2}

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
    moves = iter([{0: 1, 1: 2}, {0: 2, 1: 2}, {0: 2, 1: 2}, {0: 2, 1: 2}])  # partition 0 moves mid-listing
    Client.partition_leaders = lambda self, topic: next(moves)  # type: ignore[method-assign]
    assert len(transport.list_transactions()) == 2  # listed again once the leaders held still
    with pytest.raises(StopIteration):
        next(moves)
    leaders = {0: 1, 1: 3}  # a coordinator partition led by a broker not in the cluster
    Client.partition_leaders = lambda self, topic: leaders  # type: ignore[method-assign]
    with pytest.raises(IncompleteListingError, match=r"partitions \[1\] have no available leader"):
        transport.list_transactions()
