"""Transactional producer throughput: kafka2pc (produce, produce_batch; 2PC) against confluent-kafka (produce,
produce_batch) and kafka-python, in one process, against one broker, on the same records: 100-byte values,
transactions of 10 000 records.

    python benchmarks/producer.py [--bootstrap HOST:PORT] [--transactions 20] [--rounds 3]

Without --bootstrap a local Apache Kafka broker is started (kafka2pc.testing). Each contender runs ``--rounds``
times, interleaved, and the median throughput is reported with its min-max and its ratio to confluent-kafka's
``produce``. The like-for-like pairs are then compared: batch API against batch API (kafka2pc ``produce_batch``,
confluent-kafka ``produce_batch``) and per record against per record (both ``produce``). Beside each figure: the
process's CPU (user + system, every thread) per record, and its ratio for each pair.
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
from typing import Any

from confluent_kafka import KafkaError, KafkaException
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


def _confluent(bootstrap: str, transactions: int, write: Callable[[ConfluentProducer], None]) -> None:
    """Runs ``transactions`` transactions of ``write``. Every record must be delivered: a failed delivery makes
    ``commit_transaction`` raise, and is also collected by a delivery callback that only failures reach (with
    ``delivery.report.only.error`` the client skips it in C for delivered records, so it costs them nothing)."""
    failed: list[KafkaError | None] = []
    producer = ConfluentProducer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "transactional.id": f"bench-{uuid.uuid4().hex[:6]}",
                                  "delivery.report.only.error": True,
                                  "on_delivery": lambda err, _msg: failed.append(err)})
    producer.init_transactions(60)
    for _ in range(transactions):
        producer.begin_transaction()
        write(producer)
        producer.commit_transaction(60)
        if failed:
            raise RuntimeError(f"{len(failed)} records not delivered, first: {failed[0]}")


def confluent_produce(bootstrap: str, topic: str, transactions: int, values: list[bytes]) -> None:
    def one_by_one(producer: ConfluentProducer) -> None:
        for value in values:
            while True:
                try:
                    producer.produce(topic, value)
                    break
                except BufferError:  # local queue full: let librdkafka deliver some
                    producer.poll(0.01)

    _confluent(bootstrap, transactions, one_by_one)


def _confluent_enqueue_batch(producer: ConfluentProducer, topic: str, messages: list[dict[str, Any]]) -> None:
    """``Producer.produce_batch`` raises no BufferError: it returns how many messages it queued and adds an
    ``_error`` (KafkaError) to each refused message dict. A full local queue refuses the rest of the batch, which is
    retried here once librdkafka has delivered some; any other refusal fails the run."""
    pending = messages
    while pending:
        queued = producer.produce_batch(topic, pending)
        if queued == len(pending):
            return
        refused = [message for message in pending if "_error" in message]
        # popped: the dicts are reused by the retry and by the next transaction
        errors: list[KafkaError] = [message.pop("_error") for message in refused]
        if len(refused) != len(pending) - queued or any(e.code() != KafkaError._QUEUE_FULL for e in errors):
            raise KafkaException(errors[0] if errors else KafkaError(KafkaError._FAIL, "produce_batch miscounted"))
        pending = refused
        producer.poll(0.01)


def confluent_produce_batch(bootstrap: str, topic: str, transactions: int, values: list[bytes]) -> None:
    # the batch API's record format, built once per run (in the timed part) and reused by every transaction
    messages: list[dict[str, Any]] = [{"value": value} for value in values]
    _confluent(bootstrap, transactions, lambda producer: _confluent_enqueue_batch(producer, topic, messages))


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
    "confluent-kafka produce_batch": confluent_produce_batch,
    "kafka2pc produce (2PC)": kafka2pc_produce,
    "confluent-kafka produce": confluent_produce,
    "kafka-python transactional": kafka_python,
}
BASELINE = "confluent-kafka produce"
# like for like: (kafka2pc, confluent-kafka) with the same API shape
PAIRS = {
    "batch": ("kafka2pc produce_batch (2PC)", "confluent-kafka produce_batch"),
    "per-record": ("kafka2pc produce (2PC)", "confluent-kafka produce"),
}


def _report(results: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    baseline = statistics.median(results[BASELINE]) if BASELINE in results else None
    print("\nmedian of rounds (min-max); CPU: the process's user + system time per record, median of rounds:")
    for name, rates in results.items():
        median = statistics.median(rates)
        ratio = f"{median / baseline:5.2f}x {BASELINE}" if baseline else ""
        spread = f"({min(rates):,.0f}-{max(rates):,.0f})"
        print(f"  {name:32s} {median:>10,.0f} records/s  {spread:23s} CPU {statistics.median(cpu[name]):5.2f} "
              f"us/record  {ratio}")
    for pair, (ours, theirs) in PAIRS.items():
        if ours in results and theirs in results:
            per_round = [a / b for a, b in zip(results[ours], results[theirs], strict=True)]
            of_medians = statistics.median(results[ours]) / statistics.median(results[theirs])
            cpu_ratio = statistics.median(cpu[ours]) / statistics.median(cpu[theirs])
            print(f"{pair + ':':11s} kafka2pc/confluent = {of_medians:.2f}x  (medians; per round "
                  f"{min(per_round):.2f}x-{max(per_round):.2f}x); CPU per record {cpu_ratio:.2f}x")


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
        cpu: dict[str, list[float]] = {name: [] for name in contenders}
        print(f"{records} records of {VALUE_SIZE} B per run, {args.transactions} transactions of "
              f"{RECORDS_PER_TXN}, {args.rounds} rounds, broker {bootstrap}", flush=True)
        for round_no in range(1 - args.warmup, args.rounds + 1):
            for name, run in contenders.items():
                topic = create_topic(bootstrap)
                started, cpu_before = time.perf_counter(), os.times()
                run(bootstrap, topic, args.transactions, values)
                elapsed, cpu_after = time.perf_counter() - started, os.times()
                # the process's CPU, every thread (librdkafka's and kafka-python's IO threads too) over the records
                cpu_us = 1e6 * ((cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)) / records
                written = sum(end_offsets(bootstrap, topic, isolation="read_uncommitted").values())
                # each transaction adds one commit marker to the log
                if written != records + args.transactions:
                    print(f"  {name}: wrote {written} log entries, expected {records + args.transactions}",
                          file=sys.stderr)
                    return 1
                label = f"round {round_no}" if round_no > 0 else "warm-up"
                if round_no > 0:
                    results[name].append(records / elapsed)
                    cpu[name].append(cpu_us)
                print(f"  {label}: {name:32s} {records / elapsed:>10,.0f} records/s  CPU {cpu_us:5.2f} us/record",
                      flush=True)
        _report(results, cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
