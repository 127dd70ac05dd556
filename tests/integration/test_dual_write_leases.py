"""The lease statements of a fleet (kafka2pc.dualwrite.leases) on a real SQLite file and a real PostgreSQL server:
concurrent claims never share an id, a claim never takes (or waits for) a row a transaction holds, leases expire by
the database's clock and renewals extend only the holder's, old rows are adopted, a table made before leases gets
its columns (or names the DDL), and a frozen session's transaction is ended after a lease. No Kafka."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from kafka2pc.dualwrite.blocking import run
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import LeaseTable
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import ConfigError, ProducerFencedError

from .test_dual_write import Database, schema_database

pytestmark = pytest.mark.integration
OLD_DDL = ("CREATE TABLE kafka2pc_dual_write_state (transactional_id VARCHAR(249) PRIMARY KEY, owner VARCHAR(64), "
           "prepared_state VARCHAR(64), transaction_version INTEGER, completed INTEGER NOT NULL DEFAULT 1, "
           "two_phase INTEGER NOT NULL DEFAULT 0, txn_token VARCHAR(32))")  # the release before leases


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path) -> Database:
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        return Database(f"sqlite:{path}", lambda: sqlite3.connect(path, timeout=30, check_same_thread=False), "?")
    return schema_database(request.getfixturevalue("postgres_dsn"))[0]


def leases(connection: Any, prefix: str = "shop", *, create: bool = True) -> LeaseTable:
    return LeaseTable(StateTable(adapt(connection), "kafka2pc_dual_write_state", create=create), prefix)


def token() -> str:
    return uuid.uuid4().hex


def claim_at_once(db: Database, threads: int, each: int, max_ids: int) -> list[Any]:
    """``threads`` threads, each on its own connection, claim ``each`` times at once; the leases they got."""
    claimed: list[Any] = []
    errors: list[BaseException] = []
    guard, start = threading.Lock(), threading.Barrier(threads)

    def claim() -> None:
        connection = db.connect()
        try:
            table = leases(connection)
            start.wait(timeout=30)
            for _ in range(each):
                lease = table.claim(token(), "test:1", 30, max_ids=max_ids)
                if lease is not None:
                    with guard:
                        claimed.append(lease)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=claim) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not errors, errors
    return claimed


def test_concurrent_claims_never_share_an_id_and_stop_at_max_ids(db):
    connection = db.connect()
    table = leases(connection)
    run(table.table.ensure_leasing(), table.table.connection)
    new = claim_at_once(db, 8, 3, 20)
    names = sorted((lease.transactional_id for lease in new), key=lambda name: int(name.rsplit("-", 1)[1]))
    print(f"\n24 claims of new ids by 8 threads with max_ids=20: {len(new)} leases, {len(set(names))} distinct")
    assert names == [f"shop-{n}" for n in range(20)]
    for lease in new:
        assert table.release(lease.transactional_id, lease.token)
    free = claim_at_once(db, 8, 3, 20)  # the same ids, free now: each row to one claim only
    names = [lease.transactional_id for lease in free]
    print(f"24 claims of free ids: {len(free)} leases, {len(set(names))} distinct")
    assert sorted(names) == sorted(f"shop-{n}" for n in range(20))
    holders = {row[0]: row[1] for row in table.table.connection.cursor().execute(
        "SELECT transactional_id, lease_owner FROM kafka2pc_dual_write_state").fetchall()}
    assert all(holders[lease.transactional_id] == lease.token for lease in free)
    connection.rollback()
    connection.close()


def test_a_claim_takes_the_lowest_free_id_first_and_only_expired_ones_from_others(db):
    connection = db.connect()
    table = leases(connection)
    first, second, third = (table.claim(token(), "a:1", 30, max_ids=None) for _ in range(3))
    assert [first.index, second.index, third.index] == [0, 1, 2]
    assert table.release(second.transactional_id, second.token)
    assert not table.release(first.transactional_id, token())  # not the holder: nothing
    again = table.claim(token(), "b:2", 30, max_ids=None)
    assert again.transactional_id == "shop-1" and again.taken_from is None  # free, not taken over
    assert table.claim(token(), "b:2", 30, max_ids=None, expired_only=True) is None
    connection.close()


def test_leases_expire_by_the_database_clock_and_only_the_holder_renews(db):
    connection = db.connect()
    table = leases(connection)
    lease = table.claim(token(), "a:1", 1.0, max_ids=None)
    assert table.expired() == []
    time.sleep(1.3)
    assert [name for name, _ in table.expired()] == [lease.transactional_id]
    assert table.renew({lease.transactional_id: token()}, 30) == set()  # another token renews nothing
    assert table.renew({lease.transactional_id: lease.token}, 30) == {lease.transactional_id}
    assert table.expired() == []
    time.sleep(0.2)
    [row] = table.rows()
    assert row.status == "leased" and row.holder == "a:1" and 0 < row.heartbeat_age_s < 5
    connection.close()


def test_an_expired_lease_is_taken_over_and_its_holder_can_no_longer_write_the_row(db):
    connection = db.connect()
    table = leases(connection)
    old = table.claim(token(), "dead:1", 1.0, max_ids=None)
    time.sleep(1.3)
    new = table.claim(token(), "live:2", 30, max_ids=None, expired_only=True)
    assert new.transactional_id == old.transactional_id and new.taken_from == "dead:1" and new.expired_s > 0
    state = table.table
    run(state.begin_locked(old.transactional_id), state.connection)
    with pytest.raises(ProducerFencedError, match="taken over"):
        run(state.write(old.transactional_id, completed=True, lease=(old.token, 30)), state.connection)
    connection.rollback()
    run(state.begin_locked(old.transactional_id), state.connection)
    # the new holder writes
    run(state.write(old.transactional_id, completed=True, lease=(new.token, 30)), state.connection)
    connection.commit()
    connection.close()


def test_rows_of_a_fixed_prefix_are_adopted_and_others_left_alone(db):
    connection = db.connect()
    state = StateTable(adapt(connection), "kafka2pc_dual_write_state")
    for name in ("shop-0", "shop-7", "shop-x", "shop-01", "shop-2-1", "shopping-1", "other-1"):
        run(state.begin_locked(name), state.connection)
        connection.commit()
    table = LeaseTable(state, "shop")
    assert table.adopt() == 2
    assert [row.transactional_id for row in table.rows()] == ["shop-0", "shop-7"]
    assert table.claim(token(), "a:1", 30, max_ids=None).transactional_id == "shop-0"
    assert table.claim(token(), "a:1", 30, max_ids=None).transactional_id == "shop-7"
    assert table.claim(token(), "a:1", 30, max_ids=None).transactional_id == "shop-8"  # after the highest
    connection.close()


def test_a_table_made_before_leases_gets_the_columns_or_names_the_ddl(db):
    connection = db.connect()
    connection.cursor().execute(OLD_DDL)
    connection.cursor().execute(db.sql("INSERT INTO kafka2pc_dual_write_state (transactional_id, owner) "
                                       "VALUES ('shop-0', 'old-writer')"))
    connection.commit()
    # a writer outside a pool keeps working on it as it is
    unleased = StateTable(adapt(connection), "kafka2pc_dual_write_state", create=False)
    assert run(unleased.begin_locked("shop-0"), unleased.connection).owner == "old-writer"
    run(unleased.write("shop-0", completed=True), unleased.connection)
    connection.commit()
    assert not unleased.leasing
    with pytest.raises(ConfigError, match="ALTER TABLE kafka2pc_dual_write_state ADD COLUMN lease_owner"):
        leases(connection, create=False).claim(token(), "a:1", 30, max_ids=None)
    table = leases(connection)  # allowed to alter it: it does
    assert table.adopt() == 1
    assert table.claim(token(), "a:1", 30, max_ids=None).transactional_id == "shop-0"
    again = StateTable(adapt(connection), "kafka2pc_dual_write_state")
    assert run(again.begin_locked("shop-0"), again.connection).owner == "old-writer"
    connection.rollback()
    connection.close()


def test_an_adopted_id_can_be_claimed_in_the_same_instant(tmp_path):
    """Adoption makes an id expire "now" by the database's clock; a claim in the same millisecond (SQLite's clock
    resolution) must take it, not pass over it for a new id (the last CI: shop-1 instead of shop-0)."""
    passed_over = []
    for attempt in range(40):
        connection = sqlite3.connect(tmp_path / f"app{attempt}.db")
        connection.cursor().execute(OLD_DDL)
        connection.cursor().execute("INSERT INTO kafka2pc_dual_write_state (transactional_id, owner) "
                                    "VALUES ('shop-0', 'old-writer')")
        connection.commit()
        table = leases(connection)
        table.adopt()
        lease = table.claim(token(), "a:1", 30, max_ids=None)
        if lease is None or lease.transactional_id != "shop-0":
            passed_over.append(attempt)
        connection.close()
    assert passed_over == []


def test_a_claim_never_takes_or_waits_for_a_row_a_transaction_holds(postgres_dsn):
    """A zombie's open transaction holds its id's row (its lease expired): the claim passes over it at once."""
    db = schema_database(postgres_dsn)[0]
    zombie, live = db.connect(), db.connect()
    held = leases(zombie).claim(token(), "zombie:1", 1.0, max_ids=None)
    held_row = StateTable(adapt(zombie), "kafka2pc_dual_write_state")
    run(held_row.begin_locked(held.transactional_id), held_row.connection)  # and stays
    time.sleep(1.3)
    live.cursor().execute("SET statement_timeout = '3s'")  # a claim that waited for the lock would fail here
    live.commit()
    table = leases(live)
    assert [name for name, _ in table.expired()] == [held.transactional_id]
    assert table.claim(token(), "live:2", 30, max_ids=None, expired_only=True) is None
    assert table.claim(token(), "live:2", 30, max_ids=None).transactional_id != held.transactional_id
    zombie.rollback()
    assert table.claim(token(), "live:2", 30, max_ids=None, expired_only=True).transactional_id == \
        held.transactional_id
    zombie.close()
    live.close()


def test_a_frozen_session_inside_a_transaction_is_ended_after_a_lease(postgres_dsn):
    """A process stopped inside its transaction (SIGSTOP, a GC pause, a partition) holds its row until PostgreSQL
    ends the session, idle in the transaction for as long as a lease (SET LOCAL by the statement that locks the
    row): then the id can be claimed."""
    db = schema_database(postgres_dsn)[0]
    zombie, live = db.connect(), db.connect()
    held = leases(zombie).claim(token(), "zombie:1", 1.0, max_ids=None)
    state = StateTable(adapt(zombie), "kafka2pc_dual_write_state")
    state.idle_limit_ms = 1000  # a leased writer's: the lease
    run(state.begin_locked(held.transactional_id), state.connection)
    time.sleep(2.5)
    taken = leases(live).claim(token(), "live:2", 30, max_ids=None, expired_only=True)
    assert taken is not None and taken.transactional_id == held.transactional_id
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
        zombie.cursor().execute("SELECT 1")  # its session was ended: nothing it held can commit
    assert zombie.closed
    live.close()


def test_a_renewal_planned_before_a_release_does_not_bring_the_lease_back(db):
    """The keeper's watcher renews from a snapshot of the pool's leases while its worker retires a writer and gives
    its id back: a renewal landing after the release must leave the id free (found by the fleet kill test: a row
    'leased' with no holder after every process had exited)."""
    connection = db.connect()
    table = leases(connection)
    lease = table.claim(token(), "a:1", 30, max_ids=None)
    planned = {lease.transactional_id: lease.token}
    assert table.release(lease.transactional_id, lease.token)
    assert table.renew(planned, 30) == set()
    [row] = table.rows()
    assert row.status == "free" and row.holder is None, row
    connection.close()


def test_a_fleet_starting_at_once_gets_every_id_it_asks_for(postgres_dsn):
    """32 processes start at once on an empty fleet, each claiming new ids: every claim gets one (the benchmark's
    simulated deploy of 1000 pools found claims giving up with PoolTimeoutError, failing a pool's start)."""
    db = schema_database(postgres_dsn)[0]
    state = leases(db.connect()).table
    run(state.ensure_leasing(), state.connection)
    claimed = claim_at_once(db, 32, 10, 10_000)
    names = {lease.transactional_id for lease in claimed}
    print(f"\n320 claims of new ids by 32 connections at once: {len(claimed)} leases, {len(names)} distinct")
    assert len(claimed) == len(names) == 320
