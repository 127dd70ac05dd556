"""Reading a topic for an audit: a read_committed confluent-kafka consumer (librdkafka, an independent client), up to
the end offsets taken at the start."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from kafka2pc.audit.decoding import RecordDecoder
from kafka2pc.audit.open_transactions import describe_open_transactions
from kafka2pc.audit.report import AuditReport, OpenTransaction
from kafka2pc.audit.tally import Tally
from kafka2pc.config import ClientConfig
from kafka2pc.config.librdkafka import librdkafka_settings
from kafka2pc.errors import AuditError, Kafka2pcError

_LIBRDKAFKA_LOG = logging.getLogger("kafka2pc.audit.librdkafka")
#: Kafka error codes a partition answers with while its leadership moves (OFFSET_NOT_AVAILABLE, LEADER_NOT_AVAILABLE,
#: NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH): ListOffsets is asked again after _ASK_AGAIN_S
_LEADER_CHANGING = frozenset({78, 5, 6, 74, 75})
_ASK_AGAIN_S = 0.2


def librdkafka_config(settings: Mapping[str, object]) -> dict[str, Any]:
    """Validated connection settings (either client's keys) as a librdkafka consumer takes them."""
    return librdkafka_settings(ClientConfig.from_dict(settings))


@attrs.frozen
class EndOffsets:
    """Per partition: the log start offset, the read_committed end (LSO) and the read_uncommitted end (high
    watermark)."""

    partitions: tuple[int, ...]
    low: Mapping[int, int]
    lso: Mapping[int, int]
    high: Mapping[int, int]


class _TopicReader:
    """A read_committed and a read_uncommitted confluent-kafka consumer of one topic, bounded by a deadline."""

    def __init__(self, confluent: Any, config: Mapping[str, str], topic: str, deadline: float,
                 timeout_s: float) -> None:
        self._confluent = confluent
        self.topic = topic
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.bootstrap = config.get("bootstrap.servers", "")
        base = {**config, "group.id": f"kafka2pc-audit-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                "auto.offset.reset": "earliest", "logger": _LIBRDKAFKA_LOG,
                # failures reach the caller as exceptions; librdkafka's own reports only with --verbose
                "log_level": 7 if _LIBRDKAFKA_LOG.isEnabledFor(logging.DEBUG) else 0}
        self.committed = confluent.Consumer({**base, "isolation.level": "read_committed"})
        self.uncommitted = confluent.Consumer({**base, "isolation.level": "read_uncommitted"})

    def close(self) -> None:
        """Close both consumers."""
        self.committed.close()
        self.uncommitted.close()

    def _wait_s(self, what: str, cap: float = 10.0) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise AuditError(f"{self.topic}: {what} did not finish within --timeout {self.timeout_s:g} s")
        return min(cap, left)

    def partitions(self) -> tuple[int, ...]:
        """The topic's partitions; AuditError if it does not exist or no broker answers."""
        cap = 10.0
        wait_s = self._wait_s("reading metadata", cap)
        try:
            meta = self.committed.list_topics(self.topic, timeout=wait_s).topics.get(self.topic)
        except self._confluent.KafkaException as exc:
            limit = " (the --timeout)" if wait_s < cap else ""
            raise AuditError(f"no broker answered at {self.bootstrap} within {wait_s:.3g} s{limit}: "
                             f"{_kafka_problem(exc)}") from exc
        if meta is None or meta.error is not None:
            problem = meta.error.str() if meta is not None else "no metadata"
            raise AuditError(f"topic {self.topic!r} cannot be read: {problem}")
        return tuple(sorted(meta.partitions))

    def _watermarks(self, consumer: Any, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        return {p: self._watermark(consumer, p) for p in partitions}

    def _watermark(self, consumer: Any, partition: int) -> tuple[int, int]:
        """One partition's (low, high). An answer of a partition changing leader (a new leader whose high watermark
        is not caught up yet: OFFSET_NOT_AVAILABLE, a leader not known yet) is asked again, up to the --timeout."""
        tp = self._confluent.TopicPartition(self.topic, partition)
        while True:
            try:
                low, high = consumer.get_watermark_offsets(tp, cached=False, timeout=self._wait_s("ListOffsets"))
                return low, high
            except self._confluent.KafkaException as exc:
                code = getattr(exc.args[0], "code", lambda: None)() if exc.args else None
                if code not in _LEADER_CHANGING or time.monotonic() + _ASK_AGAIN_S >= self.deadline:
                    raise
            time.sleep(_ASK_AGAIN_S)

    def settled_offsets(self, settle_s: float) -> EndOffsets:
        """End offsets after waiting up to ``settle_s`` for the LSO to reach the high watermark everywhere (a commit
        returns once the coordinator has logged it; its markers follow a moment later)."""
        partitions = self.partitions()
        settle_until = time.monotonic() + settle_s
        while True:
            committed = self._watermarks(self.committed, partitions)
            uncommitted = self._watermarks(self.uncommitted, partitions)
            settled = all(committed[p][1] >= uncommitted[p][1] for p in partitions)
            if settled or time.monotonic() >= min(settle_until, self.deadline):
                return EndOffsets(partitions, {p: committed[p][0] for p in partitions},
                                  {p: committed[p][1] for p in partitions},
                                  {p: max(committed[p][1], uncommitted[p][1]) for p in partitions})
            time.sleep(0.1)

    def records(self, ends: EndOffsets) -> Iterator[tuple[int, int, bytes | None, bytes | None]]:
        """``(partition, offset, key, value)`` of every committed record below the LSOs in ``ends``."""
        confluent = self._confluent
        pending = {p for p in ends.partitions if ends.lso[p] > ends.low[p]}
        if not pending:
            return
        consumer = self.committed
        consumer.assign([confluent.TopicPartition(self.topic, p, confluent.OFFSET_BEGINNING) for p in sorted(pending)])
        while pending:
            for message in consumer.consume(num_messages=10_000, timeout=min(0.2, self._wait_s("reading"))):
                error = message.error()
                if error is not None:
                    raise confluent.KafkaException(error)
                partition, offset = message.partition(), message.offset()
                if offset < ends.lso[partition]:
                    yield partition, offset, message.key(), message.value()
            for position in consumer.position([confluent.TopicPartition(self.topic, p) for p in sorted(pending)]):
                if position.offset >= ends.lso[position.partition]:
                    pending.discard(position.partition)
            if pending and time.monotonic() >= self.deadline:
                reached = {p.partition: p.offset for p in consumer.position(
                    [confluent.TopicPartition(self.topic, p) for p in sorted(pending)])}
                raise AuditError(f"{self.topic}: did not reach end offsets "
                                 f"{ {p: ends.lso[p] for p in sorted(pending)} } within --timeout "
                                 f"{self.timeout_s:g} s (reached {reached})")


def _kafka_problem(exc: BaseException) -> str:
    """The text of a confluent-kafka KafkaException (its KafkaError's ``str()``)."""
    error = exc.args[0] if exc.args else None
    return str(error.str()) if error is not None and hasattr(error, "str") else str(exc)


def audit_topic(settings: Mapping[str, object], topic: str, decoder: RecordDecoder, *,
                expect_range: tuple[int, int] | None = None, settle_s: float = 5.0, timeout_s: float = 120.0,
                max_examples: int = 5) -> AuditReport:
    """Read ``topic`` from the start to the read_committed end offsets taken at the start (after waiting up to
    ``settle_s`` for ending transactions' markers) and audit its ids. Raises :class:`AuditError` when the topic
    cannot be read or its end offsets are not reached within ``timeout_s``."""
    try:
        import confluent_kafka  # noqa: PLC0415 - an optional dependency
    except ImportError as exc:
        raise AuditError("kafka2pc audit reads with confluent-kafka: pip install kafka2pc[audit]") from exc
    config = librdkafka_config(settings)
    deadline = time.monotonic() + timeout_s
    try:
        reader = _TopicReader(confluent_kafka, config, topic, deadline, timeout_s)
        try:
            ends = reader.settled_offsets(settle_s)
            pinned = [p for p in ends.partitions if ends.high[p] > ends.lso[p]]
            notes = [f"partition {p} starts at offset {low}: earlier records were deleted"
                     for p, low in sorted(ends.low.items()) if low > 0]
            open_txns: dict[int, tuple[OpenTransaction, ...]] = {}
            if pinned:
                try:
                    open_txns, more = describe_open_transactions(settings, topic, pinned, deadline)
                except Kafka2pcError as exc:  # the pinned partitions are reported all the same
                    more = [f"open transactions not identified: {exc}"]
                notes += more
            tally = Tally(expect_range=expect_range, max_examples=max_examples,
                          grouped=decoder.group_field is not None)
            for partition, offset, key, value in reader.records(ends):
                decoded = decoder.decode(key, value)
                if decoded is None:
                    tally.add(partition, offset, None)
                else:
                    tally.add(partition, offset, decoded[0], decoded[1])
        finally:
            reader.close()
    except confluent_kafka.KafkaException as exc:
        if time.monotonic() >= deadline:
            raise AuditError(f"{topic}: --timeout {timeout_s:g} s ran out ({_kafka_problem(exc)})") from exc
        raise AuditError(f"{topic}: {_kafka_problem(exc)}") from exc
    return tally.report(end_offsets=ends.lso, high_watermarks=ends.high, open_transactions=open_txns,
                        topic=topic, notes=notes)
