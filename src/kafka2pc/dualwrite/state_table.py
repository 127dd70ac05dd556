"""The dual writer's state table: one row per transactional id, written in the same DB transaction as the
application's rows. The row names the last Kafka transaction the database committed (its prepared state), and the
writer instance that owns the id (a token a successor replaces, fencing the predecessor in the database too).

Works with any DB-API 2.0 connection; sqlite3, psycopg 3 and PyMySQL (MariaDB) are the tested ones (they differ in
placeholders, in how a transaction takes the write lock: ``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR UPDATE``
elsewhere, and in how a missing row is made)."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from kafka2pc.dualwrite.actions import Begin, Commit, Fetch, Rollback, Savepoint, Sleep, Sql, Steps
from kafka2pc.dualwrite.connection import DbapiConnection, is_closed
from kafka2pc.dualwrite.outcome import ReadBack
from kafka2pc.errors import ConfigError, ProducerFencedError, UsageError
from kafka2pc.prepared_state import PreparedTxnState

_DDL_ATTEMPTS = 5
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
    #: the pool writer that holds the id's lease (DualWriterPool); None for an id no pool leased
    lease_owner: str | None = None


#: the columns DualWriterPool's leases use (docs/fleet.md), added by ALTER TABLE to a table made before them
LEASE_COLUMNS = (("lease_owner", "VARCHAR(64)"), ("lease_expires", "DOUBLE PRECISION"),
                 ("heartbeat_at", "DOUBLE PRECISION"), ("holder", "VARCHAR(255)"), ("fleet", "VARCHAR(249)"),
                 ("fleet_index", "INTEGER"), ("problem", "VARCHAR(1000)"))


def _checked(table: str) -> str:
    if not _TABLE_NAME.fullmatch(table):
        raise ConfigError("state_table", f"{table!r} is not a plain SQL identifier")
    return table


def state_table_ddl(table: str = "kafka2pc_dual_write_state") -> str:
    """The CREATE TABLE statement of a dual writer's state table (for a migration, or a DBA to run ahead)."""
    leases = "".join(f", {name} {kind}" for name, kind in LEASE_COLUMNS)
    return (f"CREATE TABLE IF NOT EXISTS {_checked(table)} (transactional_id VARCHAR(249) PRIMARY KEY, "
            "owner VARCHAR(64), prepared_state VARCHAR(64), transaction_version INTEGER, "
            "completed INTEGER NOT NULL DEFAULT 1, two_phase INTEGER NOT NULL DEFAULT 0, txn_token VARCHAR(32)"
            f"{leases})")


def state_table_upgrade_ddl(table: str = "kafka2pc_dual_write_state") -> list[str]:
    """The statements that add the lease columns to a state table made by kafka2pc before DualWriterPool leased
    ids (each adds one nullable column: no rewrite, no default to fill in; releases that predate them ignore them)."""
    return [f"ALTER TABLE {_checked(table)} ADD COLUMN {name} {kind}" for name, kind in LEASE_COLUMNS]


_BLOCK_SAVEPOINT = "kafka2pc_dual_write_block"
_COLUMNS = "owner, prepared_state, transaction_version, completed, two_phase, txn_token"
#: the database's clock, in seconds since the epoch: leases are timed by it, never by a client's clock
NOW_SQL = {"sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
           "mysql": "UNIX_TIMESTAMP(SYSDATE(6))",
           "other": "EXTRACT(EPOCH FROM clock_timestamp())"}
#: MariaDB's limits on a session idle inside a transaction: the general one, and those for a transaction that wrote
#: or only read, each of which replaces the general one when set
_MARIADB_IDLE_LIMITS = ("idle_transaction_timeout", "idle_write_transaction_timeout",
                        "idle_readonly_transaction_timeout")
#: MySQL/MariaDB errors after which the server has rolled the whole transaction back (a deadlock's victim)
_MYSQL_TRANSACTION_ROLLED_BACK = frozenset({1213})


def _seconds(milliseconds: int) -> int:
    """MariaDB's idle limits are whole seconds: a limit in ms, rounded up."""
    return max(1, -(-int(milliseconds) // 1000))


def _stored(row: Sequence[Any]) -> StoredState:
    owner, prepared, version, completed, two_phase, token, *lease = row
    state = PreparedTxnState.parse(prepared, transaction_version=version) if prepared else None
    return StoredState(owner, state, bool(completed), bool(two_phase), token, lease[0] if lease else None)


#: PostgreSQL ended the session for a reason that came before the commit (the transaction stayed idle longer than
#: idle_in_transaction_session_timeout: a frozen process's, once its lease ran out): the commit was never run
_ENDED_BEFORE_COMMIT = frozenset({"25P03"})


def _causes(exc: BaseException) -> tuple[object, ...]:
    """A driver's error, and the driver error a wrapper carries: SQLAlchemy's ``.orig``, Django's ``__cause__``."""
    return exc, getattr(exc, "orig", None), exc.__cause__


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver's error, or of the driver error SQLAlchemy or Django wraps."""
    for candidate in _causes(exc):
        state = getattr(candidate, "sqlstate", None)
        if isinstance(state, str):
            return state
    return None


def _mysql_errno(exc: BaseException) -> int | None:
    """The error number PyMySQL and mysqlclient carry as their first argument (of the error SQLAlchemy wraps too)."""
    for candidate in _causes(exc):
        args = getattr(candidate, "args", ())
        if args and isinstance(args[0], int):
            return args[0]
    return None


class StateTable:
    """The state row's SQL for one connection's database flavour, as protocol steps (:mod:`.actions`): run them
    with :func:`kafka2pc.dualwrite.blocking.run`, or an asyncio edge. Single statements are returned as a
    :class:`Sql` to yield; sequences are generators to ``yield from``."""

    def __init__(self, connection: DbapiConnection, table: str, *, create: bool = True):
        if not _TABLE_NAME.fullmatch(table):
            raise ConfigError("state_table", f"{table!r} is not a plain SQL identifier")
        self.connection = connection
        self.table = table
        #: PostgreSQL: each transaction that holds the row ends itself when its client leaves it idle this long
        #: (a frozen or cut-off process: its row lock frees the id for a claim); None: no limit (SET LOCAL, so it
        #: holds on a reconnected session too and never outlives the transaction)
        self.idle_limit_ms: int | None = None
        #: PostgreSQL: the session's own idle_in_transaction_session_timeout (ms), read as each transaction begins
        self.session_idle_limit_ms: int | None = None
        #: create the table on first use if it is missing (else only check that it exists)
        self.create = create
        self._table_checked = False
        #: whether the table has the lease columns (a table made before them works unleased)
        self.leasing = False
        self.sqlite, self.mysql = connection.sqlite, connection.mysql
        #: MariaDB, which tells whether a transaction is open (@@in_transaction); MySQL has no such variable
        self.mariadb = self.mysql and "MariaDB" in str(getattr(connection.dbapi, "server_version", ""))
        self.now = NOW_SQL["sqlite" if self.sqlite else "mysql" if self.mysql else "other"]
        self._style = connection.paramstyle
        self.errors = connection.module  # DB-API exception classes live on the driver module

    def sql(self, text: str) -> str:
        """``text`` with its ``?`` placeholders in the connection's style (``%s``; ``$1``, ``$2``... for asyncpg)."""
        if self._style == "qmark":
            return text
        if self._style == "numeric_dollar":
            parts = text.split("?")
            return parts[0] + "".join(f"${number}{part}" for number, part in enumerate(parts[1:], start=1))
        return text.replace("?", "%s")

    def _ensure_table(self, *, leases: bool = False) -> Steps[None]:
        """Check once that the table exists (with the lease columns when ``leases``); create it, or add the
        columns, if missing and allowed. Runs only with no transaction open, and commits nothing but its own DDL (a
        least-privilege role that may not create tables never needs to)."""
        if self._table_checked and (self.leasing or not leases):
            return
        if not (yield from self._exists()):
            if not self.create:
                raise ConfigError("state_table", f"{self.table!r} does not exist and create_state_table=False: "
                                                 f"create it first with\n{state_table_ddl(self.table)}")
            yield from self._run_ddl([state_table_ddl(self.table)], done=self._exists)
        present = yield from self._column_names()
        missing = [name for name, _ in LEASE_COLUMNS if name not in present]
        if missing and leases:
            additions = [(name, statement) for (name, _), statement
                         in zip(LEASE_COLUMNS, state_table_upgrade_ddl(self.table), strict=True) if name in missing]
            if not self.create:
                statements = "".join(f"{statement};\n" for _, statement in additions)
                raise ConfigError("state_table", f"{self.table!r} lacks the lease columns DualWriterPool needs and "
                                                 f"create_state_table=False: add them first with\n{statements}")
            for name, statement in additions:
                yield from self._run_ddl([statement], done=functools.partial(self._has_column, name))
            missing = []
        self.leasing = not missing
        self._table_checked = True

    def _run_ddl(self, statements: list[str], *, done: Callable[[], Steps[bool]]) -> Steps[None]:
        """Run DDL in a transaction of its own; a concurrent writer's identical DDL winning the race is fine
        (``done()`` says whether the change is there). On PostgreSQL each attempt waits at most 2 s for its lock,
        so the writers of a running fleet never queue behind it for longer (tried 5 times, with backoff)."""
        for attempt in range(_DDL_ATTEMPTS):
            try:
                yield Begin()
                if not self.sqlite and not self.mysql:
                    yield Sql("SET LOCAL lock_timeout = '2s'")
                for statement in statements:
                    yield Sql(statement)
                yield Commit()
                return
            except Exception:
                yield Rollback()
                if (yield from done()):
                    return
                if attempt == _DDL_ATTEMPTS - 1:
                    raise
                yield Sleep(0.2 * 2 ** attempt)

    def _has_column(self, name: str) -> Steps[bool]:
        return name in (yield from self._column_names())

    def _column_names(self) -> Steps[set[str]]:
        try:  # the Begin inside: a cancel delivered at it still rolls back what it began
            yield Begin()
            return set((yield Sql(f"SELECT * FROM {self.table} WHERE 1 = 0", fetch=Fetch.COLUMNS)))
        finally:
            yield Rollback()

    def ensure_leasing(self) -> Steps[None]:
        """Make sure the table has the lease columns (adding them when allowed), before a pool leases ids."""
        yield from self._ensure_table(leases=True)

    @property
    def _columns(self) -> str:
        return f"{_COLUMNS}, lease_owner" if self.leasing else _COLUMNS

    def _exists(self) -> Steps[bool]:
        try:
            yield Begin()
            if self.sqlite:
                row = yield Sql("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (self.table,),
                                Fetch.ONE)
            elif self.mysql:
                row = yield Sql("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() "
                                "AND table_name = %s", (self.table,), Fetch.ONE)  # PyMySQL: %s
            else:  # PostgreSQL: the table as the connection's search_path finds it
                row = yield Sql(self.sql("SELECT to_regclass(?) IS NOT NULL"), (self.table,), Fetch.ONE)
            return bool(row and row[0])
        finally:
            yield Rollback()

    def begin_locked(self, transactional_id: str, *, idle_limit_ms: int | None = None) -> Steps[StoredState]:
        """Start a DB transaction holding the id's row (created if missing) until commit or rollback: writers with
        the same id serialise here; the row's state is read under the lock. If taking the lock fails (a lock or
        statement timeout, a serialization failure), what it began is rolled back and the database's error raised:
        the connection is ready for a retry."""
        self.connection.check_not_autocommit()
        if self.connection.in_transaction():
            raise UsageError(self.connection.why_in_transaction())
        limit = idle_limit_ms if idle_limit_ms is not None else self.idle_limit_ms
        if self.mariadb:  # the status flag misses a transaction that only read: the server's own variable does not
            row = yield Sql(f"SELECT @@in_transaction, {', '.join('@@' + name for name in _MARIADB_IDLE_LIMITS)}",
                            fetch=Fetch.ONE)
            if row[0]:
                raise UsageError(self.connection.why_in_transaction())
            if limit is not None and any(int(value) != _seconds(limit) for value in row[1:]):  # set once per session
                # (again after a reconnect): no round trip more per transaction
                yield from self.limit_idle(limit)
        yield from self._ensure_table()
        try:
            yield Begin()
            # the write lock first: BEGIN IMMEDIATE on SQLite, where a deferred transaction's write (its implicit
            # one, with autocommit=False) must come before any read; the row lock of SELECT FOR UPDATE elsewhere
            insert_first = self.sqlite and self.connection.implicit_transactions
            if self.sqlite and not insert_first:
                yield Sql("BEGIN IMMEDIATE")
            if insert_first:
                yield self._insert_row(transactional_id)
            row = yield from self._select_locked(transactional_id, limit)
            if row is None and self.mysql:
                # InnoDB's locking read of a missing row took a gap lock, which two writers' new ids can share: both
                # inserting would deadlock. So the row is made in a transaction of its own, once, then locked
                yield Rollback()
                yield Begin()
                yield self._insert_row(transactional_id)
                yield Commit()
                yield Begin()
                row = yield from self._select_locked(transactional_id, limit)
            elif row is None:  # a new id: one more round trip, once
                yield self._insert_row(transactional_id)
                row = yield from self._select_locked(transactional_id, limit)
            return _stored(row)
        except BaseException:
            with contextlib.suppress(Exception):
                yield Rollback()
            raise

    def _insert_row(self, transactional_id: str) -> Sql:
        if self.mysql:
            return Sql(self.sql(f"INSERT IGNORE INTO {self.table} (transactional_id) VALUES (?)"), (transactional_id,))
        return Sql(self.sql(f"INSERT INTO {self.table} (transactional_id) VALUES (?) "
                            "ON CONFLICT (transactional_id) DO NOTHING"), (transactional_id,))

    def _select_locked(self, transactional_id: str, idle_limit_ms: int | None) -> Steps[Any]:
        if self.sqlite or self.mysql or idle_limit_ms is None:  # MariaDB: the session's limit (begin_locked)
            lock = "" if self.sqlite else " FOR UPDATE"
            return (yield Sql(self.sql(f"SELECT {self._columns} FROM {self.table} WHERE transactional_id = ?{lock}"),
                              (transactional_id,), Fetch.ONE))
        # by the statement that locks the row (no round trip more), left to right: the session's own idle limit
        # (whether a 25P03 can be another limit's), then the transaction's
        row = yield Sql(self.sql(f"SELECT {self._columns}, (SELECT setting FROM pg_settings WHERE name = "
                                 "'idle_in_transaction_session_timeout'), "
                                 "set_config('idle_in_transaction_session_timeout', ?, true) "
                                 f"FROM {self.table} WHERE transactional_id = ? FOR UPDATE"),
                        (str(idle_limit_ms), transactional_id), Fetch.ONE)
        if row is None:
            return None
        self.session_idle_limit_ms = int(row[-2])
        return row[:-2]

    def limit_idle(self, idle_limit_ms: int) -> Steps[None]:
        """MariaDB: end the session when it leaves a transaction idle for ``idle_limit_ms`` (whole seconds, at least
        one; set for the session, before its transaction: a frozen process's row locks free with it). All three of
        MariaDB's limits: one for writing or read-only transactions, when set, replaces the general one."""
        if self.mysql:
            seconds = _seconds(idle_limit_ms)
            yield Sql("SET SESSION " + ", ".join(f"{name} = {seconds}" for name in _MARIADB_IDLE_LIMITS))

    def unlimit_idle(self) -> Steps[None]:
        """MariaDB: the session's idle limits back to the server's (before a pool gives the connection back to an
        Engine, whose other users must not inherit a lease's limit)."""
        if self.mysql:
            yield Sql("SET SESSION " + ", ".join(f"{name} = DEFAULT" for name in _MARIADB_IDLE_LIMITS))

    @staticmethod
    def mark_block() -> Savepoint:
        """Take the savepoint that tells whether the application ended the transaction inside the block."""
        return Savepoint("take", _BLOCK_SAVEPOINT)

    @staticmethod
    def release_block() -> Savepoint:
        """Release that savepoint; fails (on SQLite and PostgreSQL) once the transaction that took it has ended."""
        return Savepoint("release", _BLOCK_SAVEPOINT)

    def block_ended(self) -> Steps[bool]:
        """After the block raised: whether the transaction that took the savepoint has ended (rolling back to the
        savepoint works in a transaction a failed statement aborted, and fails once it has ended). A session the
        database ended meanwhile (its idle limit) is not that: False."""
        try:
            yield Savepoint("rollback_to", _BLOCK_SAVEPOINT)
        except Exception as exc:
            return not self.ended_by_own_limit(exc)
        return False

    @staticmethod
    def session_ended(exc: BaseException) -> bool:
        """Whether the database ended the session for a reason before any commit (SQLSTATE 25P03)."""
        return _sqlstate(exc) in _ENDED_BEFORE_COMMIT

    def ended_by_own_limit(self, exc: BaseException) -> bool:
        """Whether PostgreSQL ended the session for the limit set on the writer's transaction (its lease): a 25P03
        on a session with no idle limit of its own. With one (set for the role, the database or the session), the
        application may have committed inside the block and the session's limit ended the transaction it began
        next: then nobody can tell."""
        return self.session_ended(exc) and self.session_idle_limit_ms == 0

    def is_failed_transaction(self, exc: BaseException) -> bool:
        """Whether a statement failed because an earlier one aborted the transaction (PostgreSQL's 25P02), or the
        server rolled the whole transaction back (MySQL's deadlock victim)."""
        if self.mysql:
            return _mysql_errno(exc) in _MYSQL_TRANSACTION_ROLLED_BACK
        return _sqlstate(exc) == "25P02"

    def write(self, transactional_id: str, *, owner: str | None = None, prepared: PreparedTxnState | None = None,
              two_phase: bool = False, token: str | None = None, completed: bool,
              lease: tuple[str, float] | None = None, clear_problem: bool = False) -> Steps[None]:
        """Update the row inside the current transaction (``owner``, ``prepared``, ``token`` only when given; an
        empty prepared state, of a transaction that produced nothing, is stored as none). With ``lease`` (the
        writer's lease token, its length in seconds) the lease is renewed in the same statement, which updates the
        row only while that token holds it: otherwise ProducerFencedError, and the caller rolls back."""
        sets: list[str] = ["completed = ?"]
        values: list[object] = [1 if completed else 0]
        if lease is not None:
            sets += [f"lease_expires = {self.now} + ?", f"heartbeat_at = {self.now}"]
            values.append(lease[1])
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
        if clear_problem and self.leasing:
            sets.append("problem = NULL")
        where, keys = "transactional_id = ?", [transactional_id]
        if lease is not None:
            where, keys = f"{where} AND lease_owner = ?", [transactional_id, lease[0]]
        changed = yield Sql(self.sql(f"UPDATE {self.table} SET {', '.join(sets)} WHERE {where}"), (*values, *keys),
                            Fetch.ROWCOUNT)
        if lease is not None and changed == 0:
            raise ProducerFencedError(f"{transactional_id!r}: this process's lease on the id was taken over by "
                                      "another process: this writer is fenced")

    def extend_lease(self, transactional_id: str, lease: tuple[str, float]) -> Sql:
        """Renew the lease (token, length in seconds) inside the current transaction, if that token holds it."""
        return Sql(self.sql(f"UPDATE {self.table} SET lease_expires = {self.now} + ?, heartbeat_at = {self.now} "
                            "WHERE transactional_id = ? AND lease_owner = ? AND lease_expires IS NOT NULL"),
                   (lease[1], transactional_id, lease[0]))

    def read(self, transactional_id: str) -> Steps[StoredState | None]:
        """The row, read in a transaction of its own (ended here)."""
        try:
            yield Begin()
            row = yield Sql(self.sql(f"SELECT {self._columns} FROM {self.table} WHERE transactional_id = ?"),
                            (transactional_id,), Fetch.ONE)
        finally:
            yield Rollback()
        return None if row is None else _stored(row)

    def read_back(self, transactional_id: str, token: str, session: Any) -> Steps[ReadBack]:
        """After a failed commit (rolled back here first): whether the row holds ``token``, and whether the read ran
        on ``session``, the driver connection that sent the commit, still open."""
        with contextlib.suppress(Exception):
            yield Rollback()
        try:
            row = yield from self.read(transactional_id)
        except Exception:
            return ReadBack(token_seen=None, same_session=False)
        same = session is not None and self.connection.session() is session and not is_closed(session)
        return ReadBack(token_seen=row is not None and row.token == token, same_session=same)

    def is_definite_failure(self, exc: BaseException) -> bool:
        """Whether a failed commit certainly did not commit (a constraint, data or SQL error), as opposed to a lost
        connection whose commit may or may not have happened."""
        if self.session_ended(exc):
            return True
        if getattr(exc, "connection_invalidated", False):
            return False  # SQLAlchemy took it for a disconnect
        definite = tuple(getattr(self.errors, name) for name in ("IntegrityError", "DataError", "ProgrammingError")
                         if hasattr(self.errors, name))
        return isinstance(exc, definite)
