"""The process's cache of handed-over producers follows the cluster's two-phase commit: a producer that uses it goes
on only while its decision stands (DECISION_STANDS_S); then the task's new producer asks the cluster again, so a
cluster that turned two-phase commit off is no longer given transactions that never time out."""

from kafka2pc._core.initialization import DECISION_STANDS_S
from kafka2pc._core.messages import ObservedTransaction
from kafka2pc._core.states import State
from kafka2pc.sink.producer_cache import ProducerCache

CONFIG = {"bootstrap.servers": "localhost:9092"}
ENDED = ObservedTransaction("CompleteCommit", 1, 2)


class FakeProducer:
    def __init__(self, transactional_id):
        self.transactional_id, self.state = transactional_id, State.PREPARED
        self.two_phase_commit_active = True
        self.closed = False

    def continue_after_completion(self, observed):
        self.state = State.READY
        return True

    def close(self):
        self.closed = True


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_producer_goes_on_while_its_decision_stands_then_a_new_one_decides_again():
    clock = Clock()
    cache = ProducerCache(clock=clock)
    producer = FakeProducer("p-0-0")
    cache.keep(CONFIG, producer, two_phase_commit=True)  # decided during this task
    for _ in range(3):  # goes on, task after task, keeping the time it decided at
        clock.now += DECISION_STANDS_S / 4
        assert cache.take(CONFIG, "p-0-0", ENDED, two_phase_commit=True) is producer
        producer.state = State.PREPARED
        cache.keep(CONFIG, producer, two_phase_commit=True)
    clock.now += DECISION_STANDS_S / 4
    assert cache.take(CONFIG, "p-0-0", ENDED, two_phase_commit=True) is None
    assert producer.closed

    newer = FakeProducer("p-0-0")  # the task's new producer, which initialised: its decision is new
    cache.keep(CONFIG, newer, two_phase_commit=True)
    clock.now += DECISION_STANDS_S / 2
    assert cache.take(CONFIG, "p-0-0", ENDED, two_phase_commit=True) is newer


def test_plain_producers_have_no_decision_to_follow():
    clock = Clock()
    cache = ProducerCache(clock=clock)
    producer = FakeProducer("p-0-0")
    producer.two_phase_commit_active = False
    cache.keep(CONFIG, producer, two_phase_commit=False)
    clock.now += DECISION_STANDS_S * 2  # within the idle timeout
    assert cache.take(CONFIG, "p-0-0", ENDED, two_phase_commit=False) is producer
