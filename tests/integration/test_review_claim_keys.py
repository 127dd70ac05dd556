"""Adversarial review of bfc80b0 (MariaDB claims: candidates read without locks, then each locked by its key,
LeaseStatements._lock_first; helper-50). Each failed on bfc80b0 with the message its assertion gives, and passes
since the change after it. A real MariaDB server; fixtures of test_review_mariadb_leases.py."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from kafka2pc.dualwrite import blocking
from kafka2pc.dualwrite.actions import Commit, Fetch, Sql
from kafka2pc.dualwrite.connection import adapt
from kafka2pc.dualwrite.lease_statements import _MARIADB_LOCK_NAME
from kafka2pc.dualwrite.leases import LeaseTable
from kafka2pc.dualwrite.state_table import StateTable
from tests.integration.test_review_mariadb_leases import TABLE, url  # noqa: F401
from tests.integration.test_review_mariadb_leases import leases as _leases

pymysql = pytest.importorskip("pymysql")
mariadb = pytest.importorskip("kafka2pc_harness.mariadb")
pytestmark = pytest.mark.integration


_OPEN: list[Any] = []


def leases(url: str, prefix: str, lease_s: float = 30) -> LeaseTable:  # noqa: F811
    """As test_review_mariadb_leases.leases, closed after the test (GET_LOCK is the server's, not the database's:
    a session a test leaves open with the new-id lock would fail the next tests' claims)."""
    table = _leases(url, prefix, lease_s)
    _OPEN.append(table.table.connection.given)
    return table


@pytest.fixture(autouse=True)
def _close_all() -> Any:
    yield
    while _OPEN:
        with contextlib.suppress(Exception):
            _OPEN.pop().close()


class Stepper:
    """A claim's steps run by hand on its table's connection."""

    def __init__(self, table: LeaseTable, steps: Any):
        self.table, self.steps, self.reply, self.done, self.value = table, steps, None, False, None

    def until(self, stop: Callable[[Any], bool], *, run_it: bool) -> Any:
        """Run actions until one matches ``stop`` (run it too when ``run_it``); returns it."""
        for _ in range(500):
            action = self.steps.send(self.reply)
            if stop(action) and not run_it:
                self.pending = action
                return action
            self.reply = blocking.perform(action, self.table.table.connection)
            if stop(action):
                return action
        raise AssertionError("no such step")

    def finish(self, first: Any = None) -> Any:
        if first is not None:
            self.reply = blocking.perform(first, self.table.table.connection)
        try:
            for _ in range(500):
                self.reply = blocking.perform(self.steps.send(self.reply), self.table.table.connection)
        except StopIteration as stop:
            return stop.value
        raise AssertionError("never finished")


def _writer(url: str, wait_s: int = 2) -> StateTable:  # noqa: F811
    writer = StateTable(adapt(mariadb.connect(url)), TABLE)
    writer.connection.given.cursor().execute(f"SET SESSION innodb_lock_wait_timeout = {wait_s}")
    return writer


def _try_begin_locked(writer: StateTable, transactional_id: str) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        blocking.run(writer.begin_locked(transactional_id), writer.connection)
        writer.connection.given.rollback()
        return None, time.monotonic() - started
    except Exception as exc:
        return exc, time.monotonic() - started


def _held_before_commit(url: str, stepper: Stepper, holder: LeaseTable, transactional_id: str,  # noqa: F811
                        token: str) -> tuple[Any, BaseException | None, float, set[str]]:
    """Run the claim up to its COMMIT (not run); meanwhile the holder of ``transactional_id`` begins a block and
    renews its lease; then the claim ends. Its outcome, the block's failure and wait, the ids renewed."""
    stepper.until(lambda a: isinstance(a, Commit), run_it=False)
    writer = _writer(url)
    try:
        failure, took = _try_begin_locked(writer, transactional_id)
        renewed = holder.renew({transactional_id: token}, 30)
    finally:
        outcome = stepper.finish(stepper.pending)
        writer.connection.given.close()
    return outcome, failure, took, renewed


@pytest.mark.parametrize("max_ids", [3, None])
def test_a_candidate_leased_after_the_read_is_not_kept_locked(url: str, max_ids: int | None) -> None:  # noqa: F811
    """The late claim reads shop-1 as a candidate; another claim leases shop-1 and commits; the late claim's key
    lock SELECT rejects it (the condition checked again). The late claim then goes on (GET_LOCK, maybe an insert)
    and is open until its COMMIT (frozen: up to lease_s). shop-1's new holder must be able to begin its block and
    renew its lease meanwhile."""
    fleet = leases(url, "shop")
    held = [fleet.claim(f"t{n}", "live", 30, max_ids=None) for n in range(3)]
    assert all(held)
    fleet.release("shop-1", "t1")
    late = leases(url, "shop")
    stepper = Stepper(late, late.statements.claim("late", "late", 30, max_ids=max_ids))
    stepper.until(lambda a: isinstance(a, Sql) and a.fetch is Fetch.ALL, run_it=True)
    assert [row[0] for row in stepper.reply] == ["shop-1"]
    first = leases(url, "shop")
    got = first.claim("first", "first", 30, max_ids=max_ids)
    assert got is not None and got.transactional_id == "shop-1"
    # the key-lock SELECT of shop-1 (rejected), then on to the COMMIT, not run
    outcome, failure, took, renewed = _held_before_commit(url, stepper, first, "shop-1", "first")
    assert (outcome is None) if max_ids == 3 else (outcome.transactional_id == "shop-3"), outcome
    assert failure is None and renewed == {"shop-1"}, (
        f"while a claim that rejected shop-1 was open, shop-1's holder could not begin its block ({took:.1f} s): "
        f"{failure!r}; its renewal renewed {renewed}")


def test_a_claim_that_finds_the_fleet_full_does_not_keep_the_new_id_lock(url: str) -> None:  # noqa: F811
    """max_ids reached, every id leased: the claim takes the fleet's new-id lock (GET_LOCK) in _insert_new, finds
    index >= max_ids and returns None: body() returns before the release, and the release on error is not run.
    The session keeps the named lock with no transaction open (a pool's connection from an Engine goes back to the
    Engine still holding it): every other process's claim of a new id waits lease_s for it and fails."""
    fleet = leases(url, "shop", lease_s=2)
    assert fleet.claim("t0", "live", 30, max_ids=None) is not None
    full = leases(url, "shop", lease_s=2)
    assert full.claim("t1", "full", 30, max_ids=1) is None
    cursor = fleet.table.connection.given.cursor()
    cursor.execute(f"SELECT IS_USED_LOCK({_MARIADB_LOCK_NAME.replace('?', '%s')}) IS NOT NULL",
                   (f"kafka2pc-fleet:{TABLE}:shop",))
    held = bool(cursor.fetchone()[0])
    fleet.table.connection.given.rollback()
    other_error = None
    try:
        got = leases(url, "shop", lease_s=2).claim("t2", "grower", 30, max_ids=None)
    except Exception as exc:
        other_error, got = exc, None
    full.table.connection.given.close()
    assert not held and other_error is None, (f"the session of a claim that returned None still holds the new-id "
                                              f"lock: {held}; a growing pool's claim then: {other_error!r}")
    assert got is not None and got.transactional_id == "shop-1"


def test_an_expired_id_past_the_first_32_held_ones_is_reaped(url: str) -> None:  # noqa: F811
    """33 expired ids; the lowest 32 are held by transactions (frozen writers inside their block, or live ones in
    a block longer than a lease, whose renewals skip the row). The keeper's claim (expired_only) must still reach
    shop-32; before bfc80b0 (one statement, SKIP LOCKED over the whole fleet) it did; PostgreSQL does."""
    fleet = leases(url, "shop", lease_s=1)
    got = [fleet.claim(f"t{n}", "dead", 1, max_ids=None) for n in range(33)]
    assert [lease.transactional_id for lease in got if lease] == [f"shop-{n}" for n in range(33)]
    zombies = []
    try:
        for n in range(32):
            zombie = StateTable(adapt(mariadb.connect(url)), TABLE)
            blocking.run(zombie.begin_locked(f"shop-{n}"), zombie.connection)
            zombies.append(zombie)
        time.sleep(1.3)
        keeper = leases(url, "shop", lease_s=30)
        reaped = keeper.claim("keeper", "keeper", 30, max_ids=33, expired_only=True)
        grower = keeper.claim("grower", "grower", 30, max_ids=33)
    finally:
        for zombie in zombies:
            with contextlib.suppress(Exception):
                zombie.connection.given.close()
    assert reaped is not None and reaped.transactional_id == "shop-32", \
        f"the keeper's claim got {reaped}, with shop-32 expired and unheld"
    assert grower is None


def test_a_claim_inserting_past_a_case_variant_id_does_not_block_its_writer(url: str) -> None:  # noqa: F811
    """shop-0 and SHOP-1 leased: fleet shop's next new id is shop-1, whose INSERT IGNORE meets SHOP-1 (the key is
    case-insensitive) and so takes a shared lock on SHOP-1, kept until the claim commits (it then inserts shop-2).
    While that claim is open, SHOP-1's own writer cannot begin its block and its renewal skips it."""
    lower, upper = leases(url, "shop"), leases(url, "SHOP")
    assert lower.claim("l0", "l", 30, max_ids=None).transactional_id == "shop-0"  # type: ignore[union-attr]
    assert upper.claim("u0", "u", 30, max_ids=None).transactional_id == "SHOP-1"  # type: ignore[union-attr]
    grower = leases(url, "shop")
    stepper = Stepper(grower, grower.statements.claim("g", "g", 30, max_ids=None))
    outcome, failure, took, renewed = _held_before_commit(url, stepper, upper, "SHOP-1", "u0")
    assert outcome.transactional_id == "shop-2"
    assert failure is None and renewed == {"SHOP-1"}, (
        f"while fleet shop's claim of a new id was open, SHOP-1's writer: {failure!r} ({took:.1f} s); its renewal: "
        f"{renewed}")


def test_the_new_id_lock_is_one_databases_not_the_servers(url: str) -> None:  # noqa: F811
    """GET_LOCK's names are the server's: the lock is named after the database too, so a claim holding it in one
    database never makes a new-id claim in another (same table, same prefix) wait (on bfc80b0 it waited lease_s
    and raised PoolTimeoutError)."""
    other = url.rsplit("/", 1)[0] + f"/r_{uuid.uuid4().hex[:10]}"
    with mariadb.connect(url) as admin:
        admin.cursor().execute(f"CREATE DATABASE {other.rsplit('/', 1)[1]}")
    holder = Stepper(leases(url, "shop", lease_s=30), None)
    holder.steps = holder.table.statements.claim("holder", "holder", 30, max_ids=None)
    holder.until(lambda action: isinstance(action, Sql) and "GET_LOCK" in action.text, run_it=True)
    try:
        got = leases(other, "shop", lease_s=2).claim("elsewhere", "elsewhere", 30, max_ids=None)
    finally:
        holder.finish()
    assert got is not None and got.transactional_id == "shop-0"
