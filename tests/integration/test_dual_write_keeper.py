"""The lease keeper on PostgreSQL (the coordinator model instead of a broker), from an adversarial review of the
leased DualWriterPool: it reconnects after losing its connection, renews while its worker waits for Kafka, every
lease transaction ends itself when left idle for a lease (the keeper's renewal, a writer on a reconnected session),
and nothing of that leaks into the application's engine. Each docstring says what the review found on the first
leasing version."""

from __future__ import annotations

import contextlib
import time
import uuid

import psycopg
import pytest

from kafka2pc._core.messages import DescribeTransaction, InitProducerId
from kafka2pc.dualwrite import (
    DualWriteIncompleteError,
    DualWriter,
    DualWriterPool,
    DualWriteUsageError,
    LeaseLostError,
)
from kafka2pc.errors import BrokerUnavailableError, RetriableError
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport
from tests.model.test_dual_write_pool import Serialised

from .test_dual_write import schema_database

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
LEASE_S = 1.0


class SlowTransport(Serialised):
    """The coordinator model, one call at a time; ``slow_describes`` DescribeTransactions first wait ``delay_s`` of
    real time and then get no answer (a broker that went away while a recovery holds the row lock)."""

    def __init__(self) -> None:
        self.model = CoordinatorModel(transaction_version=2, two_phase_enabled=True)
        super().__init__(ModelTransport(self.model, Faults()))
        self.slow_describes, self.delay_s = 0, 2.5

    def execute(self, transactional_id, command):
        if isinstance(command, DescribeTransaction) and self.slow_describes:
            self.slow_describes -= 1
            time.sleep(self.delay_s)
            self.faults.failed_describes.append(True)
        with self._lock:
            return self._transport.execute(transactional_id, command)


def make_db(postgres_dsn):
    db, _ = schema_database(postgres_dsn)
    connection = db.connect()
    connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    connection.commit()
    connection.close()
    return db


def make_pool(connect, transport: SlowTransport, prefix: str, **options) -> DualWriterPool:
    config = {"bootstrap.servers": "model:9092", "transactional.id": prefix, "linger.ms": 0}
    pool = DualWriterPool(connect, config, size=options.pop("size", 1), lease_s=options.pop("lease_s", LEASE_S),
                          transport_for=lambda _: transport, **options)
    stop_keeper_thread(pool)
    return pool


def stop_keeper_thread(pool: DualWriterPool) -> None:
    """The test ticks the keeper itself (its connection stays open)."""
    pool._keeper.halt()


def order(pool: DualWriterPool, order_id: int) -> None:
    with pool.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (%s)", (order_id,))
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)


def lose_the_completion(transport: SlowTransport, pool: DualWriterPool, order_id: int) -> None:
    """The database commits the order; Kafka's completion never arrives: decided, still prepared."""
    with pytest.raises(DualWriteIncompleteError), pool.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (%s)", (order_id,))
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)
        transport.faults.dropped_requests.extend([True] * 5)
    transport.faults.dropped_requests.clear()


def tick_for(pool: DualWriterPool, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pool._keeper.tick()
        time.sleep(LEASE_S / 4)


def test_a_recovery_slower_than_a_lease_ends_its_own_session_and_the_keeper_never_settles_after(postgres_dsn):
    """Finding: the keeper settles an idle writer's decided transaction (DualWriteIncompleteError: the broker
    went away at completion). Its recovery holds the row lock while it asks Kafka (describe, bounded by max.block.ms,
    60 s by default), so a broker still away for longer than lease_s makes PostgreSQL end the writer's own session
    (idle_in_transaction_session_timeout = lease_s). The broker comes back; every later tick's settle fails at once
    on the dead connection (ConfigError 'has an open transaction', logged at DEBUG), while the same tick renews
    the lease, so no other pool ever reaps the id: the decided transaction stays prepared, pinning read_committed
    consumers, until a request happens to borrow that writer (and fails)."""
    db, transport, prefix = make_db(postgres_dsn), SlowTransport(), f"r-{uuid.uuid4().hex[:6]}"
    pool = make_pool(db.connect, transport, prefix)
    order(pool, 1)
    lose_the_completion(transport, pool, 2)
    assert len(transport.model.open_transactions()) == 1
    transport.slow_describes = 1  # the broker is still away at the keeper's first settle, for 2.5 leases
    pool._keeper.tick()
    writer = pool._set.writers[f"{prefix}-0"]
    print(f"\nafter the slow settle: writer connection closed={writer.connection.closed}")
    tick_for(pool, 4 * LEASE_S)  # the broker is back
    rows = pool._keeper._leases.rows()
    print(f"after 4 leases with a healthy broker: open Kafka transactions {len(transport.model.open_transactions())}, "
          f"lease {[(r.transactional_id, r.status) for r in rows]}")
    try:
        assert transport.model.open_transactions() == [], (
            "the keeper keeps renewing the lease of a writer it can no longer settle (its session was ended by "
            "the idle timeout during its own recovery); the DB-decided transaction stays prepared")
    finally:
        pool.close()


@pytest.mark.parametrize("keeper_limited", [False, True], ids=["as-is", "keeper-session-limited"])
def test_a_keeper_frozen_inside_its_renewal_does_not_pin_the_ids_forever(postgres_dsn, keeper_limited):
    """Finding: the keeper's own connection never gets idle_in_transaction_session_timeout (only writers' do).
    Its renewal locks every row of the process (UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)); a
    process frozen (SIGSTOP, GC) or cut off between that UPDATE and its COMMIT holds all those rows until TCP
    keepalive notices (hours), and every live pool's claim SKIPs them: the dead process's decided transaction is
    never settled and pins read_committed consumers."""
    db, transport, prefix = make_db(postgres_dsn), SlowTransport(), f"r-{uuid.uuid4().hex[:6]}"
    frozen = make_pool(db.connect, transport, prefix)
    order(frozen, 1)
    lose_the_completion(transport, frozen, 2)
    keeper = frozen._keeper
    del keeper_limited  # fixed: every lease transaction sets its own limit (SET LOCAL)
    with keeper._connection.cursor() as cursor:
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        print(f"\nkeeper session's idle_in_transaction_session_timeout: {cursor.fetchone()[0]}")
    keeper._connection.rollback()
    keeper._leases._db.commit = lambda: None  # the process freezes right after the renewal's UPDATE
    _, tokens, _ = frozen._set.snapshot()
    keeper._leases.lost(tokens, frozen._set.lease_s)  # the renewal, left uncommitted
    live = make_pool(db.connect, transport, prefix, min_size=0)
    try:
        tick_for(live, 5 * LEASE_S)
        expired = [name for name, _ in live._keeper._leases.expired()]
        print(f"expired leases seen by the live pool: {expired}; open Kafka transactions: "
              f"{len(transport.model.open_transactions())}")
        assert transport.model.open_transactions() == [], (
            "the frozen keeper's renewal still holds the row lock: the live pool cannot claim the expired id")
    finally:
        with contextlib.suppress(Exception):
            keeper._connection.rollback()
        live.close()
        frozen.close()


def test_a_writer_whose_sqlalchemy_connection_reconnected_keeps_the_idle_limit(postgres_dsn):
    """Finding: limit_idle_transactions is a session setting made once per connection at claim time. A SQLAlchemy
    Connection whose DBAPI connection was invalidated (a PostgreSQL restart, a failover, pg_terminate_backend)
    reconnects by itself on its next use when the pool did not replace the writer (the keeper's settle path never
    does): the new session has no idle_in_transaction_session_timeout, so a process frozen inside a block on it
    holds its row, and its expired id, until TCP keepalive notices."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    db, transport, prefix = make_db(postgres_dsn), SlowTransport(), f"r-{uuid.uuid4().hex[:6]}"
    engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=db.connect, pool_size=5)
    pool = make_pool(engine, transport, prefix)
    try:
        order(pool, 1)
        lose_the_completion(transport, pool, 2)
        writer = pool._set.writers[f"{prefix}-0"]
        pid = writer.connection.connection.dbapi_connection.info.backend_pid
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(3):  # the first settle finds the connection dead; a later one runs on a reconnected one
            pool._keeper.tick()
        assert transport.model.open_transactions() == []
        with pool.transaction() as tx:  # the limit is the transaction's own (SET LOCAL): on any session
            setting = tx.connection.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
            tx.produce("t", value=b"3", key=b"3", partition=0)
        print(f"\nafter SQLAlchemy reconnected the writer: idle_in_transaction_session_timeout = {setting}")
        assert setting != "0", "a writer runs on a session PostgreSQL never ends when its process freezes"
    finally:
        pool.close()
        engine.dispose()


def test_a_pools_idle_limit_does_not_leak_into_the_applications_engine(postgres_dsn):
    """Finding: with an Engine (the documented way), each writer's connection is checked out of the application's
    own pool and gets idle_in_transaction_session_timeout = lease_s for the session; when the writer retires the
    DBAPI connection goes back to the application's pool still carrying it, and an unrelated application
    transaction idle for 15 s (a report, a slow HTTP call) is killed with FATAL 25P03."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    db, transport, prefix = make_db(postgres_dsn), SlowTransport(), f"r-{uuid.uuid4().hex[:6]}"
    engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=db.connect, pool_size=2, max_overflow=0)
    pool = make_pool(engine, transport, prefix, min_size=0)
    order(pool, 1)
    pool.close()
    try:
        with engine.connect() as first, engine.connect() as second:  # every connection of the application's pool
            settings = [c.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() for c in (first, second)]
        print(f"\nthe application's engine connections after the pool closed: {settings}")
        assert settings == ["0", "0"]
    finally:
        engine.dispose()


def test_a_live_pool_keeps_its_leases_while_its_keeper_waits_for_kafka(postgres_dsn):
    """Finding: one keeper thread renews AND settles/reaps, in that order, in one tick. A settle (or each of up to
    8 reaps per tick) waits for Kafka up to max.block.ms (60 s by default) while lease_s is 15 s, so a broker outage
    starves the renewals: every idle lease of a live, healthy process expires, and when the broker is back the
    fleet's keepers take each other's ids over (fencing idle writers, recovering ids that needed nothing)."""
    db, transport, prefix = make_db(postgres_dsn), SlowTransport(), f"r-{uuid.uuid4().hex[:6]}"
    lease_s = 2.0  # renewals every 0.67 s: room for a loaded machine's scheduling
    live = make_pool(db.connect, transport, prefix, size=2, min_size=2, lease_s=lease_s)
    lose_the_completion(transport, live, 1)  # one writer unfinished (the broker went away); the other idle
    held = live._set.snapshot()[1]
    other = make_pool(db.connect, transport, prefix, size=1, min_size=0, lease_s=lease_s)
    other._keeper.start()  # another process of the fleet, claiming whatever lease expires
    try:
        transport.slow_describes, transport.delay_s = 1, 2.5 * lease_s  # the settle waits for the broker
        live._keeper.start()  # its threads (make_pool stopped them): the watcher renews while the worker waits
        time.sleep(3 * lease_s)
        taken = [tid for tid, token in held.items() if not live._keeper._leases.holds(tid, token)]
        print(f"\nids of the live pool taken over by another pool while its keeper waited for Kafka: {taken}")
        assert taken == [], "a live pool lost its leases because its keeper waited for Kafka"
    finally:
        other.close()
        live.close()


def test_a_recovery_that_waited_for_kafka_longer_than_the_lease_lets_the_row_go_with_the_lease_renewed(postgres_dsn):
    """Finding (the clean-clone CI at 36864b6, in the test above): a settle that waits for Kafka longer than lease_s
    holds the id's row, so the watcher's renewals skip it, and it used to roll back with the lease run out. Another
    process's claim could take the id before the keeper renewed it after the failure: a live pool lost an id to a
    process that could do no better. A recovery for a caller that keeps the id (the keeper's settle, a request)
    renews its lease before it lets the row go; one on a path that gives the id up (a reap, a retirement, a failed
    start) does not, so a healthy process can take the id at once (the review of b4ffb6a)."""
    db, transport, prefix = make_db(postgres_dsn), SlowTransport(), f"r-{uuid.uuid4().hex[:6]}"
    pool = make_pool(db.connect, transport, prefix, size=1, min_size=1)
    lose_the_completion(transport, pool, 1)
    (transactional_id, token), = pool._set.snapshot()[1].items()
    writer = pool._set.take_idle(transactional_id)
    assert writer is not None

    def fail_slowly(keep_lease: bool) -> tuple[bool, float]:
        transport.slow_describes, transport.delay_s = 1, 2 * LEASE_S
        with pytest.raises(BrokerUnavailableError):
            writer.recover_unfinished(keep_lease=keep_lease)
        with contextlib.closing(db.connect()) as connection:
            owner, left_s = connection.execute(
                "SELECT lease_owner, lease_expires - EXTRACT(EPOCH FROM clock_timestamp()) "
                "FROM kafka2pc_dual_write_state WHERE transactional_id = %s", (transactional_id,)).fetchone()
        print(f"\nkeep_lease={keep_lease}: after a recovery that waited {2 * LEASE_S:g} s for Kafka (lease "
              f"{LEASE_S:g} s): lease owner is ours {owner == token}, {left_s:.2f} s left")
        return owner == token, float(left_s)

    try:
        ours, left_s = fail_slowly(keep_lease=True)
        assert ours and left_s > LEASE_S / 2, "the row was let go with its lease run out"
        ours, left_s = fail_slowly(keep_lease=False)
        assert ours and left_s < 0, "a recovery on a path that gives the id up kept it for another lease"
    finally:
        pool._set.give_back(writer)
        pool.close()


@pytest.mark.parametrize("how", ["session ended", "fenced in Kafka"])
def test_a_block_that_outlives_its_lease_raises_a_retriable_error_and_the_pool_goes_on(postgres_dsn, how):
    """Finding (the soak, issue 32: a broker SIGKILLed or SIGSTOPped under a fleet with lease_s=5): a request whose
    block waited for Kafka longer than lease_s reached the application as psycopg's IdleInTransactionSessionTimeout
    (PostgreSQL ended the session) or as ProducerFencedError, a FatalError (another process claimed the lapsed id and
    its recovery fenced the producer): neither is a RetriableError, though both sides rolled back and the pool goes
    on with another writer. The pool raises LeaseLostError (RetriableError), the cause chained."""
    db, transport, prefix = make_db(postgres_dsn), SlowTransport(), f"r-{uuid.uuid4().hex[:6]}"
    pool = make_pool(db.connect, transport, prefix, size=1, min_size=1)
    try:
        with pytest.raises(Exception) as raised, pool.transaction() as tx:
            tx.cursor.execute("INSERT INTO orders VALUES (%s)", (1,))
            tx.produce("t", value=b"1", key=b"1", partition=0)
            time.sleep(2.5 * LEASE_S)  # idle in its transaction for longer than the lease: PostgreSQL ends it
            if how == "fenced in Kafka":  # and another process, which claimed the lapsed id, recovered it
                transport.model.init_producer_id(tx._producer.transactional_id,
                                                  InitProducerId(transaction_timeout_ms=60_000, enable_2pc=True))
                tx.produce("t", value=b"1", key=b"1", partition=1)  # the block's next records: fenced
                time.sleep(0.5)
                tx.produce("t", value=b"1", key=b"1", partition=1)
        print(f"\n{how}: the application saw {type(raised.value).__name__} (retriable: "
              f"{isinstance(raised.value, RetriableError)}), cause {type(raised.value.__cause__).__name__}")
        assert isinstance(raised.value, LeaseLostError), repr(raised.value)
        order(pool, 2)  # the pool goes on, with another writer
        assert db.ids() == [2]
    finally:
        pool.close()
    assert transport.model.committed_records() == [b"2"]


@pytest.mark.parametrize("limit", ["connection", "set later"])
@pytest.mark.parametrize("how", ["the block exits", "the block raises", "its next statement is refused"])
def test_a_session_limit_of_its_own_ending_what_the_application_began_after_committing_inside_is_never_retriable(
        postgres_dsn, how, limit):
    """Finding (review of 3e77408): the writer's idle limit belongs to its transaction, so once the application
    commits inside the block it is gone; a 25P03 after that comes from the session's own limit (set for the role,
    the database or the session) and says nothing of the writer's transaction. It was read as the lease's: the
    pool said LeaseLostError (retry) for rows the application had committed, or, when the block raised, hid the
    usage error. Only on a session without a limit of its own is a 25P03 the lease's; otherwise nobody can tell,
    and the pool never says retry. The session's limit is read as each transaction begins: one set on the connection
    by an earlier block (or by ALTER SYSTEM and a reload) counts too (the second review: it was read once)."""
    db = make_db(postgres_dsn)
    limited = db.url.removesuffix("'") + " -c idle_in_transaction_session_timeout=1500'"  # its options, and this
    pool = make_pool(lambda: psycopg.connect(db.url if limit == "set later" else limited), SlowTransport(),
                     f"r-{uuid.uuid4().hex[:6]}")
    try:
        if limit == "set later":
            with pool.transaction() as tx:  # a block that sets a limit for the session (SET outlives its commit)
                tx.cursor.execute("SET idle_in_transaction_session_timeout = 1500")
        with pytest.raises(Exception) as raised, pool.transaction() as tx:
            tx.cursor.execute("INSERT INTO orders VALUES (1)")
            tx.cursor.execute("COMMIT")  # the misuse: a commit past psycopg (which refuses commit() in the block)
            tx.cursor.execute("SELECT 1")  # a transaction of its own, under the session's limit only
            time.sleep(2.5)  # a slow call: PostgreSQL ends the session (25P03)
            if how == "the block raises":
                raise ValueError("the application's own error")
            if how == "its next statement is refused":
                tx.cursor.execute("SELECT 2")
        print(f"\n{how}: {type(raised.value).__name__} (retriable: {isinstance(raised.value, RetriableError)}), "
              f"cause {type(raised.value.__cause__).__name__}; committed {db.ids()}")
        assert db.ids() == [1]
        assert not isinstance(raised.value, RetriableError), repr(raised.value)
        if how == "the block raises":
            assert isinstance(raised.value, DualWriteUsageError), repr(raised.value)
    finally:
        pool.close()


def test_a_plain_writer_whose_session_limit_ended_the_block_says_so_beside_the_usage_error(postgres_dsn):
    """Leftover of issue 32: a plain DualWriter (no lease, so the session's own limit is not read) on a session with
    idle_in_transaction_session_timeout set. The block waits longer than that and raises: rolling back to the block's
    savepoint then fails, as it does after the application committed inside the block, so the error is
    DualWriteUsageError. It said only "the application committed or rolled back", which it had not: it now names the
    session ended by the database as the other reading (nothing of the block committed)."""
    db = make_db(postgres_dsn)
    connection = psycopg.connect(db.url.removesuffix("'") + " -c idle_in_transaction_session_timeout=1000'")
    writer = DualWriter(connection, {"bootstrap.servers": "model:9092", "transactional.id": f"s-{uuid.uuid4().hex[:6]}",
                                     "linger.ms": 0}, transport=SlowTransport())
    try:
        with pytest.raises(DualWriteUsageError) as raised, writer.transaction() as tx:
            tx.cursor.execute("INSERT INTO orders VALUES (1)")
            time.sleep(2.0)  # a slow call: PostgreSQL ends the session (25P03)
            raise ValueError("the application's own error")
        print(f"\n{raised.value}")
        assert "the database ended the session while the block ran" in str(raised.value)
        assert db.ids() == []
    finally:
        writer.close()
        connection.close()


@pytest.mark.parametrize("connect", ["dbapi", "engine"])
def test_the_keeper_works_again_after_its_connection_was_lost(postgres_dsn, connect):
    """Finding: the keeper's connection is made once (DualWriterPool.__init__) and never replaced. With a callable
    returning DB-API connections (psycopg), one PostgreSQL restart, failover or pg_terminate_backend leaves every
    pool of the fleet with a dead keeper for the rest of its life: each tick fails at its first statement (logged,
    retried forever), so no lease is renewed (idle ids are taken over), no unfinished writer settled, and no dead
    process's expired lease reaped: a process of the fleet that dies afterwards leaves its decided transaction
    prepared for good (only a demand claim that happens to pick that id settles it)."""
    db, transport, prefix = make_db(postgres_dsn), SlowTransport(), f"r-{uuid.uuid4().hex[:6]}"
    config = {"bootstrap.servers": "model:9092", "transactional.id": prefix, "linger.ms": 0}
    source = db.connect
    if connect == "engine":
        sqlalchemy = pytest.importorskip("sqlalchemy")
        source = sqlalchemy.create_engine("postgresql+psycopg://", creator=db.connect, pool_size=5)
    live = DualWriterPool(source, config, size=1, min_size=0, lease_s=LEASE_S, transport_for=lambda _: transport)
    keeper_connection = live._keeper._leases.table.connection
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:  # the database restarts (its sessions end)
        admin.execute("SELECT pg_terminate_backend(%s)", (keeper_connection.dbapi.info.backend_pid,))
    time.sleep(1)
    dead = make_pool(db.connect, transport, prefix)  # a process started after the restart, which then dies
    lose_the_completion(transport, dead, 1)
    try:
        deadline = time.monotonic() + 6 * LEASE_S
        while transport.model.open_transactions() and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"\n{connect}: keeper connection closed={keeper_connection.dbapi.closed}; open Kafka transactions "
              f"{len(transport.model.open_transactions())} after {6 * LEASE_S:g} s")
        assert transport.model.open_transactions() == [], "no keeper of the fleet settles the dead process's id"
    finally:
        live.close()
        dead.close()
