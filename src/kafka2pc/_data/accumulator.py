"""Per-partition batching of records waiting to be sent. Pure: no I/O, no clocks it does not get passed."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Sequence

import attrs

from kafka2pc._data.records import Header, encode_record, encode_values

TopicPartition = tuple[str, int]

#: Per-record bytes beyond key and value in the worst case for small records (length, attributes, deltas, lengths).
_RECORD_OVERHEAD = 16


@attrs.define
class Batch:
    """Records of one partition, encoded as a v2 record sequence, not yet framed as a batch."""

    topic: str
    partition: int
    records: bytes
    count: int
    base_timestamp: int
    max_timestamp: int
    #: set by the sender the first time the batch is sent; retries reuse it (idempotence)
    base_sequence: int = -1
    framed: bytes = b""


@attrs.define
class _OpenBatch:
    parts: list[bytes]
    count: int
    size: int
    base_timestamp: int
    max_timestamp: int
    limit: int


class RecordAccumulator:
    """Collects records into batches whose records take at most ``batch_size`` bytes (a single larger record gets a
    batch alone; the broker's ``message.max.bytes`` then decides)."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        #: smaller limits of single topics (their max.message.bytes, less the batch header)
        self.topic_limits: dict[str, int] = {}
        self._open: dict[TopicPartition, _OpenBatch] = {}
        self._closed: dict[TopicPartition, deque[Batch]] = {}
        self.buffered_bytes = 0
        self.buffered_records = 0
        #: closed batches waiting to be sent
        self.waiting = 0

    def _new_open(self, tp: TopicPartition, timestamp: int) -> _OpenBatch:
        current = self._open[tp] = _OpenBatch([], 0, 0, timestamp, timestamp, self.limit(tp[0]))
        return current

    def append(self, tp: TopicPartition, key: bytes | None, value: bytes | None, headers: Sequence[Header] | None,
               timestamp: int) -> None:
        """Add one record."""
        current = self._open.get(tp)
        if current is None:
            current = self._new_open(tp, timestamp)
        record = encode_record(current.count, timestamp - current.base_timestamp, key, value, headers)
        if current.count and current.size + len(record) > current.limit:
            self._close(tp)
            current = self._new_open(tp, timestamp)
            record = encode_record(0, 0, key, value, headers)
        size = len(record)
        current.parts.append(record)
        current.count += 1
        current.size += size
        current.max_timestamp = max(current.max_timestamp, timestamp)
        self.buffered_bytes += size
        self.buffered_records += 1

    def append_values(self, tp: TopicPartition, values: Sequence[bytes], keys: Sequence[bytes | None] | None,
                      timestamp: int, on_batch: Callable[[], None] | None = None) -> None:
        """Add many records with one timestamp and no headers, encoded in bulk (the fast path). ``on_batch`` is
        called after each batch is closed, so a sender can ship it while the next one is encoded."""
        if tp in self._open:
            self._close(tp)
        start = 0
        total = len(values)
        limit = self.limit(tp[0])
        while start < total:
            end, size = start, 0
            while end < total:
                key = keys[end] if keys is not None else None
                size += len(values[end]) + (len(key) if key else 0) + _RECORD_OVERHEAD
                if size > limit and end > start:
                    break
                end += 1
            chunk_keys = keys[start:end] if keys is not None else None
            records = encode_values(values[start:end], chunk_keys)
            self._closed.setdefault(tp, deque()).append(
                Batch(tp[0], tp[1], records, end - start, timestamp, timestamp))
            self.waiting += 1
            self.buffered_bytes += len(records)
            self.buffered_records += end - start
            start = end
            if on_batch is not None:
                on_batch()

    def limit(self, topic: str) -> int:
        """The most bytes of records one batch of ``topic`` holds."""
        return min(self.batch_size, self.topic_limits.get(topic, self.batch_size))

    def _close(self, tp: TopicPartition) -> None:
        current = self._open.pop(tp)
        self._closed.setdefault(tp, deque()).append(Batch(
            tp[0], tp[1], b"".join(current.parts), current.count, current.base_timestamp, current.max_timestamp))
        self.waiting += 1

    def full_batches(self) -> int:
        """How many batches are closed and waiting."""
        return self.waiting

    def drain(self, *, include_open: bool, exclude: Collection[TopicPartition] = ()) -> list[Batch]:
        """Take the oldest waiting batch of every partition not in ``exclude`` (closing open ones if asked)."""
        if include_open:
            for tp in list(self._open):
                if tp not in exclude:
                    self._close(tp)
        taken = []
        for tp, queue in self._closed.items():
            if queue and tp not in exclude:
                batch = queue.popleft()
                self.waiting -= 1
                taken.append(batch)
                self.buffered_bytes -= len(batch.records)
                self.buffered_records -= batch.count
        return taken

    def requeue_front(self, batch: Batch) -> None:
        """Put a batch that must be retried back at the head of its partition's queue."""
        self._closed.setdefault((batch.topic, batch.partition), deque()).appendleft(batch)
        self.waiting += 1
        self.buffered_bytes += len(batch.records)
        self.buffered_records += batch.count

    def partitions(self) -> set[TopicPartition]:
        """Partitions with anything buffered."""
        return {tp for tp, q in self._closed.items() if q} | set(self._open)

    def is_empty(self) -> bool:
        """Whether nothing is buffered."""
        return not self._open and not any(self._closed.values())

    def clear(self) -> None:
        """Drop everything (abort)."""
        self._open.clear()
        self._closed.clear()
        self.buffered_bytes = 0
        self.buffered_records = 0
        self.waiting = 0
