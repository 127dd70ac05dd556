"""Adversarial review of cf0bfe3 / f09a3cc / 90f6c80 (DatabaseConnectionLostError, MariaDB lease fixes): real
PostgreSQL and MariaDB, Kafka as the coordinator model. Each test asserts what the change promises; the ones that
fail show a finding (quoted in the docstring)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kafka2pc.dualwrite import DualWriter, blocking
from kafka2pc.dualwrite.actions import Commit, Sql
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import LeaseTable
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import RetriableError
from tests.model.test_dual_write_pool import Cluster

pytestmark = pytest.mark.integration
TABLE = "kafka2pc_dual_write_state"


# -- 1. a RetriableError for a block whose rows are committed -------------------------------------------------------


def test_a_block_that_committed_its_rows_is_never_told_to_retry(postgres_dsn: str) -> None:
    """SQLAlchemy lets the application commit the writer's transaction inside the block (``tx.connection.commit()``,
    or a helper / ORM Session doing it); psycopg and Django refuse that, SQLAlchemy does not and the writer has no
    block_misuse() for it, though SQLAlchemy's own Connection knows (its root transaction is no longer the one the
    writer began). If the connection is then lost (failover, restart, pooler) the pool says
    DatabaseConnectionLostError, "the writer committed nothing ... retry": the client retries and the order is
    written twice, its first copy never evented."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    psycopg = pytest.importorskip("psycopg")
    orders = f"orders_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE TABLE {orders} (id INTEGER PRIMARY KEY)")
    engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(postgres_dsn))
    cluster = Cluster()
    cluster.config = {**cluster.config, "transactional.id": f"cl-{uuid.uuid4().hex[:6]}"}
    pool = cluster.pool(engine, size=1, lease_s=30)
    failure: list[BaseException] = []
    try:
        try:
            with pool.transaction() as tx:
                tx.connection.execute(sqlalchemy.text(f"INSERT INTO {orders} VALUES (1)"))
                tx.produce("t", value=b"1", key=b"1", partition=0)
                pid = tx.connection.execute(sqlalchemy.text("SELECT pg_backend_pid()")).scalar()
                tx.connection.commit()  # the application (a helper, an ORM session) commits inside the block
                with psycopg.connect(postgres_dsn, autocommit=True) as admin:  # then the connection is lost
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        except Exception as exc:
            failure.append(exc)
    finally:
        pool.close()
        engine.dispose()
    with psycopg.connect(postgres_dsn) as check:
        committed = [row[0] for row in check.execute(f"SELECT id FROM {orders}")]
    print(f"\nrows committed: {committed}; Kafka: {cluster.kafka_ids()}; the request got {failure!r:.300}")
    assert failure, "the block ended with its connection gone: an error was expected"
    assert committed == [1], "the scenario needs the application's own commit to have landed"
    assert not isinstance(failure[0], RetriableError), (
        f"told to retry, yet rows {committed} are committed without their events: {failure[0]!r:.200}")


# -- 2. the claim's insert loop adopts another writer's id, differing in case (MariaDB) ------------------------------


@pytest.fixture
def maria(mariadb_url: str) -> str:
    """A database of its own on the session's MariaDB server (its default collation: case-insensitive)."""
    mariadb = pytest.importorskip("kafka2pc_harness.mariadb")
    name = f"r_{uuid.uuid4().hex[:10]}"
    with mariadb.connect(mariadb_url) as admin:
        admin.cursor().execute(f"CREATE DATABASE {name}")
    return mariadb_url.rsplit("/", 1)[0] + f"/{name}"


def _connect(url: str):
    mariadb = pytest.importorskip("kafka2pc_harness.mariadb")
    return mariadb.connect(url)


def _leases(url: str, prefix: str, lease_s: float = 30) -> LeaseTable:
    table = LeaseTable(StateTable(adapt(_connect(url)), TABLE), prefix, lease_s=lease_s)
    blocking.run(table.table.ensure_leasing(), table.table.connection)
    return table


def test_a_fleet_never_leases_a_standalone_writers_id_differing_in_case(maria: str) -> None:
    """A standalone DualWriter on transactional.id 'SHOP-0' (its row: fleet NULL) and a pool of prefix 'shop' share
    the state table. f09a3cc compares fleets byte for byte, but the claim's insert loop, after INSERT IGNORE 'shop-0'
    hits 'SHOP-0' (the case-insensitive key), runs _adopt_row('shop-0'), whose ``transactional_id = ?`` matches
    'SHOP-0' too: the standalone writer's row joins fleet 'shop' as an expired lease, and the next claim leases
    'SHOP-0' (adopt() itself checks names with a case-sensitive regex and would not). The pool's writer would then
    recover Kafka id 'SHOP-0', fencing the standalone writer in Kafka and in its row."""
    cluster = Cluster()
    standalone = DualWriter(_connect(maria), {**cluster.config, "transactional.id": "SHOP-0"},
                            transport=cluster.transport)
    standalone.recover()  # its row: owner set, fleet NULL
    fleet = _leases(maria, "shop")
    leased = []
    for _ in range(3):
        lease = fleet.claim(uuid.uuid4().hex, "pool", 30, max_ids=None)
        assert lease is not None
        leased.append(lease.transactional_id)
    with _connect(maria) as check:
        cursor = check.cursor()
        cursor.execute(f"SELECT fleet FROM {TABLE} WHERE BINARY transactional_id = 'SHOP-0'")
        fleet_of_standalone = cursor.fetchone()[0]
    standalone.close()
    print(f"\nfleet 'shop' leased {leased}; the standalone row 'SHOP-0' is now in fleet {fleet_of_standalone!r}")
    assert all(name.startswith("shop-") for name in leased), leased
    assert fleet_of_standalone is None


# -- 3. the new-id lock released inside the claim's transaction: a lock cycle comes back (MariaDB) ------------------


def test_a_claim_meeting_an_uncommitted_new_id_never_deadlocks_its_first_user(maria: str) -> None:  # noqa: PLR0915
    """f09a3cc releases the new-id lock before the claim's COMMIT, so the next claim reads the old MAX (READ
    COMMITTED), INSERT IGNOREs the same number and waits; when the first commits it holds a shared lock on the
    duplicate and then UPDATEs it (_adopt_row): the lock cycle test_concurrent_claims_of_a_new_id_deadlock found, now
    with the first claim's new writer (its recovery's SELECT ... FOR UPDATE on its own new id) as the third
    session. Driven deterministically: claim A up to its COMMIT, claim B into its INSERT, A commits, A's writer
    locks its row, B adopts."""
    a, b = _leases(maria, "shop"), _leases(maria, "shop")
    steps_a, reply = a.statements.claim("tok-a", "a", 30, max_ids=None), None
    while True:  # A: everything up to its COMMIT (its new-id lock already released)
        action = steps_a.send(reply)
        if isinstance(action, Commit):
            break
        reply = blocking.perform(action, a.table.connection)
    steps_b, reply_b = b.statements.claim("tok-b", "b", 30, max_ids=None), None
    inserted = threading.Event()
    state: dict[str, object] = {}

    def claim_b() -> None:  # B: up to its INSERT IGNORE of A's number (which waits for A), then one step more
        nonlocal reply_b
        try:
            while True:
                action = steps_b.send(reply_b)
                reply_b = blocking.perform(action, b.table.connection)
                if isinstance(action, Sql) and action.text.startswith("INSERT"):
                    state["b_inserted"] = reply_b
                    inserted.set()
                    state["b_next"] = steps_b.send(reply_b)  # the _adopt_row UPDATE, held back
                    return
        except Exception as exc:
            state["b_error"] = exc
            inserted.set()

    thread_b = threading.Thread(target=claim_b, daemon=True)
    thread_b.start()
    time.sleep(0.5)  # B waits on A's uncommitted row
    blocking.perform(Commit(), a.table.connection)  # A commits
    with pytest.raises(StopIteration):
        steps_a.send(None)
    assert inserted.wait(10), "B's INSERT IGNORE never returned"
    user = _connect(maria)  # A's new writer: its first recovery locks the row of its new id
    locked: dict[str, object] = {}

    def recover_a() -> None:
        try:
            cursor = user.cursor()
            cursor.execute(f"SELECT owner FROM {TABLE} WHERE transactional_id = 'shop-0' FOR UPDATE")
            locked["row"] = cursor.fetchone()
            user.rollback()
        except Exception as exc:
            locked["error"] = exc

    thread_a = threading.Thread(target=recover_a, daemon=True)
    thread_a.start()
    time.sleep(0.5)  # A's writer waits behind B's shared lock
    b_error: BaseException | None = None
    try:
        reply_b = blocking.perform(state["b_next"], b.table.connection)  # type: ignore[arg-type]
        while True:
            reply_b = blocking.perform(steps_b.send(reply_b), b.table.connection)
    except StopIteration:
        pass
    except Exception as exc:
        b_error = exc
    thread_a.join(60)
    print(f"\nB inserted {state.get('b_inserted')!r}; B's claim ended with {b_error!r:.160}; A's writer: "
          f"{locked!r:.160}")
    assert "b_error" not in state, state
    assert b_error is None and "error" not in locked, (b_error, locked)
