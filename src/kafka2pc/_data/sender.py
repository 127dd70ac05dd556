"""The data plane of a producer: partitioning, batching, send rounds, retries and flush, over an injectable
:class:`~kafka2pc._data.produce.ProduceTransport`.

One send round is in flight at a time, with at most one batch per partition per round, so a retried batch (same
bytes, same sequence number) can never overtake a later one; the idempotent producer's sequence numbers then make
retries exactly-once. Rounds that must be sent again wait under the one retry policy
(:func:`~kafka2pc._core.retry.produce_retry`: ``retry.backoff.ms`` doubling, with jitter, within
``delivery.timeout.ms``); a round that needs no retry ends the series. A batch the broker refuses as too large is
split in two and its sequence numbers assigned anew (nothing later of its partition has been framed yet).

A topic's partitions are read once and kept for ``metadata.max.age.ms`` (Kafka's 5 minutes by default): the first
transaction begun after that reads them again, so partitions added to a topic get records from then on (keyed records
go to ``murmur2(key) % count`` of the new count, as with Java's default partitioner). A send that needs a retry reads
them again at once.
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from kafka2pc._core import codes
from kafka2pc._core.messages import ProducerIdentity
from kafka2pc._core.retry import Retry, produce_retry
from kafka2pc._data.accumulator import Batch, RecordAccumulator, TopicPartition
from kafka2pc._data.partitioner import key_partition, key_partitions
from kafka2pc._data.produce import FramedBatch, ProduceCall, ProduceReply, ProduceTransport
from kafka2pc._data.records import (
    BATCH_OVERHEAD,
    RECORD_FRAME_BOUND,
    Header,
    compression_codec,
    encode_batch,
    record_size_bound,
    split_records,
)
from kafka2pc.config import ProducerConfig
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    Kafka2pcError,
    KafkaProtocolError,
    ProducerFencedError,
    RecordTooLargeError,
    TransactionAbortableError,
)

log = logging.getLogger(__name__)

_MAX_SEQUENCE = 2**31 - 1
_Round = tuple["concurrent.futures.Future[list[ProduceReply | Exception]]", list[tuple[int, list[Batch]]]]


class RecordSender:
    """Sends the records of one producer's transactions.

    :meth:`begin` starts a transaction under an identity; ``before_send`` is called with the partitions of each
    round before it goes out (the producer registers them with the coordinator, or notes that the coordinator may now
    know the transaction). Failures raise :class:`~kafka2pc.errors.TransactionAbortableError` (the transaction must
    be aborted), :class:`~kafka2pc.errors.ProducerFencedError` or :class:`~kafka2pc.errors.AuthorizationError`.
    """

    def __init__(self, config: ProducerConfig, transport: ProduceTransport):
        self._config = config
        self._transport = transport
        self._compression = compression_codec(config.compression_name)
        self._accumulator = RecordAccumulator(config.batch_size)
        self._identity = ProducerIdentity(-1, -1)
        self._v2 = False
        self._before_send: Callable[[set[TopicPartition]], None] = lambda partitions: None
        self._sequences: dict[TopicPartition, int] = {}
        self._leaders: dict[str, dict[int, int]] = {}
        self._counts: dict[str, int] = {}
        #: when each topic's partitions were read (time.monotonic()); older than metadata.max.age.ms, the next
        #: transaction reads them again
        self._read_at: dict[str, float] = {}
        #: the partition count last read of every topic this producer has used (kept when the above expire)
        self._seen: dict[str, int] = {}
        #: why each partition's last send must be retried (an error name, or the failed request), until it is written
        self._failing: dict[TopicPartition, str] = {}
        self._metadata_max_age_s = int(config.client.options.get("metadata_max_age_ms", 300_000)) / 1000
        self._limits: dict[str, int] = {}
        self._sticky: dict[str, tuple[int, int]] = {}
        self._round: _Round | None = None
        #: whether the round in flight has been answered (set by its future's callback)
        self._round_done = False
        self._unsent_since: float | None = None
        self._retry_policy = produce_retry(config.retry_backoff_ms, config.delivery_timeout_ms)
        #: the series of retried rounds under way (None: the last round needed no retry)
        self._retries: Retry | None = None
        self._retry_after = 0.0
        self._timeout_ms = int(config.client.options.get("request_timeout_ms", 30_000))

    def begin(self, identity: ProducerIdentity, *, transaction_version: int,
              before_send: Callable[[set[TopicPartition]], None]) -> None:
        """Start sending a transaction's records under ``identity``."""
        if identity != self._identity:
            self._sequences.clear()
        self._identity = identity
        self._v2 = transaction_version >= 2
        self._before_send = before_send
        self._sticky.clear()
        self._failing.clear()
        self._retries, self._retry_after = None, 0.0
        now = time.monotonic()
        for topic in [t for t, at in self._read_at.items() if now - at >= self._metadata_max_age_s]:
            # read again when next used: partitions may have been added (or the topic deleted) since
            self._leaders.pop(topic, None)
            self._counts.pop(topic, None)
            del self._read_at[topic]

    # -- adding records ----------------------------------------------------------------------------------------------

    def _partitions(self, topic: str) -> dict[int, int]:
        """Partition -> leader of ``topic``. A broker that does not answer is retriable (BrokerUnavailableError);
        one that answers with an error (the topic does not exist) fails the transaction: abort it."""
        leaders = self._leaders.get(topic)
        if leaders is None:
            try:
                leaders = self._transport.partition_leaders(topic)
            except KafkaProtocolError as exc:
                raise self._unreadable(topic, exc) from exc
            before = self._seen.get(topic)
            if before is not None and before != len(leaders):
                log.info("topic %r has %d partitions now (%d before): keyed records go to their key's partition "
                         "among %d from here on", topic, len(leaders), before, len(leaders))
            self._leaders[topic] = leaders
            self._counts[topic] = self._seen[topic] = len(leaders)
            self._read_at[topic] = time.monotonic()
        return leaders

    def _unreadable(self, topic: str, exc: KafkaProtocolError) -> TransactionAbortableError:
        """The error for a topic whose partitions cannot be read; for one this producer used before, that it was
        deleted."""
        if codes.kind(exc.error_code) is not codes.Kind.UNKNOWN_TOPIC:
            return TransactionAbortableError(f"the partitions of topic {topic!r} cannot be read: {exc}")
        if topic in self._seen:
            return TransactionAbortableError(
                f"topic {topic!r} no longer exists: it was deleted after this producer began writing to it. This "
                "transaction cannot commit: abort it (the abort releases its other partitions); writes to the "
                f"topic fail until an operator creates it again, or the job writes elsewhere: {exc}")
        return TransactionAbortableError(
            f"the partitions of topic {topic!r} cannot be read (it does not exist, or this principal may not "
            f"describe it: create it first; kafka2pc never asks the broker to create topics): {exc}")

    def _count(self, topic: str) -> int:
        count = self._counts[topic] = len(self._partitions(topic))
        return count

    def _limit(self, topic: str) -> int:
        """The largest record batch ``topic`` takes: max.request.size, or the topic's max.message.bytes if lower."""
        limit = self._limits.get(topic)
        if limit is None:
            topic_max = self._transport.max_message_bytes(topic)
            limit = min(self._config.max_request_size, topic_max or self._config.max_request_size)
            self._limits[topic] = limit
            self._accumulator.topic_limits[topic] = max(1, limit - BATCH_OVERHEAD)
        return limit

    def _check_size(self, topic: str, size: int) -> None:
        limit = self._limit(topic)
        if size > limit:
            raise RecordTooLargeError(f"a record of about {size} bytes exceeds the {limit} bytes topic {topic!r} "
                                      "accepts (max.request.size, or the topic's max.message.bytes); it was not added")

    def choose_partition(self, topic: str, partition: int | None, key: bytes | None, size: int) -> int:
        """Kafka's choice: the given partition, the key's partition, or a sticky one for unkeyed records."""
        count = self._counts.get(topic) or self._count(topic)
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise ValueError(f"partition must be an int, got {partition!r}")
            if not 0 <= partition < count:
                self._leaders.pop(topic, None)  # partitions may have been added since
                count = self._count(topic)
                if not 0 <= partition < count:
                    raise ValueError(f"partition {partition!r} does not exist: topic {topic!r} has {count} "
                                     "partitions")
            return partition
        if key is not None:
            return key_partition(key, count)
        sticky = self._sticky.get(topic)
        if sticky is None or sticky[1] >= self._config.batch_size:
            current, filled = random.randrange(count), 0
        else:
            current, filled = sticky
        self._sticky[topic] = (current, filled + size)
        return current

    def append(self, topic: str, value: bytes | None, key: bytes | None, partition: int | None, *,
               headers: Sequence[Header] | None, timestamp: int) -> None:
        """Buffer one record (sent when a batch fills or ``linger.ms`` has passed)."""
        size = len(value) if value is not None else 0
        bound = BATCH_OVERHEAD + RECORD_FRAME_BOUND + size + (len(key) if key is not None else 0)
        if headers or bound > (self._limits.get(topic) or self._limit(topic)):
            self._check_size(topic, record_size_bound(key, value, headers))
        tp = (topic, self.choose_partition(topic, partition, key, size))
        self._accumulator.append(tp, key, value, headers, timestamp)
        self._after_append()

    def append_batch(self, topic: str, values: Sequence[bytes], keys: Sequence[bytes | None] | None,
                     partition: int | None, *, timestamp: int) -> None:
        """Buffer many records with one timestamp and no headers: the fast path."""
        largest = max(map(len, values)) + (max(len(k or b"") for k in keys) if keys is not None else 0)
        self._check_size(topic, BATCH_OVERHEAD + RECORD_FRAME_BOUND + largest)
        if partition is not None or keys is None:
            chosen = self.choose_partition(topic, partition, None, sum(map(len, values)))
            self._accumulator.append_values((topic, chosen), values, keys, timestamp, self._ship_full_batches)
        else:
            count = len(self._partitions(topic))
            groups: dict[int, tuple[list[bytes], list[bytes | None]]] = {}
            targets = key_partitions(cast("Sequence[bytes]", keys), count) if None not in keys else [
                key_partition(key, count) if key is not None else random.randrange(count) for key in keys]
            for key, value, target in zip(keys, values, targets, strict=True):
                group = groups.setdefault(target, ([], []))
                group[0].append(value)
                group[1].append(key)
            for target, (group_values, group_keys) in groups.items():
                self._accumulator.append_values((topic, target), group_values, group_keys, timestamp,
                                                self._ship_full_batches)
        self._after_append()

    def _after_append(self) -> None:
        now = time.monotonic()
        if self._unsent_since is None:
            self._unsent_since = now
        lingered = now - self._unsent_since >= self._config.linger_ms / 1000
        if self._accumulator.full_batches() or lingered:
            self._pump(include_open=lingered)

    def _ship_full_batches(self) -> None:
        if self._unsent_since is None:
            self._unsent_since = time.monotonic()
        self._pump(include_open=False)

    # -- rounds ------------------------------------------------------------------------------------------------------

    def _pump(self, *, include_open: bool) -> None:
        """Start a send round if none is in flight; wait for the one in flight when too much is buffered."""
        if self._round is not None:
            future = self._round[0]
            # the flag the round's own callback sets, not future.done(): this runs for every record once linger.ms
            # has passed, and done() takes the future's lock each time (7 % of per-record produce's CPU)
            if not self._round_done and self._accumulator.buffered_bytes < 4 * self._config.batch_size:
                return
            self._collect(self._wait(future, time.monotonic() + self._config.delivery_timeout_ms / 1000))
        if time.monotonic() >= self._retry_after:
            self._start_round(include_open=include_open)

    def _wait(self, future: concurrent.futures.Future[list[ProduceReply | Exception]],
              deadline: float) -> list[ProduceReply | Exception]:
        try:
            return future.result(timeout=max(0.001, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            raise TransactionAbortableError(f"records not acknowledged within delivery.timeout.ms="
                                            f"{self._config.delivery_timeout_ms}{self._unwritten()}") from None

    def _start_round(self, *, include_open: bool) -> None:
        batches = self._accumulator.drain(include_open=include_open)
        if not batches:
            return
        self._unsent_since = None if self._accumulator.is_empty() else time.monotonic()
        try:
            self._before_send({(b.topic, b.partition) for b in batches})
            by_node: dict[int, list[Batch]] = {}
            for batch in batches:
                leader = self._partitions(batch.topic).get(batch.partition, -1)
                if leader < 0:
                    self._leaders.pop(batch.topic, None)
                    leader = self._partitions(batch.topic).get(batch.partition, -1)
                self._frame(batch)
                by_node.setdefault(leader, []).append(batch)
        except TransactionAbortableError:
            self._accumulator.clear()
            raise
        except (BrokerUnavailableError, KafkaProtocolError) as exc:
            self._accumulator.clear()
            raise TransactionAbortableError(f"could not send: {exc}") from exc
        groups = list(by_node.items())
        calls = [ProduceCall(self._transactional_id, node, tuple(
            FramedBatch(b.topic, b.partition, b.framed) for b in node_batches), 12 if self._v2 else 11,
            self._timeout_ms) for node, node_batches in groups]
        future = self._transport.send_produce(calls)
        self._round, self._round_done = (future, groups), False
        # run by the IO thread once answered (or here, if it already was); a late one of an earlier round is ignored
        future.add_done_callback(self._round_answered)

    def _round_answered(self, future: concurrent.futures.Future[list[ProduceReply | Exception]]) -> None:
        current = self._round  # read once: the caller's thread may collect it meanwhile
        if current is not None and current[0] is future:
            self._round_done = True  # if the next round began meanwhile, _pump waits on it (bounded): no harm

    @property
    def _transactional_id(self) -> str:
        return self._config.transactional_id

    def _frame(self, batch: Batch) -> None:
        if batch.base_sequence >= 0:
            return  # a retry: same bytes, same sequence
        tp = (batch.topic, batch.partition)
        sequence = self._sequences.get(tp, 0)
        batch.base_sequence = sequence
        self._sequences[tp] = (sequence + batch.count) % (_MAX_SEQUENCE + 1)
        batch.framed = encode_batch(batch.records, batch.count, base_timestamp=batch.base_timestamp,
                                    max_timestamp=batch.max_timestamp, producer_id=self._identity.producer_id,
                                    producer_epoch=self._identity.epoch, base_sequence=sequence,
                                    compression=self._compression)

    def _collect(self, answers: list[ProduceReply | Exception]) -> None:
        """Interpret a finished send round: done batches are dropped, retriable ones requeued, errors raised."""
        assert self._round is not None
        groups = self._round[1]
        self._round = None
        failure: Kafka2pcError | None = None
        retried = False
        for (node, batches), answer in zip(groups, answers, strict=True):
            if isinstance(answer, Exception):
                log.debug("produce to node %s failed: %r; retrying", node, answer)
                self._failing.update(((b.topic, b.partition), f"no answer from node {node}: {answer!r}")
                                     for b in batches)
                self._retry(batches)
                retried = True
                continue
            for batch in batches:
                code, message = answer.get((batch.topic, batch.partition), (codes.UNKNOWN_TOPIC_OR_PARTITION, ""))
                kind = codes.kind(code)
                if kind in (codes.Kind.DONE, codes.Kind.DUPLICATE):
                    self._failing.pop((batch.topic, batch.partition), None)
                    continue
                if kind is codes.Kind.TOO_LARGE and batch.count > 1:
                    self._split(batch)
                elif kind in (codes.Kind.PARTITION_BUSY, codes.Kind.TIMED_OUT, codes.Kind.UNKNOWN_TOPIC,
                              codes.Kind.COORDINATOR_BUSY):
                    self._failing[(batch.topic, batch.partition)] = codes.error_name(code)
                    self._retry([batch])
                    retried = True
                elif kind is codes.Kind.FENCED:
                    failure = ProducerFencedError(f"transactional id {self._transactional_id!r} is owned by a newer "
                                                  f"producer ({codes.error_name(code)} writing "
                                                  f"{batch.topic}-{batch.partition})")
                elif kind is codes.Kind.UNAUTHORIZED:
                    failure = AuthorizationError(f"the principal may not write with transactional id "
                                                 f"{self._transactional_id!r}: grant WRITE on it "
                                                 "(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
                elif failure is None:
                    failure = TransactionAbortableError(f"writing to {batch.topic}-{batch.partition} failed: "
                                                        f"{codes.error_name(code)} {message}".strip())
        if failure is not None:
            self._accumulator.clear()
            raise failure
        self._after_round(retried)

    def _after_round(self, retried: bool) -> None:
        """The next retry of the series under way, or the series' end: a round that needed none ends it."""
        if not retried:
            self._retries = None
            return
        now = time.monotonic()
        series = self._retries or self._retry_policy.started(now)
        following = series.next(now)
        if following is None:
            raise TransactionAbortableError(f"records not acknowledged within delivery.timeout.ms="
                                            f"{self._config.delivery_timeout_ms} ({series.tries} retried rounds)"
                                            f"{self._unwritten()}")
        self._retries = following
        self._retry_after = now + following.delay_s

    def _unwritten(self) -> str:
        """The partitions whose records were sent and must be sent again, with the last reason (for a timeout's
        message: a topic deleted meanwhile shows as its partitions and UNKNOWN_TOPIC_OR_PARTITION)."""
        if not self._failing:
            return ""
        shown = [f"{topic}-{partition}: {why}" for (topic, partition), why in sorted(self._failing.items())[:5]]
        more = len(self._failing) - len(shown)
        return "; not written: " + ", ".join(shown) + (f" and {more} more partitions" if more > 0 else "")

    def _retry(self, batches: list[Batch]) -> None:
        for batch in reversed(batches):
            self._leaders.pop(batch.topic, None)
            self._accumulator.requeue_front(batch)

    def _split(self, batch: Batch) -> None:
        """The broker refused ``batch`` as too large: send its two halves instead, under new sequence numbers."""
        tp = (batch.topic, batch.partition)
        self._sequences[tp] = batch.base_sequence
        first, second = split_records(batch.records, batch.count)
        log.info("%s-%d refused a batch of %d records as too large; splitting it", *tp, batch.count)
        for run in (second, first):
            self._accumulator.requeue_front(Batch(batch.topic, batch.partition, run.records, run.count,
                                                  batch.base_timestamp, batch.base_timestamp + run.max_timestamp_delta))

    # -- flush and discard -------------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Send everything buffered and wait until the brokers have it (bounded by ``delivery.timeout.ms``)."""
        deadline = time.monotonic() + self._config.delivery_timeout_ms / 1000
        while self._round is not None or not self._accumulator.is_empty():
            if time.monotonic() > deadline:
                raise TransactionAbortableError(f"records not acknowledged within delivery.timeout.ms="
                                                f"{self._config.delivery_timeout_ms}{self._unwritten()}")
            if self._round is not None:
                self._collect(self._wait(self._round[0], deadline))
            pause = self._retry_after - time.monotonic()
            if pause > 0:
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            self._start_round(include_open=True)
        self._unsent_since = None

    def discard(self) -> None:
        """Drop everything unsent, and wait (bounded) for the round in flight: the transaction is being aborted."""
        self._accumulator.clear()
        self._unsent_since = None
        self._failing.clear()
        self._retries, self._retry_after = None, 0.0
        if self._round is not None:
            future, self._round = self._round[0], None
            try:
                future.result(timeout=self._config.delivery_timeout_ms / 1000)
            except Exception as exc:  # the transaction is being aborted; its writes no longer matter
                log.debug("ignoring send failure during abort: %r", exc)

    @property
    def idle(self) -> bool:
        """Whether nothing is buffered or in flight."""
        return self._round is None and self._accumulator.is_empty()


def as_headers(headers: object) -> list[Header] | None:
    """Headers as (str, bytes | None) pairs, from pairs or a mapping; TypeError on anything else."""
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    result: list[Header] = []
    for item in items:  # type: ignore[attr-defined]
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"headers must be (str, bytes | None) pairs, got {item!r}")
        result.append((item[0], as_bytes(f"header {item[0]!r}", item[1])))
    return result


def as_bytes(name: str, value: object) -> bytes | None:
    """``value`` as bytes (or None); TypeError on anything else."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{name} must be bytes or None, got {type(value).__name__}")
