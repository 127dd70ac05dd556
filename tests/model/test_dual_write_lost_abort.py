"""A dual write whose DB commit fails definitely while Kafka's abort gets no answer (found by the adversarial review
of issue 28): the prepared transaction — two-phase, so no broker timeout ends it — must be settled by the writer's
next transaction() and by the pool's close(), never left pinning read_committed consumers."""

import sqlite3

import pytest

from kafka2pc.dualwrite import DualWriter, DualWriterPool
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport


class CommitFailsOnce(sqlite3.Connection):
    """A deferred constraint failing at COMMIT (a definite failure); ``before`` runs first."""

    before = None

    def commit(self):
        hook = type(self).before
        if hook is None:
            return super().commit()
        type(self).before = None
        hook()
        super().rollback()
        raise sqlite3.IntegrityError("FOREIGN KEY constraint failed (deferred, at COMMIT)")


def connect(path):
    connection = sqlite3.connect(path, timeout=1, factory=CommitFailsOnce, check_same_thread=False)
    connection.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
    connection.commit()
    return connection


def write(tx, order: int) -> None:
    tx.cursor.execute("INSERT INTO orders VALUES (?)", (order,))
    tx.produce("t", value=str(order).encode(), partition=0)


def fail_commit_and_lose_the_abort(transport):
    CommitFailsOnce.before = lambda: transport.faults.dropped_requests.extend([True] * 20)


def test_a_failed_commit_whose_abort_is_lost_is_settled_by_the_next_transaction(tmp_path):
    model = CoordinatorModel(transaction_version=2, two_phase_enabled=True)
    transport = ModelTransport(model, Faults())
    writer = DualWriter(connect(tmp_path / "a.db"), {"bootstrap.servers": "m:1", "transactional.id": "dw-0"},
                        transport=transport)
    with writer.transaction() as tx:  # recovered, in use
        write(tx, 1)
    fail_commit_and_lose_the_abort(transport)
    with pytest.raises(sqlite3.IntegrityError), writer.transaction() as tx:
        write(tx, 2)
    transport.faults.dropped_requests.clear()
    assert model.open_transactions() and writer.unfinished
    with writer.transaction() as tx:  # recovers first: aborts what the database never committed
        write(tx, 3)
    assert model.committed_records() == [b"1", b"3"] and model.open_transactions() == []
    writer.close()


def test_a_pool_closing_settles_a_transaction_whose_abort_was_lost(tmp_path):
    model = CoordinatorModel(transaction_version=2, two_phase_enabled=True)
    transport = ModelTransport(model, Faults())
    path = tmp_path / "p.db"
    pool = DualWriterPool(lambda: connect(path), {"bootstrap.servers": "m:1", "transactional.id": "dw"}, size=2,
                          transport_for=lambda _id: transport)
    fail_commit_and_lose_the_abort(transport)
    with pytest.raises(sqlite3.IntegrityError), pool.transaction() as tx:
        write(tx, 2)
    transport.faults.dropped_requests.clear()
    assert model.open_transactions()
    pool.close()
    assert model.open_transactions() == [] and model.committed_records() == []
