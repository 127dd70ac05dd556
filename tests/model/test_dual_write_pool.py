"""DualWriterPool against the coordinator model (no broker) and SQLite files: its start recovers every id, a writer
whose connection broke at commit is replaced and its transaction settled, and a pool with no free writer says so."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from kafka2pc.dualwrite import DualWriteOutcomeUnknownError, DualWriter, DualWriterPool, PoolTimeoutError

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


def test_the_pools_start_recovers_every_id(tmp_path):
    cluster, path = Cluster(), tmp_path / "a.db"
    dead = DualWriter(connect(path), {**cluster.config, "transactional.id": "shop-1"}, transport=cluster.transport)
    block = dead.transaction()  # a process dies inside a block: its transaction stays open
    block.__enter__().produce("t", value=b"99", key=b"99", partition=0)
    dead.connection.close()  # its database transaction dies with it
    assert len(cluster.model.open_transactions()) == 1
    pool = cluster.pool(lambda: connect(path), size=3)
    assert pool.transactional_ids == ["shop-0", "shop-1", "shop-2"]
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
        made.append(connect(path, BreaksAtCommit))
        return made[-1]

    pool = cluster.pool(make_connection, size=1)
    order(pool, 1)
    BreaksAtCommit.break_next = True
    with pytest.raises(DualWriteOutcomeUnknownError):
        order(pool, 2)
    assert len(made) == 2  # a new connection for the id
    order(pool, 3)  # its writer recovers first: order 2's prepared transaction is aborted (the DB has no order 2)
    pool.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 3]
    assert cluster.model.open_transactions() == []


def test_no_free_writer_in_time_is_a_retriable_error(tmp_path):
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: connect(path), size=1, acquire_timeout_s=0.05)
    with pool.transaction(), pytest.raises(PoolTimeoutError, match="all 1 are busy") as raised:
        order(pool, 1)
    assert raised.value.retriable()
    pool.close()


def test_a_pool_lends_each_writer_to_one_thread_at_a_time(tmp_path):
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: sqlite3.connect(path, timeout=10, check_same_thread=False), size=2)
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
