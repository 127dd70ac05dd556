"""What a read_committed consumer sees: the ground truth every kafka2pc test asserts on.

Uses confluent-kafka (librdkafka), an independent client, so a bug in kafka2pc's own wire code cannot hide itself.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kafka2pc.config import ClientConfig
from kafka2pc.config.librdkafka import librdkafka_settings
from kafka2pc.testing.cluster import KafkaService

__all__ = ["ConsumedRecord", "create_topic", "end_offsets", "produce_orders", "read_records", "values"]


@attrs.frozen
class ConsumedRecord:
    """One record as a consumer saw it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


#: ``"host:port"``, a client config, or a broker fixture's ``KafkaService`` itself (its ``client_config``)
Connection = str | Mapping[str, object] | KafkaService


def _connection(connection: Connection) -> dict[str, Any]:
    """``"host:port"``, or a client config in either client's keys (a secured cluster's ``client_config``, Java's
    ``sasl.jaas.config`` and truststores) as librdkafka takes it, or a cluster (``kafka`` of the fixtures)."""
    if isinstance(connection, str):
        return {"bootstrap.servers": connection}
    if isinstance(connection, KafkaService):
        connection = connection.client_config
    return librdkafka_settings(ClientConfig.from_dict(connection))


def create_topic(bootstrap: Connection, name: str | None = None, *, partitions: int = 1,
                 replication_factor: int | None = None, config: dict[str, str] | None = None,
                 timeout_s: float = 30.0) -> str:
    """Create a topic (a fresh unique name when ``name`` is None) and return its name."""
    topic = name or f"t-{uuid.uuid4().hex[:12]}"
    admin = AdminClient(_connection(bootstrap))
    new = NewTopic(topic, num_partitions=partitions,
                   replication_factor=replication_factor if replication_factor is not None else -1,
                   config=config or {})
    admin.create_topics([new], operation_timeout=timeout_s)[topic].result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # metadata propagates to every broker asynchronously
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions and all(
                p.leader >= 0 for p in meta.partitions.values()):
            return topic
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} has no leaders after {timeout_s:g} s")


def produce_orders(bootstrap: Connection, topic: str, first: int, count: int, *, over_s: float = 0.0) -> None:
    """Orders ``first .. first + count - 1`` into ``topic`` as JSON values ``{"id": n, "amount": a}`` keyed by the id,
    by an idempotent producer (so no duplicates of its own), spread over ``over_s`` seconds."""
    producer = Producer({**_connection(bootstrap), "enable.idempotence": True, "linger.ms": 5})
    for order in range(first, first + count):
        producer.produce(topic, key=str(order), value=json.dumps({"id": order, "amount": order % 97 / 10}))
        producer.poll(0)
        if over_s:
            time.sleep(over_s / count)
    if producer.flush(30) != 0:
        raise KafkaException(f"orders {first}..{first + count - 1} not acknowledged within 30 s")


def _consumer(bootstrap: Connection, isolation: str) -> Consumer:
    return Consumer({
        **_connection(bootstrap),
        "group.id": f"kafka2pc-verify-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "auto.offset.reset": "earliest",
    })


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    if meta.error is not None:
        raise KafkaException(meta.error)
    return sorted(meta.partitions)


def end_offsets(bootstrap: Connection, topic: str, *, isolation: str = "read_committed",
                settle_s: float = 0.0) -> dict[int, int]:
    """Per partition, the offset a consumer of that isolation level reads up to.

    For ``read_committed`` this is the last stable offset (LSO): an open transaction holds it back, and so do the
    markers of a commit until the coordinator has written them; ``settle_s`` waits up to that long for the LSO to
    reach the log end.
    """
    consumer = _consumer(bootstrap, isolation)
    try:
        partitions = _partitions(consumer, topic)
        return _settled_ends(bootstrap, topic, consumer, partitions,
                             settle_s if isolation == "read_committed" else 0.0)
    finally:
        consumer.close()


def _settled_ends(bootstrap: Connection, topic: str, consumer: Consumer, partitions: list[int],
                  settle_s: float) -> dict[int, int]:
    """End offsets of ``consumer``'s isolation level, after waiting up to ``settle_s`` for read_committed ones to
    reach the log end: a commit returns once the coordinator has logged it, and its markers follow a moment later."""
    deadline = time.monotonic() + settle_s
    while True:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in partitions}
        if settle_s <= 0 or time.monotonic() > deadline:
            return ends
        if ends == end_offsets(bootstrap, topic, isolation="read_uncommitted"):
            return ends
        time.sleep(0.05)


def read_records(bootstrap: Connection, topic: str, *, isolation: str = "read_committed",
                 timeout_s: float = 30.0, settle_s: float = 5.0) -> list[ConsumedRecord]:
    """Every record of ``topic`` a consumer of ``isolation`` sees, reading from the start up to the end offsets
    taken when the call begins. With read_committed, first waits up to ``settle_s`` for transactions that are
    ending to get their markers (pass 0 where transactions are deliberately left open). Raises TimeoutError if the
    end offsets are not reached in ``timeout_s``."""
    consumer = _consumer(bootstrap, isolation)
    try:
        partitions = _partitions(consumer, topic)
        ends = _settled_ends(bootstrap, topic, consumer, partitions,
                             settle_s if isolation == "read_committed" else 0.0)
        pending = {p for p in partitions if ends[p] > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[ConsumedRecord] = []
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: did not reach end offsets {ends} in {timeout_s:g} s")
            for msg in consumer.consume(num_messages=10_000, timeout=0.2):
                error = msg.error()
                if error is not None:
                    raise KafkaException(error)
                records.append(ConsumedRecord(topic, msg.partition() or 0, msg.offset() or 0, msg.key(), msg.value()))
            for p in list(pending):
                position = consumer.position([TopicPartition(topic, p)])[0].offset
                if position >= ends[p]:
                    pending.discard(p)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def values(records: Iterable[ConsumedRecord]) -> list[bytes | None]:
    """The values of ``records`` in order."""
    return [r.value for r in records]
