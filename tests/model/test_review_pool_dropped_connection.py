"""Adversarial review of 3d64fa6 (a pooled writer whose connection was found dropped before the block began is
replaced and the request retried; helper-53): what the steps before the block may have done when the connection
breaks, and how far the retry goes when new connections keep breaking. The two "bounded few times" tests failed on
3d64fa6 (size + 2 new connections, then "PoolTimeoutError: every writer tried was fenced or benched") and pass since
one reconnection per request; the others passed."""

from __future__ import annotations

import sqlite3

import pytest

from kafka2pc.errors import DatabaseConnectionLostError, RetriableError

from .test_dual_write import db_ids
from .test_dual_write_pool import BreaksAtCommit, Cluster, lose_the_completion, order, pconnect


class Flaky(sqlite3.Connection):
    """A connection the server may drop: at a statement matching ``rule`` (before it runs), after a commit that
    landed (``break_after_commit``), or at its first use (``poisoned``: a proxy that accepts, then drops)."""

    rule = None  # a callable of the SQL: True breaks the connection there (once)
    break_after_commit = False
    closed = False
    poisoned = False

    def cursor(self, *args, **kwargs):
        if self.closed or self.poisoned:
            self.closed = True
            raise sqlite3.OperationalError("server closed the connection unexpectedly")
        return super().cursor(FlakyCursor)

    def commit(self) -> None:
        if self.closed:
            raise sqlite3.OperationalError("the connection is closed")
        super().commit()
        if Flaky.break_after_commit:
            Flaky.break_after_commit = False
            self.closed = True
            raise sqlite3.OperationalError("server closed the connection unexpectedly")

    def rollback(self) -> None:
        if self.closed:
            raise sqlite3.OperationalError("the connection is closed")
        super().rollback()


class FlakyCursor(sqlite3.Cursor):
    def execute(self, sql, *args):
        connection = self.connection
        if Flaky.rule is not None and Flaky.rule(sql):
            Flaky.rule = None
            connection.closed = True
            raise sqlite3.OperationalError("server closed the connection unexpectedly")
        return super().execute(sql, *args)


@pytest.fixture(autouse=True)
def _reset():
    Flaky.rule, Flaky.break_after_commit = None, False
    BreaksAtCommit.break_next = False
    yield
    Flaky.rule, Flaky.break_after_commit = None, False
    BreaksAtCommit.break_next = False


def recovery_row_write(sql: str) -> bool:
    """The recovery's write of the row (owner, completed), after Kafka was settled and init_transactions ran."""
    head = sql.split("WHERE", maxsplit=1)[0]
    return sql.lstrip().upper().startswith("UPDATE") and "completed" in sql and "prepared" not in head


def writer_of(pool):
    (writer,) = pool._set.writers.values()
    return writer


def test_an_unfinished_writer_whose_connection_breaks_after_recovery_committed_kafka_is_settled_once(tmp_path):
    """The database committed order 2, Kafka's completion was lost (the writer is unfinished). The next request's
    recovery commits order 2 in Kafka, then the connection breaks before the row says so: the retry's recovery (a
    successor, a new producer) must find it committed, neither bench the id nor lose or repeat anything."""
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path, Flaky), size=1)
    order(pool, 1)
    lose_the_completion(cluster, pool, 2)
    assert writer_of(pool).unfinished
    Flaky.rule = recovery_row_write
    order(pool, 3)  # the retried request
    assert Flaky.rule is None, "the fault was not hit"
    assert pool.benched == {}
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 2, 3]
    assert cluster.model.open_transactions() == []


def test_a_recovery_whose_database_commit_landed_then_the_connection_broke_is_not_repeated_wrongly(tmp_path):
    """The recovery of an unfinished writer commits its row (it landed), then the connection breaks with the
    answer: the retry recovers again on a new connection, and the request goes on once."""
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path, Flaky), size=1)
    order(pool, 1)
    lose_the_completion(cluster, pool, 2)
    Flaky.break_after_commit = True  # the next commit is the recovery's
    order(pool, 3)
    assert not Flaky.break_after_commit, "the fault was not hit"
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 2, 3]
    assert cluster.model.open_transactions() == []


def test_a_commit_of_unknown_outcome_then_a_dropped_idle_connection_aborts_the_undecided_one(tmp_path):
    """Order 2's commit did not land (outcome unknown: prepared in Kafka, the successor unfinished). Its connection
    is then dropped while idle: the next request replaces it again and retries; the recovery must abort order 2
    (the database never committed it), not commit it."""
    cluster, path = Cluster(), tmp_path / "a.db"

    class Both(Flaky, BreaksAtCommit):
        pass

    pool = cluster.pool(lambda: pconnect(path, Both), size=1)
    order(pool, 1)
    BreaksAtCommit.break_next = True
    from kafka2pc.dualwrite import DualWriteOutcomeUnknownError  # noqa: PLC0415

    with pytest.raises(DualWriteOutcomeUnknownError):
        order(pool, 2)
    assert writer_of(pool).unfinished
    assert len(cluster.model.open_transactions()) == 1  # pinning the LSO until a recovery
    writer_of(pool).connection.closed = True  # dropped while idle
    order(pool, 3)
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 3]
    assert cluster.model.open_transactions() == []


def test_a_database_that_accepts_then_drops_every_connection_is_retried_a_bounded_few_times(tmp_path):
    """A proxy (or a database in recovery) that accepts each connection and drops it at its first statement: each
    round of the retry loop makes a new connection, and a new writer (a new Kafka client and producer) that
    recovers the id. The request should end soon with DatabaseConnectionLostError; found: as many rounds as
    size + 2, then PoolTimeoutError 'every writer tried was fenced or benched'."""
    cluster, path = Cluster(), tmp_path / "a.db"
    made: list[Flaky] = []
    poison = [False]

    def make_connection() -> Flaky:
        connection = pconnect(path, Flaky)
        connection.poisoned = poison[0]
        made.append(connection)
        return connection

    pool = cluster.pool(make_connection, size=8)
    order(pool, 1)
    before = len(made)
    writer_of(pool).connection.closed = True  # dropped while idle
    poison[0] = True
    with pytest.raises(RetriableError) as caught:
        order(pool, 2)
    rounds = len(made) - before
    poison[0] = False
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1]
    assert cluster.model.open_transactions() == []
    assert isinstance(caught.value, DatabaseConnectionLostError) and rounds <= 2, \
        f"{rounds} new connections (and writers) for one request, then {caught.value!r}"


def test_a_dropped_connection_of_a_writer_whose_lease_was_taken_over_is_not_retried_on_that_id(tmp_path):
    """The process was frozen: its lease on shop-0 expired and another pool claimed and recovered the id; the
    writer's idle connection was dropped meanwhile. The replacement keeps the old lease (the pool's memory of it):
    its recovery must find the lease taken (fenced, dropped), and the request go on under another id, once."""
    from .test_dual_write_pool import fence  # noqa: PLC0415

    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path, Flaky), size=2)
    order(pool, 1)
    (old,) = pool._set.writers.values()
    assert old.transactional_id == "shop-0"
    other = fence(cluster, path, "shop-0")
    old.connection.closed = True  # dropped while idle
    order(pool, 2)
    assert pool.transactional_ids == ["shop-1"]
    order(other, 3)
    pool.close()
    other.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 2, 3]
    assert cluster.model.open_transactions() == []


def test_async_a_database_that_accepts_then_drops_every_connection_is_retried_a_bounded_few_times(postgres_dsn):
    """The asyncio pool, the same case as the blocking one's: size + 2 rounds, each a new connection, a new
    writer and a recovery that begins on the broken connection, then PoolTimeoutError ('fenced or benched')."""
    import asyncio  # noqa: PLC0415

    psycopg = pytest.importorskip("psycopg")
    from kafka2pc.dualwrite import AsyncDualWriterPool  # noqa: PLC0415

    from .test_dual_write_async_pool import Fleet  # noqa: PLC0415
    from .test_dual_write_async_pool import order as aorder  # noqa: PLC0415

    fleet = Fleet(postgres_dsn, "psycopg")
    poison, made = [False], []

    async def connect():
        connection = await psycopg.AsyncConnection.connect(fleet.dsn)
        made.append(connection)
        if poison[0]:  # accepted, then ended by the server before its first statement
            with psycopg.connect(fleet.dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (connection.info.backend_pid,))
        return connection

    async def scenario():
        pool = AsyncDualWriterPool(connect, {"bootstrap.servers": "model:9092", "transactional.id": "shop",
                                             "linger.ms": 0}, size=6, transport_for=lambda _: fleet.transport)
        async with pool:
            await aorder(pool, 1)
            before = len(made)
            (writer,) = pool._set.writers.values()
            with psycopg.connect(fleet.dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (writer.connection.info.backend_pid,))
            poison[0] = True
            try:
                await aorder(pool, 2)
            except RetriableError as exc:
                caught = exc
            else:
                caught = None
            poison[0] = False
            return len(made) - before, caught

    rounds, caught = asyncio.run(scenario())
    assert fleet.db_ids() == fleet.kafka_ids() == [1]
    assert fleet.model.open_transactions() == []
    assert isinstance(caught, DatabaseConnectionLostError) and rounds <= 2, \
        f"{rounds} new connections (and writers) for one request, then {caught!r}"
