"""Adversarial review of MariaDB claims (helper-49): what an open claim may lock. 4a7e420 read the fleet's ids off
an index on (fleet, fleet_index) with FORCE INDEX (InnoDB then kept the lock of every leased row the claim passed
over, and of a case-variant fleet's rows), reverted for candidates read without locks, each locked by its key
(LeaseStatements._lock_first). The failures quoted are 4a7e420's; all pass on the change after it. A real MariaDB
server; fixtures of test_review_mariadb_leases.py."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kafka2pc.dualwrite import blocking
from kafka2pc.dualwrite.actions import Fetch, Sql
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.leases import Lease, LeaseTable
from kafka2pc.dualwrite.state_table import StateTable
from tests.integration.test_review_mariadb_leases import TABLE, leases, paused_before_commit, url  # noqa: F401

pymysql = pytest.importorskip("pymysql")
mariadb = pytest.importorskip("kafka2pc_harness.mariadb")
pytestmark = pytest.mark.integration


def _token() -> str:
    return uuid.uuid4().hex


def test_a_claim_skips_a_row_a_writer_holds_at_once(url: str) -> None:  # noqa: F811
    """A writer's block holds its id's row (begin_locked); a claim must pass over the lock at once (SKIP LOCKED),
    not wait."""
    fleet = leases(url, "shop", lease_s=1)
    first = fleet.claim(_token(), "zombie", 1, max_ids=None)
    assert first is not None and first.transactional_id == "shop-0"
    zombie = StateTable(adapt(mariadb.connect(url)), TABLE)
    blocking.run(zombie.begin_locked("shop-0"), zombie.connection)  # and stays open
    time.sleep(1.3)  # shop-0's lease expired, its row still held
    live = leases(url, "shop", lease_s=30)
    live.table.connection.given.cursor().execute("SET SESSION innodb_lock_wait_timeout = 2")
    started = time.monotonic()
    assert live.claim(_token(), "live", 30, max_ids=None, expired_only=True) is None
    other = live.claim(_token(), "live", 30, max_ids=None)
    took = time.monotonic() - started
    zombie.connection.given.rollback()
    assert other is not None and other.transactional_id == "shop-1", other
    assert took < 1.5, took
    again = live.claim(_token(), "live", 30, max_ids=None, expired_only=True)
    assert again is not None and again.transactional_id == "shop-0"


def _case_variant_fleets(url: str) -> tuple[LeaseTable, LeaseTable]:  # noqa: F811
    """shop-0 (shop, 0), SHOP-1 (SHOP, 1), shop-2 (shop, 2), SHOP-3 (SHOP, 3): interleaved in the index, whose
    first column compares case-insensitively."""
    lower, upper = leases(url, "shop"), leases(url, "SHOP")
    got = [lower.claim("l0", "l", 30, max_ids=None), upper.claim("u0", "u", 30, max_ids=None),
           lower.claim("l1", "l", 30, max_ids=None), upper.claim("u1", "u", 30, max_ids=None)]
    names = [lease.transactional_id for lease in got if lease is not None]
    assert names == ["shop-0", "SHOP-1", "shop-2", "SHOP-3"], names
    return lower, upper


def test_a_claim_of_one_case_fleet_does_not_hide_the_others_free_ids(url: str) -> None:  # noqa: F811
    """Fleet shop's claim reads the index range fleet = 'shop' (case-insensitive: SHOP's rows too), rejecting SHOP's
    rows by BINARY fleet. In READ COMMITTED the rows a locking read rejects are unlocked, unless rejected inside
    InnoDB (index condition pushdown) where the lock stays. While shop's claim is open, SHOP's claim must still
    see SHOP-1."""
    lower, upper = _case_variant_fleets(url)
    # shop-0 stays leased: shop's claim passes over it and over SHOP-1
    upper.release("SHOP-1", "u0")
    upper.release("SHOP-3", "u1")
    lower.release("shop-2", "l1")
    commit = paused_before_commit(lower, "paused", max_ids=4)  # takes shop-2, passing over SHOP-1
    try:
        other = leases(url, "SHOP").claim("second", "second", 30, max_ids=4)
    finally:
        mine = commit()
    assert mine.transactional_id == "shop-2"
    assert other is not None and other.transactional_id == "SHOP-1", \
        f"fleet SHOP's claim got {other and other.transactional_id!r} while shop's claim was open, with SHOP-1 free"


def test_concurrent_claims_of_case_variant_fleets_never_cross(url: str) -> None:  # noqa: F811
    """Both fleets claim at once, from several sessions: every id leased is its own fleet's, none twice."""
    results: list[tuple[str, Lease | str | None]] = []
    lock = threading.Lock()

    def run(prefix: str, n: int) -> None:
        table = leases(url, prefix)
        for i in range(3):
            try:
                got: Lease | str | None = table.claim(f"{prefix}{n}-{i}", prefix, 30, max_ids=None)
            except Exception as exc:
                got = repr(exc)
            with lock:
                results.append((prefix, got))
        table.table.connection.given.close()

    leases(url, "shop"), leases(url, "SHOP")
    threads = [threading.Thread(target=run, args=(p, n)) for p in ("shop", "SHOP") for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    errors = [r for r in results if not isinstance(r[1], Lease)]
    assert not errors, errors
    ids = [lease.transactional_id for _, lease in results]  # type: ignore[union-attr]
    assert len(ids) == len(set(ids)), ids
    assert all(lease.transactional_id.startswith(f"{p}-") for p, lease in results), results  # type: ignore


def _leased_and_free(url: str) -> tuple[LeaseTable, Lease]:  # noqa: F811
    """shop-0 leased (a live pool's writer holds it), shop-1 free."""
    fleet = leases(url, "shop")
    mine = fleet.claim("live-token", "live", 30, max_ids=None)
    other = fleet.claim("t1", "setup", 30, max_ids=None)
    assert mine is not None and other is not None
    fleet.release(other.transactional_id, other.token)
    return fleet, mine


def test_a_claim_in_progress_does_not_block_the_writer_of_a_leased_id(url: str) -> None:  # noqa: F811
    """Another pool's claim is between its SELECT and its COMMIT (a few ms; up to lease_s when its process freezes
    there, or when it waits lease_s on GET_LOCK for a new id). The claim read shop-0 off the index, rejected it
    (leased) and, unlike the primary-key scan before 4a7e420, kept its row lock: the live writer of shop-0 cannot
    begin its transaction (begin_locked's SELECT ... FOR UPDATE waits for the claim)."""
    _fleet, mine = _leased_and_free(url)
    commit = paused_before_commit(leases(url, "shop"), "claimer", max_ids=3)  # takes shop-1
    writer = StateTable(adapt(mariadb.connect(url)), TABLE)
    writer.connection.given.cursor().execute("SET SESSION innodb_lock_wait_timeout = 2")
    started, failure = time.monotonic(), None
    try:
        blocking.run(writer.begin_locked(mine.transactional_id), writer.connection)
        writer.connection.given.rollback()
    except Exception as exc:
        failure = exc
    finally:
        claimed = commit()
    took = time.monotonic() - started
    assert claimed.transactional_id == "shop-1"
    assert failure is None, f"the writer of leased shop-0 waited {took:.1f} s behind a claim of shop-1: {failure!r}"


def test_a_claim_in_progress_does_not_skip_the_renewal_of_a_leased_id(url: str) -> None:  # noqa: F811
    """The keeper's renewal (SELECT ... FOR UPDATE SKIP LOCKED) skips a row another transaction holds: while a claim
    of shop-1 is open it holds leased shop-0 too, and shop-0's lease is not extended (a claimer frozen for a lease
    before its COMMIT: every lease below the first free id runs out while their holders live)."""
    fleet, mine = _leased_and_free(url)
    commit = paused_before_commit(leases(url, "shop"), "claimer", max_ids=3)
    try:
        renewed = fleet.renew({mine.transactional_id: mine.token}, 30)
    finally:
        commit()
    assert renewed == {mine.transactional_id}, f"renewed {renewed} while a claim of shop-1 was open"


def test_a_claim_for_a_new_id_does_not_lock_every_leased_id(url: str) -> None:  # noqa: F811
    """Every id leased (a busy fleet growing): the claim reads and rejects every row of the fleet, keeps them all
    locked, then waits on GET_LOCK (up to lease_s behind another process's new id) and inserts, while no writer of
    the fleet can begin a transaction."""
    fleet = leases(url, "shop")
    held = [fleet.claim(f"t{n}", "live", 30, max_ids=None) for n in range(3)]
    commit = paused_before_commit(leases(url, "shop"), "grower", max_ids=None)  # inserts shop-3
    blocked = []
    try:
        for lease in held:
            assert lease is not None
            writer = StateTable(adapt(mariadb.connect(url)), TABLE)
            writer.connection.given.cursor().execute("SET SESSION innodb_lock_wait_timeout = 1")
            try:
                blocking.run(writer.begin_locked(lease.transactional_id), writer.connection)
                writer.connection.given.rollback()
            except Exception:
                blocked.append(lease.transactional_id)
            writer.connection.given.close()
    finally:
        grown = commit()
    assert grown.transactional_id == "shop-3"
    assert blocked == [], f"writers blocked behind one new-id claim: {blocked}"


def test_a_candidate_another_claim_took_after_the_read_is_not_taken_again(url: str) -> None:  # noqa: F811
    """The candidates are read without locks: between that read and the lock by key another claim may lease one
    and commit. The condition, checked again under the lock, must reject it (without it both claims hold shop-1)."""
    fleet = leases(url, "shop")
    held = [fleet.claim(f"t{n}", "setup", 30, max_ids=None) for n in range(3)]
    assert all(held)
    fleet.release("shop-1", "t1")
    late = leases(url, "shop")
    steps, reply = late.statements.claim("late", "late", 30, max_ids=3), None
    while True:  # up to the candidates' read, and through it
        action = steps.send(reply)
        reply = blocking.perform(action, late.table.connection)
        if isinstance(action, Sql) and action.fetch is Fetch.ALL:
            break
    assert [row[0] for row in reply] == ["shop-1"]
    first = leases(url, "shop").claim("first", "first", 30, max_ids=3)
    assert first is not None and first.transactional_id == "shop-1"
    try:
        while True:
            reply = blocking.perform(steps.send(reply), late.table.connection)
    except StopIteration as stop:
        second = stop.value
    assert second is None, f"the late claim took {second.transactional_id} too"
