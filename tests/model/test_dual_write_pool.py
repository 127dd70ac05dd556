"""DualWriterPool against the coordinator model (no broker) and SQLite files: ids adopted and leased, a writer
whose connection broke at commit is replaced and its transaction settled, a fenced writer replaced by another
lease, one needing an operator benched, and a pool with no free writer says so."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time

import pytest

from kafka2pc.dualwrite import (
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriter,
    DualWriterPool,
    PoolTimeoutError,
    state_table_ddl,
)
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import LeaseTable
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import ConfigError, DatabaseConnectionLostError, UsageError

from .coordinator import CoordinatorModel, Faults, ModelTransport
from .test_dual_write import connect, db_ids


class Serialised:
    """The coordinator model, one call at a time (it models one coordinator; the pool's threads share it)."""

    def __init__(self, transport: ModelTransport):
        self._transport, self._lock = transport, threading.Lock()

    def __getattr__(self, name: str):
        attribute = getattr(self._transport, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            with self._lock:
                return attribute(*args, **kwargs)
        return call


class Cluster:
    def __init__(self) -> None:
        self.model = CoordinatorModel(transaction_version=2, two_phase_enabled=True)
        self.transport = Serialised(ModelTransport(self.model, Faults()))
        self.config = {"bootstrap.servers": "model:9092", "transactional.id": "shop", "linger.ms": 0}

    def pool(self, make_connection, size: int, **options) -> DualWriterPool:
        return DualWriterPool(make_connection, self.config, size=size, transport_for=lambda _: self.transport,
                              **options)

    def kafka_ids(self) -> list[int]:
        return sorted(int(v) for v in self.model.committed_records())


def order(pool: DualWriterPool, order_id: int) -> None:
    with pool.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (?)", (order_id,))
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)


def pconnect(path, factory: type[sqlite3.Connection] = sqlite3.Connection) -> sqlite3.Connection:
    """A connection a pool's threads may share."""
    connection = sqlite3.connect(path, timeout=10, factory=factory, check_same_thread=False)
    connection.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
    connection.commit()
    return connection


def expire(path, *transactional_ids: str) -> None:
    """The holder of these leases stopped renewing them long ago (a dead or frozen process)."""
    with sqlite3.connect(path) as db:
        for transactional_id in transactional_ids:
            db.execute("UPDATE kafka2pc_dual_write_state SET lease_expires = 1 WHERE transactional_id = ?",
                       (transactional_id,))


def test_ids_of_a_fixed_prefix_are_adopted_and_recovered_when_claimed(tmp_path):
    """A row of a writer before leases (or of a pool with a fixed prefix) is one of the fleet's ids, free to
    claim: the pool that claims it recovers what its dead writer left."""
    cluster, path = Cluster(), tmp_path / "a.db"
    dead = DualWriter(connect(path), {**cluster.config, "transactional.id": "shop-1"}, transport=cluster.transport)
    block = dead.transaction()  # a process dies inside a block: its transaction stays open
    block.__enter__().produce("t", value=b"99", key=b"99", partition=0)
    dead.connection.close()  # its database transaction dies with it
    assert len(cluster.model.open_transactions()) == 1
    pool = cluster.pool(lambda: pconnect(path), size=3, min_size=3)
    assert pool.transactional_ids == ["shop-1", "shop-2", "shop-3"]  # the adopted id first, then new ones
    assert cluster.model.open_transactions() == []
    for order_id in range(6):
        order(pool, order_id)
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == list(range(6))


class BreaksAtCommit(sqlite3.Connection):
    """Its commit fails with the connection (it did not land), and it cannot be used again."""

    break_next = False
    closed = False

    def commit(self) -> None:
        if BreaksAtCommit.break_next:
            BreaksAtCommit.break_next = False
            self.closed = True
            raise sqlite3.OperationalError("server closed the connection unexpectedly")
        super().commit()

    def cursor(self, *args, **kwargs):
        if self.closed:
            raise sqlite3.OperationalError("the connection is closed")
        return super().cursor(*args, **kwargs)


def test_a_writer_whose_connection_broke_at_commit_is_replaced_and_its_transaction_settled(tmp_path):
    cluster, path = Cluster(), tmp_path / "a.db"
    made: list[sqlite3.Connection] = []

    def make_connection() -> sqlite3.Connection:
        made.append(pconnect(path, BreaksAtCommit))
        return made[-1]

    pool = cluster.pool(make_connection, size=1)
    order(pool, 1)
    made.clear()
    BreaksAtCommit.break_next = True
    with pytest.raises(DualWriteOutcomeUnknownError):
        order(pool, 2)
    assert len(made) == 1  # a new connection for the id
    order(pool, 3)  # its writer recovers first: order 2's prepared transaction is aborted (the DB has no order 2)
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 3]
    assert cluster.model.open_transactions() == []


class DropsWhileIdle(sqlite3.Connection):
    """Dropped by the server between two requests (a restart, a proxy's idle timeout): known closed once used."""

    drop_next = False
    closed = False

    def cursor(self, *args, **kwargs):
        if DropsWhileIdle.drop_next or self.closed:
            DropsWhileIdle.drop_next = False
            self.closed = True
            raise sqlite3.OperationalError("server closed the connection unexpectedly")
        return super().cursor(*args, **kwargs)


def test_a_connection_dropped_between_requests_is_replaced_and_the_request_goes_on(tmp_path):
    """Found by a user-level review: the next request got the driver's error (not retriable), though nothing of it
    had begun. Now the pool replaces the connection and the request goes on; when no new connection can be made,
    DatabaseConnectionLostError (retriable), and the request after the database is back goes on."""
    cluster, path = Cluster(), tmp_path / "a.db"
    refusing = [False]

    def make_connection() -> sqlite3.Connection:
        if refusing[0]:
            raise sqlite3.OperationalError("connection refused")
        return pconnect(path, DropsWhileIdle)

    pool = cluster.pool(make_connection, size=1)
    order(pool, 1)
    DropsWhileIdle.drop_next = True
    order(pool, 2)
    DropsWhileIdle.drop_next, refusing[0] = True, True
    with pytest.raises(DatabaseConnectionLostError, match="before the block began"):
        order(pool, 3)
    refusing[0] = False
    order(pool, 4)
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 2, 4]
    assert cluster.model.open_transactions() == []


def test_no_free_writer_in_time_is_a_retriable_error(tmp_path):
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path), size=1, acquire_timeout_s=0.05)
    with pool.transaction(), pytest.raises(PoolTimeoutError, match="all 1 are busy") as raised:
        order(pool, 1)
    assert raised.value.retriable()
    pool.close()


def test_a_pool_lends_each_writer_to_one_thread_at_a_time(tmp_path):
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: sqlite3.connect(path, timeout=10, check_same_thread=False), size=2, min_size=2)
    lent: list[str] = []
    guard = threading.Lock()
    busy: set[str] = set()

    def borrow() -> None:
        for _ in range(20):
            with pool.transaction() as tx:
                with guard:
                    assert id(tx.connection) not in busy
                    busy.add(id(tx.connection))
                lent.append(str(id(tx.connection)))
                with guard:
                    busy.discard(id(tx.connection))

    threads = [threading.Thread(target=borrow) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    pool.close()
    assert len(lent) == 80 and len(set(lent)) <= 2


def fence(cluster: Cluster, path, transactional_id: str) -> DualWriterPool:
    """Another process of the fleet takes the id over: its lease expired (this process was frozen), and the other
    process's pool claims it and recovers it."""
    expire(path, transactional_id)
    other = cluster.pool(lambda: pconnect(path), size=1)
    assert other.transactional_ids == [transactional_id]
    return other


def lose_the_completion(cluster: Cluster, pool: DualWriterPool, order_id: int) -> None:
    """The DB commits the order; its EndTxn never arrives (DualWriteIncompleteError)."""
    with pytest.raises(DualWriteIncompleteError), pool.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (?)", (order_id,))
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)
        cluster.transport.faults.dropped_requests.extend([True] * 5)
    cluster.transport.faults.dropped_requests.clear()


@pytest.mark.parametrize("trouble", ["fenced", "needs an operator"])
def test_a_writer_whose_id_is_fenced_or_needs_an_operator_is_dropped_and_the_pool_serves(tmp_path, trouble):
    """Issue 29: a writer fenced by another process was benched for good (with every id fenced, every request
    failed). Its lease is gone: the pool drops it and leases another id. An id that needs an operator is benched,
    and marked so in its row: no pool of the fleet claims it until DualWriter.resolve."""
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path), size=4, min_size=4)
    top = "shop-3"  # the last writer put on the free list: the next one lent
    if trouble == "fenced":
        other = fence(cluster, path, top)
    else:  # order 0's completion is lost, then the coordinator forgets the id: recovery cannot confirm order 0
        lose_the_completion(cluster, pool, 0)
        del cluster.model.ids[top]
    served, failed = 0, []
    for order_id in range(1, 21):
        try:
            order(pool, order_id)
            served += 1
        except Exception as exc:
            failed.append(type(exc).__name__)
    print(f"\n{trouble}: {served} of 20 served, failed: {failed}, ids {pool.transactional_ids}")
    assert served == 20, failed
    assert top not in pool.transactional_ids
    if trouble == "fenced":
        assert pool.benched == {}
        order(other, 21)  # the process that took the id over uses it
        other.close()
    else:
        assert list(pool.benched) == [top]
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT problem FROM kafka2pc_dual_write_state WHERE transactional_id = ?",
                              (top,)).fetchone()[0]
        expire(path, top)
        another = cluster.pool(lambda: pconnect(path), size=1)
        assert top not in another.transactional_ids  # never claimed while it needs an operator
        another.close()
    pool.close()
    expected = list(range(1, 22 if trouble == "fenced" else 21))
    assert [i for i in db_ids(path) if i] == cluster.kafka_ids() == expected


@pytest.mark.parametrize("left", ["an unfinished completion", "a commit of unknown outcome"])
def test_close_settles_what_a_writer_left_unfinished(tmp_path, left):
    """Issue 28 (pool): closing after DualWriteIncompleteError or DualWriteOutcomeUnknownError left the prepared
    transaction open (pinning the partitions' LSO) until a pool with the prefix started again."""
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path, BreaksAtCommit), size=2)
    order(pool, 1)
    if left == "an unfinished completion":
        lose_the_completion(cluster, pool, 2)
        expected = [1, 2]
    else:
        BreaksAtCommit.break_next = True
        with pytest.raises(DualWriteOutcomeUnknownError):
            order(pool, 2)
        expected = [1]
    assert len(cluster.model.open_transactions()) == 1
    pool.close()
    assert cluster.model.open_transactions() == []
    assert db_ids(path) == cluster.kafka_ids() == expected


def test_close_says_so_when_it_cannot_settle_and_a_live_pool_settles_it(tmp_path, caplog):
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path), size=1)
    lose_the_completion(cluster, pool, 1)
    cluster.transport.faults.dropped_requests.extend([True] * 50)  # the broker still away at close
    caplog.set_level(logging.WARNING, logger="kafka2pc.dualwrite.pool")
    pool.close()
    cluster.transport.faults.dropped_requests.clear()
    assert any("shop-0" in r.getMessage() and "a live pool of the fleet settles it" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert len(cluster.model.open_transactions()) == 1  # its lease was kept: another process settles it
    live = cluster.pool(lambda: pconnect(path), size=1, min_size=0)
    assert live.transactional_ids == [] and len(cluster.model.open_transactions()) == 1  # not expired yet
    expire(path, "shop-0")
    live._keeper.tick()
    assert cluster.model.open_transactions() == []
    live.close()
    assert db_ids(path) == cluster.kafka_ids() == [1]


def test_an_id_that_needs_an_operator_at_the_pools_start_is_benched_and_the_pool_starts(tmp_path):
    """One id of the fleet that recovery cannot confirm must not stop every process from starting: it is benched
    (its writer and connection closed) and marked in its row; the pool leases another id."""
    cluster, path = Cluster(), tmp_path / "a.db"
    with sqlite3.connect(path) as setup:
        setup.execute(state_table_ddl())
        setup.execute("INSERT INTO kafka2pc_dual_write_state (transactional_id, owner, prepared_state, "
                      "transaction_version, completed, two_phase) VALUES ('shop-0', 'gone', '987654:3', 2, 0, 1)")
    made: list[sqlite3.Connection] = []

    def make_connection() -> sqlite3.Connection:
        made.append(pconnect(path))
        return made[-1]

    pool = cluster.pool(make_connection, size=3)
    assert list(pool.benched) == ["shop-0"] and "no longer knows" in str(pool.benched["shop-0"])
    assert pool.transactional_ids == ["shop-1"]
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        made[1].execute("SELECT 1")  # the benched writer's (made[0] is the keeper's)
    order(pool, 1)
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1]


def test_a_closed_pool_refuses_a_transaction_as_a_misuse_not_a_configuration(tmp_path):
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path), size=1)
    order(pool, 1)
    pool.close()
    with pytest.raises(UsageError, match="'shop' is closed") as raised:
        order(pool, 2)
    assert not isinstance(raised.value, ConfigError)
    assert db_ids(path) == cluster.kafka_ids() == [1]


def test_a_sqlite_connection_bound_to_its_thread_is_refused_at_once(tmp_path):
    cluster, path = Cluster(), tmp_path / "a.db"
    with pytest.raises(ConfigError, match="check_same_thread=False"):
        cluster.pool(lambda: sqlite3.connect(path), size=1)


def state_row(path, transactional_id: str) -> tuple:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT owner, txn_token, prepared_state, completed FROM kafka2pc_dual_write_state WHERE "
                          "transactional_id = ?", (transactional_id,)).fetchone()


def test_a_writer_whose_lease_was_claimed_writes_nothing_before_the_claimer_recovers(tmp_path):
    """A process frozen past its lease goes on after another process claimed its id, before that process's
    recovery wrote the row's owner: only the lease says the id is no longer its. Its request is served under
    another lease, and the claimed id's row is left as the claimer found it."""
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path), size=2)
    assert pool.transactional_ids == ["shop-0"]
    order(pool, 1)
    expire(path, "shop-0")
    claim = LeaseTable(StateTable(adapt(pconnect(path)), "kafka2pc_dual_write_state"), "shop").claim(
        "the-claimers-token", "other:2", 60, max_ids=None, expired_only=True)
    assert claim.transactional_id == "shop-0"
    found = state_row(path, "shop-0")
    order(pool, 2)
    assert state_row(path, "shop-0") == found, "the writer wrote the row of an id another process holds"
    assert pool.transactional_ids == ["shop-1"]
    claimer = DualWriter(pconnect(path), {**cluster.config, "transactional.id": "shop-0"},
                         transport=cluster.transport, lease=claim, lease_s=60)
    claimer.recover()
    with claimer.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (3)")
        tx.produce("t", value=b"3", key=b"3", partition=0)
    claimer.close()
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 2, 3]
    assert cluster.model.open_transactions() == []


def test_the_keeper_reports_leased_ids_open_transactions_and_settled_leases(tmp_path):
    from kafka2pc.metrics import sample  # noqa: PLC0415

    cluster, path = Cluster(), tmp_path / "a.db"
    cluster.config = {**cluster.config, "transactional.id": f"m-{tmp_path.name[-12:]}"}
    prefix = {"prefix": cluster.config["transactional.id"]}
    pool = cluster.pool(lambda: pconnect(path), size=2, min_size=2)
    with pool.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (1)")
        time.sleep(0.05)
        pool._keeper.tick()
        assert sample("kafka2pc_dual_write_leased_ids", **prefix) == 2
        assert sample("kafka2pc_dual_write_oldest_open_transaction_seconds", **prefix) >= 0.05
    pool._keeper.tick()
    assert sample("kafka2pc_dual_write_oldest_open_transaction_seconds", **prefix) == 0
    dead = cluster.pool(lambda: pconnect(path), size=1)  # another process, which dies
    dead._keeper.stop()
    expire(path, *dead.transactional_ids)
    before = sample("kafka2pc_dual_write_leases_taken_over_total", **prefix) or 0
    pool._keeper.tick()
    assert sample("kafka2pc_dual_write_expired_leases", **prefix) == 1  # seen, then settled
    assert sample("kafka2pc_dual_write_leases_taken_over_total", **prefix) == before + 1
    pool._keeper.tick()
    assert sample("kafka2pc_dual_write_expired_leases", **prefix) == 0
    pool.close()


def test_a_forked_child_can_neither_use_nor_close_the_parents_pool(tmp_path):
    """gunicorn --preload, multiprocessing: a pool made before a fork shares its connections with the child. The
    child's transaction() is refused, and its exit (atexit closes pools) leaves the parent's leases alone."""
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path), size=1)
    order(pool, 1)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        code = 3
        try:
            order(pool, 2)
        except UsageError as exc:  # a misuse (where the pool is made), not a configuration
            code = 0 if "before a fork" in str(exc) and not isinstance(exc, ConfigError) else 4
        finally:
            pool.close()  # what the child's atexit does at its exit (os._exit: not pytest's own handlers)
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM kafka2pc_dual_write_state WHERE lease_expires IS NOT NULL"
                          ).fetchone()[0] == 1, "the child gave back the parent's lease"
    order(pool, 3)
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 3]


def test_an_id_lost_before_the_pools_start_recovered_it_is_dropped_and_the_pool_starts(tmp_path):
    """Found by the fleet kill test on a loaded machine (SQLite): a pool's start claimed an id, its recovery waited
    for the database's write lock longer than the lease, and another process claimed the id meanwhile; the start
    raised ProducerFencedError and the worker never served. The lost id is dropped and another one leased."""
    cluster, path = Cluster(), tmp_path / "a.db"
    stolen: list[str] = []

    def transport_for(transactional_id: str):
        if not stolen:  # another process claims the first id before this pool's recovery of it runs
            stolen.append(transactional_id)
            with sqlite3.connect(path) as db:
                db.execute("UPDATE kafka2pc_dual_write_state SET lease_owner = 'another', lease_expires = 1e12 "
                           "WHERE transactional_id = ?", (transactional_id,))
        return cluster.transport

    pool = DualWriterPool(lambda: pconnect(path), cluster.config, size=2, transport_for=transport_for)
    assert stolen == ["shop-0"] and pool.transactional_ids == ["shop-1"]
    order(pool, 1)
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1]
