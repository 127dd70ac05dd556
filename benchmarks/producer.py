"""Transactional producer throughput: kafka2pc (produce, produce_batch; 2PC) against confluent-kafka and kafka-python,
in one process, against one broker, on the same records: 100-byte values, transactions of 10 000 records.

    python benchmarks/producer.py [--bootstrap HOST:PORT] [--transactions 20] [--rounds 3]

Without --bootstrap a local Apache Kafka broker is started (kafka2pc.testing). Each contender runs ``--rounds``
times, interleaved, and the median throughput is reported with its ratio to confluent-kafka's.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Producer as ConfluentProducer
from kafka import KafkaProducer

from kafka2pc import TwoPhaseProducer
from kafka2pc.testing.provider import bootstrap_or_local
from kafka2pc.testing.verify import create_topic, end_offsets

RECORDS_PER_TXN = 10_000
VALUE_SIZE = 100


def _kafka2pc(bootstrap: str, transactions: int, write: Callable[[TwoPhaseProducer], None]) -> None:
    with TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:6]}"},
                          two_phase_commit=True) as producer:
        producer.init_transactions()
        for _ in range(transactions):
            producer.begin_transaction()
            write(producer)
            producer.complete_transaction(producer.prepare_transaction())


def kafka2pc_produce(bootstrap: str, topic: str, transactions: int, values: list[bytes]) -> None:
    def one_by_one(producer: TwoPhaseProducer) -> None:
        for value in values:
            producer.produce(topic, value)

    _kafka2pc(bootstrap, transactions, one_by_one)


def kafka2pc_produce_batch(bootstrap: str, topic: str, transactions: int, values: list[bytes]) -> None:
    _kafka2pc(bootstrap, transactions, lambda producer: producer.produce_batch(topic, values))


def confluent(bootstrap: str, topic: str, transactions: int, values: list[bytes]) -> None:
    producer = ConfluentProducer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "transactional.id": f"bench-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(60)
    for _ in range(transactions):
        producer.begin_transaction()
        for value in values:
            while True:
                try:
                    producer.produce(topic, value)
                    break
                except BufferError:  # local queue full: let librdkafka deliver some
                    producer.poll(0.01)
        producer.commit_transaction(60)


def kafka_python(bootstrap: str, topic: str, transactions: int, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"bench-{uuid.uuid4().hex[:6]}",
                             linger_ms=5, batch_size=1_048_576)
    producer.init_transactions()
    for _ in range(transactions):
        producer.begin_transaction()
        for value in values:
            producer.send(topic, value)
        producer.commit_transaction()
    producer.close()


CONTENDERS: dict[str, Callable[[str, str, int, list[bytes]], None]] = {
    "kafka2pc produce_batch (2PC)": kafka2pc_produce_batch,
    "kafka2pc produce (2PC)": kafka2pc_produce,
    "confluent-kafka transactional": confluent,
    "kafka-python transactional": kafka_python,
}
BASELINE = "confluent-kafka transactional"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap")
    parser.add_argument("--transactions", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="uncounted rounds first (broker JIT, page cache)")
    parser.add_argument("--skip", action="append", default=[], help="leave out a contender (by name prefix)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)

    with bootstrap_or_local(args.bootstrap) as bootstrap:
        values = [os.urandom(VALUE_SIZE) for _ in range(RECORDS_PER_TXN)]
        records = args.transactions * RECORDS_PER_TXN
        contenders = {name: fn for name, fn in CONTENDERS.items()
                      if not any(name.startswith(skip) for skip in args.skip)}
        results: dict[str, list[float]] = {name: [] for name in contenders}
        print(f"{records} records of {VALUE_SIZE} B per run, {args.transactions} transactions of "
              f"{RECORDS_PER_TXN}, {args.rounds} rounds, broker {bootstrap}", flush=True)
        for round_no in range(1 - args.warmup, args.rounds + 1):
            for name, run in contenders.items():
                topic = create_topic(bootstrap)
                started = time.perf_counter()
                run(bootstrap, topic, args.transactions, values)
                elapsed = time.perf_counter() - started
                written = sum(end_offsets(bootstrap, topic, isolation="read_uncommitted").values())
                # each transaction adds one commit marker to the log
                if written != records + args.transactions:
                    print(f"  {name}: wrote {written} log entries, expected {records + args.transactions}",
                          file=sys.stderr)
                    return 1
                label = f"round {round_no}" if round_no > 0 else "warm-up"
                if round_no > 0:
                    results[name].append(records / elapsed)
                print(f"  {label}: {name:32s} {records / elapsed:>10,.0f} records/s", flush=True)
        baseline = statistics.median(results[BASELINE]) if BASELINE in results else None
        print("\nmedian of rounds:")
        for name, rates in results.items():
            median = statistics.median(rates)
            ratio = f"{median / baseline:5.2f}x {BASELINE}" if baseline else ""
            print(f"  {name:32s} {median:>10,.0f} records/s  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
