"""The lease statements of a fleet, as protocol steps (:mod:`.actions`): what :class:`~.leases.LeaseTable` runs
on a blocking connection and an asyncio pool awaits. The rules they keep are :mod:`.leases`'s."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from kafka2pc.dualwrite.actions import Begin, Commit, Fetch, Rollback, Sql, Steps
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import ConfigError, PoolTimeoutError

T = TypeVar("T")
#: MariaDB: the free or expired ids a claim reads at a time (lowest first), to lock one of
_CANDIDATES = 32
#: MariaDB: the name of a fleet's new-id lock, from its table and prefix: GET_LOCK's names are the server's (every
#: database's) and at most 64 characters
_MARIADB_LOCK_NAME = "CONCAT('kafka2pc-fleet:', SHA1(CONCAT(IFNULL(DATABASE(), ''), ':', ?)))"
#: how many times a claim reads the highest id again when concurrent claims insert the next one first
_INSERT_ATTEMPTS = 64


@attrs.frozen
class Lease:
    """An id a writer holds: ``token`` is the writer's owner token; ``taken_from`` the holder whose expired lease
    was claimed (None: a free id, or a new one); ``expired_s`` how long that lease had been expired."""

    transactional_id: str
    index: int
    token: str
    taken_from: str | None = None
    expired_s: float | None = None


@attrs.frozen
class FleetRow:
    """One id of a fleet, as an operator sees it (``kafka2pc fleet``)."""

    transactional_id: str
    holder: str | None
    #: seconds since the holder's last heartbeat (None: never leased); negative lease left = expired
    heartbeat_age_s: float | None
    lease_left_s: float | None
    prepared_state: str | None
    completed: bool
    problem: str | None

    @property
    def status(self) -> str:
        """free, leased, expired (waiting for a live pool to settle it), or needs-operator."""
        if self.problem:
            return "needs-operator"
        if self.lease_left_s is None:
            return "free"
        return "leased" if self.lease_left_s >= 0 else "expired"


class LeaseStatements:
    """The lease statements on one state table, each a transaction of its own."""

    def __init__(self, table: StateTable, prefix: str, *, lease_s: float = 15.0):
        if table.mysql and not table.mariadb:
            raise ConfigError("connection", "is MySQL, where pools cannot lease ids (MySQL has no idle-transaction "
                                            "limit to free a frozen process's row; MariaDB's idle_transaction_timeout "
                                            "does): use one DualWriter per transactional id (docs/dual-write.md, "
                                            "MySQL and MariaDB)")
        self.table, self.prefix, self.lease_s = table, prefix, lease_s
        # the ids of a fleet are a primary-key range: '<prefix>-' <= id < '<prefix>.' ('.' follows '-')
        self._range = (f"{prefix}-", f"{prefix}.")
        self._name = re.compile(re.escape(prefix) + r"-(0|[1-9][0-9]{0,8})")

    def _transaction(self, body: Callable[[], Steps[T]], *, write: bool) -> Steps[T]:
        yield from self.table.ensure_leasing()
        if self.table.mysql:
            # each read sees the latest commits (a claim reads the highest id again after a concurrent insert), and
            # no gap locks; the session ends a transaction left idle for a lease (a frozen process frees its rows)
            yield Sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            if write:
                yield from self.table.limit_idle(int(self.lease_s * 1000))
        try:
            yield Begin()  # inside: a cancel delivered at it still rolls back what it began
            if write and self.table.sqlite and not self.table.connection.implicit_transactions:
                yield Sql("BEGIN IMMEDIATE")  # the write lock before the first read, as StateTable's
            if write and not self.table.sqlite and not self.table.mysql:  # rows it locks are freed if its process
                # freezes before the commit
                yield Sql(f"SET LOCAL idle_in_transaction_session_timeout = {int(self.lease_s * 1000)}")
            result = yield from body()
            yield Commit()
            return result
        except BaseException:
            with contextlib.suppress(Exception):
                yield Rollback()
            raise

    def _in_fleet(self, extra: str = "") -> str:
        # MariaDB compares the columns case-insensitively (the default collation): the fleet's name byte for byte
        fleet = "BINARY fleet" if self.table.mysql else "fleet"
        return self.table.sql(f"transactional_id >= ? AND transactional_id < ? AND {fleet} = ?{extra}")

    def adopt(self) -> Steps[int]:
        """Make ids named ``<prefix>-<n>`` that no pool leased yet (rows of a release before leases, or of a pool
        with a fixed prefix) members of the fleet, as expired leases: a live pool's keeper settles each (what a
        pool's start did before leases) and frees it. Returns how many."""

        def body() -> Steps[int]:
            rows = yield Sql(self.table.sql(f"SELECT transactional_id FROM {self.table.table} WHERE transactional_id "
                                            ">= ? AND transactional_id < ? AND fleet IS NULL"), self._range, Fetch.ALL)
            names = [(row[0], self._name.fullmatch(row[0])) for row in rows]
            adopted = [(name, int(match[1])) for name, match in names if match]
            for name, index in adopted:
                yield self._adopt_row(name, index)
            return len(adopted)

        return (yield from self._transaction(body, write=True))

    def _adopt_row(self, transactional_id: str, index: int) -> Sql:
        # expired as of now (its age in the metrics starts at the adoption, not in 1970)
        # MariaDB's key is case-insensitive: only the row of exactly this name (never a writer's 'SHOP-0' for 'shop-0')
        exact = " AND BINARY transactional_id = ?" if self.table.mysql else ""
        return Sql(self.table.sql(f"UPDATE {self.table.table} SET fleet = ?, fleet_index = ?, lease_expires = "
                                  f"{self.table.now} WHERE transactional_id = ? AND fleet IS NULL{exact}"),
                   (self.prefix, index, transactional_id, *((transactional_id,) if exact else ())), Fetch.ROWCOUNT)

    def claim(self, token: str, holder: str, lease_s: float, *, max_ids: int | None,
              expired_only: bool = False) -> Steps[Lease | None]:
        """Lease the lowest-numbered free or expired id (only an expired one with ``expired_only``), or a new id
        when none is and the fleet has fewer than ``max_ids``; None when there is nothing to lease."""
        table, now = self.table.table, self.table.now
        free = "" if expired_only else "lease_expires IS NULL OR "
        named_lock: list[str] = []  # MariaDB: the fleet's new-id lock, held by the session until released

        def body() -> Steps[Lease | None]:
            row = yield from self._lock_first(f" AND problem IS NULL AND ({free}lease_expires <= {now})")
            lease: Lease | None
            if row is not None:
                transactional_id, index, previous, expired_s = row
                lease = Lease(transactional_id, int(index), token, previous if expired_s is not None else None,
                              None if expired_s is None else float(expired_s))
            elif expired_only:
                return None
            else:
                lease = yield from self._insert_new(token, max_ids, named_lock)
                if lease is None:  # the fleet is full: the new-id lock goes now, not with the session
                    if named_lock:
                        yield self._release_named_lock(named_lock.pop())
                    return None
            yield Sql(self.table.sql(f"UPDATE {table} SET lease_owner = ?, lease_expires = {now} + ?, "
                                     f"heartbeat_at = {now}, holder = ? WHERE transactional_id = ?"),
                      (token, lease_s, holder[:255], lease.transactional_id))
            if named_lock:  # released inside the transaction, never held by a session with none open (the idle
                # limit would not end a process frozen after its commit); the next claim may insert the same number
                # before this commit lands: two sessions on one key wait for each other, and never deadlock
                yield self._release_named_lock(named_lock.pop())
            return lease

        try:
            return (yield from self._transaction(body, write=True))
        except Exception:
            if named_lock:
                with contextlib.suppress(Exception):
                    yield self._release_named_lock(named_lock.pop())
            raise

    def _lock_first(self, wanted: str) -> Steps[Any]:
        """The fleet's lowest-numbered row meeting ``wanted`` that no other transaction holds, locked: its id, index,
        holder and seconds since its lease expired (None if never leased); None when there is none."""
        table, now = self.table.table, self.table.now
        columns = f"SELECT transactional_id, fleet_index, holder, {now} - lease_expires FROM {table} WHERE "
        if not self.table.mysql:  # PostgreSQL locks only the row it returns; SQLite's write lock is the table's
            lock = "" if self.table.sqlite else " FOR UPDATE SKIP LOCKED"
            return (yield Sql(self._in_fleet(wanted).join((columns, f" ORDER BY fleet_index LIMIT 1{lock}")),
                              (*self._range, self.prefix), Fetch.ONE))
        # InnoDB keeps the lock on every row a locking read sorts, or rejects inside an index: a sorted SKIP LOCKED
        # read hid every free id from a concurrent claim. So the candidates come from a read that locks nothing, and
        # each is locked by its key alone (READ COMMITTED frees a row the condition, checked again, rejects)
        # A one-key range, not `transactional_id = ?`: InnoDB keeps the lock of a row an equality lookup read and
        # the condition rejected (a candidate another claim leased meanwhile), and releases it after a range read.
        lock_one = Sql(self.table.sql(f"{columns}transactional_id >= ? AND transactional_id <= ? AND "
                                      f"BINARY fleet = ?{wanted} FOR UPDATE SKIP LOCKED"), None, Fetch.ONE)
        after = -1
        while True:  # a page of candidates at a time, until one is locked or the fleet's rows are read
            page = yield Sql(self._in_fleet(f"{wanted} AND fleet_index > ?").join(
                (f"SELECT transactional_id, fleet_index FROM {table} WHERE ",
                 f" ORDER BY fleet_index LIMIT {_CANDIDATES}")), (*self._range, self.prefix, after), Fetch.ALL)
            for candidate, _ in page:
                row = yield attrs.evolve(lock_one, params=(candidate, candidate, self.prefix))
                if row is not None:
                    return row
            if len(page) < _CANDIDATES:
                return None
            after = int(page[-1][1])

    def _release_named_lock(self, name: str) -> Sql:
        return Sql(self.table.sql(f"SELECT RELEASE_LOCK({_MARIADB_LOCK_NAME})"), (name,), Fetch.ONE)

    def _insert_new(self, token: str, max_ids: int | None, named_lock: list[str]) -> Steps[Lease | None]:
        """Insert the fleet's next id (the one after its highest number), below ``max_ids``; a number a concurrent
        claim inserted first is skipped (the highest is read again). Inside the claim's transaction."""
        table = self.table.table
        # new ids one claim at a time (SQLite's write lock does the same): concurrent inserts of one key deadlock
        # on InnoDB (its duplicate-key locks), and race elsewhere
        name = f"kafka2pc-fleet:{table}:{self.prefix}"
        if self.table.mysql:  # a named lock of the session (the server's: named after the database too)
            acquired = yield Sql(self.table.sql(f"SELECT GET_LOCK({_MARIADB_LOCK_NAME}, ?)"),
                                 (name, int(self.lease_s)), Fetch.ONE)
            if not acquired or acquired[0] != 1:
                raise PoolTimeoutError(f"fleet {self.prefix!r}: another process held the new-id lock for "
                                       f"{int(self.lease_s)} s; retry")
            named_lock.append(name)
        elif not self.table.sqlite:
            yield Sql(self.table.sql("SELECT pg_advisory_xact_lock(hashtext(?))"), (name,), Fetch.ONE)
        tried = -1
        for _ in range(_INSERT_ATTEMPTS):
            row = yield Sql(self.table.sql(f"SELECT MAX(fleet_index) FROM {table} WHERE ") + self._in_fleet(),
                            (*self._range, self.prefix), Fetch.ONE)
            # past a number already tried: its name may be another row's that is not the fleet's (on MariaDB a
            # prefix differing only in case, which the case-insensitive key takes for the same id)
            index = max(0 if row[0] is None else int(row[0]) + 1, tried + 1)
            tried = index
            if max_ids is not None and index >= max_ids:
                return None
            name = f"{self.prefix}-{index}"
            owner_of = Sql(self.table.sql(f"SELECT fleet FROM {table} WHERE transactional_id = ?"), (name,), Fetch.ONE)
            owner = None
            if self.table.mysql:
                # a plain read before the insert: InnoDB's duplicate-key check would lock an existing row (another
                # fleet's, whose name differs only in case) until this claim commits, and its writer would wait
                owner = yield owner_of
                inserted = 0 if owner is not None else (yield Sql(self.table.sql(
                    f"INSERT IGNORE INTO {table} (transactional_id, fleet, fleet_index) VALUES (?, ?, ?)"),
                    (name, self.prefix, index), Fetch.ROWCOUNT))
            else:
                inserted = yield Sql(self.table.sql(f"INSERT INTO {table} (transactional_id, fleet, fleet_index) "
                                                    "VALUES (?, ?, ?) ON CONFLICT (transactional_id) DO NOTHING"),
                                     (name, self.prefix, index), Fetch.ROWCOUNT)
            if inserted == 1:
                return Lease(name, index, token)
            # a concurrent claim inserted it (the fleet's: the next number), or a row of that name outside the
            # fleet (a writer of an earlier release, an operator's recover) has it: adopted, to be settled. A plain
            # read first: on MariaDB updating a row the fleet's new writer is about to lock would deadlock with it
            if owner is None:
                owner = yield owner_of
            if owner is not None and owner[0] is None:
                yield self._adopt_row(name, index)
        raise PoolTimeoutError(f"fleet {self.prefix!r}: {_INSERT_ATTEMPTS} concurrent claims inserted the next id "
                               "first, every time; retry")

    def renew(self, leases: Mapping[str, str], lease_s: float) -> Steps[set[str]]:
        """Extend the leases (id → token) this process still holds; returns the ids renewed. On PostgreSQL a row a
        transaction holds is skipped, not waited for (that transaction renews it when it writes the row)."""
        if not leases:
            return set()
        table, now = self.table.table, self.table.now
        # never a lease given back meanwhile (its writer retired while this renewal was planned)
        pairs = " OR ".join(["(transactional_id = ? AND lease_owner = ? AND lease_expires IS NOT NULL)"] * len(leases))
        values = [value for pair in leases.items() for value in pair]
        where = f"({pairs})"
        if not self.table.sqlite:
            where = f"transactional_id IN (SELECT transactional_id FROM {table} WHERE {pairs} FOR UPDATE SKIP LOCKED)"

        def body() -> Steps[set[str]]:
            if self.table.mysql:  # no UPDATE ... RETURNING: the rows this renewal may take, then their update
                rows = yield Sql(self.table.sql(f"SELECT transactional_id FROM {table} WHERE {pairs} FOR UPDATE "
                                                "SKIP LOCKED"), tuple(values), Fetch.ALL)
                ids = [row[0] for row in rows]
                if ids:
                    yield Sql(self.table.sql(f"UPDATE {table} SET lease_expires = {now} + ?, heartbeat_at = {now} "
                                             f"WHERE transactional_id IN ({', '.join('?' * len(ids))})"),
                              (lease_s, *ids))
                return set(ids)
            rows = yield Sql(self.table.sql(f"UPDATE {table} SET lease_expires = {now} + ?, heartbeat_at = {now} "
                                            f"WHERE {where} RETURNING transactional_id"), (lease_s, *values), Fetch.ALL)
            return {row[0] for row in rows}

        return (yield from self._transaction(body, write=True))

    def lost(self, leases: Mapping[str, str], lease_s: float) -> Steps[set[str]]:
        """Renew the leases (id → token); returns those no longer this process's. A row a transaction of ours holds
        is skipped by the renewal, and is ours while its token is in it."""
        renewed = yield from self.renew(leases, lease_s)
        lost = set()
        for transactional_id in set(leases) - renewed:
            if not (yield from self.holds(transactional_id, leases[transactional_id])):
                lost.add(transactional_id)
        return lost

    def holds(self, transactional_id: str, token: str) -> Steps[bool]:
        """Whether ``token`` still holds the id's lease (a plain read: it does not wait for a writer's lock)."""

        def body() -> Steps[bool]:
            row = yield Sql(self.table.sql(f"SELECT lease_owner FROM {self.table.table} WHERE transactional_id = ?"),
                            (transactional_id,), Fetch.ONE)
            return row is not None and row[0] == token

        return (yield from self._transaction(body, write=False))

    def release(self, transactional_id: str, token: str) -> Steps[bool]:
        """Give the id back to the fleet (free for the next claim) if ``token`` still holds it."""

        def body() -> Steps[bool]:
            changed = yield Sql(self.table.sql(f"UPDATE {self.table.table} SET lease_owner = NULL, lease_expires = "
                                               "NULL, holder = NULL WHERE transactional_id = ? AND lease_owner = ?"),
                                (transactional_id, token), Fetch.ROWCOUNT)
            return bool(changed == 1)

        return (yield from self._transaction(body, write=True))

    def set_problem(self, transactional_id: str, token: str, problem: str | None) -> Steps[None]:
        """Take the id out of the fleet's claims until an operator resolves it (``problem``; None puts it back)."""

        def body() -> Steps[None]:
            yield Sql(self.table.sql(f"UPDATE {self.table.table} SET problem = ?, lease_expires = NULL "
                                     "WHERE transactional_id = ? AND lease_owner = ?"),
                      (None if problem is None else problem[:1000], transactional_id, token))

        yield from self._transaction(body, write=True)

    def expired(self) -> Steps[list[tuple[str, float]]]:
        """The fleet's expired leases, (id, seconds since it expired), oldest first."""
        now = self.table.now

        def body() -> Steps[list[tuple[str, float]]]:
            rows = yield Sql(self._in_fleet(f" AND problem IS NULL AND lease_expires <= {now}").join(
                (f"SELECT transactional_id, {now} - lease_expires FROM {self.table.table} WHERE ",
                 " ORDER BY lease_expires")), (*self._range, self.prefix), Fetch.ALL)
            return [(row[0], float(row[1])) for row in rows]

        return (yield from self._transaction(body, write=False))

    def rows(self) -> Steps[list[FleetRow]]:
        """Every id of the fleet, by number."""
        now = self.table.now

        def body() -> Steps[list[FleetRow]]:
            rows = yield Sql(self._in_fleet().join(
                (f"SELECT transactional_id, holder, {now} - heartbeat_at, lease_expires - {now}, prepared_state, "
                 f"completed, problem FROM {self.table.table} WHERE ", " ORDER BY fleet_index")),
                (*self._range, self.prefix), Fetch.ALL)
            return [FleetRow(row[0], row[1], _seconds(row[2]), _seconds(row[3]), row[4], bool(row[5]), row[6])
                    for row in rows]

        return (yield from self._transaction(body, write=False))


def _seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)
