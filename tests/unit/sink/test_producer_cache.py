"""The process's cache of clients and handed-over producers: what it gives back, what it closes, and when."""

import types

from kafka2pc import metrics
from kafka2pc._core.initialization import VERSIONS_MAX_AGE_S
from kafka2pc._core.messages import ObservedTransaction
from kafka2pc._core.states import State
from kafka2pc.sink import producer_cache
from kafka2pc.sink.producer_cache import ProducerCache

CONFIG = {"bootstrap.servers": "localhost:9092"}


class FakeProducer:
    def __init__(self, transactional_id, state=State.PREPARED, goes_on=True, two_phase_commit_active=True):
        self.transactional_id, self.state, self.goes_on = transactional_id, state, goes_on
        self.two_phase_commit_active = two_phase_commit_active
        self.closed = False
        self.looked_at = []

    def continue_after_completion(self, observed):
        self.looked_at.append(observed)
        if self.goes_on:
            self.state = State.READY
        return self.goes_on

    def close(self):
        self.closed = True


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _count(result):
    return metrics.sample("kafka2pc_producer_cache_lookups_total", result=result) or 0.0


def test_a_kept_producer_goes_on_with_the_look_it_is_given():
    cache = ProducerCache()
    producer = FakeProducer("p-0-0")
    cache.keep(CONFIG, producer, two_phase_commit=True)
    look = ObservedTransaction("CompleteCommit", 1, 2)
    before = _count("continued")
    assert cache.take(CONFIG, "p-0-0", look, two_phase_commit=True) is producer
    assert producer.looked_at == [look] and not producer.closed
    assert _count("continued") == before + 1
    # taken: a second task never gets the same producer
    assert cache.take(CONFIG, "p-0-0", look, two_phase_commit=True) is None


def test_one_that_may_not_go_on_is_closed_and_none_is_given():
    cache = ProducerCache()
    producer = FakeProducer("p-0-0", goes_on=False)
    cache.keep(CONFIG, producer, two_phase_commit=True)
    before = _count("superseded")
    assert cache.take(CONFIG, "p-0-0", ObservedTransaction("Empty", 1, 3), two_phase_commit=True) is None
    assert producer.closed and _count("superseded") == before + 1


def test_producers_are_kept_per_id_and_configuration():
    cache = ProducerCache()
    producer = FakeProducer("p-0-0")
    cache.keep(CONFIG, producer, two_phase_commit=True)
    assert cache.take(CONFIG, "p-0-4", None, two_phase_commit=True) is None
    assert cache.take({**CONFIG, "client.id": "other"}, "p-0-0", None, two_phase_commit=True) is None
    assert len(cache) == 1


def test_only_a_prepared_producer_is_kept_and_none_with_caching_off():
    cache = ProducerCache()
    ready = FakeProducer("p-0-0", state=State.READY)
    cache.keep(CONFIG, ready, two_phase_commit=True)
    assert ready.closed and len(cache) == 0
    off = ProducerCache(idle_timeout_s=0)
    prepared = FakeProducer("p-0-0")
    off.keep(CONFIG, prepared, two_phase_commit=True)
    assert prepared.closed and len(off) == 0


def test_a_newer_producer_of_the_id_replaces_the_older():
    cache = ProducerCache()
    old, new = FakeProducer("p-0-0"), FakeProducer("p-0-0")
    cache.keep(CONFIG, old, two_phase_commit=True)
    cache.keep(CONFIG, new, two_phase_commit=True)
    assert old.closed and not new.closed and len(cache) == 1


def test_idle_producers_and_then_their_clients_are_closed(monkeypatch):
    clients = []

    class FakeClient:
        def __init__(self, *args, **kwargs):
            self.closed = False
            clients.append(self)

        def close(self):
            self.closed = True

    monkeypatch.setattr(producer_cache, "ClusterClient", FakeClient)
    clock = Clock()
    cache = ProducerCache(idle_timeout_s=60, clock=clock)
    client = cache.client(CONFIG)
    assert cache.client(CONFIG) is client
    idle, busy = FakeProducer("p-0-0"), FakeProducer("p-1-0")
    cache.keep(CONFIG, idle, two_phase_commit=True)
    clock.now = 50
    cache.keep(CONFIG, busy, two_phase_commit=True)
    clock.now = 70  # idle unused for 70 s, busy for 20 s
    cache.evict_idle()
    assert idle.closed and not busy.closed and not client.closed  # a cached producer still uses the client
    clock.now = 200
    cache.evict_idle()
    assert busy.closed and client.closed and len(cache) == 0
    assert cache.client(CONFIG) is not client  # connected afresh


def test_what_the_coordinator_operations_learn_is_kept_with_their_client(monkeypatch):
    """The cluster's transaction protocol is read once per client and VERSIONS_MAX_AGE_S, not once per task or
    commit (in Spark, a commit asked for it again every batch: a DescribeFeatures round trip); a client closed as
    idle takes it with it."""
    facts_read = []

    class FakeClient:
        def __init__(self, *args, **kwargs):
            self.closed = False

        def cluster_facts(self):
            facts_read.append(self)
            return types.SimpleNamespace(finalized_transaction_version=2, transaction_version=2)

        def close(self):
            self.closed = True

    monkeypatch.setattr(producer_cache, "ClusterClient", FakeClient)
    clock = Clock()
    cache = ProducerCache(idle_timeout_s=60, clock=clock)
    assert cache.control(CONFIG).transaction_version == 2
    assert cache.control(CONFIG).transaction_version == 2
    assert cache.control(CONFIG).transport is cache.client(CONFIG) and len(facts_read) == 1
    clock.now = VERSIONS_MAX_AGE_S + 1  # the cluster may have raised or lowered transaction.version since
    assert cache.control(CONFIG).transaction_version == 2 and len(facts_read) == 2
    clock.now = 1000
    cache.evict_idle()
    assert cache.control(CONFIG).transaction_version == 2 and len(facts_read) == 3  # a new client, read again
    assert facts_read[0].closed and not facts_read[2].closed


def test_a_producer_that_fell_back_from_two_phase_commit_is_not_kept():
    """Its id's next task sends a new InitProducerId, asking for Enable2Pc again: brokers that gained it are used
    from then on, instead of a cached producer going on with transactions the broker times out."""
    cache = ProducerCache()
    fell_back = FakeProducer("p-0-0", two_phase_commit_active=False)
    cache.keep(CONFIG, fell_back, two_phase_commit=True)
    assert fell_back.closed and len(cache) == 0
    plain = FakeProducer("p-0-0", two_phase_commit_active=False)  # two_phase_commit=False asked: kept
    cache.keep(CONFIG, plain, two_phase_commit=False)
    assert not plain.closed and len(cache) == 1


def test_a_producer_is_given_only_to_a_task_asking_for_the_same_two_phase_commit():
    cache = ProducerCache()
    producer = FakeProducer("p-0-0")
    cache.keep(CONFIG, producer, two_phase_commit=True)
    look = ObservedTransaction("CompleteCommit", 1, 2)
    assert cache.take(CONFIG, "p-0-0", look, two_phase_commit=False) is None
    assert cache.take(CONFIG, "p-0-0", look, two_phase_commit=True) is producer


def test_a_look_slower_than_the_idle_timeout_does_not_close_the_client_the_task_uses(monkeypatch):
    class FakeClient:
        def __init__(self, *args, **kwargs):
            self.closed = False

        def close(self):
            self.closed = True

    monkeypatch.setattr(producer_cache, "ClusterClient", FakeClient)
    clock = Clock()
    cache = ProducerCache(idle_timeout_s=0.6, clock=clock)
    cache.keep(CONFIG, FakeProducer("p-0-0"), two_phase_commit=True)
    client = cache.client(CONFIG)  # the task's look starts
    clock.now = 5.0  # ... and takes longer than the timeout
    producer = cache.take(CONFIG, "p-0-0", ObservedTransaction("CompleteCommit", 1, 2), two_phase_commit=True)
    assert producer is not None and not client.closed  # the task goes on with it, on its open client
