"""A plain (non-2PC) transactional producer from confluent-kafka: the baseline the harness tests lean on."""

import uuid

from confluent_kafka import Producer


def transactional_producer(bootstrap: str, transactional_id: str | None = None, **extra) -> Producer:
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": transactional_id or f"baseline-{uuid.uuid4().hex[:8]}",
        "transaction.timeout.ms": 60_000,
        **extra,
    })
    producer.init_transactions(30)
    return producer


def produce_all(producer: Producer, topic: str, payloads: list[bytes]) -> None:
    for payload in payloads:
        producer.produce(topic, value=payload)
    assert producer.flush(30) == 0
