"""DualWriter on real databases (SQLite files, a PostgreSQL server) and real Kafka brokers (4.4.0, and 3.9 for the
tests without two-phase commit): writer processes SIGKILLed in each of the four failure modes and recovered by a
successor, errors inside and at the end of the block, fencing, a terminated PostgreSQL backend, and a state row
naming a transaction the broker does not have.

After every recovery the order ids committed in the database must equal the keys a read_committed consumer sees."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.dualwrite import AsyncDualWriter, DualWriter, DualWriterPool
from kafka2pc.errors import (
    DualWriteRecoveryError,
    Kafka2pcError,
    ProducerFencedError,
    RecordTooLargeError,
    TransactionLostError,
)
from kafka2pc.testing import PRE_2PC_KAFKA_VERSION, BrokerSettings
from kafka2pc.testing.verify import read_records
from kafka2pc.transaction_control import TransactionControl
from kafka2pc_harness.proxy import FaultProxy

psycopg = pytest.importorskip("psycopg")
from prometheus_client import REGISTRY  # noqa: E402

pytestmark = pytest.mark.integration
JOB = Path(__file__).with_name("dual_write_job.py")
KILLS_PER_MODE = int(os.environ.get("KAFKA2PC_DUAL_WRITE_KILLS", "3"))


class Database:
    """One test's database: a SQLite file, or a PostgreSQL schema of its own."""

    def __init__(self, url: str, connect: Callable[[], Any], placeholder: str):
        self.url, self.connect, self.placeholder = url, connect, placeholder

    def sql(self, text: str) -> str:
        return text.replace("?", self.placeholder)

    def ids(self) -> list[int]:
        connection = self.connect()
        try:
            return [row[0] for row in connection.cursor().execute("SELECT id FROM orders ORDER BY id").fetchall()]
        finally:
            connection.close()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path) -> Iterator[Database]:
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        db = Database(f"sqlite:{path}", lambda: sqlite3.connect(path, timeout=30, check_same_thread=False), "?")
    else:
        db, _ = schema_database(request.getfixturevalue("postgres_dsn"))
    create_orders(db)
    yield db


def schema_database(dsn: str) -> tuple[Database, str]:
    """A PostgreSQL schema of its own (and its name), as a test's database."""
    schema = f"s_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    scoped = f"{dsn} options='-c search_path={schema}'"
    return Database(scoped, lambda: psycopg.connect(scoped), "%s"), schema


def create_orders(db: Database) -> None:
    connection = db.connect()
    connection.cursor().execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
    connection.commit()
    connection.close()


def kafka_keys(bootstrap: str, topic: str) -> list[int]:
    return sorted(int(r.key) for r in read_records(bootstrap, topic))


def recover(db: Database, bootstrap: str, transactional_id: str, config: dict[str, Any] | None = None) -> None:
    connection = db.connect()
    writer = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                     **(config or {})})
    try:
        writer.recover()
    finally:
        writer.close()
        connection.close()


def run_job(db: Database, bootstrap: str, topic: str, transactional_id: str, *, orders: range, kill_at: int,
            mode: str, config: dict[str, Any] | None = None) -> None:
    """One writer process that SIGKILLs itself at order ``kill_at`` in failure mode ``mode`` (dual_write_job.py)."""
    job = subprocess.run([sys.executable, str(JOB), db.url, bootstrap, topic, transactional_id, str(orders.start),
                          str(len(orders)), str(kill_at), mode, json.dumps(config or {})],
                         capture_output=True, text=True, timeout=120, check=False)
    assert job.returncode == -9, job.stderr[-3000:]


def recover_async(db: Database, bootstrap: str, transactional_id: str, config: dict[str, Any] | None = None) -> None:
    """What ``recover`` does, by AsyncDualWriter on psycopg's AsyncConnection (the same database as the jobs')."""
    async def run() -> None:
        with contextlib.closing(db.connect()) as blocking:
            dsn = blocking.info.dsn
        connection = await psycopg.AsyncConnection.connect(dsn)
        async with AsyncDualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                                **(config or {})}) as writer:
            await writer.recover()
        await connection.close()

    asyncio.run(run())


def kill_and_recover(db: Database, bootstrap: str, topic: str, modes: list[str], *, seed: int,
                     config: dict[str, Any] | None = None,
                     recover: Callable[..., None] = recover,
                     transactional_id: str | None = None) -> collections.Counter[str]:
    """Writers killed in ``modes`` (shuffled), a successor recovering after each: DB ids == Kafka keys every time."""
    transactional_id = transactional_id or f"orders-{uuid.uuid4().hex[:6]}"
    rng = random.Random(seed)
    rounds = list(modes)
    rng.shuffle(rounds)
    first, kills = 0, collections.Counter[str]()
    for mode in rounds:
        count = rng.randint(3, 8)
        kill_at = first + rng.randrange(count)
        run_job(db, bootstrap, topic, transactional_id, orders=range(first, first + count), kill_at=kill_at,
                mode=mode, config=config)
        kills[mode] += 1
        recover(db, bootstrap, transactional_id, config)
        db_ids, keys = db.ids(), kafka_keys(bootstrap, topic)
        assert db_ids == keys, f"mode {mode}, order {kill_at}: DB {db_ids} != Kafka {keys}"
        # the killed order is in both exactly when the database committed it (modes c and d)
        assert (kill_at in db_ids) == (mode in "cd")
        # and nothing is left open to pin the LSO (an aborted transaction has no rows on either side to tell)
        state = transaction_state(bootstrap, transactional_id)
        assert state in ENDED_STATES, f"mode {mode}, order {kill_at}: {transactional_id} left {state}"
        first += count
    return kills


#: what DescribeTransactions answers for an id with nothing open (None: the coordinator never saw it)
ENDED_STATES = (None, "Empty", "CompleteCommit", "CompleteAbort")


def transaction_state(bootstrap: str, transactional_id: str) -> str | None:
    """The coordinator's state of the id's transaction."""
    with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
        seen = TransactionControl(client).describe(transactional_id)
    return None if seen is None else seen.state


@pytest.mark.timeout(600)
def test_writers_killed_in_every_failure_mode_leave_db_and_kafka_equal(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=3)
    kills = kill_and_recover(database, bootstrap, topic, [mode for mode in "abcd" for _ in range(KILLS_PER_MODE)],
                             seed=int(os.environ.get("KAFKA2PC_DUAL_WRITE_SEED", "7")))
    print(f"\n{sum(kills.values())} kills {dict(sorted(kills.items()))}: DB ids == Kafka keys, nothing open, after "
          f"each recovery ({len(database.ids())} orders)")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("driver", ["psycopg", pytest.param("sqlalchemy-asyncpg", marks=pytest.mark.slow),
                                    pytest.param("asyncpg", marks=pytest.mark.slow)])
def test_async_writers_killed_in_every_failure_mode_leave_db_and_kafka_equal(postgres_dsn, kafka, topic_factory,
                                                                             driver):
    """AsyncDualWriter on psycopg's AsyncConnection, SQLAlchemy's on asyncpg, or a bare asyncpg connection,
    SIGKILLed in each mode; each successor (async too) recovers."""
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=3)
    scoped, schema = schema_database(postgres_dsn)
    create_orders(scoped)
    url = scoped.url
    if driver != "psycopg":
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

        parts = conninfo_to_dict(postgres_dsn)
        url = f"postgresql+asyncpg://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}#{schema}"
        if driver == "asyncpg":
            url = "asyncpg:" + url.replace("postgresql+asyncpg://", "postgresql://")
    database = Database(f"async:{url}", scoped.connect, "%s")
    transactional_id = f"orders-{uuid.uuid4().hex[:6]}"
    kills = kill_and_recover(database, bootstrap, topic, [mode for mode in "abcd" for _ in range(KILLS_PER_MODE)],
                             seed=int(os.environ.get("KAFKA2PC_DUAL_WRITE_SEED", "11")), recover=recover_async,
                             transactional_id=transactional_id)
    ids, keys = database.ids(), [r.key for r in read_records(bootstrap, topic)]
    assert len(keys) == len(set(keys)) == len(ids), "duplicates in Kafka"
    print(f"\n{sum(kills.values())} kills {dict(sorted(kills.items()))}: DB ids == Kafka keys, nothing open, after "
          f"each async recovery ({len(ids)} orders, no duplicates, {transactional_id} "
          f"{transaction_state(bootstrap, transactional_id)})")


@pytest.mark.timeout(300)
def test_without_two_phase_commit_the_fallback_is_visible_and_every_mode_recovers(database, kafka_pre2pc,
                                                                                   topic_factory):
    """Kafka 3.9 has no KIP-939: the writer (two_phase_commit=True, the default) falls back to timeout-bound
    transactions, says so, and still recovers each failure mode exactly when the successor comes in time."""
    bootstrap, topic = kafka_pre2pc.bootstrap_servers, topic_factory(kafka_pre2pc, partitions=3)
    fallbacks = REGISTRY.get_sample_value("kafka2pc_two_phase_commit_fallbacks_total", {"reason": "no_v6"}) or 0.0
    warnings, logger = Warnings(), logging.getLogger("kafka2pc")
    level = logger.level  # the model tests raise it to ERROR for the whole session when they are collected
    logger.addHandler(warnings)
    logger.setLevel(logging.WARNING)
    try:
        writer, connection = writer_for(database, bootstrap)
    finally:
        logger.removeHandler(warnings)
        logger.setLevel(level)
    assert not writer.two_phase_commit_active
    assert any("two-phase commit is NOT active" in message for message in warnings.messages)
    assert REGISTRY.get_sample_value("kafka2pc_two_phase_commit_fallbacks_total", {"reason": "no_v6"}) == fallbacks + 1
    writer.close()
    connection.close()
    kills = kill_and_recover(database, bootstrap, topic, list("abcd"), seed=11)
    assert kills == collections.Counter("abcd")


@pytest.mark.timeout(300)
def test_without_two_phase_commit_a_decided_transaction_the_broker_timed_out_is_reported(kafka_factory, topic_factory,
                                                                                          tmp_path):
    """A writer dies after the database commit (mode c) on a broker without 2PC and nobody recovers within the
    transaction timeout: the broker aborts the decided Kafka transaction. Recovery must say so
    (DualWriteRecoveryError over TransactionLostError), never report success or drop it silently; after an
    operator's resolve() the id works again."""
    broker = kafka_factory(BrokerSettings(version=PRE_2PC_KAFKA_VERSION, transaction_max_timeout_ms=4_000,
                                          extra={"transaction.abort.timed.out.transaction.cleanup.interval.ms":
                                                 "1000"}))
    bootstrap = broker.bootstrap_servers
    topic = topic_factory(broker)
    path = tmp_path / "app.db"
    db = Database(f"sqlite:{path}", lambda: sqlite3.connect(path, timeout=30, check_same_thread=False), "?")
    create_orders(db)
    config = {"transaction.timeout.ms": 4_000}
    run_job(db, bootstrap, topic, "late-0", orders=range(3), kill_at=1, mode="c", config=config)
    assert db.ids() == [0, 1] and kafka_keys(bootstrap, topic) == [0]  # order 1: decided, Kafka not completed
    time.sleep(4 + 4)  # past the timeout and one abort sweep of the coordinator
    connection = db.connect()
    successor = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": "late-0", **config})
    with pytest.raises(DualWriteRecoveryError, match="can no longer commit") as info:
        successor.recover()
    assert isinstance(info.value.__cause__, TransactionLostError)
    assert db.ids() == [0, 1] and kafka_keys(bootstrap, topic) == [0]  # reported; the database was not touched
    successor.resolve("order 1's event re-sent by hand")
    successor.recover()
    with successor.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (?, ?)", (5, 5))
        tx.produce(topic, value=b"5", key=b"5")
    successor.close()
    assert db.ids() == [0, 1, 5] and kafka_keys(bootstrap, topic) == [0, 5]


class Warnings(logging.Handler):
    """The WARNING records logged while it is attached (works with pytest's logging plugin off, as in make chaos)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def writer_for(db: Database, bootstrap: str, transactional_id: str | None = None) -> tuple[DualWriter, Any]:
    connection = db.connect()
    writer = DualWriter(connection, {"bootstrap.servers": bootstrap,
                                     "transactional.id": transactional_id or f"w-{uuid.uuid4().hex[:6]}"})
    writer.recover()
    return writer, connection


def test_a_db_error_inside_or_at_the_end_of_the_block_rolls_both_back(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    writer, _ = writer_for(database, bootstrap)
    insert = database.sql("INSERT INTO orders (id, amount) VALUES (?, ?)")
    with writer.transaction() as tx:
        tx.cursor.execute(insert, (1, 1))
        tx.produce(topic, value=b"1", key=b"1")
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"), writer.transaction() as tx:
        tx.produce(topic, value=b"2", key=b"2")
        tx.cursor.execute(insert, (1, 2))  # a constraint violation inside the block
    with pytest.raises(Exception, match=r"(?i)null"), writer.transaction() as tx:
        tx.produce(topic, value=b"3", key=b"3")
        tx.cursor.execute(insert, (3, None))
    with writer.transaction() as tx:  # the writer carries on
        tx.cursor.execute(insert, (4, 4))
        tx.produce(topic, value=b"4", key=b"4")
    writer.close()
    assert database.ids() == kafka_keys(bootstrap, topic) == [1, 4]


def test_a_kafka_error_rolls_both_back(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, config={"max.message.bytes": "2000"})
    writer, _ = writer_for(database, bootstrap)
    insert = database.sql("INSERT INTO orders (id, amount) VALUES (?, ?)")
    with pytest.raises(RecordTooLargeError), writer.transaction() as tx:
        tx.cursor.execute(insert, (1, 1))
        tx.produce(topic, value=b"x" * 5000, key=b"1")
    with writer.transaction() as tx:
        tx.cursor.execute(insert, (2, 2))
        tx.produce(topic, value=b"2", key=b"2")
    writer.close()
    assert database.ids() == kafka_keys(bootstrap, topic) == [2]


def test_a_broker_gone_at_the_end_of_the_block_rolls_both_back(database, kafka, topic_factory):
    """The broker goes away inside the block (its proxy closes: open connections cut, new ones refused, as when a
    broker process stops): preparing fails, the database rolls back, nothing is committed anywhere."""
    topic = topic_factory(kafka)
    proxy = FaultProxy(kafka.bootstrap_servers).start()
    connection = database.connect()
    writer = DualWriter(connection, {"bootstrap.servers": proxy.bootstrap_servers, "transactional.id": "gone-0",
                                     "request.timeout.ms": 1000, "max.block.ms": 3000, "delivery.timeout.ms": 3000})
    writer.recover()
    with pytest.raises(Kafka2pcError), writer.transaction() as tx:
        tx.cursor.execute(database.sql("INSERT INTO orders (id, amount) VALUES (?, ?)"), (1, 1))
        tx.produce(topic, value=b"1", key=b"1")
        proxy.close()
    assert database.ids() == []
    recover(database, kafka.bootstrap_servers, "gone-0")  # the broker back: nothing to commit, the open one aborted
    assert database.ids() == kafka_keys(kafka.bootstrap_servers, topic) == []
    assert open_transaction_count(kafka.bootstrap_servers, "gone-0") == 0


def test_a_second_writer_with_the_same_id_fences_the_first(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    first, _ = writer_for(database, bootstrap, "shared-0")
    other, _ = writer_for(database, bootstrap, "other-0")  # distinct ids share the database
    second, _ = writer_for(database, bootstrap, "shared-0")
    insert = database.sql("INSERT INTO orders (id, amount) VALUES (?, ?)")
    with pytest.raises(ProducerFencedError), first.transaction() as tx:
        tx.cursor.execute(insert, (1, 1))
        tx.produce(topic, value=b"1", key=b"1")
    for writer, order in ((second, 2), (other, 3)):
        with writer.transaction() as tx:
            tx.cursor.execute(insert, (order, order))
            tx.produce(topic, value=b"x", key=str(order).encode())
    assert database.ids() == kafka_keys(bootstrap, topic) == [2, 3]


def test_a_postgres_backend_terminated_at_commit_is_settled_by_recovery(database, postgres_dsn, kafka, topic_factory):
    if database.placeholder != "%s":
        pytest.skip("PostgreSQL only")
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    writer, connection = writer_for(database, bootstrap, "terminated-0")
    backend = connection.info.backend_pid
    with pytest.raises(Exception), writer.transaction() as tx:  # noqa: B017 - the driver's own error
        tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (1, 1))
        tx.produce(topic, value=b"1", key=b"1")
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
    recover(database, bootstrap, "terminated-0")
    assert database.ids() == kafka_keys(bootstrap, topic) == []
    assert open_transaction_count(bootstrap, "terminated-0") == 0


def open_transaction_count(bootstrap: str, transactional_id: str) -> int:
    from kafka2pc.cluster import ClusterClient  # noqa: PLC0415
    from kafka2pc.config import ClientConfig  # noqa: PLC0415
    from kafka2pc.transaction_control import TransactionControl  # noqa: PLC0415

    with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
        observed = TransactionControl(client).describe(transactional_id)
    return int(observed is not None and observed.state == "Ongoing")


def test_a_state_row_naming_a_transaction_the_broker_does_not_have_is_a_clear_error(database, kafka, topic_factory):
    bootstrap = kafka.bootstrap_servers
    writer, connection = writer_for(database, bootstrap, "forgotten-0")
    writer.close()
    connection.close()
    connection = database.connect()
    connection.cursor().execute(database.sql(
        "UPDATE kafka2pc_dual_write_state SET prepared_state = ?, transaction_version = 2, completed = 0, "
        "two_phase = 1 WHERE transactional_id = ?"), ("987654:3", "forgotten-0"))
    connection.commit()
    successor = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": "forgotten-0"})
    with pytest.raises(DualWriteRecoveryError, match="cannot be confirmed"):
        successor.recover()
    with pytest.raises(DualWriteRecoveryError):  # nothing silently dropped: a transaction() refuses too
        successor.transaction().__enter__()
    successor.resolve("checked by hand: order 41 is on the topic")
    successor.recover()
    successor.close()


@pytest.mark.parametrize("successor_sees", ["another state table", "a truncated table"])
def test_a_decided_transaction_a_successor_has_no_row_for_is_reported_not_aborted(database, kafka, topic_factory,
                                                                                   successor_sees):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=1)
    transactional_id = f"rowless-{uuid.uuid4().hex[:6]}"
    run_job(database, bootstrap, topic, transactional_id, orders=range(1, 2), kill_at=1, mode="c")
    assert database.ids() == [1] and kafka_keys(bootstrap, topic) == []  # decided in the DB, prepared in Kafka
    connection = database.connect()
    state_table = "kafka2pc_dual_write_state"
    if successor_sees == "a truncated table":
        connection.cursor().execute(f"DELETE FROM {state_table}")
        connection.commit()
    else:
        state_table = "other_state"
    successor = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": transactional_id},
                           state_table=state_table)
    with pytest.raises(DualWriteRecoveryError, match="no writer ever owned"):
        successor.recover()
    assert open_transaction_count(bootstrap, transactional_id) == 1  # still prepared: nothing aborted
    successor.close()
    connection.close()
    if successor_sees == "another state table":  # the right table's successor still commits it
        recover(database, bootstrap, transactional_id)
        assert database.ids() == kafka_keys(bootstrap, topic) == [1]


POOL_JOB = Path(__file__).with_name("dual_write_pool_job.py")
POOL_THREADS = 4
POOL_LEASE_S = 2.0  # dual_write_pool_job.py's


def recover_pool(db: Database, bootstrap: str, prefix: str) -> list[str]:
    """Once the killed process's leases ran out, a live pool of the fleet settles them; returns the fleet's ids."""
    time.sleep(POOL_LEASE_S + 0.5)
    pool = DualWriterPool(db.connect, {"bootstrap.servers": bootstrap, "transactional.id": prefix},
                          size=POOL_THREADS, min_size=0, lease_s=POOL_LEASE_S)
    try:
        pool.settle_expired()
        with contextlib.closing(db.connect()) as connection:
            deadline = time.monotonic() + 30  # the pool's keeper may be settling one of them at the same time
            rows = pool._set.lease_table(connection).rows()
            while any(row.status != "free" for row in rows):
                assert time.monotonic() < deadline, rows
                time.sleep(0.2)
                rows = pool._set.lease_table(connection).rows()
        return [row.transactional_id for row in rows]
    finally:
        pool.close()


@pytest.mark.timeout(600)
# SQLite in make chaos (the suite's time budget): the pool's SQLite paths are the model tests'
@pytest.mark.parametrize("database", [pytest.param("sqlite", marks=pytest.mark.slow), "postgres"], indirect=True)
def test_a_pool_of_four_writing_threads_killed_in_every_failure_mode_leaves_db_and_kafka_equal(database, kafka,
                                                                                                 topic_factory):
    """Processes whose four threads write through a DualWriterPool, SIGKILLed in each mode while the other threads
    are inside their own transactions; once their leases run out, a live pool of the fleet settles all four ids."""
    kill_pool_processes(database, kafka, topic_factory)


def kill_pool_processes(database: Database, kafka: Any, topic_factory: Any) -> None:
    """The pool kill rounds on ``database`` (any the jobs connect to: a URL of SQLite, PostgreSQL or MariaDB)."""
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=3)
    prefix = f"pool-{uuid.uuid4().hex[:6]}"
    rng = random.Random(int(os.environ.get("KAFKA2PC_DUAL_WRITE_SEED", "7")))
    rounds = [mode for mode in "abcd" for _ in range(max(1, KILLS_PER_MODE // 2))]
    rng.shuffle(rounds)
    first = 0
    for mode in rounds:
        count = rng.randint(12, 24)
        kill_at = first + rng.randrange(POOL_THREADS, count)
        job = subprocess.run([sys.executable, str(POOL_JOB), database.url, bootstrap, topic, prefix,
                              str(POOL_THREADS), str(first), str(count), str(kill_at), mode],
                             capture_output=True, text=True, timeout=120, check=False)
        assert job.returncode == -9, job.stderr[-3000:]
        fleet = recover_pool(database, bootstrap, prefix)
        db_ids, keys = database.ids(), kafka_keys(bootstrap, topic)
        assert db_ids == keys, f"mode {mode}, order {kill_at}: DB {db_ids} != Kafka {keys}"
        assert (kill_at in db_ids) == (mode in "cd")
        assert len(fleet) <= 2 * POOL_THREADS, fleet
        for transactional_id in fleet:
            assert open_transaction_count(bootstrap, transactional_id) == 0
        first += count
    print(f"\n{len(rounds)} pool processes killed ({''.join(rounds)}), {POOL_THREADS} threads each: DB ids == Kafka "
          f"keys after each recovery ({len(database.ids())} orders)")


CUT_AT = (2, 5, 8)


@pytest.mark.timeout(120)
def test_a_client_dropped_at_commit_while_postgres_commits_leaves_db_and_kafka_equal(postgres_dsn, kafka,
                                                                                     topic_factory):
    """Issue 28 (2): a pooler or proxy drops the client at its COMMIT and the server commits a moment later. Through
    SQLAlchemy (which reconnects), the writer's read-back runs on a new session and sees the old token first. That
    must mean "outcome unknown" (Kafka stays prepared), never "failed": then DB ids == read_committed keys after
    recovery, every cut order in both."""
    import sqlalchemy  # noqa: PLC0415
    from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: PLC0415

    from kafka2pc.errors import DualWriteOutcomeUnknownError  # noqa: PLC0415
    from kafka2pc_harness.pg_proxy import PgProxy  # noqa: PLC0415

    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=3)
    server = conninfo_to_dict(postgres_dsn)
    db, schema = schema_database(postgres_dsn)
    create_orders(db)
    with PgProxy(str(server.get("host", "127.0.0.1")), int(server.get("port", 5432)), commit_delay_s=0.5) as proxy:
        proxy.start()
        proxied = make_conninfo(postgres_dsn, host="127.0.0.1", port=proxy.port, sslmode="disable",
                                gssencmode="disable", options=f"-c search_path={schema}")
        engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(proxied))
        writer = DualWriter(engine, {"bootstrap.servers": bootstrap, "transactional.id": f"cut-{schema}"})
        writer.recover()
        errors: dict[int, str] = {}
        insert = sqlalchemy.text("INSERT INTO orders (id, amount) VALUES (:id, :amount)")
        for order in range(10):
            if order in CUT_AT:
                proxy.cut_next_commit()
            try:
                with writer.transaction() as tx:
                    tx.connection.execute(insert, {"id": order, "amount": order})
                    tx.produce(topic, value=b"%d" % order, key=b"%d" % order)
            except Exception as exc:
                errors[order] = type(exc).__name__
        writer.close()
        engine.dispose()
        assert proxy.wait_landed(len(CUT_AT))
    recover(db, bootstrap, f"cut-{schema}")
    db_ids, keys = db.ids(), kafka_keys(bootstrap, topic)
    print(f"\n{proxy.commits_landed} COMMITs cut and landed later; errors {errors}; DB {db_ids}; Kafka {keys}")
    assert db_ids == keys, f"DB {db_ids} != Kafka {keys} (errors {errors})"
    assert db_ids == list(range(10))  # every cut COMMIT landed on the server
    assert errors == dict.fromkeys(CUT_AT, DualWriteOutcomeUnknownError.__name__)
    assert open_transaction_count(bootstrap, f"cut-{schema}") == 0
