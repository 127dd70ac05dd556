"""Adversarial review of DualWriterPool's leases on MariaDB (f985beb, and 9b68360's new-id lock) and of 1b0e37d's
async start/close: a real MariaDB server (PostgreSQL for the async test), Kafka as the coordinator model (the
findings are the databases'). Each test asserts what the leases promise, with the failure it showed quoted in its
docstring. test_concurrent_claims_of_a_new_id_deadlock failed on f985beb and passes since 9b68360; the control
cases of the frozen-process test pass; the others fail on 9b68360."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from kafka2pc.dualwrite import blocking
from kafka2pc.dualwrite.actions import Commit
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import Lease, LeaseTable
from kafka2pc.dualwrite.state_table import StateTable
from tests.model.test_dual_write_pool import Cluster

pymysql = pytest.importorskip("pymysql")
mariadb = pytest.importorskip("kafka2pc_harness.mariadb")
pytestmark = pytest.mark.integration
TABLE = "kafka2pc_dual_write_state"


@pytest.fixture
def url(mariadb_url: str) -> str:
    """A database of its own on the session's MariaDB server (its default collation: case-insensitive), with an
    orders table."""
    name = f"r_{uuid.uuid4().hex[:10]}"
    with mariadb.connect(mariadb_url) as admin:
        admin.cursor().execute(f"CREATE DATABASE {name}")
    made = mariadb_url.rsplit("/", 1)[0] + f"/{name}"
    with mariadb.connect(made) as connection:
        connection.cursor().execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        connection.commit()
    return made


def leases(url: str, prefix: str, lease_s: float = 30) -> LeaseTable:
    table = LeaseTable(StateTable(adapt(mariadb.connect(url)), TABLE), prefix, lease_s=lease_s)
    blocking.run(table.table.ensure_leasing(), table.table.connection)
    return table


def paused_before_commit(table: LeaseTable, token: str, *, max_ids: int | None) -> Callable[[], Lease]:
    """Run a claim up to its COMMIT (its statements done, its transaction open: any process between the two);
    returns what commits it."""
    steps, reply = table.statements.claim(token, "paused", 30, max_ids=max_ids), None
    while True:
        action = steps.send(reply)
        if isinstance(action, Commit):
            break
        reply = blocking.perform(action, table.table.connection)

    def commit() -> Lease:
        """The COMMIT, and what follows it (9b68360: the new-id lock's release)."""
        reply = blocking.perform(Commit(), table.table.connection)
        try:
            while True:
                reply = blocking.perform(steps.send(reply), table.table.connection)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    return commit


def test_concurrent_claims_of_a_new_id_deadlock(url: str) -> None:
    """Three claims need a new id at once (a fleet's first start, a burst of load): the first inserts shop-0, the
    other two read the old MAX under READ COMMITTED and INSERT IGNORE shop-0 too, waiting for the first; when it
    commits both hold a shared lock on the duplicate and both UPDATE it (_adopt_row, a unique search: no
    semi-consistent read): a lock cycle. On f985beb one died with the server's deadlock, raised to the caller (a
    pool's constructor, or a request's lend); 9b68360's new-id lock fixed it:
    ``AssertionError: ... "OperationalError(1213, 'Deadlock found when trying to get lock; ...')"``"""
    first = leases(url, "shop")
    commit = paused_before_commit(first, "first", max_ids=None)  # shop-0 inserted, not committed
    outcomes: dict[str, object] = {}

    def claim(name: str) -> None:
        try:
            outcomes[name] = leases(url, "shop").claim(name, name, 30, max_ids=None)
        except Exception as exc:
            outcomes[name] = repr(exc)

    others = [threading.Thread(target=claim, args=(name,)) for name in ("second", "third")]
    for thread in others:
        thread.start()
    time.sleep(1.0)  # both wait for shop-0's insert
    assert commit().transactional_id == "shop-0"
    for thread in others:
        thread.join(60)
    print(f"\nthe other two claims: {outcomes}")
    assert all(isinstance(outcome, Lease) for outcome in outcomes.values()), outcomes


def test_a_process_frozen_after_a_new_id_claim_does_not_stop_the_fleets_growth(url: str) -> None:
    """9b68360's new-id lock (GET_LOCK) belongs to the session, not the transaction, and is released by a statement
    after the claim's COMMIT. A process that stops between the two (SIGSTOP) holds it with no transaction open, so
    idle_transaction_timeout never ends its session: wait_timeout does (8 h by default). Meanwhile every claim of the
    fleet that needs a new id (its ids all leased, the frozen one's reaped) waits lease_s for the lock and fails: the
    fleet cannot grow for hours. On 9b68360:
    ``kafka2pc.errors.PoolTimeoutError: fleet 'shop': another process held the new-id lock for 2 s; retry``"""
    frozen = leases(url, "shop", lease_s=2)
    steps, reply = frozen.statements.claim("frozen", "frozen", 2, max_ids=None), None
    while not isinstance(action := steps.send(reply), Commit):
        reply = blocking.perform(action, frozen.table.connection)
    blocking.perform(Commit(), frozen.table.connection)  # shop-0 is the frozen one's; its next statement never comes
    time.sleep(3)  # longer than the session's idle limit
    live = leases(url, "shop", lease_s=2)
    cursor = live.table.connection.given.cursor()
    cursor.execute("SELECT IS_USED_LOCK(%s) IS NOT NULL", (f"kafka2pc-fleet:{TABLE}:shop",))
    print(f"\nthe frozen session still holds the new-id lock after 3 s: {bool(cursor.fetchone()[0])}")
    live.table.connection.given.rollback()
    try:
        reaped = live.claim("live", "live", 2, max_ids=None)  # the frozen one's expired lease, to settle
        assert reaped is not None and reaped.transactional_id == "shop-0"
        grown = live.claim("more", "live", 2, max_ids=None)  # the fleet needs one id more: a new one
    finally:
        frozen.table.connection.given.close()  # the frozen process dies at last: its lock goes with its session
        with contextlib.suppress(BaseException):
            steps.close()
    assert grown is not None and grown.transactional_id == "shop-1"


def test_a_claim_in_progress_does_not_hide_every_free_id(url: str) -> None:
    """``SELECT ... ORDER BY fleet_index LIMIT 1 FOR UPDATE SKIP LOCKED``: fleet_index has no index, so InnoDB
    reads, locks and sorts every free row before the LIMIT (PostgreSQL locks only the row returned); fixed by
    locking the candidates one at a time by their key (LeaseStatements._lock_first). While one
    claim is open every free id is locked, and a concurrent claim skips them all: with max_ids it finds nothing
    (the pool waits, then PoolTimeoutError 'fleet full'); without, it mints a new id. On f985beb:
    ``AssertionError: a concurrent claim got None, with shop-1 and shop-2 free``"""
    fleet = leases(url, "shop")
    held = [fleet.claim(f"t{n}", "setup", 30, max_ids=None) for n in range(3)]
    for lease in held:
        assert lease is not None
        fleet.release(lease.transactional_id, lease.token)
    commit = paused_before_commit(fleet, "first", max_ids=3)
    try:
        second = leases(url, "shop").claim("second", "second", 30, max_ids=3)
    finally:
        commit()
    assert second is not None, "a concurrent claim got None, with shop-1 and shop-2 free"
    assert second.transactional_id == "shop-1"


def test_two_fleets_whose_prefixes_differ_in_case_never_share_ids(url: str) -> None:
    """Kafka's transactional ids are case-sensitive; the state table's columns take the database's collation,
    case-insensitive by default (latin1_swedish_ci here, utf8mb4_general_ci or utf8mb4_uca1400_ai_ci elsewhere),
    so ``fleet = 'SHOP'`` and the range 'SHOP-' <= id < 'SHOP.' match fleet shop's rows. On f985beb fleet SHOP
    leases shop-0 (and its writer then uses Kafka id shop-0, with SHOP's configuration: another cluster, another
    principal). docs/dual-write.md (6fa099e) now says "do not do that"; nothing refuses it. On 9b68360:
    ``AssertionError: fleet 'SHOP' leased 'shop-0'``"""
    lower = leases(url, "shop")
    mine = lower.claim("lower", "lower", 30, max_ids=None)
    assert mine is not None and mine.transactional_id == "shop-0"
    lower.release(mine.transactional_id, mine.token)  # free again, for fleet shop's next claim
    upper = leases(url, "SHOP").claim("upper", "upper", 30, max_ids=None)
    assert upper is not None
    assert upper.transactional_id.startswith("SHOP-"), f"fleet 'SHOP' leased {upper.transactional_id!r}"


def _frozen_block_is_settled(url: str, setting: str | None, *, write: bool) -> tuple[bool, list[BaseException]]:
    """A pooled writer's process stops inside its block (the block wrote a row, or only locked its state row);
    whether a live pool claimed and settled the id while it slept. ``setting``: a session variable the server gives
    every connection (a DBA's my.cnf), set here by the connect callable."""
    cluster = Cluster()

    def connect() -> Any:
        connection = mariadb.connect(url)
        if setting is not None:
            connection.cursor().execute(f"SET SESSION {setting} = 60")
        return connection

    frozen = cluster.pool(connect, size=1, lease_s=2)
    inside, woke = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def freeze() -> None:
        try:
            with frozen.transaction() as tx:
                if write:
                    tx.cursor.execute("INSERT INTO orders (id) VALUES (1)")
                tx.produce("t", value=b"1", key=b"1", partition=0)
                inside.set()
                time.sleep(8)  # SIGSTOP: the client sends nothing
        except BaseException as exc:
            failure.append(exc)
        finally:
            inside.set()
            woke.set()

    thread = threading.Thread(target=freeze)
    thread.start()
    assert inside.wait(30)
    frozen._keeper.halt()  # the whole process is frozen: its keeper renews nothing either
    live = cluster.pool(connect, size=1, min_size=0, lease_s=2)
    settled = 0
    try:
        for _ in range(30):  # bounded: 6 s, while the frozen one sleeps
            settled += live.settle_expired()
            if settled or woke.is_set():
                break
            time.sleep(0.2)
        claimed_while_frozen = settled > 0 and not woke.is_set()
        thread.join(30)
    finally:
        live.close()
        frozen.close()
    return claimed_while_frozen, failure


@pytest.mark.parametrize(("setting", "write"), [  # the controls and the read-only case in make chaos (suite time)
    pytest.param(None, True, id="control-wrote", marks=pytest.mark.slow),
    pytest.param(None, False, id="control-locked-only", marks=pytest.mark.slow),
    pytest.param("idle_write_transaction_timeout", True, id="idle_write_transaction_timeout"),
    pytest.param("idle_readonly_transaction_timeout", False, id="idle_readonly_transaction_timeout",
                 marks=pytest.mark.slow),
])
def test_a_frozen_block_frees_its_id_whatever_idle_limits_the_server_sets(url: str, setting: str | None,
                                                                          write: bool) -> None:
    """MariaDB ends a session idle in a transaction after idle_write_transaction_timeout (a transaction that wrote)
    or idle_readonly_transaction_timeout (one that did not) when those are non-zero, and only otherwise after
    idle_transaction_timeout, the one variable the writer sets (and checks). A server that sets either (a DBA's
    my.cnf, 60 s here) keeps a frozen process's row locked that long, not a lease: nobody can settle its id, and its
    open 2PC transaction (which no broker timeout aborts) holds back the partitions' LSO meanwhile. On f985beb the
    control cases pass and the two others fail:
    ``AssertionError: the frozen session kept its row locked: no live pool could settle its id``"""
    claimed_while_frozen, failure = _frozen_block_is_settled(url, setting, write=write)
    print(f"\n{setting or 'no other limit'} ({'wrote' if write else 'locked only'}): claimed while frozen: "
          f"{claimed_while_frozen}; the frozen block ended with {failure!r:.120}")
    assert claimed_while_frozen, "the frozen session kept its row locked: no live pool could settle its id"


def test_the_lease_limit_does_not_outlive_the_pool_on_an_engines_connections(url: str) -> None:
    """A pool made on the application's SQLAlchemy Engine (DualWriterPool's documented ``connect``) checks its
    connections out and returns them to the Engine's pool on close or retirement, with the session's
    idle_transaction_timeout still set to the lease (PostgreSQL's limit is SET LOCAL: it never outlives the
    transaction). The application's later transaction on that connection, idle longer than a lease (a slow call
    between two statements), has its session killed. On f985beb:
    ``AssertionError: the engine's connections after the pool: idle_transaction_timeout [2, 2, ...]``"""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(url.replace("mysql://", "mysql+pymysql://"), pool_size=4, max_overflow=0)
    try:
        with engine.connect() as before:
            server_default = before.exec_driver_sql("SELECT @@idle_transaction_timeout").scalar()
        pool = Cluster().pool(engine, size=2, lease_s=2)
        with pool.transaction() as tx:
            tx.connection.exec_driver_sql("INSERT INTO orders (id) VALUES (1)")
            tx.produce("t", value=b"1", key=b"1", partition=0)
        pool.close()
        connections = [engine.connect() for _ in range(4)]  # every pooled connection (all the pool used)
        limits = [c.exec_driver_sql("SELECT @@idle_transaction_timeout").scalar() for c in connections]
        killed: list[str] = []
        for connection in connections:
            connection.rollback()
        leaked = next((c for c, limit in zip(connections, limits, strict=True) if limit != server_default), None)
        if leaked is not None:  # the application's own transaction on it, with a pause of 3 s between statements
            try:
                leaked.exec_driver_sql("SELECT COUNT(*) FROM orders").scalar()
                time.sleep(3)
                leaked.exec_driver_sql("SELECT COUNT(*) FROM orders").scalar()
                leaked.commit()
            except sqlalchemy.exc.DBAPIError as exc:
                killed.append(repr(exc.orig)[:100])
        for connection in connections:
            connection.close()
        print(f"\nserver default {server_default}; the engine's connections after the pool: {limits}; "
              f"the application's transaction: {killed or 'fine'}")
        assert limits == [server_default] * 4, \
            f"the engine's connections after the pool: idle_transaction_timeout {limits}; application: {killed}"
    finally:
        engine.dispose()


def test_close_during_a_start_in_progress_leaves_no_keeper_running(postgres_dsn: str) -> None:
    """1b0e37d (AsyncDualWriterPool, PostgreSQL): start() now sets ``self._keeper`` only once the start succeeded,
    and close() neither takes ``_starting`` nor knows the start's keeper. A shutdown (FastAPI's lifespan exit)
    while a request's start() recovers on a slow broker: close() stops no keeper; the start then succeeds on the
    closed pool and starts the worker too, so the closed pool's watcher and worker keep running (renewing, reaping
    the fleet's expired leases) until the loop ends and cancels them mid-round, the case 1b0e37d meant to end. On
    1b0e37d: ``AssertionError: ['kafka2pc-lease-watcher-shop', 'kafka2pc-lease-worker-shop']``"""
    from tests.model.test_dual_write_async_pool import Fleet  # noqa: PLC0415 - PostgreSQL's test only
    from tests.model.test_review_async_pool_cancel import Gate  # noqa: PLC0415

    fleet = Fleet(postgres_dsn, "psycopg")
    gate = Gate(fleet.transport)
    fleet.transport = gate  # type: ignore[assignment]

    async def scenario() -> list[str]:
        pool = fleet.pool(size=1, lease_s=4.0)
        gate.shut()
        starting = asyncio.create_task(pool.start())  # a request's transaction() starting the pool
        assert await asyncio.to_thread(gate.waiting.wait, 10), "the start never reached the broker"
        closing = asyncio.create_task(pool.close())  # the lifespan's shutdown, while the start waits on the broker
        await asyncio.sleep(0.3)
        gate.opened.set()  # the broker answers: the start ends, then the close (which waited for it) stops its keeper
        await closing
        with contextlib.suppress(Exception):
            await starting
        await asyncio.sleep(0.5)
        running = sorted(task.get_name() for task in asyncio.all_tasks()
                         if task.get_name().startswith("kafka2pc-lease") and not task.done())
        if pool._keeper is not None:  # cleanup only
            await pool._keeper.stop()
        return running

    running = asyncio.run(scenario())
    gate.opened.set()
    print(f"\nkeeper tasks still running after close(): {running}")
    assert running == []
