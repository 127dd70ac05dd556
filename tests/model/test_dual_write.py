"""DualWriter against the coordinator model (no broker) and a SQLite file: the review's findings, each a sequence
that once lost an event the database committed, or left recovery or the writer stuck."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from kafka2pc.dualwrite import DualWriter
from kafka2pc.errors import (
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriteRecoveryError,
    DualWriteUsageError,
    ProducerFencedError,
)

from .coordinator import CoordinatorModel, Faults, ModelTransport

TID = "dw-0"


class Cluster:
    def __init__(self, version: int, two_phase: bool, first_epoch: int = -1):
        self.model = CoordinatorModel(transaction_version=version, two_phase_enabled=two_phase,
                                      first_epoch=first_epoch)
        self.transport = ModelTransport(self.model, Faults())

    def writer(self, connection: Any) -> DualWriter:
        return DualWriter(connection, {"bootstrap.servers": "model:9092", "transactional.id": TID, "linger.ms": 0},
                          transport=self.transport)

    def kafka_ids(self) -> list[int]:
        return sorted(int(v) for v in self.model.committed_records())


def connect(path: Path, factory: type[sqlite3.Connection] = sqlite3.Connection) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=1, factory=factory)
    connection.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
    connection.commit()
    return connection


def db_ids(path: Path) -> list[int]:
    with sqlite3.connect(path) as connection:
        return [row[0] for row in connection.execute("SELECT id FROM orders ORDER BY id")]


def order(writer: DualWriter, order_id: int, during=None) -> None:
    with writer.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (?)", (order_id,))
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)
        if during is not None:
            during()


@pytest.mark.parametrize(("version", "two_phase"), [(2, True), (1, True), (2, False)])
def test_close_after_an_unfinished_completion_never_marks_it_complete(tmp_path, version, two_phase):
    cluster, path = Cluster(version, two_phase), tmp_path / "a.db"
    writer = cluster.writer(connect(path))
    order(writer, 1)
    with pytest.raises(DualWriteIncompleteError):  # the DB commits order 2; its EndTxn never arrives
        order(writer, 2, during=lambda: cluster.transport.faults.dropped_requests.extend([True] * 5))
    cluster.transport.faults.dropped_requests.clear()
    writer.close()
    if not two_phase:
        cluster.model.time_out(TID)  # the broker aborts it on its timeout: the event is lost, which must be said
        with pytest.raises(DualWriteRecoveryError, match="can no longer commit"):
            cluster.writer(connect(path)).recover()
        return
    cluster.writer(connect(path)).recover()
    assert db_ids(path) == cluster.kafka_ids() == [1, 2]
    assert cluster.model.open_transactions() == []


def test_the_same_writer_recovers_its_own_unfinished_completion_first(tmp_path):
    cluster, path = Cluster(2, True), tmp_path / "a.db"
    writer = cluster.writer(connect(path))
    with pytest.raises(DualWriteIncompleteError):
        order(writer, 1, during=lambda: cluster.transport.faults.dropped_requests.extend([True] * 5))
    cluster.transport.faults.dropped_requests.clear()
    order(writer, 2)  # recovers first: commits order 1, then writes order 2
    writer.recover()  # and recovering again is harmless
    order(writer, 3)
    assert db_ids(path) == cluster.kafka_ids() == [1, 2, 3]


class CommitLandsThenFails(sqlite3.Connection):
    fail_next = False

    def commit(self) -> None:
        super().commit()
        if CommitLandsThenFails.fail_next:
            CommitLandsThenFails.fail_next = False
            raise sqlite3.OperationalError("disk I/O error")


def test_a_commit_that_landed_though_it_reported_an_error_is_completed_not_aborted(tmp_path):
    cluster, path = Cluster(2, True), tmp_path / "a.db"
    writer = cluster.writer(connect(path, CommitLandsThenFails))
    order(writer, 1)
    order(writer, 2, during=lambda: setattr(CommitLandsThenFails, "fail_next", True))
    order(writer, 3)
    assert db_ids(path) == cluster.kafka_ids() == [1, 2, 3]


@pytest.mark.parametrize(("version", "prepare"), [(1, False), (1, True), (2, False), (2, True)])
def test_without_two_phase_commit_a_crash_before_the_db_commit_recovers(tmp_path, version, prepare):
    cluster, path = Cluster(version, False), tmp_path / "a.db"
    connection = connect(path)
    writer = cluster.writer(connection)
    order(writer, 1)
    block = writer.transaction()
    tx = block.__enter__()  # the process dies inside order 2 (mode a), or after preparing it (mode b)
    tx.cursor.execute("INSERT INTO orders VALUES (2)")
    tx.produce("t", value=b"2", key=b"2", partition=0)
    if prepare:
        writer._protocol.producer.prepare_transaction()
    connection.close()
    for _ in range(2):
        cluster.writer(connect(path)).recover()
    assert db_ids(path) == cluster.kafka_ids() == [1]
    assert cluster.model.open_transactions() == []


def test_a_crash_after_the_producer_id_rotated_recovers_without_an_operator(tmp_path):
    cluster, path = Cluster(2, True, first_epoch=32762), tmp_path / "a.db"
    connection = connect(path)
    writer = cluster.writer(connection)
    for order_id in (1, 2, 3):
        order(writer, order_id)
    block = writer.transaction()  # order 4 begins under a new producer id, prepares, and the process dies
    tx = block.__enter__()
    tx.cursor.execute("INSERT INTO orders VALUES (4)")
    tx.produce("t", value=b"4", key=b"4", partition=0)
    writer._protocol.producer.prepare_transaction()
    connection.close()
    cluster.writer(connect(path)).recover()
    assert db_ids(path) == cluster.kafka_ids() == [1, 2, 3]
    assert cluster.model.open_transactions() == []


def test_a_db_only_transaction_that_reported_an_error_but_landed_is_not_misread(tmp_path):
    cluster, path = Cluster(2, True), tmp_path / "a.db"
    writer = cluster.writer(connect(path, CommitLandsThenFails))
    with writer.transaction() as tx:  # no record: the prepared state is empty
        tx.cursor.execute("INSERT INTO orders VALUES (1)")
        CommitLandsThenFails.fail_next = True
    assert db_ids(path) == [1]


@pytest.mark.parametrize("version", [1, 2])
def test_without_two_phase_commit_a_crash_before_anything_of_the_next_order_was_sent_recovers(tmp_path, version):
    """Real-broker finding (Kafka 3.9): the writer completes order 1, begins order 2 (protocol v1 bumps the epoch
    past order 1's) and dies before any record of it left the process. The row still names order 1, not marked
    complete; the coordinator shows the id idle at a later epoch. Without two-phase commit recovery cannot tell
    "completed, then moved past" from "timed out", so the row must already say order 1 was completed."""
    cluster, path = Cluster(version, False), tmp_path / "a.db"
    connection = connect(path)
    writer = DualWriter(connection, {"bootstrap.servers": "model:9092", "transactional.id": TID,
                                     "linger.ms": 60_000}, transport=cluster.transport)
    order(writer, 1)
    block = writer.transaction()
    tx = block.__enter__()  # mode a: the process dies inside order 2, its record still in the producer's buffer
    tx.cursor.execute("INSERT INTO orders VALUES (2)")
    tx.produce("t", value=b"2", key=b"2", partition=0)
    connection.close()
    cluster.writer(connect(path)).recover()
    assert db_ids(path) == cluster.kafka_ids() == [1]
    assert cluster.model.open_transactions() == []


@pytest.mark.parametrize(("version", "two_phase"), [(2, True), (1, False)])
def test_a_writer_whose_completion_failed_never_takes_the_id_back_from_its_successor(tmp_path, version, two_phase):
    """Review finding: writer A's completion of order 1 fails, successor B recovers (commits order 1, owns the id);
    A's next transaction() must be fenced, not recover and take the id back from the live B."""
    cluster, path = Cluster(version, two_phase), tmp_path / "a.db"
    first = cluster.writer(connect(path))
    with pytest.raises(DualWriteIncompleteError):
        order(first, 1, during=lambda: cluster.transport.faults.dropped_requests.extend([True] * 5))
    cluster.transport.faults.dropped_requests.clear()
    second = cluster.writer(connect(path))
    second.recover()
    with pytest.raises(ProducerFencedError):
        order(first, 2)
    order(second, 3)  # the successor carries on, unfenced
    assert db_ids(path) == cluster.kafka_ids() == [1, 3]
    assert cluster.model.open_transactions() == []


class CommitsAfterTheClientLeft(sqlite3.Connection):
    """Armed, its COMMIT reaches the database after the client lost the connection: the client sees a disconnect at
    once (SQLAlchemy invalidates the connection and reconnects), the commit lands ``DELAY_S`` later (a synchronous
    standby slow to acknowledge, a pooler that dropped only the client side)."""

    DELAY_S = 0.3
    armed = False
    landings: list[threading.Thread] = []  # noqa: RUF012 - the test's record of the delayed commits
    dropped = False

    def commit(self) -> None:
        if not CommitsAfterTheClientLeft.armed:
            self._check_open()
            super().commit()
            return
        CommitsAfterTheClientLeft.armed = False
        self.dropped = True
        landing = threading.Timer(self.DELAY_S, self._land)
        CommitsAfterTheClientLeft.landings.append(landing)
        landing.start()
        self._check_open()

    def _land(self) -> None:
        sqlite3.Connection.commit(self)
        sqlite3.Connection.close(self)

    def _check_open(self) -> None:
        if self.dropped:
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")  # SQLAlchemy's disconnect

    def rollback(self) -> None:
        self._check_open()
        super().rollback()

    def cursor(self, *args, **kwargs):
        self._check_open()
        return super().cursor(*args, **kwargs)

    def close(self) -> None:
        if not self.dropped:  # the client went away; the server's side commits, then closes (_land)
            super().close()


def test_a_commit_still_landing_when_the_client_lost_it_is_unknown_not_failed(tmp_path):
    """Issue 28 (2): through SQLAlchemy, a COMMIT that fails with the connection may still land after the read-back,
    which runs on a new session (SQLAlchemy reconnects) and sees the old token. That proves nothing: Kafka must stay
    prepared for recovery, not be aborted — else the database has order 2 and Kafka never does."""
    cluster, path = Cluster(2, True), tmp_path / "a.db"
    connect(path).close()
    engine = sqlalchemy.create_engine(f"sqlite:///{path}", creator=lambda: sqlite3.connect(
        path, timeout=5, factory=CommitsAfterTheClientLeft, check_same_thread=False))
    writer = cluster.writer(engine)
    order(writer, 1)
    CommitsAfterTheClientLeft.landings.clear()
    with pytest.raises(Exception) as raised:
        order(writer, 2, during=lambda: setattr(CommitsAfterTheClientLeft, "armed", True))
    for landing in CommitsAfterTheClientLeft.landings:
        landing.join(5)
    assert db_ids(path) == [1, 2]  # the commit landed after the writer had given up on it
    order(writer, 3)  # recovers first, under the row's lock: the database committed order 2, so Kafka commits it
    writer.close()
    cluster.writer(connect(path)).recover()
    engine.dispose()
    assert db_ids(path) == cluster.kafka_ids() == [1, 2, 3]
    assert cluster.model.open_transactions() == []
    assert isinstance(raised.value, DualWriteOutcomeUnknownError), repr(raised.value)


class CommitFailsOnALiveSession(sqlite3.Connection):
    """Armed, its commit fails without committing and the connection stays usable (the database answered)."""

    fail_next = False

    def commit(self) -> None:
        if CommitFailsOnALiveSession.fail_next:
            CommitFailsOnALiveSession.fail_next = False
            raise sqlite3.OperationalError("disk I/O error")
        super().commit()


def test_a_commit_that_failed_on_its_own_live_session_is_failed_not_unknown(tmp_path):
    """The read-back on the session that sent the commit proves it failed: both rolled back, the driver's error."""
    cluster, path = Cluster(2, True), tmp_path / "a.db"
    writer = cluster.writer(connect(path, CommitFailsOnALiveSession))
    order(writer, 1)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        order(writer, 2, during=lambda: setattr(CommitFailsOnALiveSession, "fail_next", True))
    assert cluster.model.open_transactions() == []  # aborted at once, not left prepared
    order(writer, 3)
    assert db_ids(path) == cluster.kafka_ids() == [1, 3]


def test_a_row_factory_on_the_applications_connection_is_fine(tmp_path):
    """The application's sqlite3 row factory gives dicts: the writer's own statements still read tuples (found by
    the user-level review with psycopg's dict_row and PyMySQL's DictCursor: KeyError: 0)."""
    cluster, path = Cluster(2, True), tmp_path / "a.db"
    connection = connect(path)
    connection.row_factory = lambda cursor, row: {column[0]: value for column, value in
                                                  zip(cursor.description, row, strict=True)}
    writer = cluster.writer(connection)
    order(writer, 1)
    order(writer, 2)
    writer.close()
    assert db_ids(path) == cluster.kafka_ids() == [1, 2]


def test_one_writer_used_by_two_threads_at_once_says_so(tmp_path):
    """Not a nested block: the message names the two threads and the way out (found by the user-level review)."""
    cluster, path = Cluster(2, True), tmp_path / "a.db"
    writer = cluster.writer(sqlite3.connect(path, check_same_thread=False))
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with writer.transaction():
            inside.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(10)
    try:
        with pytest.raises(DualWriteUsageError, match="from two threads at once"), writer.transaction():
            pass
    finally:
        leave.set()
        holder.join(10)
    with pytest.raises(DualWriteUsageError, match="inside another"), writer.transaction(), writer.transaction():
        pass
    writer.close()


def test_a_produce_after_the_block_is_a_usage_error(tmp_path):
    """Found by the user-level review: it was the producer's own TransactionStateError, advising begin_transaction()
    (a producer call a DualWriter user never makes)."""
    cluster, path = Cluster(2, True), tmp_path / "a.db"
    writer = cluster.writer(connect(path))
    with writer.transaction() as tx:
        tx.produce("t", value=b"1", key=b"1", partition=0)
    with pytest.raises(DualWriteUsageError, match="after its block"):
        tx.produce("t", value=b"2", key=b"2", partition=0)
    writer.close()
    assert cluster.kafka_ids() == [1]
