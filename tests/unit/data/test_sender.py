"""The data plane without a broker: size checks, splitting refused batches, retries with the same sequence, and
bounded waits."""

from __future__ import annotations

from concurrent.futures import Future

import kafka.errors as kafka_errors
import pytest
from kafka.record.default_records import DefaultRecordBatch

from kafka2pc._core import codes
from kafka2pc._core.messages import ProducerIdentity
from kafka2pc._data.sender import RecordSender
from kafka2pc.config import ProducerConfig
from kafka2pc.errors import KafkaProtocolError, ProducerFencedError, RecordTooLargeError, TransactionAbortableError


class ScriptedTransport:
    """Answers Produce requests with ``reply(batch) -> error code | Exception``; ``hang`` leaves rounds unanswered."""

    def __init__(self, reply=lambda batch: codes.NONE, *, topic_limit=None, hang=False):
        self.reply = reply
        self.topic_limit = topic_limit
        self.hang = hang
        self.sent: list[DefaultRecordBatch] = []

    def partition_leaders(self, topic):
        return {0: 1}

    def max_message_bytes(self, topic):
        return self.topic_limit

    def send_produce(self, calls):
        future: Future = Future()
        if self.hang:
            return future
        answers = []
        for call in calls:
            reply = {}
            for framed in call.batches:
                batch = DefaultRecordBatch(framed.data)
                self.sent.append(batch)
                outcome = self.reply(batch)
                if isinstance(outcome, Exception):
                    reply = outcome
                    break
                reply[(framed.topic, framed.partition)] = (outcome, "")
            answers.append(reply)
        future.set_result(answers)
        return future


def sender(transport, **config) -> RecordSender:
    settings = {"bootstrap.servers": "x:1", "transactional.id": "t", "linger.ms": 0, "retry.backoff.ms": 0, **config}
    result = RecordSender(ProducerConfig.from_dict(settings, two_phase_commit=False), transport)
    result.begin(ProducerIdentity(3, 1), transaction_version=2, before_send=lambda partitions: None)
    return result


def values_sent(transport) -> list[bytes]:
    return [r.value for b in transport.sent for r in b]


def test_a_record_over_max_request_size_is_refused_and_nothing_is_added():
    transport = ScriptedTransport()
    s = sender(transport, **{"max.request.size": 1000})
    with pytest.raises(RecordTooLargeError, match="exceeds the 1000 bytes"):
        s.append("t", b"x" * 2000, None, None, headers=None, timestamp=1)
    with pytest.raises(RecordTooLargeError):
        s.append_batch("t", [b"ok", b"x" * 2000], None, None, timestamp=1)
    assert s.idle
    s.append("t", b"small", None, None, headers=None, timestamp=1)
    s.flush()
    assert values_sent(transport) == [b"small"]


def test_batches_fit_the_topics_max_message_bytes():
    transport = ScriptedTransport(topic_limit=2000)
    s = sender(transport)
    s.append_batch("t", [b"v" * 90] * 100, None, None, timestamp=1)
    s.flush()
    assert len(transport.sent) >= 5 and all(b.size_in_bytes <= 2000 for b in transport.sent)
    assert values_sent(transport) == [b"v" * 90] * 100
    with pytest.raises(RecordTooLargeError, match="topic 't'"):
        s.append("t", b"v" * 2500, None, None, headers=None, timestamp=1)


def test_a_batch_refused_as_too_large_is_split_with_fresh_sequences():
    def reply(batch):
        return codes.MESSAGE_TOO_LARGE if batch.records_count > 25 else codes.NONE

    transport = ScriptedTransport(reply)
    s = sender(transport)
    values = [f"{i:04d}".encode() for i in range(100)]
    s.append_batch("t", values, None, None, timestamp=1)
    s.flush()
    accepted = [b for b in transport.sent if b.records_count <= 25]
    assert [r.value for b in accepted for r in b] == values  # all, once, in order
    expected, sequences = 0, []
    for batch in accepted:
        sequences.append(batch.base_sequence)
        assert batch.base_sequence == expected
        expected += batch.records_count
    assert sequences[0] == 0


def test_a_lost_response_is_retried_with_the_same_bytes_and_sequence():
    lost = [ConnectionError("response lost")]
    transport = ScriptedTransport(lambda batch: lost.pop() if lost else codes.NONE)
    s = sender(transport)
    s.append_batch("t", [b"a", b"b"], None, None, timestamp=1)
    s.flush()
    first, retry = transport.sent
    assert (first.base_sequence, first.producer_epoch) == (retry.base_sequence, retry.producer_epoch) == (0, 1)
    assert [r.value for r in retry] == [b"a", b"b"]


def test_an_unanswered_round_becomes_an_abortable_error_not_a_timeout_exception():
    s = sender(ScriptedTransport(hang=True), **{"delivery.timeout.ms": 200})
    s.append("t", b"x", None, None, headers=None, timestamp=1)
    with pytest.raises(TransactionAbortableError, match=r"delivery\.timeout\.ms=200"):
        s.flush()


def test_fencing_is_reported_as_such():
    s = sender(ScriptedTransport(lambda batch: codes.INVALID_PRODUCER_EPOCH))
    s.append("t", b"x", None, None, headers=None, timestamp=1)
    with pytest.raises(ProducerFencedError):
        s.flush()


class FakeClock:
    """The sender's clock: ``sleep`` moves it and records how long each wait was."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    import kafka2pc._data.sender as sender_module  # noqa: PLC0415

    fake = FakeClock()
    monkeypatch.setattr(sender_module, "time", fake)
    return fake


def busy_then_done(busy: int):
    """NOT_LEADER for the first ``busy`` sends of a batch, then written."""
    answers = [kafka_errors.NotLeaderForPartitionError.errno] * busy

    def reply(batch):
        return answers.pop(0) if answers else codes.NONE
    return reply


def test_produce_retries_back_off_from_retry_backoff_ms_doubling_to_a_second(clock):
    """Before, every retry waited retry.backoff.ms exactly. Now the one Retry policy: the base doubling to
    retry.backoff.max.ms (Kafka's default 1 s), each wait up to 20 % shorter (jitter)."""
    transport = ScriptedTransport(busy_then_done(7))
    s = sender(transport, **{"retry.backoff.ms": 100})
    s.append("t", b"x", None, None, headers=None, timestamp=1)
    s.flush()
    nominal = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert len(clock.slept) == len(nominal) and len(transport.sent) == 8
    assert all(0.8 * n - 1e-9 <= d <= n + 1e-9 for d, n in zip(clock.slept, nominal, strict=True)), clock.slept
    assert {b.base_sequence for b in transport.sent} == {0}  # the same batch each time


def test_a_round_without_retries_ends_the_series(clock):
    transport = ScriptedTransport(busy_then_done(3))
    s = sender(transport, **{"retry.backoff.ms": 100})
    s.append("t", b"x", None, None, headers=None, timestamp=1)
    s.flush()
    transport.reply = busy_then_done(1)
    s.append("t", b"y", None, None, headers=None, timestamp=1)
    s.flush()
    assert clock.slept[3] <= 0.1 + 1e-9  # the next failure starts from retry.backoff.ms again


def test_a_base_longer_than_the_cap_is_kept(clock):
    transport = ScriptedTransport(busy_then_done(2))
    s = sender(transport, **{"retry.backoff.ms": 3000})
    s.append("t", b"x", None, None, headers=None, timestamp=1)
    s.flush()
    assert all(2.4 - 1e-9 <= d <= 3.0 + 1e-9 for d in clock.slept) and len(clock.slept) == 2


@pytest.mark.parametrize("code", [kafka_errors.NotEnoughReplicasError.errno, codes.REQUEST_TIMED_OUT])
def test_a_batch_whose_write_timed_out_is_sent_again(clock, code):
    """REQUEST_TIMED_OUT (its own kind, TIMED_OUT: the replicas were slow) sends the same batch again, as a partition
    that could not write yet does."""
    answers = [code, code]
    transport = ScriptedTransport(lambda batch: answers.pop(0) if answers else codes.NONE)
    s = sender(transport, **{"retry.backoff.ms": 100})
    s.append("t", b"x", None, None, headers=None, timestamp=1)
    s.flush()
    assert len(transport.sent) == 3 and {b.base_sequence for b in transport.sent} == {0}


def test_retries_stop_at_delivery_timeout_ms(clock):
    s = sender(ScriptedTransport(lambda batch: kafka_errors.NotLeaderForPartitionError.errno),
               **{"retry.backoff.ms": 100, "delivery.timeout.ms": 5000})
    s.append("t", b"x", None, None, headers=None, timestamp=1)
    with pytest.raises(TransactionAbortableError, match=r"delivery\.timeout\.ms=5000"):
        s.flush()
    assert sum(clock.slept) <= 5.0


def test_a_topic_the_broker_does_not_know_fails_the_transaction_not_the_producer():
    """Before, produce() raised KafkaProtocolError (a FatalError) and the producer stayed IN_TRANSACTION."""
    class NoTopic(ScriptedTransport):
        def partition_leaders(self, topic):
            raise KafkaProtocolError("Metadata", "UNKNOWN_TOPIC_OR_PARTITION", codes.UNKNOWN_TOPIC_OR_PARTITION)

    s = sender(NoTopic())
    with pytest.raises(TransactionAbortableError,
                       match=r"partitions of topic 'nope' cannot be read \(it does not exist") as raised:
        s.append("nope", b"x", None, None, headers=None, timestamp=1)
    assert isinstance(raised.value.__cause__, KafkaProtocolError) and s.idle


class HeldTransport(ScriptedTransport):
    """Leaves each round unanswered until the test answers it (``answer(n)``): every batch written."""

    def __init__(self):
        super().__init__()
        self.rounds: list[tuple[Future, list]] = []

    def send_produce(self, calls):
        future: Future = Future()
        self.rounds.append((future, calls))
        return future

    def answer(self, index: int) -> None:
        future, calls = self.rounds[index]
        for call in calls:
            self.sent.extend(DefaultRecordBatch(framed.data) for framed in call.batches)
        future.set_result([{(f.topic, f.partition): (codes.NONE, "") for f in call.batches} for call in calls])


def test_records_added_while_a_round_is_in_flight_go_in_the_next_round_once_it_is_answered():
    """Records keep coming while a round is in flight: none is sent before it is answered, and the first record
    after its answer starts the next round with everything buffered meanwhile (no flush needed). The sender learns
    of the answer from the round's own callback, not by asking the future for every record."""
    transport = HeldTransport()
    producer = sender(transport)  # linger.ms 0: every record is ready to go at once
    producer.append("t", b"1", None, None, headers=None, timestamp=0)
    producer.append("t", b"2", None, None, headers=None, timestamp=0)
    assert len(transport.rounds) == 1  # the first round is in flight: record 2 waits
    transport.answer(0)
    producer.append("t", b"3", None, None, headers=None, timestamp=0)
    assert len(transport.rounds) == 2
    transport.answer(1)
    assert values_sent(transport) == [b"1", b"2", b"3"]
