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

from collections.abc import Mapping

from kafka2pc.dualwrite import blocking
from kafka2pc.dualwrite.lease_statements import FleetRow, Lease, LeaseStatements
from kafka2pc.dualwrite.state_table import StateTable

__all__ = ["FleetRow", "Lease", "LeaseTable"]


class LeaseTable:
    """The lease statements (:class:`~.lease_statements.LeaseStatements`) run on one connection (a StateTable's),
    each in a transaction of its own."""

    def __init__(self, table: StateTable, prefix: str, *, lease_s: float = 15.0):
        self.statements = LeaseStatements(table, prefix, lease_s=lease_s)
        self.table, self.prefix, self.lease_s = table, prefix, lease_s
        self._db = table.connection

    def adopt(self) -> int:
        """LeaseStatements.adopt."""
        return blocking.run(self.statements.adopt(), self._db)

    def claim(self, token: str, holder: str, lease_s: float, *, max_ids: int | None,
              expired_only: bool = False) -> Lease | None:
        """LeaseStatements.claim."""
        return blocking.run(self.statements.claim(token, holder, lease_s, max_ids=max_ids,
                                                  expired_only=expired_only), self._db)

    def renew(self, leases: Mapping[str, str], lease_s: float) -> set[str]:
        """LeaseStatements.renew."""
        return blocking.run(self.statements.renew(leases, lease_s), self._db)

    def lost(self, leases: Mapping[str, str], lease_s: float) -> set[str]:
        """LeaseStatements.lost."""
        return blocking.run(self.statements.lost(leases, lease_s), self._db)

    def holds(self, transactional_id: str, token: str) -> bool:
        """LeaseStatements.holds."""
        return blocking.run(self.statements.holds(transactional_id, token), self._db)

    def release(self, transactional_id: str, token: str) -> bool:
        """LeaseStatements.release."""
        return blocking.run(self.statements.release(transactional_id, token), self._db)

    def set_problem(self, transactional_id: str, token: str, problem: str | None) -> None:
        """LeaseStatements.set_problem."""
        blocking.run(self.statements.set_problem(transactional_id, token, problem), self._db)

    def expired(self) -> list[tuple[str, float]]:
        """LeaseStatements.expired."""
        return blocking.run(self.statements.expired(), self._db)

    def rows(self) -> list[FleetRow]:
        """LeaseStatements.rows."""
        return blocking.run(self.statements.rows(), self._db)
