"""DualWriter on MariaDB through PyMySQL, against a real broker and a real MariaDB server (Debian's mariadb-server,
started by the harness): the four failure modes, and what MySQL does differently from PostgreSQL (a locking read of
a missing row takes a gap lock; a deadlock rolls the whole transaction back; savepoints)."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from kafka2pc.dualwrite import DualWriter, DualWriterPool, DualWriteUsageError
from kafka2pc.errors import ConfigError, DatabaseConnectionLostError, RetriableError, UsageError

from .test_dual_write import Database, kafka_keys, kill_and_recover, kill_pool_processes

pymysql = pytest.importorskip("pymysql")
mariadb = pytest.importorskip("kafka2pc_harness.mariadb")
pytestmark = pytest.mark.integration
KILLS_PER_MODE = int(os.environ.get("KAFKA2PC_DUAL_WRITE_KILLS", "3"))


class MariaDatabase(Database):
    def ids(self) -> list[int]:
        connection = self.connect()
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT id FROM orders ORDER BY id")
            return [row[0] for row in cursor.fetchall()]
        finally:
            connection.close()


@pytest.fixture
def database(mariadb_url) -> MariaDatabase:
    """A database of its own on the session's MariaDB server, with the orders table."""
    name = f"d_{uuid.uuid4().hex[:10]}"
    with mariadb.connect(mariadb_url) as admin:
        admin.cursor().execute(f"CREATE DATABASE {name}")
    url = mariadb_url.rsplit("/", 1)[0] + f"/{name}"
    db = MariaDatabase(url, lambda: mariadb.connect(url), "%s")
    connection = db.connect()
    connection.cursor().execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
    connection.commit()
    connection.close()
    return db


def writer(db: Database, bootstrap: str, transactional_id: str, connection=None) -> DualWriter:
    return DualWriter(connection or db.connect(), {"bootstrap.servers": bootstrap,
                                                   "transactional.id": transactional_id})


@pytest.mark.timeout(600)
def test_writers_killed_in_every_failure_mode_leave_db_and_kafka_equal(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=3)
    kills = kill_and_recover(database, bootstrap, topic, [mode for mode in "abcd" for _ in range(KILLS_PER_MODE)],
                             seed=int(os.environ.get("KAFKA2PC_DUAL_WRITE_SEED", "13")))
    keys = kafka_keys(bootstrap, topic)
    assert keys == database.ids() and len(set(keys)) == len(keys)
    print(f"\n{sum(kills.values())} kills {dict(sorted(kills.items()))} on MariaDB: DB ids == Kafka keys, "
          f"nothing open, after each recovery ({len(keys)} orders, no duplicates)")


def test_an_application_commit_inside_the_block_ends_it_with_an_error(database, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    connection = database.connect()
    dual = writer(database, bootstrap, f"c-{uuid.uuid4().hex[:6]}", connection)
    with pytest.raises(DualWriteUsageError, match="committed or rolled back inside"), dual.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (1, 1)")
        tx.produce(topic, value=b"1", key=b"1")
        connection.commit()  # the application's own commit: MySQL ends the savepoint with the transaction
    with dual.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (2, 2)")
        tx.produce(topic, value=b"2", key=b"2")
    dual.close()
    assert kafka_keys(bootstrap, topic) == [2]  # order 1's row was committed by the application, without its event


def test_a_deadlock_inside_the_block_is_the_databases_error_not_a_usage_error(database, kafka, topic_factory):
    """InnoDB rolls a deadlock's victim back whole (error 1213), savepoints and all: the writer reports the
    database's error and rolls Kafka back, as for any failed statement, not as an application commit."""
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    setup = database.connect()
    setup.cursor().execute("INSERT INTO orders VALUES (100, 0), (200, 0)")
    setup.commit()
    other = database.connect()
    dual = writer(database, bootstrap, f"d-{uuid.uuid4().hex[:6]}")
    locked = threading.Event()

    def the_other_transaction() -> None:
        cursor = other.cursor()
        # InnoDB picks the victim that changed fewer rows: this one changes many, so the block's is picked
        cursor.executemany("INSERT INTO orders VALUES (%s, 0)", [(n,) for n in range(1000, 1200)])
        cursor.execute("UPDATE orders SET amount = 1 WHERE id = 200")
        locked.set()
        cursor.execute("UPDATE orders SET amount = 1 WHERE id = 100")  # waits for the block: the cycle
        other.rollback()

    with pytest.raises(pymysql.err.OperationalError) as raised, dual.transaction() as tx:
        tx.cursor.execute("UPDATE orders SET amount = 2 WHERE id = 100")
        tx.produce(topic, value=b"100", key=b"100")
        thread = threading.Thread(target=the_other_transaction)
        thread.start()
        assert locked.wait(10)
        tx.cursor.execute("UPDATE orders SET amount = 2 WHERE id = 200")  # closes the cycle: this one is the victim
    thread.join(30)
    assert raised.value.args[0] == 1213, raised.value
    with dual.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (3, 3)")
        tx.produce(topic, value=b"3", key=b"3")
    dual.close()
    assert kafka_keys(bootstrap, topic) == [3]


def test_new_ids_locked_at_once_never_deadlock(database, kafka, topic_factory):
    """Eight writers with new ids (their rows missing, one gap of the index) take their first lock at once: none
    dies a deadlock's victim, as two inserts under two gap locks would."""
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    writers = [writer(database, bootstrap, f"g-{uuid.uuid4().hex[:6]}-{n}") for n in range(8)]
    start, failures = threading.Barrier(len(writers)), []

    def one(index: int, dual: DualWriter) -> None:
        try:
            start.wait(10)
            with dual.transaction() as tx:
                tx.cursor.execute("INSERT INTO orders VALUES (%s, 0)", (index,))
                tx.produce(topic, value=str(index).encode(), key=str(index).encode())
        except Exception as exc:
            failures.append(repr(exc))

    threads = [threading.Thread(target=one, args=(n, w)) for n, w in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for dual in writers:
        dual.close()
    assert failures == []
    assert database.ids() == kafka_keys(bootstrap, topic) == list(range(8))


@pytest.mark.timeout(600)
def test_a_pool_of_four_writing_threads_killed_in_every_failure_mode_leaves_db_and_kafka_equal(database, kafka,
                                                                                                 topic_factory):
    """DualWriterPool on MariaDB: leases with FOR UPDATE SKIP LOCKED, renewals without UPDATE ... RETURNING, a
    session idle_transaction_timeout freeing a frozen process's rows; processes SIGKILLed in each mode while their
    other threads are inside transactions, settled by a live pool once their leases run out."""
    kill_pool_processes(database, kafka, topic_factory)


def test_a_pool_on_mysql_proper_is_refused_with_a_clear_error(database, kafka):
    """MySQL has no idle-transaction limit (a frozen process would hold its ids' rows until TCP gives up)."""

    def as_mysql() -> object:
        connection = database.connect()
        connection.server_version = "8.0.36"  # what PyMySQL reads from a MySQL server's handshake
        return connection

    with pytest.raises(ConfigError, match="MySQL has no idle-transaction limit"):
        DualWriterPool(as_mysql, {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": "p"}, size=1)


def test_a_dict_cursor_connection_is_fine(database, kafka, topic_factory):
    """PyMySQL's DictCursor as the connection's cursor class (Flask apps' usual setup): the writer's own
    statements read tuples; the application's cursor gives dicts."""
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    connection = mariadb.connect(database.url, cursorclass=pymysql.cursors.DictCursor)
    dual = writer(database, bootstrap, f"dc-{uuid.uuid4().hex[:6]}", connection)
    with dual.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (1, 1)")
        tx.produce(topic, value=b"1", key=b"1")
        tx.cursor.execute("SELECT id FROM orders")
        assert tx.cursor.fetchone() == {"id": 1}
    dual.close()
    assert database.ids() == kafka_keys(bootstrap, topic) == [1]


def test_a_transaction_that_only_read_is_refused_before_the_block(database, kafka):
    """A SELECT leaves a transaction open that PyMySQL's status flag does not show (found by the second
    adversarial review: on a new id, the writer's rollback ended it and dropped its locks)."""
    connection = database.connect()
    dual = writer(database, kafka.bootstrap_servers, f"r-{uuid.uuid4().hex[:6]}", connection)
    cursor = connection.cursor()
    cursor.execute("SELECT id FROM orders")  # PyMySQL's status flag does not show this one
    with pytest.raises(UsageError, match="open transaction"), dual.transaction():
        pass
    connection.rollback()
    with dual.transaction():
        pass
    dual.close()


@pytest.mark.slow  # make chaos: the default suite runs the same freeze against the coordinator model
# (test_review_mariadb_leases.py, with a server's idle_write_transaction_timeout set)
def test_a_pool_frozen_inside_its_block_frees_its_id_for_a_live_pool(database, kafka, topic_factory):
    """A pooled writer's process stops inside its block (its client idle, its row locked): MariaDB ends the session
    after a lease (idle_transaction_timeout, set by the writer), so a live pool claims the expired id and settles
    it while the frozen one still sleeps; the frozen block then fails, and nothing of it is committed."""
    import time  # noqa: PLC0415

    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=1)
    config = {"bootstrap.servers": bootstrap, "transactional.id": f"fz-{uuid.uuid4().hex[:6]}"}
    frozen = DualWriterPool(database.connect, config, size=1, lease_s=2)
    inside, woke = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def freeze() -> None:
        try:
            with frozen.transaction() as tx:
                tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (1, 1)")
                tx.produce(topic, value=b"1", key=b"1")
                inside.set()
                time.sleep(10)  # the process stopped (SIGSTOP): its client sends nothing
                woke.set()
        except BaseException as exc:
            failure.append(exc)
            woke.set()

    thread = threading.Thread(target=freeze)
    thread.start()
    assert inside.wait(30)
    frozen._keeper.halt()  # the whole process is frozen: its keeper renews nothing either
    live = DualWriterPool(database.connect, config, size=1, min_size=0, lease_s=2)
    try:
        settled = 0
        for _ in range(40):  # bounded: 8 s
            settled += live.settle_expired()
            if settled or woke.is_set():
                break
            time.sleep(0.2)
        claimed_while_frozen = settled > 0 and not woke.is_set()
        thread.join(30)
        with live.transaction() as tx:
            tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (2, 2)")
            tx.produce(topic, value=b"2", key=b"2")
    finally:
        live.close()
        frozen.close()
    print(f"\nclaimed while frozen: {claimed_while_frozen}; the frozen block ended with {failure!r:.160}")
    assert claimed_while_frozen, "the frozen session kept its row locked: no live pool could settle its id"
    assert failure, "the frozen block must not commit"
    assert isinstance(failure[0], RetriableError), repr(failure[0])
    assert database.ids() == kafka_keys(bootstrap, topic) == [2]


def test_a_fleet_claiming_new_ids_at_once_never_deadlocks(database):
    """Found by bench-dual-write on MariaDB: 8 pools growing at once deadlocked (1213) in their claims, on InnoDB's
    duplicate-key locks of a new id two of them inserted. New ids are made one claim at a time (a named lock)."""
    from kafka2pc.dualwrite.connection import adapt  # noqa: PLC0415
    from kafka2pc.dualwrite.leases import LeaseTable  # noqa: PLC0415
    from kafka2pc.dualwrite.state_table import StateTable  # noqa: PLC0415

    def table() -> LeaseTable:
        return LeaseTable(StateTable(adapt(database.connect()), "kafka2pc_dual_write_state"), "claims", lease_s=15)

    tables = [table() for _ in range(8)]
    tables[0].adopt()  # the table and its lease columns, once
    claimed: list[str] = []
    failures: list[BaseException] = []
    for _ in range(3):
        start = threading.Barrier(len(tables))

        def claim(leases: LeaseTable, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                lease = leases.claim(uuid.uuid4().hex, "test", 15, max_ids=None)
                assert lease is not None
                claimed.append(lease.transactional_id)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=claim, args=(leases,)) for leases in tables]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    print(f"\n{len(claimed)} claims of new ids by 8 sessions at once, 3 rounds: failures {failures!r:.300}")
    assert failures == []
    assert sorted(claimed) == sorted(f"claims-{n}" for n in range(24))


def test_a_block_outliving_its_lease_under_sqlalchemy_is_a_lost_connection_not_a_misuse(database, kafka,
                                                                                      topic_factory):
    """Found by a user-level review: a slow call inside a pooled block on SQLAlchemy over PyMySQL (lease_s 1, the
    block 3 s): MariaDB ends the session, the writer's RELEASE SAVEPOINT fails on PyMySQL's connection, and
    SQLAlchemy has not noticed. It was reported as the application committing inside the block
    (DualWriteUsageError, "rows committed inside stay without their events"), which nothing did."""
    import time  # noqa: PLC0415

    import sqlalchemy  # noqa: PLC0415

    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=1)
    engine = sqlalchemy.create_engine(database.url.replace("mysql://", "mysql+pymysql://", 1))
    pool = DualWriterPool(engine, {"bootstrap.servers": bootstrap, "transactional.id": f"sl-{uuid.uuid4().hex[:6]}"},
                          size=1, lease_s=1)
    insert = sqlalchemy.text("INSERT INTO orders (id, amount) VALUES (:id, 1)")
    try:
        with pytest.raises(DatabaseConnectionLostError, match="lost inside the block"), pool.transaction() as tx:
            tx.connection.execute(insert, {"id": 1})
            tx.produce(topic, value=b"1", key=b"1")
            time.sleep(3)  # a slow call to another service
        with pool.transaction() as tx:
            tx.connection.execute(insert, {"id": 2})
            tx.produce(topic, value=b"2", key=b"2")
    finally:
        pool.close()
        engine.dispose()
    assert database.ids() == kafka_keys(bootstrap, topic) == [2]


def test_kafka2pc_fleet_reads_a_mariadb_state_table(database, kafka):
    """Found by a user-level review: `kafka2pc fleet --db mysql://...` failed with psycopg's traceback."""
    import json  # noqa: PLC0415

    from .test_cli_fleet import fleet  # noqa: PLC0415

    prefix = f"cf-{uuid.uuid4().hex[:6]}"
    pool = DualWriterPool(database.connect, {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": prefix},
                          size=2, min_size=2)
    try:
        shown = fleet("--db", database.url, "--prefix", prefix, "--json")
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)
        print(f"\n{fleet('--db', database.url, '--prefix', prefix).stdout}")
    finally:
        pool.close()
    assert sorted(row["transactional_id"] for row in rows) == pool_ids(prefix, 2)
    assert {row["status"] for row in rows} == {"leased"}
    freed = json.loads(fleet("--db", database.url, "--prefix", prefix, "--json").stdout)
    assert {row["status"] for row in freed} == {"free"}


def pool_ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{n}" for n in range(count)]
