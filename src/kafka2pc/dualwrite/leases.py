"""Leased transactional ids: the SQL by which a fleet of DualWriterPools shares the ids under one prefix
(docs/fleet.md).

The lease lives in the id's state-table row, beside the state it guards: ``lease_owner`` (the token of the writer
holding it), ``lease_expires`` (by the database's clock), ``holder`` (host and pid, for operators), ``fleet`` and
``fleet_index`` (the prefix, and n in ``<prefix>-<n>``). An id is free when ``lease_expires`` is NULL and expired
when it is not in the future (an adopted id expires the moment it is adopted). A claim takes the lowest-numbered
free or expired id in a transaction that holds its row:
PostgreSQL's ``FOR UPDATE SKIP LOCKED`` (a row a writer holds, a live transaction or a zombie's, is never taken),
SQLite's database write lock. Only a claim changes ``lease_owner``; every write of a writer's transaction is
conditional on it (StateTable.write), so a process whose id was claimed cannot commit that id's row."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from kafka2pc.dualwrite import blocking
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.errors import ConfigError, PoolTimeoutError

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


class LeaseTable:
    """The lease statements, on one connection (a StateTable's), each in a transaction of its own."""

    def __init__(self, table: StateTable, prefix: str, *, lease_s: float = 15.0):
        if table.mysql:
            raise ConfigError("connection", "is MySQL/MariaDB, where DualWriterPool does not lease ids yet (no "
                                            "idle-transaction limit to free a frozen process's row): use one "
                                            "DualWriter per transactional id (docs/dual-write.md, MySQL and MariaDB)")
        self.table, self.prefix, self.lease_s = table, prefix, lease_s
        self._db = table.connection
        # the ids of a fleet are a primary-key range: '<prefix>-' <= id < '<prefix>.' ('.' follows '-')
        self._range = (f"{prefix}-", f"{prefix}.")
        self._name = re.compile(re.escape(prefix) + r"-(0|[1-9][0-9]{0,8})")

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[Any]:
        blocking.run(self.table.ensure_leasing(), self._db)
        self._db.begin()
        try:
            cursor = self._db.statement_cursor()
            if write and self.table.sqlite and not self._db.implicit_transactions:
                cursor.execute("BEGIN IMMEDIATE")  # the write lock before the first read, as StateTable's
            if write:  # rows this transaction locks are freed if its process freezes before the commit
                self.table.limit_idle(cursor, int(self.lease_s * 1000))
            yield cursor
            self._db.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                self._db.rollback()
            raise

    def _in_fleet(self, extra: str = "") -> str:
        return self.table.sql(f"transactional_id >= ? AND transactional_id < ? AND fleet = ?{extra}")

    def adopt(self) -> int:
        """Make ids named ``<prefix>-<n>`` that no pool leased yet (rows of a release before leases, or of a pool
        with a fixed prefix) members of the fleet, as expired leases: a live pool's keeper settles each (what a
        pool's start did before leases) and frees it. Returns how many."""
        table = self.table.table
        with self._transaction(write=True) as cursor:
            cursor.execute(self.table.sql(f"SELECT transactional_id FROM {table} WHERE transactional_id >= ? AND "
                                           "transactional_id < ? AND fleet IS NULL"), self._range)
            names = [(row[0], self._name.fullmatch(row[0])) for row in cursor.fetchall()]
            adopted = [(name, int(match[1])) for name, match in names if match]
            for name, index in adopted:
                self._adopt_row(cursor, name, index)
        return len(adopted)

    def _adopt_row(self, cursor: Any, transactional_id: str, index: int) -> bool:
        # expired as of now (its age in the metrics starts at the adoption, not in 1970)
        cursor.execute(self.table.sql(f"UPDATE {self.table.table} SET fleet = ?, fleet_index = ?, "
                                      f"lease_expires = {self.table.now} WHERE transactional_id = ? AND fleet IS NULL"),
                       (self.prefix, index, transactional_id))
        return bool(cursor.rowcount == 1)

    def claim(self, token: str, holder: str, lease_s: float, *, max_ids: int | None,
              expired_only: bool = False) -> Lease | None:
        """Lease the lowest-numbered free or expired id (only an expired one with ``expired_only``), or a new id
        when none is and the fleet has fewer than ``max_ids``; None when there is nothing to lease."""
        table, now = self.table.table, self.table.now
        free = "" if expired_only else "lease_expires IS NULL OR "
        lock = "" if self.table.sqlite else " FOR UPDATE SKIP LOCKED"
        with self._transaction(write=True) as cursor:
            cursor.execute(self._in_fleet(f" AND problem IS NULL AND ({free}lease_expires <= {now})").join(
                (f"SELECT transactional_id, fleet_index, holder, {now} - lease_expires FROM {table} WHERE ",
                 f" ORDER BY fleet_index LIMIT 1{lock}")), (*self._range, self.prefix))
            row = cursor.fetchone()
            if row is not None:
                transactional_id, index, previous, expired_s = row
                lease = Lease(transactional_id, int(index), token, previous if expired_s is not None else None,
                              None if expired_s is None else float(expired_s))
            elif expired_only:
                return None
            else:
                found = self._insert_new(cursor, token, max_ids)
                if found is None:
                    return None
                lease = found
            cursor.execute(self.table.sql(f"UPDATE {table} SET lease_owner = ?, lease_expires = {now} + ?, "
                                           f"heartbeat_at = {now}, holder = ? WHERE transactional_id = ?"),
                           (token, lease_s, holder[:255], lease.transactional_id))
        return lease

    def _insert_new(self, cursor: Any, token: str, max_ids: int | None) -> Lease | None:
        """Insert the fleet's next id (the one after its highest number), below ``max_ids``; a number a concurrent
        claim inserted first is skipped (the highest is read again). Inside the claim's transaction."""
        table = self.table.table
        if not self.table.sqlite:  # new ids one claim at a time (SQLite's write lock does the same): no insert race
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"kafka2pc-fleet:{table}:{self.prefix}",))
        for _ in range(_INSERT_ATTEMPTS):
            cursor.execute(self.table.sql(f"SELECT MAX(fleet_index) FROM {table} WHERE ") + self._in_fleet(),
                           (*self._range, self.prefix))
            highest = cursor.fetchone()[0]
            index = 0 if highest is None else int(highest) + 1
            if max_ids is not None and index >= max_ids:
                return None
            cursor.execute(self.table.sql(f"INSERT INTO {table} (transactional_id, fleet, fleet_index) VALUES "
                                          "(?, ?, ?) ON CONFLICT (transactional_id) DO NOTHING"),
                           (f"{self.prefix}-{index}", self.prefix, index))
            if cursor.rowcount == 1:
                return Lease(f"{self.prefix}-{index}", index, token)
            # a concurrent claim inserted it, or a row of that name outside the fleet (a writer of an earlier
            # release, an operator's recover) has it: adopted, to be settled, and the next number tried
            self._adopt_row(cursor, f"{self.prefix}-{index}", index)
        raise PoolTimeoutError(f"fleet {self.prefix!r}: {_INSERT_ATTEMPTS} concurrent claims inserted the next id "
                               "first, every time; retry")

    def renew(self, leases: Mapping[str, str], lease_s: float) -> set[str]:
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
        with self._transaction(write=True) as cursor:
            cursor.execute(self.table.sql(f"UPDATE {table} SET lease_expires = {now} + ?, heartbeat_at = {now} "
                                           f"WHERE {where} RETURNING transactional_id"), (lease_s, *values))
            return {row[0] for row in cursor.fetchall()}

    def holds(self, transactional_id: str, token: str) -> bool:
        """Whether ``token`` still holds the id's lease (a plain read: it does not wait for a writer's lock)."""
        with self._transaction(write=False) as cursor:
            cursor.execute(self.table.sql(f"SELECT lease_owner FROM {self.table.table} WHERE transactional_id = ?"),
                           (transactional_id,))
            row = cursor.fetchone()
        return row is not None and row[0] == token

    def release(self, transactional_id: str, token: str) -> bool:
        """Give the id back to the fleet (free for the next claim) if ``token`` still holds it."""
        with self._transaction(write=True) as cursor:
            cursor.execute(self.table.sql(f"UPDATE {self.table.table} SET lease_owner = NULL, lease_expires = NULL, "
                                           "holder = NULL WHERE transactional_id = ? AND lease_owner = ?"),
                           (transactional_id, token))
            return bool(cursor.rowcount == 1)

    def set_problem(self, transactional_id: str, token: str, problem: str | None) -> None:
        """Take the id out of the fleet's claims until an operator resolves it (``problem``; None puts it back)."""
        with self._transaction(write=True) as cursor:
            cursor.execute(self.table.sql(f"UPDATE {self.table.table} SET problem = ?, lease_expires = NULL "
                                           "WHERE transactional_id = ? AND lease_owner = ?"),
                           (None if problem is None else problem[:1000], transactional_id, token))

    def expired(self) -> list[tuple[str, float]]:
        """The fleet's expired leases, (id, seconds since it expired), oldest first."""
        now = self.table.now
        with self._transaction(write=False) as cursor:
            cursor.execute(self._in_fleet(f" AND problem IS NULL AND lease_expires <= {now}").join(
                (f"SELECT transactional_id, {now} - lease_expires FROM {self.table.table} WHERE ",
                 " ORDER BY lease_expires")), (*self._range, self.prefix))
            return [(row[0], float(row[1])) for row in cursor.fetchall()]

    def rows(self) -> list[FleetRow]:
        """Every id of the fleet, by number."""
        now = self.table.now
        with self._transaction(write=False) as cursor:
            cursor.execute(self._in_fleet().join(
                (f"SELECT transactional_id, holder, {now} - heartbeat_at, lease_expires - {now}, prepared_state, "
                 f"completed, problem FROM {self.table.table} WHERE ", " ORDER BY fleet_index")),
                (*self._range, self.prefix))
            return [FleetRow(row[0], row[1], _seconds(row[2]), _seconds(row[3]), row[4], bool(row[5]), row[6])
                    for row in cursor.fetchall()]


def _seconds(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)
