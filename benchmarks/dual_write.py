"""Dual write against the database alone and against the outbox pattern's write side, in one run, on the same
database and broker, on SQLite (a file) and PostgreSQL (a server the harness starts, or --postgres DSN):

- DB only: INSERT the order, COMMIT;
- outbox (write side): INSERT the order and its event row in the same transaction, COMMIT (the CDC/poller that
  would then publish the event is not counted);
- dual write: INSERT the order and produce its event to Kafka in one DualWriter transaction (prepare, state row,
  COMMIT, complete).

Transactions/s and p50/p99 latency per contender, ``--rounds`` interleaved rounds of ``--transactions`` each.

    python benchmarks/dual_write.py [--bootstrap HOST:PORT] [--postgres DSN] [--transactions 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kafka2pc.dualwrite import DualWriter
from kafka2pc.testing.postgres import postgres_dsn
from kafka2pc.testing.provider import bootstrap_or_local
from kafka2pc.testing.verify import create_topic

EVENT = json.dumps({"type": "OrderPlaced", "customer": "c-1", "amount": 12.5, "pad": "x" * 40}).encode()


def timed(count: int, one: Callable[[int], None], first_id: int) -> list[float]:
    latencies = []
    for i in range(count):
        started = time.perf_counter()
        one(first_id + i)
        latencies.append(time.perf_counter() - started)
    return latencies


def contenders(connection: Any, p: str, bootstrap: str, topic: str) -> dict[str, Callable[[int], None]]:
    insert_order = f"INSERT INTO orders (id, amount) VALUES ({p}, {p})"
    insert_event = f"INSERT INTO outbox (id, aggregate_id, payload) VALUES ({p}, {p}, {p})"
    writer = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": f"b-{uuid.uuid4().hex[:6]}"})
    writer.recover()

    def db_only(order: int) -> None:
        connection.cursor().execute(insert_order, (order, 12.5))
        connection.commit()

    def outbox(order: int) -> None:
        cursor = connection.cursor()
        cursor.execute(insert_order, (order, 12.5))
        cursor.execute(insert_event, (order, order, EVENT))
        connection.commit()

    def dual_write(order: int) -> None:
        with writer.transaction() as tx:
            tx.cursor.execute(insert_order, (order, 12.5))
            tx.produce(topic, value=EVENT, key=str(order).encode())

    return {"DB only": db_only, "outbox (write side)": outbox, "dual write (DB + Kafka 2PC)": dual_write}


def run(name: str, connection: Any, p: str, bootstrap: str, *, transactions: int, rounds: int) -> None:
    cursor = connection.cursor()
    for ddl in ("CREATE TABLE orders (id BIGINT PRIMARY KEY, amount REAL)",
                "CREATE TABLE outbox (id BIGINT PRIMARY KEY, aggregate_id BIGINT, payload BYTEA)"):
        cursor.execute(ddl if "postgres" in name.lower() else ddl.replace("BYTEA", "BLOB"))
    connection.commit()
    funcs = contenders(connection, p, bootstrap, create_topic(bootstrap, partitions=3))
    results: dict[str, list[float]] = {k: [] for k in funcs}
    next_id = 0
    for _ in range(rounds + 1):  # the first round warms up, not counted
        for key, one in funcs.items():
            latencies = timed(transactions, one, next_id)
            next_id += transactions
            if _ > 0:
                results[key] += latencies
    print(f"\n{name}: {rounds} rounds x {transactions} transactions")
    base = len(results["DB only"]) / sum(results["DB only"])
    for key, latencies in results.items():
        rate = len(latencies) / sum(latencies)
        ordered = sorted(latencies)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        p50 = statistics.median(latencies)
        print(f"  {key:28s} {rate:8.0f} tx/s ({rate / base:4.2f}x DB only)   p50 {1000 * p50:6.2f} ms   "
              f"p99 {1000 * p99:6.2f} ms")


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
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    with bootstrap_or_local(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as work:
        print(f"broker {bootstrap}")
        with sqlite3.connect(Path(work) / "bench.db") as connection:
            run("SQLite (file, default journal, synchronous=FULL)", connection, "?", bootstrap,
                transactions=args.transactions, rounds=args.rounds)
        import psycopg  # noqa: PLC0415

        with postgres(args.postgres) as dsn, psycopg.connect(dsn) as connection:
            schema = f"bench_{uuid.uuid4().hex[:8]}"
            connection.execute(f"CREATE SCHEMA {schema}")
            connection.execute(f"SET search_path = {schema}")
            connection.commit()
            run("PostgreSQL 15 (fsync on)", connection, "%s", bootstrap, transactions=args.transactions,
                rounds=args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
