"""Dual write against its peers, in one run, on the same database and broker, on SQLite (a file) and PostgreSQL (a
server the harness starts, or --postgres DSN), at 1, 2, 4 and 8 concurrent writers (threads):

- DB only: INSERT the order, COMMIT (a connection per thread);
- outbox (write side): INSERT the order and its event row in the same transaction, COMMIT (the CDC/poller that
  would then publish the event is not counted);
- Kafka only: confluent-kafka's transactional producer, begin/produce/commit, a transactional id per thread (what
  a plain Kafka transaction costs, without any database);
- dual write: INSERT the order and produce its event in one transaction of a DualWriterPool with one writer per
  thread (lock, prepare, state row, COMMIT, complete).

Each figure: ``--transactions`` spread over the threads, timed from a barrier to the last thread's end, best of
``--rounds`` after a warm-up round; p50/p99 over every transaction of the counted rounds.

    python benchmarks/dual_write.py [--bootstrap HOST:PORT] [--postgres DSN] [--transactions 400] [--rounds 2]
                                    [--writers 1,2,4,8]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from kafka2pc.dualwrite import DualWriterPool
from kafka2pc.testing.postgres import postgres_dsn
from kafka2pc.testing.provider import bootstrap_or_local
from kafka2pc.testing.verify import create_topic

EVENT = json.dumps({"type": "OrderPlaced", "customer": "c-1", "amount": 12.5, "pad": "x" * 40}).encode()
#: one transaction: called with the order id
Transaction = Callable[[int], None]


class Database:
    def __init__(self, name: str, connect: Callable[[], Any], placeholder: str):
        self.name, self.connect, self.p = name, connect, placeholder


def measure(workers: list[Transaction], transactions: int, ids: Iterator[int]) -> tuple[float, list[float]]:
    """Run ``transactions`` spread over one thread per worker; the rate from a common start to the last end."""
    share = transactions // len(workers)
    latencies: list[list[float]] = [[] for _ in workers]
    orders = [[next(ids) for _ in range(share)] for _ in workers]
    start = threading.Barrier(len(workers) + 1)

    def work(index: int) -> None:
        start.wait()
        one, mine = workers[index], latencies[index]
        for order in orders[index]:
            began = time.perf_counter()
            one(order)
            mine.append(time.perf_counter() - began)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(workers))]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return share * len(workers) / (time.perf_counter() - began), [x for mine in latencies for x in mine]


def db_only(db: Database) -> Transaction:
    connection = db.connect()
    insert = f"INSERT INTO orders (id, amount) VALUES ({db.p}, {db.p})"

    def one(order: int) -> None:
        connection.cursor().execute(insert, (order, 12.5))
        connection.commit()
    return one


def outbox(db: Database) -> Transaction:
    connection = db.connect()
    insert_order = f"INSERT INTO orders (id, amount) VALUES ({db.p}, {db.p})"
    insert_event = f"INSERT INTO outbox (id, aggregate_id, payload) VALUES ({db.p}, {db.p}, {db.p})"

    def one(order: int) -> None:
        cursor = connection.cursor()
        cursor.execute(insert_order, (order, 12.5))
        cursor.execute(insert_event, (order, order, EVENT))
        connection.commit()
    return one


def kafka_only(bootstrap: str, topic: str) -> Transaction:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"peer-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)

    def one(order: int) -> None:
        producer.begin_transaction()
        producer.produce(topic, value=EVENT, key=str(order).encode())
        producer.commit_transaction(30)
    return one


def dual_write(pool: DualWriterPool, db: Database, topic: str) -> Transaction:
    insert = f"INSERT INTO orders (id, amount) VALUES ({db.p}, {db.p})"

    def one(order: int) -> None:
        with pool.transaction() as tx:
            tx.cursor.execute(insert, (order, 12.5))
            tx.produce(topic, value=EVENT, key=str(order).encode())
    return one


def run(db: Database, bootstrap: str, *, writer_counts: list[int], transactions: int, rounds: int) -> None:
    setup = db.connect()
    for ddl in ("CREATE TABLE orders (id BIGINT PRIMARY KEY, amount REAL)",
                "CREATE TABLE outbox (id BIGINT PRIMARY KEY, aggregate_id BIGINT, payload BYTEA)"):
        setup.cursor().execute(ddl if db.p == "%s" else ddl.replace("BYTEA", "BLOB"))
    setup.commit()
    topic = create_topic(bootstrap, partitions=8)
    ids = itertools.count()
    print(f"\n{db.name}: {transactions} transactions per figure, best of {rounds} rounds after a warm-up")
    print(f"  {'contender':30s} {'writers':>7s} {'tx/s':>8s} {'x Kafka only':>12s} {'x 1 writer':>10s} "
          f"{'p50 ms':>8s} {'p99 ms':>8s}")
    single: dict[str, float] = {}
    for count in writer_counts:
        connections: list[Any] = []

        def connect(connections: list[Any] = connections) -> Any:
            connections.append(db.connect())
            return connections[-1]

        pool = DualWriterPool(connect, {"bootstrap.servers": bootstrap, "transactional.id": f"bench-{count}"},
                              size=count)
        contenders: dict[str, list[Transaction]] = {
            "DB only": [db_only(db) for _ in range(count)],
            "outbox (write side)": [outbox(db) for _ in range(count)],
            "Kafka only (confluent txn)": [kafka_only(bootstrap, topic) for _ in range(count)],
            "dual write (DualWriterPool)": [dual_write(pool, db, topic) for _ in range(count)],
        }
        figures: dict[str, tuple[float, list[float]]] = {}
        for round_ in range(rounds + 1):
            for name, workers in contenders.items():
                rate, latencies = measure(workers, transactions, ids)
                if round_ == 0:
                    continue
                best, kept = figures.get(name, (0.0, []))
                figures[name] = (max(best, rate), kept + latencies)
        pool.close()
        for connection in connections:
            connection.close()
        kafka_rate = figures["Kafka only (confluent txn)"][0]
        for name, (rate, latencies) in figures.items():
            single.setdefault(name, rate)
            ordered = sorted(latencies)
            p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
            print(f"  {name:30s} {count:7d} {rate:8.0f} {rate / kafka_rate:12.2f} {rate / single[name]:10.2f} "
                  f"{1000 * statistics.median(latencies):8.2f} {1000 * p99:8.2f}")
    setup.close()


@contextlib.contextmanager
def postgres(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    with postgres_dsn() as started:
        yield started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap")
    parser.add_argument("--postgres", metavar="DSN")
    parser.add_argument("--transactions", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--writers", default="1,2,4,8")
    args = parser.parse_args()
    writer_counts = [int(n) for n in args.writers.split(",")]
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    options = {"writer_counts": writer_counts, "transactions": args.transactions, "rounds": args.rounds}
    with bootstrap_or_local(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as work:
        print(f"broker {bootstrap}")
        path = Path(work) / "bench.db"
        run(Database("SQLite (file, default journal, synchronous=FULL)",
                     lambda: sqlite3.connect(path, timeout=60, check_same_thread=False), "?"), bootstrap, **options)
        import psycopg  # noqa: PLC0415

        with postgres(args.postgres) as dsn:
            schema = f"bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(f"CREATE SCHEMA {schema}")
            scoped = psycopg.conninfo.make_conninfo(dsn, options=f"-c search_path={schema}")
            run(Database("PostgreSQL (fsync on)", lambda: psycopg.connect(scoped), "%s"), bootstrap, **options)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
