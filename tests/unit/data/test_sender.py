"""The data plane without a broker: size checks, splitting refused batches, retries with the same sequence, and
bounded waits."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from kafka.record.default_records import DefaultRecordBatch

from kafka2pc._core import codes
from kafka2pc._core.messages import ProducerIdentity
from kafka2pc._data.sender import RecordSender
from kafka2pc.config import ProducerConfig
from kafka2pc.errors import ProducerFencedError, RecordTooLargeError, TransactionAbortableError


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
