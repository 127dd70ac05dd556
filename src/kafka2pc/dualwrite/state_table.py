"""The dual writer's state table: one row per transactional id, written in the same DB transaction as the
application's rows. The row names the last Kafka transaction the database committed (its prepared state), and the
writer instance that owns the id (a token a successor replaces, fencing the predecessor in the database too).

Works with any DB-API 2.0 connection; sqlite3 and psycopg 3 are the tested ones (they differ in placeholders and in
how a transaction takes the write lock: ``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR UPDATE`` elsewhere)."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import attrs

from kafka2pc.errors import ConfigError
from kafka2pc.prepared_state import PreparedTxnState

_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


@attrs.frozen
class StoredState:
    """What the row holds."""

    owner: str | None
    prepared: PreparedTxnState | None
    #: the prepared transaction is known to be complete (set by recovery and on close, cleared by the next write)
    completed: bool
    #: it was prepared with two-phase commit active (no broker timeout could abort it)
    two_phase: bool = False
    #: a random token each dual-write transaction writes: reading it back tells whether that transaction committed
    token: str | None = None


_COLUMNS = "owner, prepared_state, transaction_version, completed, two_phase, txn_token"


def _stored(row: Sequence[Any]) -> StoredState:
    owner, prepared, version, completed, two_phase, token = row
    state = PreparedTxnState.parse(prepared, transaction_version=version) if prepared else None
    return StoredState(owner, state, bool(completed), bool(two_phase), token)


def _driver_module(connection: Any) -> Any:
    """The DB-API module of the connection's class, or of the first base class that has one (an application's
    subclass of ``sqlite3.Connection`` or ``psycopg.Connection`` is defined in its own module)."""
    for cls in type(connection).__mro__:
        module = sys.modules.get(cls.__module__.split(".")[0])
        if module is not None and hasattr(module, "paramstyle"):
            return module
    return None


class StateTable:
    """SQL for one connection's database flavour."""

    def __init__(self, connection: Any, table: str):
        if not _TABLE_NAME.fullmatch(table):
            raise ConfigError("state_table", f"{table!r} is not a plain SQL identifier")
        self.connection = connection
        self.table = table
        module = _driver_module(connection)
        self.sqlite = module is not None and module.__name__ == "sqlite3"
        style = getattr(module, "paramstyle", "qmark")
        self._p = "?" if style == "qmark" else "%s"
        self.errors = module  # DB-API exception classes live on the driver module

    def _sql(self, text: str) -> str:
        return text.replace("?", self._p)

    def ensure(self) -> None:
        """Create the table if missing (committed at once)."""
        cursor = self.connection.cursor()
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (transactional_id VARCHAR(249) PRIMARY KEY, "
                       "owner VARCHAR(64), prepared_state VARCHAR(64), transaction_version INTEGER, "
                       "completed INTEGER NOT NULL DEFAULT 1, two_phase INTEGER NOT NULL DEFAULT 0, "
                       "txn_token VARCHAR(32))")
        self.connection.commit()

    def begin_locked(self, transactional_id: str) -> StoredState:
        """Start a DB transaction holding the id's row (created if missing) until commit or rollback: writers with
        the same id serialise here; the row's state is read under the lock."""
        if getattr(self.connection, "autocommit", False) is True:
            raise ConfigError("connection", "is in autocommit mode: a dual write needs the connection's transactions "
                                            "(set autocommit = False)")
        if self.in_transaction():
            raise ConfigError("connection", "has an open transaction: commit or roll back before a dual-write "
                                            "transaction (its rows would be committed with it)")
        cursor = self.connection.cursor()
        if self.sqlite:
            cursor.execute("BEGIN IMMEDIATE")
        cursor.execute(self._sql(f"INSERT INTO {self.table} (transactional_id) VALUES (?) "
                                 "ON CONFLICT (transactional_id) DO NOTHING"), (transactional_id,))
        lock = "" if self.sqlite else " FOR UPDATE"
        cursor.execute(self._sql(f"SELECT {_COLUMNS} FROM {self.table} WHERE transactional_id = ?{lock}"),
                       (transactional_id,))
        return _stored(cursor.fetchone())

    def write(self, transactional_id: str, *, owner: str | None = None, prepared: PreparedTxnState | None = None,
              two_phase: bool = False, token: str | None = None, completed: bool) -> None:
        """Update the row inside the current transaction (``owner``, ``prepared``, ``token`` only when given; an
        empty prepared state, of a transaction that produced nothing, is stored as none)."""
        sets: list[str] = ["completed = ?"]
        values: list[object] = [1 if completed else 0]
        if owner is not None:
            sets.append("owner = ?")
            values.append(owner)
        if prepared is not None:
            sets += ["prepared_state = ?", "transaction_version = ?", "two_phase = ?"]
            values += [None if prepared.is_empty else str(prepared), prepared.transaction_version,
                       1 if two_phase else 0]
        if token is not None:
            sets.append("txn_token = ?")
            values.append(token)
        self.connection.cursor().execute(
            self._sql(f"UPDATE {self.table} SET {', '.join(sets)} WHERE transactional_id = ?"),
            (*values, transactional_id))

    def read(self, transactional_id: str) -> StoredState | None:
        """The row, read in a transaction of its own (ended here)."""
        cursor = self.connection.cursor()
        cursor.execute(self._sql(f"SELECT {_COLUMNS} FROM {self.table} WHERE transactional_id = ?"),
                       (transactional_id,))
        row = cursor.fetchone()
        self.connection.rollback()
        return None if row is None else _stored(row)

    def in_transaction(self) -> bool:
        """Whether the connection has a transaction open."""
        if self.sqlite:
            return bool(self.connection.in_transaction)
        info = getattr(self.connection, "info", None)
        status = getattr(info, "transaction_status", None)
        return status is not None and int(status) != 0  # psycopg: 0 is IDLE

    def is_definite_failure(self, exc: BaseException) -> bool:
        """Whether a failed commit certainly did not commit (a constraint, data or SQL error), as opposed to a lost
        connection whose commit may or may not have happened."""
        definite = tuple(getattr(self.errors, name) for name in ("IntegrityError", "DataError", "ProgrammingError")
                         if hasattr(self.errors, name))
        return isinstance(exc, definite)
