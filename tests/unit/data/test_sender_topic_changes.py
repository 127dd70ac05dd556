"""The data plane when the output topic changes under it (issue 32, part 3), without a broker: partitions added are
used once the producer's partition metadata is ``metadata.max.age.ms`` old; a topic deleted after use is named as
deleted; a send retried until ``delivery.timeout.ms`` names the partitions it could not write and why."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from kafka.record.default_records import DefaultRecordBatch

from kafka2pc._core import codes
from kafka2pc._core.messages import ProducerIdentity
from kafka2pc._data.partitioner import key_partition
from kafka2pc._data.sender import RecordSender
from kafka2pc.config import ProducerConfig
from kafka2pc.errors import KafkaProtocolError, TransactionAbortableError


class Topic:
    """One topic on a fake cluster: its partition count can grow, it can be deleted, and Produce answers can be
    scripted per partition. ``written`` holds (partition, key) of every record the fake accepted."""

    def __init__(self, partitions: int):
        self.partitions = partitions
        self.deleted = False
        self.produce_error: int | None = None
        self.metadata_reads = 0
        self.written: list[tuple[int, bytes]] = []

    def partition_leaders(self, topic):
        self.metadata_reads += 1
        if self.deleted:
            raise KafkaProtocolError("Metadata", "UNKNOWN_TOPIC_OR_PARTITION", codes.UNKNOWN_TOPIC_OR_PARTITION,
                                     f"topic {topic!r}")
        return dict.fromkeys(range(self.partitions), 1)

    def max_message_bytes(self, topic):
        return None

    def send_produce(self, calls):
        answers = []
        for call in calls:
            reply = {}
            for framed in call.batches:
                code = codes.UNKNOWN_TOPIC_OR_PARTITION if self.deleted else self.produce_error or codes.NONE
                if code == codes.NONE:
                    self.written += [(framed.partition, r.key) for r in DefaultRecordBatch(framed.data)]
                reply[(framed.topic, framed.partition)] = (code, "")
            answers.append(reply)
        future: Future = Future()
        future.set_result(answers)
        return future


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    import kafka2pc._data.sender as sender_module  # noqa: PLC0415

    fake = Clock()
    monkeypatch.setattr(sender_module, "time", fake)
    return fake


def new_sender(topic: Topic, **config) -> RecordSender:
    settings = {"bootstrap.servers": "x:1", "transactional.id": "t", "linger.ms": 0, "retry.backoff.ms": 100,
                **config}
    return RecordSender(ProducerConfig.from_dict(settings, two_phase_commit=False), topic)


def transaction(sender: RecordSender, keys: list[bytes], *, batch: bool) -> None:
    sender.begin(ProducerIdentity(3, 1), transaction_version=2, before_send=lambda partitions: None)
    if batch:
        sender.append_batch("out", [b"v"] * len(keys), keys, None, timestamp=1)
    else:
        for key in keys:
            sender.append("out", b"v", key, None, headers=None, timestamp=1)
    sender.flush()


KEYS = [str(i).encode() for i in range(200)]


@pytest.mark.parametrize("batch", [False, True], ids=["produce", "produce_batch"])
def test_partitions_added_are_used_from_the_first_transaction_after_metadata_max_age(clock, batch):
    """Before, a producer read a topic's partitions once and kept them for its lifetime: partitions added later
    never got a record from it (a cached Spark task producer, a DualWriter), while new producers used them, so one
    key went to two partitions for as long as the old producers lived."""
    topic = Topic(partitions=2)
    sender = new_sender(topic, **{"metadata.max.age.ms": 60_000})
    transaction(sender, KEYS, batch=batch)
    topic.partitions = 5
    clock.now += 30
    transaction(sender, KEYS, batch=batch)  # younger than metadata.max.age.ms: the count read before stands
    assert {p for p, _ in topic.written} == {0, 1}
    assert all(p == key_partition(k, 2) for p, k in topic.written)
    clock.now += 31
    transaction(sender, KEYS, batch=batch)
    after = topic.written[2 * len(KEYS):]
    assert all(p == key_partition(k, 5) for p, k in after)
    assert {p for p, _ in after} == {0, 1, 2, 3, 4}
    moved = sum(key_partition(k, 2) != key_partition(k, 5) for k in KEYS)
    assert moved > len(KEYS) // 2  # most keys change partition: placement is by the new count from here on


def test_the_partitions_are_read_once_per_metadata_max_age_not_per_transaction(clock):
    topic = Topic(partitions=3)
    sender = new_sender(topic, **{"metadata.max.age.ms": 300_000})
    for _ in range(20):
        transaction(sender, KEYS[:10], batch=False)
        clock.now += 1
    assert topic.metadata_reads == 1
    clock.now += 300
    transaction(sender, KEYS[:10], batch=False)
    assert topic.metadata_reads == 2


def test_a_topic_deleted_after_use_is_named_as_deleted(clock):
    topic = Topic(partitions=2)
    sender = new_sender(topic)
    transaction(sender, KEYS[:10], batch=True)
    topic.deleted = True
    with pytest.raises(TransactionAbortableError, match=r"topic 'out' no longer exists: it was deleted") as raised:
        transaction(sender, KEYS[:10], batch=True)
    assert "abort it" in str(raised.value) and isinstance(raised.value.__cause__, KafkaProtocolError)
    assert sender.idle  # nothing left to send: the abort only has to end the transaction


def test_a_topic_that_never_existed_still_says_create_it():
    topic = Topic(partitions=1)
    topic.deleted = True
    sender = new_sender(topic)
    sender.begin(ProducerIdentity(3, 1), transaction_version=2, before_send=lambda partitions: None)
    with pytest.raises(TransactionAbortableError, match=r"cannot be read \(it does not exist"):
        sender.append("out", b"v", b"k", None, headers=None, timestamp=1)


def test_retries_that_run_out_name_the_partitions_not_written_and_why(clock):
    """A deleted topic whose metadata a broker still lists (the deletion not yet applied everywhere): Produce
    answers UNKNOWN_TOPIC_OR_PARTITION, the batch is sent again, and delivery.timeout.ms ends it. Before, the error
    said only 'records not acknowledged within delivery.timeout.ms'."""
    topic = Topic(partitions=2)
    topic.produce_error = codes.UNKNOWN_TOPIC_OR_PARTITION
    sender = new_sender(topic, **{"delivery.timeout.ms": 5000})
    with pytest.raises(TransactionAbortableError, match=r"delivery\.timeout\.ms=5000") as raised:
        transaction(sender, KEYS[:10], batch=True)
    message = str(raised.value)
    assert "not written: out-0: UNKNOWN_TOPIC_OR_PARTITION, out-1: UNKNOWN_TOPIC_OR_PARTITION" in message
    assert clock.now - 1000.0 <= 5.0 + 1e-9  # bounded by delivery.timeout.ms
