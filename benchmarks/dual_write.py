"""Dual write against its peers, in one run, on the same database and broker, on SQLite (a file), PostgreSQL (a
server the harness starts, or --postgres DSN) and MariaDB (the same, or --mariadb URL), at 1, 2, 4 and 8 concurrent
writers (threads):

- DB only: INSERT the order, COMMIT (a connection per thread);
- outbox (write side): INSERT the order and its event row in the same transaction, COMMIT (the CDC/poller that
  would then publish the event is not counted);
- Kafka only: confluent-kafka's transactional producer, begin/produce/commit, a transactional id per thread (what
  a plain Kafka transaction costs, without any database);
- dual write: INSERT the order and produce its event in one transaction of a DualWriterPool with one writer per
  thread (lock, prepare, state row, COMMIT, complete).

Each figure: ``--transactions`` spread over the threads, timed from a barrier to the last thread's end, best of
``--rounds`` after a warm-up round; p50/p99 over every transaction of the counted rounds.

Then a fleet on PostgreSQL (the pools lease their ids ``<prefix>-<n>`` from the state table; every process has the
same configuration): every process a subprocess with its own DualWriterPool(size=4) and 4 threads, started once and
run in bursts (``--fleet-transactions`` per thread; a burst's rate: its transactions over the first process's start
to the last one's end), after a warm-up burst, ``--fleet-rounds`` rounds of one burst per arm:

- 1 process x 4 threads, leasing (this checkout's kafka2pc, or ``--after-src``);
- the same with the pool before leasing (commit ``--before-commit``, 4018cfd: fixed ids ``<prefix>-0..3``; its
  ``src`` extracted with ``git archive``, or ``--before-src``), alternated with the one above (ABBA), and the median
  of the rounds' ratios: what leasing costs per transaction;
- 4 processes x 4 threads (16 in all), one prefix.

tx/s: the median burst, and the slowest and fastest; p50/p99 over every transaction; client CPU ms per transaction
(the worker processes' user + system time during the bursts, median burst). The tables above print the same for
each contender: this process's CPU per transaction, median of the counted rounds.

Then ``--sections django``: the same on Django's connection (Django's ``transaction.atomic()`` INSERT,
confluent-kafka, a DualWriterPool on ``django.db.connection``). Then ``--sections asyncio``
(benchmarks/dual_write_async.py): AsyncDualWriter at 1 and 32 concurrent tasks (``--tasks``) against async
SQLAlchemy's DB-only transaction and confluent-kafka's plain transaction, with the event loop's longest stall.

    python benchmarks/dual_write.py [--bootstrap HOST:PORT] [--postgres DSN] [--transactions 400] [--rounds 2]
                                    [--writers 1,2,4,8] [--sections sqlite,postgres,mariadb,django,fleet,asyncio]
                                    [--mariadb URL] [--tasks 1,32]
                                    [--gc-freeze]
                                    [--fleet-rounds 20]
                                    [--fleet-transactions 100] [--fleet-warmup 25] [--before-src PATH]
                                    [--after-src PATH] [--before-commit 4018cfd]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import logging
import os
import queue
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from kafka2pc.dualwrite import DualWriterPool
from kafka2pc.testing.provider import bootstrap_or_local
from kafka2pc.testing.verify import create_topic
from kafka2pc_harness.postgres import postgres_dsn

EVENT = json.dumps({"type": "OrderPlaced", "customer": "c-1", "amount": 12.5, "pad": "x" * 40}).encode()
#: one transaction: called with the order id
Transaction = Callable[[int], None]


class Database:
    def __init__(self, name: str, connect: Callable[[], Any], placeholder: str, binary: str = "BYTEA"):
        self.name, self.connect, self.p, self.binary = name, connect, placeholder, binary


def measure(workers: list[Transaction], transactions: int,
            ids: Iterator[int]) -> tuple[float, list[float], float]:
    """Run ``transactions`` spread over one thread per worker: the rate from a common start to the last end, the
    latencies, and the process's CPU (user + system, every thread: librdkafka's and kafka-python's too) in ms per
    transaction."""
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
    began, cpu = time.perf_counter(), os.times()
    for thread in threads:
        thread.join()
    elapsed, after, done = time.perf_counter() - began, os.times(), share * len(workers)
    cpu_ms = 1000 * ((after.user - cpu.user) + (after.system - cpu.system)) / done
    return done / elapsed, [x for mine in latencies for x in mine], cpu_ms


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
        setup.cursor().execute(ddl.replace("BYTEA", db.binary))
    setup.commit()
    topic = create_topic(bootstrap, partitions=8)
    ids = itertools.count()
    print(f"\n{db.name}: {transactions} transactions per figure, best of {rounds} rounds after a warm-up")
    print(f"  {'contender':30s} {'writers':>7s} {'tx/s':>8s} {'x Kafka only':>12s} {'x 1 writer':>10s} "
          f"{'p50 ms':>8s} {'p99 ms':>8s} {'CPU ms/tx':>9s}")
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
        figures: dict[str, tuple[float, list[float], list[float]]] = {}
        for round_ in range(rounds + 1):
            for name, workers in contenders.items():
                rate, latencies, cpu_ms = measure(workers, transactions, ids)
                if round_ == 0:
                    continue
                best, kept, cpus = figures.get(name, (0.0, [], []))
                figures[name] = (max(best, rate), kept + latencies, [*cpus, cpu_ms])
        pool.close()
        for connection in connections:
            with contextlib.suppress(Exception):  # the pool closed its own (PyMySQL raises on a second close)
                connection.close()
        kafka_rate = figures["Kafka only (confluent txn)"][0]
        for name, (rate, latencies, cpus) in figures.items():
            single.setdefault(name, rate)
            ordered = sorted(latencies)
            p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
            print(f"  {name:30s} {count:7d} {rate:8.0f} {rate / kafka_rate:12.2f} {rate / single[name]:10.2f} "
                  f"{1000 * statistics.median(latencies):8.2f} {1000 * p99:8.2f} {statistics.median(cpus):9.2f}")
    setup.close()


# -- a fleet: pools in processes of their own ----------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fleet_worker(spec: dict[str, Any]) -> int:
    """One process of a fleet (``--fleet-worker SPEC``): a DualWriterPool of the kafka2pc on its PYTHONPATH and
    ``threads`` threads. Each stdin line ``go FIRST N`` is a burst: every thread runs N transactions (order ids from
    FIRST); a JSON line answers it. ``quit`` closes the pool."""
    import psycopg  # noqa: PLC0415

    import kafka2pc  # noqa: PLC0415

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    pool = DualWriterPool(lambda: psycopg.connect(spec["dsn"]),
                          {"bootstrap.servers": spec["bootstrap"], "transactional.id": spec["prefix"]},
                          size=spec["size"])
    insert = "INSERT INTO orders (id, amount) VALUES (%s, %s)"
    threads = spec["threads"]
    jobs: list[queue.Queue[tuple[int, int] | None]] = [queue.Queue() for _ in range(threads)]
    done: queue.Queue[list[float] | str] = queue.Queue()

    def work(index: int) -> None:
        while (job := jobs[index].get()) is not None:
            first, count = job
            mine: list[float] = []
            try:
                for order in range(first + index * count, first + (index + 1) * count):
                    began = time.perf_counter()
                    with pool.transaction() as tx:
                        tx.cursor.execute(insert, (order, 12.5))
                        tx.produce(spec["topic"], value=EVENT, key=str(order).encode())
                    mine.append(time.perf_counter() - began)
            except Exception as exc:
                done.put(repr(exc))
                continue
            done.put(mine)

    workers = [threading.Thread(target=work, args=(index,), daemon=True) for index in range(threads)]
    for thread in workers:
        thread.start()
    print(json.dumps({"ready": True, "kafka2pc": kafka2pc.__file__}), flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[0] != "go":
            break
        cpu, began = os.times(), time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
        for job in jobs:
            job.put((int(command[1]), int(command[2])))
        answers = [done.get() for _ in workers]
        ended, after = time.monotonic(), os.times()
        failed = [answer for answer in answers if isinstance(answer, str)]
        print(json.dumps({"began": began, "ended": ended, "failed": failed,
                          "latencies": [x for answer in answers if not isinstance(answer, str) for x in answer],
                          "cpu_s": (after.user + after.system) - (cpu.user + cpu.system),
                          "ids": list(getattr(pool, "transactional_ids", []))}), flush=True)
    for job in jobs:
        job.put(None)
    pool.close()
    return 0


class FleetArm:
    """``processes`` worker processes of one kafka2pc (``src``), one prefix, run in bursts."""

    def __init__(self, name: str, src: Path, prefix: str, processes: int, threads: int = 4):
        self.name, self.src, self.prefix, self.processes, self.threads = name, src, prefix, processes, threads
        self.rates: list[float] = []
        self.latencies: list[float] = []
        self.cpu_ms_per_tx: list[float] = []
        self.ids: set[str] = set()
        self.children: list[subprocess.Popen[str]] = []

    def start(self, base: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": str(self.src)}
        spec = json.dumps({**base, "prefix": self.prefix, "threads": self.threads})
        self.children = [subprocess.Popen([sys.executable, __file__, "--fleet-worker", spec], env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                         for _ in range(self.processes)]
        for child in self.children:
            ready = json.loads(_line(child))
            if not ready["kafka2pc"].startswith(str(self.src)):
                raise SystemExit(f"{self.name}: the worker imported {ready['kafka2pc']}, not from {self.src}")

    def burst(self, orders: Iterator[int], per_thread: int, *, counted: bool = True) -> None:
        for child in self.children:
            assert child.stdin is not None
            child.stdin.write(f"go {next(orders) * self.threads * per_thread} {per_thread}\n")
            child.stdin.flush()
        results = [json.loads(_line(child)) for child in self.children]
        failed = [error for result in results for error in result["failed"]]
        if failed:
            raise SystemExit(f"{self.name}: transactions failed: {failed[:3]}")
        self.ids.update(tid for result in results for tid in result["ids"])
        if not counted:
            return
        transactions = sum(len(result["latencies"]) for result in results)
        span = max(result["ended"] for result in results) - min(result["began"] for result in results)
        self.rates.append(transactions / span)
        self.latencies += [x for result in results for x in result["latencies"]]
        self.cpu_ms_per_tx.append(1000 * sum(result["cpu_s"] for result in results) / transactions)

    def stop(self) -> None:
        for child in self.children:
            with contextlib.suppress(OSError):
                assert child.stdin is not None
                child.stdin.write("quit\n")
                child.stdin.close()
        for child in self.children:
            try:
                child.wait(timeout=120)
            except subprocess.TimeoutExpired:
                child.kill()

    def figures(self) -> dict[str, Any]:
        return {"tx_per_s": statistics.median(self.rates), "tx_per_s_min": min(self.rates),
                "tx_per_s_max": max(self.rates), "p50_ms": 1000 * percentile(self.latencies, 0.5),
                "p99_ms": 1000 * percentile(self.latencies, 0.99),
                "cpu_ms_per_tx": statistics.median(self.cpu_ms_per_tx)}

    def row(self) -> str:
        f = self.figures()
        return (f"  {self.name:46s} {self.processes * self.threads:7d} {f['tx_per_s']:8.0f} "
                f"{f['tx_per_s_min']:6.0f}-{f['tx_per_s_max']:<6.0f} {f['p50_ms']:8.2f} {f['p99_ms']:8.2f} "
                f"{f['cpu_ms_per_tx']:9.2f}")


def _line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        raise SystemExit(f"a fleet worker ended early (exit {child.wait()})")
    return line


@contextlib.contextmanager
def source_tree(given: str | None, commit: str) -> Iterator[Path]:
    """``given``, or ``src`` of ``commit`` (git archive) in a temporary folder removed afterwards."""
    if given:
        yield Path(given).resolve()
        return
    with tempfile.TemporaryDirectory(prefix=f"kafka2pc-{commit}-") as folder:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src/kafka2pc"], check=True,
                                 capture_output=True).stdout
        archive_path = Path(folder) / "src.tar"
        archive_path.write_bytes(archive)
        with tarfile.open(archive_path) as tar:
            tar.extractall(folder, filter="data")
        yield Path(folder) / "src"


def run_fleet(dsn: str, bootstrap: str, args: argparse.Namespace) -> None:
    import psycopg  # noqa: PLC0415

    import kafka2pc  # noqa: PLC0415
    from kafka2pc.dualwrite import state_table_ddl  # noqa: PLC0415

    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, amount REAL)")
        setup.execute(state_table_ddl())  # with the lease columns: both arms use the same table
    topic = create_topic(bootstrap, partitions=8)
    base = {"dsn": dsn, "bootstrap": bootstrap, "topic": topic, "size": 4}
    after_src = Path(args.after_src).resolve() if args.after_src else Path(kafka2pc.__file__).resolve().parents[1]
    per_thread = args.fleet_transactions
    with source_tree(args.before_src, args.before_commit) as before_src:
        leasing = FleetArm("1 process x pool(4), leasing", after_src, "lease", 1)
        before = FleetArm(f"1 process x pool(4), before leasing ({args.before_commit})", before_src, "fixed", 1)
        fleet = FleetArm("4 processes x pool(4), one prefix, leasing", after_src, "fleet", 4)
        print(f"\nPostgreSQL fleet: every process a DualWriterPool(size=4) and 4 threads; {args.fleet_rounds} rounds "
              f"of a burst per arm ({per_thread} transactions per thread; leasing and before ABBA), after one to warm "
              f"up; leasing: {after_src}; before: {before_src} ({args.before_commit}); {os.cpu_count()} cores, 1-min "
              f"load average {os.getloadavg()[0]:.1f}")
        orders = itertools.count(1)
        arms = (before, leasing, fleet)
        try:
            for arm in arms:
                arm.start(base)
                arm.burst(orders, args.fleet_warmup, counted=False)
            for round_ in range(args.fleet_rounds):
                pair = (leasing, before) if round_ % 4 in (0, 3) else (before, leasing)  # ABBA
                for arm in (*pair, fleet):
                    arm.burst(orders, per_thread)
        finally:
            for arm in arms:
                arm.stop()
    print(f"  {'arm':46s} {'threads':>7s} {'tx/s':>8s} {'min-max':>13s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'CPU ms/tx':>9s}")
    for arm in arms:
        print(arm.row())
    per_round = [b / a for a, b in zip(leasing.rates, before.rates, strict=True)]  # leasing's time per tx / before's
    ratio = statistics.median(per_round)
    latency = statistics.fmean(leasing.latencies) / statistics.fmean(before.latencies)
    cpu = statistics.median(leasing.cpu_ms_per_tx) / statistics.median(before.cpu_ms_per_tx)
    print(f"  leasing / before leasing, time per transaction: {ratio:.3f} (median of the rounds' ratios of tx/s; "
          f"quartiles {percentile(per_round, 0.25):.3f}-{percentile(per_round, 0.75):.3f}); mean latency "
          f"{latency:.3f}; client CPU per transaction {cpu:.3f}; 1-min load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    print(f"  ids leased: 1 process {sorted(leasing.ids)}; 4 processes: {len(fleet.ids)} distinct ids")
    print(json.dumps({"bench": "dual-write-fleet", "rounds": args.fleet_rounds, "per_thread": per_thread,
                      "before_leasing_1x4": before.figures(), "leasing_1x4": leasing.figures(),
                      "leasing_4x4": fleet.figures(), "leasing_over_before_time_per_tx": ratio,
                      "leasing_over_before_mean_latency": latency, "leasing_over_before_cpu_per_tx": cpu,
                      "per_round": [round(x, 3) for x in per_round]}))


def run_asyncio_section(dsn: str, schema: str, bootstrap: str, args: argparse.Namespace) -> None:
    """benchmarks/dual_write_async.py, on a schema of its own, through asyncpg."""
    import asyncio  # noqa: PLC0415

    import psycopg  # noqa: PLC0415
    from dual_write_async import run_asyncio  # noqa: PLC0415 - beside this file

    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, amount REAL)")
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    url = (f"postgresql+asyncpg://{parts.get('user', '')}@{parts.get('host', '127.0.0.1')}:{parts.get('port', 5432)}/"
           f"{parts.get('dbname', 'postgres')}")
    topic = create_topic(bootstrap, partitions=8)
    asyncio.run(run_asyncio(url, schema, bootstrap, topic, concurrencies=[int(n) for n in args.tasks.split(",")],
                            transactions=args.transactions, rounds=args.rounds, gc_freeze=args.gc_freeze))


def run_django_section(dsn: str, bootstrap: str, *, writer_counts: list[int], transactions: int,
                       rounds: int) -> None:
    """On PostgreSQL through Django's connection (each thread its own, as request threads have): Django's own
    transaction.atomic() INSERT, confluent-kafka's transaction, and a DualWriterPool on django.db.connection."""
    from kafka2pc_harness.postgres import configure_django  # noqa: PLC0415

    configure_django(dsn)
    from django.db import connection, transaction  # noqa: PLC0415
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY, amount REAL)")
    topic = create_topic(bootstrap, partitions=8)
    ids = itertools.count()
    insert = "INSERT INTO orders (id, amount) VALUES (%s, %s)"

    def django_only(order: int) -> None:
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute(insert, (order, 12.5))

    print(f"\nDjango on PostgreSQL (fsync on): {transactions} transactions per figure, best of {rounds} rounds after "
          "a warm-up")
    print(f"  {'contender':30s} {'writers':>7s} {'tx/s':>8s} {'x Kafka only':>12s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'CPU ms/tx':>9s}")
    for count in writer_counts:
        pool = DualWriterPool(connection, {"bootstrap.servers": bootstrap, "transactional.id": f"dj-bench-{count}"},
                              size=count)

        def dual(order: int, pool: DualWriterPool = pool) -> None:
            with pool.transaction() as tx, tx.connection.cursor() as cursor:
                cursor.execute(insert, (order, 12.5))
                tx.produce(topic, value=EVENT, key=str(order).encode())

        contenders = {"Django atomic(), DB only": [django_only] * count,
                      "Kafka only (confluent txn)": [kafka_only(bootstrap, topic) for _ in range(count)],
                      "dual write (pool on Django's)": [dual] * count}
        figures: dict[str, tuple[float, list[float], list[float]]] = {}
        for round_ in range(rounds + 1):
            for name, workers in contenders.items():
                rate, latencies, cpu_ms = measure(workers, transactions, ids)
                gc.collect()  # the ended threads' Django connections close (each thread had its own)
                if round_:
                    best, kept, cpus = figures.get(name, (0.0, [], []))
                    figures[name] = (max(best, rate), kept + latencies, [*cpus, cpu_ms])
        pool.close()
        kafka_rate = figures["Kafka only (confluent txn)"][0]
        for name, (rate, latencies, cpus) in figures.items():
            print(f"  {name:30s} {count:7d} {rate:8.0f} {rate / kafka_rate:12.2f} "
                  f"{1000 * statistics.median(latencies):8.2f} {1000 * percentile(latencies, 0.99):8.2f} "
                  f"{statistics.median(cpus):9.2f}")


def run_mariadb_section(url: str | None, bootstrap: str, options: dict[str, Any]) -> None:
    """The contenders on MariaDB (InnoDB, through PyMySQL), in a database of their own."""
    from kafka2pc_harness.mariadb import connect, mariadb_url  # noqa: PLC0415

    with contextlib.ExitStack() as stack:
        server = url or stack.enter_context(mariadb_url())
        name = f"bench_{uuid.uuid4().hex[:8]}"
        with contextlib.closing(connect(server)) as admin:
            admin.cursor().execute(f"CREATE DATABASE {name}")
        scoped = server.rsplit("/", 1)[0] + f"/{name}"
        run(Database("MariaDB (InnoDB, PyMySQL)", lambda: connect(scoped), "%s", "BLOB"), bootstrap, **options)


@contextlib.contextmanager
def postgres(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    with postgres_dsn() as started:
        yield started


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--fleet-worker":
        return fleet_worker(json.loads(sys.argv[2]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap")
    parser.add_argument("--postgres", metavar="DSN")
    parser.add_argument("--transactions", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--writers", default="1,2,4,8")
    parser.add_argument("--mariadb", metavar="URL", help="mysql://user@host:port/database (default: a server the "
                                                            "harness starts)")
    parser.add_argument("--sections", default="sqlite,postgres,mariadb,django,fleet,asyncio")
    parser.add_argument("--tasks", default="1,32", help="the asyncio section's concurrent requests")
    parser.add_argument("--gc-freeze", action="store_true", help="the asyncio section: gc.freeze() after set-up")
    parser.add_argument("--fleet-rounds", type=int, default=20)
    parser.add_argument("--fleet-transactions", type=int, default=100, help="per thread and burst")
    parser.add_argument("--fleet-warmup", type=int, default=25, help="per thread")
    parser.add_argument("--before-commit", default="4018cfd", help="the pool before leasing")
    parser.add_argument("--before-src", help="its src folder (default: git archive of --before-commit)")
    parser.add_argument("--after-src", help="the leasing kafka2pc's src folder (default: the one imported here)")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    writer_counts = [int(n) for n in args.writers.split(",")]
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    options = {"writer_counts": writer_counts, "transactions": args.transactions, "rounds": args.rounds}
    with bootstrap_or_local(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as work:
        print(f"broker {bootstrap}")
        path = Path(work) / "bench.db"
        if "sqlite" in sections:
            run(Database("SQLite (file, default journal, synchronous=FULL)",
                         lambda: sqlite3.connect(path, timeout=60, check_same_thread=False), "?", "BLOB"), bootstrap,
                **options)
        if "mariadb" in sections:
            run_mariadb_section(args.mariadb, bootstrap, options)
        import psycopg  # noqa: PLC0415

        with postgres(args.postgres) as dsn:
            for section in ("postgres", "django", "fleet", "asyncio"):
                if section not in sections:
                    continue
                schema = f"bench_{uuid.uuid4().hex[:8]}"
                with psycopg.connect(dsn, autocommit=True) as admin:
                    admin.execute(f"CREATE SCHEMA {schema}")
                scoped = psycopg.conninfo.make_conninfo(dsn, options=f"-c search_path={schema}")
                if section == "postgres":
                    run(Database("PostgreSQL (fsync on)", lambda scoped=scoped: psycopg.connect(scoped), "%s"),
                        bootstrap, **options)
                elif section == "django":
                    run_django_section(scoped, bootstrap, **options)
                elif section == "fleet":
                    run_fleet(scoped, bootstrap, args)
                else:
                    run_asyncio_section(scoped, schema, bootstrap, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
