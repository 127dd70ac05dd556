"""``kafka2pc audit``: did every id arrive exactly once? Duplicates, gaps, unreadable records and open transactions
that pin a topic's last stable offset.

Two parts: :func:`compute_report` (and the :class:`Tally` under it) turns ``(partition, offset, id-or-None)``
entries and the partitions' end offsets into an :class:`AuditReport`, without a broker; :func:`audit_topic` reads a
topic as a read_committed confluent-kafka consumer (librdkafka, an independent client) and asks the partition
leaders which producers hold the LSO back.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
from kafka.protocol.admin.transactions import DescribeProducersRequest

from kafka2pc.broker_errors import error_name
from kafka2pc.cluster_client import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import Kafka2pcError
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl

#: ``(partition, offset, id)`` or ``(partition, offset, id, group)``; id None means the record's id was unreadable.
Entry = tuple[int, int, int | None] | tuple[int, int, int | None, str | None]

_DECIMAL = re.compile(r"-?[0-9]+")
_LIBRDKAFKA_LOG = logging.getLogger("kafka2pc.audit.librdkafka")
_NOT_FOR_CONSUMERS = frozenset({"request.timeout.ms"})  # a producer property in librdkafka


class AuditError(Kafka2pcError):
    """The audit could not be carried out (topic unknown, cluster unreachable, end offsets not reached)."""


# -- the report -----------------------------------------------------------------------------------------------------

@attrs.frozen
class RecordRef:
    """Where a record is: partition and offset (and its id, where that matters)."""

    partition: int
    offset: int
    record_id: int | None = None
    group: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """``{"partition", "offset"}`` plus ``id`` and ``group`` when known."""
        out: dict[str, Any] = {"partition": self.partition, "offset": self.offset}
        if self.record_id is not None:
            out["id"] = self.record_id
        if self.group is not None:
            out["group"] = self.group
        return out


@attrs.frozen
class DuplicateExample:
    """An id read more than once: how many copies and where (at most the first few positions)."""

    record_id: int
    copies: int
    at: tuple[RecordRef, ...]
    group: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """``{"id", "copies", "at": [{"partition", "offset"}], "group"?}``."""
        out: dict[str, Any] = {"id": self.record_id, "copies": self.copies, "at": [r.to_json_dict() for r in self.at]}
        if self.group is not None:
            out["group"] = self.group
        return out


@attrs.frozen
class GapRange:
    """Ids ``first``..``last`` (inclusive) that were never read."""

    first: int
    last: int
    group: str | None = None

    @property
    def size(self) -> int:
        """How many ids are missing."""
        return self.last - self.first + 1

    def to_json_dict(self) -> dict[str, Any]:
        """``{"from", "to", "group"?}``, inclusive."""
        out: dict[str, Any] = {"from": self.first, "to": self.last}
        if self.group is not None:
            out["group"] = self.group
        return out

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


@attrs.frozen
class OpenTransaction:
    """A producer with a transaction ongoing on a partition (DescribeProducers), and whose it is if known."""

    producer_id: int
    producer_epoch: int
    start_offset: int
    transactional_id: str | None = None
    state: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """Every field, with ``start_offset`` as the offset of the transaction's first record."""
        return attrs.asdict(self)


@attrs.frozen
class PinnedPartition:
    """A partition whose last stable offset stays below its high watermark: an open transaction holds it."""

    partition: int
    lso: int
    high_watermark: int
    open_transactions: tuple[OpenTransaction, ...] = ()

    @property
    def lag(self) -> int:
        """Offsets a read_committed consumer cannot reach yet."""
        return self.high_watermark - self.lso

    def to_json_dict(self) -> dict[str, Any]:
        """``{"partition", "lso", "high_watermark", "lag", "open_transactions": [...]}``."""
        return {"partition": self.partition, "lso": self.lso, "high_watermark": self.high_watermark,
                "lag": self.lag, "open_transactions": [t.to_json_dict() for t in self.open_transactions]}


@attrs.frozen
class GroupReport:
    """The figures of one ``--group-by`` group."""

    group: str
    records: int
    distinct_ids: int
    duplicates: int
    gaps: int
    gap_ranges: int
    gap_examples: tuple[GapRange, ...]
    range: tuple[int, int] | None

    def to_json_dict(self) -> dict[str, Any]:
        """Every figure, ranges as lists."""
        return {"records": self.records, "distinct_ids": self.distinct_ids, "duplicates": self.duplicates,
                "gaps": self.gaps, "gap_ranges": self.gap_ranges,
                "gap_examples": [g.to_json_dict() for g in self.gap_examples],
                "range": list(self.range) if self.range is not None else None}


@attrs.frozen
class AuditReport:
    """What an audit found. ``duplicates`` counts extra copies; ``gaps`` counts missing ids (in ``gap_ranges``
    runs); ``outside_range`` and ``unreadable`` count records."""

    records: int
    distinct_ids: int
    duplicates: int
    duplicate_examples: tuple[DuplicateExample, ...]
    gaps: int
    gap_ranges: int
    gap_examples: tuple[GapRange, ...]
    outside_range: int
    outside_range_examples: tuple[RecordRef, ...]
    unreadable: int
    unreadable_examples: tuple[RecordRef, ...]
    lso_pinned: tuple[PinnedPartition, ...]
    range: tuple[int, int] | None
    range_expected: bool
    groups: tuple[GroupReport, ...] | None = None
    topic: str | None = None
    end_offsets: Mapping[int, int] = attrs.field(factory=dict)
    high_watermarks: Mapping[int, int] = attrs.field(factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """Every id exactly once, nothing unreadable or out of range, and no open transaction pins the LSO."""
        return not (self.duplicates or self.gaps or self.outside_range or self.unreadable or self.lso_pinned)

    @property
    def verdict(self) -> str:
        """``CLEAN`` or ``NOT CLEAN (n duplicates, m gaps, k outside range, LSO pinned on p partitions, u
        unreadable)``."""
        if self.clean:
            return "CLEAN"
        return (f"NOT CLEAN ({self.duplicates} duplicates, {self.gaps} gaps, {self.outside_range} outside range, "
                f"LSO pinned on {len(self.lso_pinned)} partitions, {self.unreadable} unreadable)")

    def to_json_dict(self) -> dict[str, Any]:
        """Every figure as plain JSON values (the ``--json`` output)."""
        return {
            "topic": self.topic,
            "records": self.records,
            "distinct_ids": self.distinct_ids,
            "duplicates": self.duplicates,
            "duplicate_examples": [d.to_json_dict() for d in self.duplicate_examples],
            "gaps": self.gaps,
            "gap_ranges": self.gap_ranges,
            "gap_examples": [g.to_json_dict() for g in self.gap_examples],
            "outside_range": self.outside_range,
            "outside_range_examples": [r.to_json_dict() for r in self.outside_range_examples],
            "unreadable": self.unreadable,
            "unreadable_examples": [r.to_json_dict() for r in self.unreadable_examples],
            "lso_pinned": [p.to_json_dict() for p in self.lso_pinned],
            "range": list(self.range) if self.range is not None else None,
            "range_source": None if self.range is None else "expected" if self.range_expected else "observed",
            "groups": None if self.groups is None else {g.group: g.to_json_dict() for g in self.groups},
            "end_offsets": {str(p): o for p, o in sorted(self.end_offsets.items())},
            "high_watermarks": {str(p): o for p, o in sorted(self.high_watermarks.items())},
            "notes": list(self.notes),
            "clean": self.clean,
            "verdict": self.verdict,
        }


# -- the pure computation -------------------------------------------------------------------------------------------

def _group_order(group: str | None) -> tuple[int, int, str]:
    """Groups in natural order: numbers numerically, then strings."""
    if group is None:
        return (0, 0, "")
    if _DECIMAL.fullmatch(group):
        return (0, int(group), "")
    return (1, 0, group)


class _Smallest:
    """The ``k`` smallest tuples offered so far."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.items: list[tuple[Any, ...]] = []

    def offer(self, item: tuple[Any, ...]) -> tuple[bool, tuple[Any, ...] | None]:
        """Keep ``item`` if it is among the k smallest: (kept, the item it pushed out)."""
        if self.k <= 0 or (len(self.items) >= self.k and item >= self.items[-1]):
            return False, None
        bisect.insort(self.items, item)
        return True, self.items.pop() if len(self.items) > self.k else None


class _GroupTally:
    """Ids of one group: where each was first read, and how many extra copies."""

    def __init__(self) -> None:
        self.first_seen: dict[int, tuple[int, int]] = {}
        self.records = 0
        self.duplicates = 0

    def gaps(self, bounds: tuple[int, int] | None, group: str | None,
             max_examples: int) -> tuple[int, int, tuple[GapRange, ...]]:
        """(missing ids, runs of them, the first few runs) within ``bounds`` (inclusive)."""
        if bounds is None:
            return 0, 0, ()
        low, high = bounds
        missing = runs = 0
        examples: list[GapRange] = []
        previous = low - 1
        for record_id in [*sorted(i for i in self.first_seen if low <= i <= high), high + 1]:
            if record_id > previous + 1:
                missing += record_id - previous - 1
                runs += 1
                if len(examples) < max_examples:
                    examples.append(GapRange(previous + 1, record_id - 1, group))
            previous = record_id
        return missing, runs, tuple(examples)

    def observed_range(self) -> tuple[int, int] | None:
        """min..max of the ids read, or None."""
        return (min(self.first_seen), max(self.first_seen)) if self.first_seen else None


class Tally:
    """Accumulates entries one at a time (memory: one dict entry per distinct id), then makes the report."""

    _MAX_POSITIONS = 10  # positions listed per duplicate example

    def __init__(self, *, expect_range: tuple[int, int] | None = None, max_examples: int = 5,
                 grouped: bool = False) -> None:
        if expect_range is not None and expect_range[0] > expect_range[1]:
            raise ValueError(f"empty range {expect_range[0]}:{expect_range[1]}")
        self.expect_range = expect_range
        self.max_examples = max_examples
        self.grouped = grouped
        self.records = 0
        self.groups: dict[str | None, _GroupTally] = {}
        self._duplicate_keys = _Smallest(max_examples)
        self._duplicate_positions: dict[tuple[Any, ...], tuple[int, list[tuple[int, int]]]] = {}
        self.outside_range = 0
        self._outside = _Smallest(max_examples)
        self.unreadable = 0
        self._unreadable = _Smallest(max_examples)

    def add(self, partition: int, offset: int, record_id: int | None, group: str | None = None) -> None:
        """Count one record; ``record_id`` None means its id (or group) could not be read."""
        self.records += 1
        if record_id is None:
            self.unreadable += 1
            self._unreadable.offer((partition, offset))
            return
        tally = self.groups.get(group)
        if tally is None:
            tally = self.groups[group] = _GroupTally()
        tally.records += 1
        if self.expect_range is not None and not self.expect_range[0] <= record_id <= self.expect_range[1]:
            self.outside_range += 1
            self._outside.offer((partition, offset, record_id, group))
        first = tally.first_seen.get(record_id)
        if first is None:
            tally.first_seen[record_id] = (partition, offset)
            return
        tally.duplicates += 1
        key = (_group_order(group), record_id, group)
        known = self._duplicate_positions.get(key)
        if known is not None:
            copies, positions = known
            if len(positions) < self._MAX_POSITIONS:
                positions.append((partition, offset))
            self._duplicate_positions[key] = (copies + 1, positions)
            return
        kept, dropped = self._duplicate_keys.offer(key)
        if kept:  # an id only ever enters at its second copy: a smaller one can displace it, never the reverse
            self._duplicate_positions[key] = (2, [first, (partition, offset)])
        if dropped is not None:
            del self._duplicate_positions[dropped]

    def report(self, *, end_offsets: Mapping[int, int] | None = None, high_watermarks: Mapping[int, int] | None = None,
               open_transactions: Mapping[int, Sequence[OpenTransaction]] | None = None, topic: str | None = None,
               notes: Sequence[str] = ()) -> AuditReport:
        """The report over everything added; partitions whose high watermark exceeds the end offset are pinned."""
        ends = dict(end_offsets or {})
        marks = dict(high_watermarks or ends)
        open_by_partition = open_transactions or {}
        pinned = tuple(PinnedPartition(p, ends[p], marks[p], tuple(open_by_partition.get(p, ())))
                       for p in sorted(ends) if marks.get(p, ends[p]) > ends[p])
        if not self.grouped:
            self.groups.setdefault(None, _GroupTally())  # an expected range with nothing read is one big gap
        group_reports = []
        for group in sorted(self.groups, key=_group_order):
            tally = self.groups[group]
            bounds = self.expect_range or tally.observed_range()
            missing, runs, examples = tally.gaps(bounds, group, self.max_examples)
            group_reports.append(GroupReport(group or "", tally.records, len(tally.first_seen), tally.duplicates,
                                             missing, runs, examples, bounds))
        every_id = [r for t in self.groups.values() for r in (t.observed_range() or ())]
        overall = self.expect_range or ((min(every_id), max(every_id)) if every_id else None)
        gap_examples = [g for r in group_reports for g in r.gap_examples][:self.max_examples]
        duplicates = tuple(
            DuplicateExample(key[1], copies, tuple(RecordRef(p, o) for p, o in sorted(positions)), key[2])
            for key in self._duplicate_keys.items for copies, positions in [self._duplicate_positions[key]])
        return AuditReport(
            records=self.records,
            distinct_ids=sum(r.distinct_ids for r in group_reports),
            duplicates=sum(r.duplicates for r in group_reports),
            duplicate_examples=duplicates,
            gaps=sum(r.gaps for r in group_reports),
            gap_ranges=sum(r.gap_ranges for r in group_reports),
            gap_examples=tuple(gap_examples),
            outside_range=self.outside_range,
            outside_range_examples=tuple(RecordRef(*item) for item in self._outside.items),
            unreadable=self.unreadable,
            unreadable_examples=tuple(RecordRef(p, o) for p, o in self._unreadable.items),
            lso_pinned=pinned,
            range=overall,
            range_expected=self.expect_range is not None,
            groups=tuple(group_reports) if self.grouped else None,
            topic=topic,
            end_offsets=ends,
            high_watermarks=marks,
            notes=tuple(notes),
        )


def compute_report(entries: Iterable[Entry], *, expect_range: tuple[int, int] | None = None,
                   end_offsets: Mapping[int, int] | None = None, high_watermarks: Mapping[int, int] | None = None,
                   open_transactions: Mapping[int, Sequence[OpenTransaction]] | None = None,
                   grouped: bool = False, max_examples: int = 5, topic: str | None = None,
                   notes: Sequence[str] = ()) -> AuditReport:
    """The audit of ``entries``: ``(partition, offset, id-or-None[, group])``. ``end_offsets`` are the
    read_committed end offsets (LSO) and ``high_watermarks`` the read_uncommitted ones, per partition."""
    tally = Tally(expect_range=expect_range, max_examples=max_examples, grouped=grouped)
    for entry in entries:
        tally.add(entry[0], entry[1], entry[2], entry[3] if len(entry) > 3 else None)
    return tally.report(end_offsets=end_offsets, high_watermarks=high_watermarks,
                        open_transactions=open_transactions, topic=topic, notes=notes)


# -- reading ids from records ---------------------------------------------------------------------------------------

def _field(document: object, path: Sequence[str]) -> object:
    for name in path:
        if not isinstance(document, dict) or name not in document:
            return None
        document = document[name]
    return document


@attrs.frozen
class RecordDecoder:
    """Where a record's id (and group) is: the key as a decimal integer, or an integer field of the JSON value
    (``a.b`` for nested fields)."""

    id_field: str | None = None
    group_field: str | None = None

    def decode(self, key: bytes | None, value: bytes | None) -> tuple[int, str | None] | None:
        """(id, group), or None when either cannot be read."""
        document: object = None
        if self.id_field is not None or self.group_field is not None:
            try:
                document = json.loads(value) if value is not None else None
            except ValueError:  # not JSON, or not UTF-8
                return None
        if self.id_field is None:
            text = key.decode("ascii", "replace") if key is not None else ""
            record_id: object = int(text) if _DECIMAL.fullmatch(text) else None
        else:
            record_id = _field(document, self.id_field.split("."))
        if not isinstance(record_id, int) or isinstance(record_id, bool):
            return None
        if self.group_field is None:
            return record_id, None
        group = _field(document, self.group_field.split("."))
        if group is None or isinstance(group, dict | list):
            return None
        return record_id, group if isinstance(group, str) else json.dumps(group)


# -- reading a topic ------------------------------------------------------------------------------------------------

def librdkafka_config(settings: Mapping[str, object]) -> dict[str, str]:
    """Validated connection settings (Kafka's dotted names) as a librdkafka consumer takes them."""
    ClientConfig.from_dict(settings)  # the same keys every kafka2pc command accepts; raises ConfigError
    return {key: str(value) for key, value in settings.items() if key not in _NOT_FOR_CONSUMERS}


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
        return {p: tuple(consumer.get_watermark_offsets(self._confluent.TopicPartition(self.topic, p), cached=False,
                                                        timeout=self._wait_s("ListOffsets")))
                for p in partitions}

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
        raise AuditError("kafka2pc audit reads with confluent-kafka: pip install kafka2pc[testing]") from exc
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


def describe_open_transactions(settings: Mapping[str, object], topic: str, partitions: Sequence[int],
                               deadline: float) -> tuple[dict[int, tuple[OpenTransaction, ...]], list[str]]:
    """Per partition, the producers with an ongoing transaction (DescribeProducers to the partition leader), named
    by transactional id where ListTransactions knows them; and notes on what could not be found out."""
    notes: list[str] = []
    found: dict[int, list[OpenTransaction]] = {}
    bootstrap_s = max(1.0, min(30.0, deadline - time.monotonic()))
    with ClusterClient(ClientConfig.from_dict(settings), bootstrap_timeout_s=bootstrap_s) as client:
        if client.broker_max_version(DescribeProducersRequest) < 0:
            return {}, ["the broker does not support DescribeProducers: open transactions not identified"]
        leaders = client.partition_leaders(topic)
        by_leader: dict[int, list[int]] = {}
        for partition in partitions:
            leader = leaders.get(partition, -1)
            if leader < 0:
                notes.append(f"partition {partition} has no leader: open transactions not identified")
            else:
                by_leader.setdefault(leader, []).append(partition)
        for leader, wanted in sorted(by_leader.items()):
            response = client.send_idempotent(_describe_producers(topic, wanted), leader, what="DescribeProducers")
            for entry in (p for t in response.topics if t.name == topic for p in t.partitions):
                if entry.error_code != 0:
                    notes.append(f"DescribeProducers on partition {entry.partition_index}: "
                                 f"{error_name(entry.error_code)}")
                    continue
                found[entry.partition_index] = [
                    OpenTransaction(s.producer_id, s.producer_epoch, s.current_txn_start_offset)
                    for s in entry.active_producers if s.current_txn_start_offset >= 0]
        if any(found.values()):
            try:
                listed = {t.producer_id: t for t in TransactionControl(client).list(states=OPEN_STATES)}
            except Kafka2pcError as exc:
                listed = {}
                notes.append(f"transactional ids not identified: {exc}")
            found = {p: [attrs.evolve(t, transactional_id=listed[t.producer_id].transactional_id,
                                      state=listed[t.producer_id].state) if t.producer_id in listed else t
                         for t in txns] for p, txns in found.items()}
    return {p: tuple(sorted(t, key=lambda o: o.start_offset)) for p, t in found.items()}, notes


def _describe_producers(topic: str, partitions: Sequence[int]) -> Any:
    def make() -> Any:
        return DescribeProducersRequest(topics=[DescribeProducersRequest.TopicRequest(
            name=topic, partition_indexes=list(partitions))])

    return make
