"""The database connection a dual writer works through: a DB-API 2.0 connection (sqlite3, psycopg 3, PyMySQL, or
SQLAlchemy's ``engine.raw_connection()``), or a SQLAlchemy ``Connection`` or ``Engine``.

With SQLAlchemy, transactions begin, commit and roll back through its ``Connection`` (so its own view of the
transaction stays right), and the writer's statements run on the DB-API connection under it."""

from __future__ import annotations

import sys
from typing import Any

from kafka2pc.dualwrite.actions import Savepoint
from kafka2pc.dualwrite.psycopg_block import PsycopgBlock
from kafka2pc.errors import ConfigError

#: the DB-API modules of MySQL's and MariaDB's drivers
_MYSQL_DRIVERS = frozenset({"pymysql"})


def is_closed(connection: Any) -> bool:
    """Whether a driver's connection is known to be closed (psycopg's and sqlite3's ``closed``, PyMySQL's ``open``)."""
    return bool(getattr(connection, "closed", False)) or getattr(connection, "open", True) is False


def driver_module(dbapi_connection: Any) -> Any:
    """The DB-API module of a connection's class, or of the first base class that has one (an application's
    subclass of ``sqlite3.Connection`` or ``psycopg.Connection`` is defined in its own module)."""
    for cls in type(dbapi_connection).__mro__:
        module = sys.modules.get(cls.__module__.split(".")[0])
        if module is not None and hasattr(module, "paramstyle"):
            return module
    return None


class DbapiConnection:
    """A DB-API 2.0 connection, used as it is."""

    def __init__(self, connection: Any):
        # SQLAlchemy's engine.raw_connection() wraps the driver's connection in a proxy of its own
        self.given = connection
        self._dbapi = getattr(connection, "dbapi_connection", None) or connection
        self.module = driver_module(self._dbapi)
        self.sqlite = self.module is not None and self.module.__name__ == "sqlite3"
        #: MySQL or MariaDB (PyMySQL, mysqlclient)
        self.mysql = self.module is not None and self.module.__name__ in _MYSQL_DRIVERS
        #: psycopg used directly: the block's savepoint is psycopg's transaction context (psycopg_block.py)
        self._block = PsycopgBlock() if self.module is not None and self.module.__name__ == "psycopg" and \
            type(self) is DbapiConnection and self.given is self._dbapi else None

    @property
    def dbapi(self) -> Any:
        """The driver's own connection."""
        return self._dbapi

    def session(self) -> Any:
        """The driver connection statements run on now (None if there is none): another one after SQLAlchemy
        reconnected is another database session."""
        try:
            return self.dbapi
        except Exception:
            return None

    @property
    def paramstyle(self) -> str:
        """The placeholder style statements are written in (the driver's)."""
        return str(getattr(self.module, "paramstyle", "qmark"))

    def lost(self) -> bool:
        """Whether the connection is known to be gone (a lost server, a session the database ended)."""
        return is_closed(self.given) or is_closed(self._dbapi)

    def why_in_transaction(self) -> str:
        """What to tell a caller who starts a dual write with a transaction open."""
        return ("the connection has an open transaction: commit or roll back before a dual-write transaction (its "
                "rows would be committed with it)")

    def block_misuse(self) -> str | None:
        """Something the application did inside the block that the transaction must not commit with (a
        framework's transaction hooks); None when nothing is known."""
        return None

    def ended_inside(self) -> bool:
        """Whether the transaction the writer began is known to have ended inside the block (the application's
        commit or rollback); False when the connection cannot tell (the savepoint then does)."""
        return False

    def marked_for_rollback(self) -> bool:
        """Whether a framework marked the open transaction for rollback after a failed statement (it is still
        open: the block's error is the application's, not an ended transaction)."""
        return False

    def begin(self) -> None:
        """Before the first statement of a transaction (DB-API drivers begin implicitly)."""

    def commit(self) -> None:
        if self._block is not None:
            self._block.drop()  # never held here (the protocol releases it first); never committed with
        self.given.commit()

    def rollback(self) -> None:
        if self._block is not None:
            self._block.drop()
        self.given.rollback()

    def savepoint(self, action: Savepoint) -> None:
        """The block's savepoint (actions.Savepoint)."""
        if self._block is None:
            self.statement_cursor().execute(action.sql)
        elif action.op == "take":
            self._block.take(self.given, action)
        else:
            self._block.end(self.given, action)

    def cursor(self) -> Any:
        return self.given.cursor()

    def statement_cursor(self) -> Any:
        """A cursor for the writer's own statements, its rows tuples whatever row factory or cursor class the
        application set on the connection (psycopg's dict_row, PyMySQL's DictCursor, sqlite3's row_factory)."""
        name = getattr(self.module, "__name__", "")
        if name == "psycopg":
            from psycopg.rows import tuple_row  # noqa: PLC0415 - the driver in use

            return self._driver_side().cursor(row_factory=tuple_row)
        if name == "pymysql":
            from pymysql.cursors import Cursor  # noqa: PLC0415

            return self._driver_side().cursor(Cursor)
        cursor = self.cursor()
        if self.sqlite:
            cursor.row_factory = None
        return cursor

    def _driver_side(self) -> Any:
        """What cursors are asked of: the given connection (a driver's, or SQLAlchemy's raw_connection proxy)."""
        return self.given

    def in_transaction(self) -> bool:
        """Whether the connection has a transaction open that a dual write would have to commit."""
        if self.sqlite:
            # Python 3.12's autocommit=False keeps a transaction open at all times (PEP 249): an empty one is ours
            return bool(self._dbapi.in_transaction) and not self.implicit_transactions
        if self.mysql:  # the server's status flags of the last answer: SERVER_STATUS_IN_TRANS
            return bool(int(getattr(self._dbapi, "server_status", 0) or 0) & 1)
        status = getattr(getattr(self._dbapi, "info", None), "transaction_status", None)
        # psycopg: ACTIVE, INTRANS, INERROR; not IDLE (0) nor UNKNOWN (4: the connection is lost, and the next
        # statement raises the driver's own error for it)
        return status is not None and int(status) in (1, 2, 3)

    @property
    def implicit_transactions(self) -> bool:
        """sqlite3 with ``autocommit=False`` (Python 3.12+): a transaction is always open; BEGIN is not allowed."""
        return self.sqlite and getattr(self._dbapi, "autocommit", None) is False

    def check_not_autocommit(self) -> None:
        getter = getattr(self._dbapi, "get_autocommit", None)  # PyMySQL, mysqlclient: autocommit is a method there
        if getattr(self._dbapi, "autocommit", False) is True or (callable(getter) and getter()):
            raise ConfigError("connection", "is in autocommit mode: a dual write needs the connection's transactions "
                                            "(set autocommit = False)")

    def close(self) -> None:
        """Nothing: the caller owns a connection it passed."""


class SqlAlchemyConnection(DbapiConnection):
    """A SQLAlchemy ``Connection`` (owned by the caller), or one the writer checks out of an ``Engine`` and owns."""

    def __init__(self, connection: Any, *, owned: bool):
        self.sqlalchemy = connection
        self.owned = owned
        self._began: Any = None
        super().__init__(connection.connection.dbapi_connection)
        self.given = connection

    @property
    def dbapi(self) -> Any:
        # after a disconnect SQLAlchemy replaces the driver's connection under the same Connection
        return self.sqlalchemy.connection.dbapi_connection

    def begin(self) -> None:
        self._began = self.sqlalchemy.begin()

    def commit(self) -> None:
        self._began = None
        self.sqlalchemy.commit()

    def rollback(self) -> None:
        self._began = None
        self.sqlalchemy.rollback()

    def ended_inside(self) -> bool:
        """SQLAlchemy's current transaction is no longer the one the writer began (``connection.commit()`` or
        ``rollback()`` inside the block; autobegin then opened another): known in memory, whatever became of the
        database connection since."""
        return self._began is not None and self.sqlalchemy.get_transaction() is not self._began

    def cursor(self) -> Any:
        return self.sqlalchemy.connection.cursor()

    def _driver_side(self) -> Any:
        return self.sqlalchemy.connection

    def in_transaction(self) -> bool:
        return bool(self.sqlalchemy.in_transaction())

    def lost(self) -> bool:
        """SQLAlchemy's disconnect, or the driver's connection closed under it before SQLAlchemy noticed (the
        writer's statements run on the driver's connection)."""
        if self.sqlalchemy.closed or self.sqlalchemy.invalidated:
            return True
        return is_closed(self.sqlalchemy.connection.dbapi_connection)  # not invalidated: no reconnect here

    def check_not_autocommit(self) -> None:
        super().check_not_autocommit()  # an engine made with isolation_level="AUTOCOMMIT" sets the driver's flag
        if self.sqlalchemy.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            raise ConfigError("connection", "uses isolation_level='AUTOCOMMIT': a dual write needs transactions")

    def close(self) -> None:
        if self.owned:
            self.sqlalchemy.close()


def adapt(connection: Any) -> DbapiConnection:
    """What a DualWriter was given, as the writer uses it."""
    if isinstance(connection, DbapiConnection):
        return connection
    from kafka2pc.dualwrite.django_connection import DjangoConnection, is_django_connection  # noqa: PLC0415

    if is_django_connection(connection):
        return DjangoConnection.of(connection)
    sqlalchemy = sys.modules.get("sqlalchemy")
    if sqlalchemy is not None:
        if isinstance(connection, sqlalchemy.engine.Engine):
            return SqlAlchemyConnection(connection.connect(), owned=True)
        if isinstance(connection, sqlalchemy.engine.Connection):
            return SqlAlchemyConnection(connection, owned=False)
        orm = sys.modules.get("sqlalchemy.orm")
        if orm is not None and isinstance(connection, orm.Session):
            raise ConfigError("connection", "is an ORM Session: pass its Engine or a Connection, and bind a Session "
                                            "to tx.connection inside the block (docs/dual-write.md, SQLAlchemy)")
    if type(connection).__module__.split(".")[0] == "MySQLdb":
        raise ConfigError("connection", "is mysqlclient's (MySQLdb): the dual writer takes PyMySQL's connections on "
                                        "MySQL and MariaDB (it reads their transaction status and error numbers)")
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(connection, psycopg.AsyncConnection):
        raise ConfigError("connection", "is a psycopg AsyncConnection: use AsyncDualWriter (docs/dual-write-async.md)")
    if type(connection).__module__.startswith("sqlalchemy.ext.asyncio"):
        raise ConfigError("connection", f"is SQLAlchemy's {type(connection).__name__}: use AsyncDualWriter "
                                        "(docs/dual-write-async.md)")
    if not callable(getattr(connection, "cursor", None)) or not callable(getattr(connection, "commit", None)):
        raise ConfigError("connection", f"{type(connection).__name__} is not a DB-API 2.0 connection, a SQLAlchemy "
                                        "Connection or an Engine")
    return DbapiConnection(connection)
