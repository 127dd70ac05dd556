"""AsyncDualWriter on SQLAlchemy's asyncio API: an ``AsyncConnection`` (the caller's) or an ``AsyncEngine`` (the
writer checks one connection out for its lifetime), over asyncpg or psycopg's async driver.

Every statement of the writer goes through ``exec_driver_sql`` and every transaction through the AsyncConnection's
``begin``/``commit``/``rollback``, so SQLAlchemy's view of the transaction stays right, and an ``AsyncSession``
bound to the block's connection (``join_transaction_mode="create_savepoint"``) works inside the dual write."""

from __future__ import annotations

import sys
from typing import Any

from kafka2pc.dualwrite.actions import Action, Begin, Commit, Fetch, Rollback, Savepoint, Sql
from kafka2pc.dualwrite.aio_edge import AsyncEdge
from kafka2pc.dualwrite.connection import DbapiConnection
from kafka2pc.errors import ConfigError


def async_sqlalchemy_kind(connection: Any) -> str | None:
    """"connection" for SQLAlchemy's AsyncConnection, "engine" for its AsyncEngine, else None."""
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    if asyncio_ext is None:
        return None
    if isinstance(connection, asyncio_ext.AsyncConnection):
        return "connection"
    if isinstance(connection, asyncio_ext.AsyncEngine):
        return "engine"
    return None


class SqlAlchemyAsyncFacts(DbapiConnection):
    """What the protocol reads of an AsyncConnection without I/O: its transaction, autocommit, paramstyle, session."""

    def __init__(self, connection: Any):
        self.given = connection
        self.module = None
        self.sqlite, self.mysql = False, False
        self._block = None
        name = connection.dialect.name
        if name != "postgresql":
            raise ConfigError("connection", f"is SQLAlchemy on {name!r}: AsyncDualWriter works on PostgreSQL "
                                            "(asyncpg, psycopg)")
        self._paramstyle = str(connection.dialect.paramstyle)
        #: the transaction the writer began (SQLAlchemy's, under the AsyncConnection), while it is open
        self.began: Any = None

    @property
    def dbapi(self) -> Any:
        return self.given.sync_connection.connection.dbapi_connection

    @property
    def paramstyle(self) -> str:
        return self._paramstyle

    def lost(self) -> bool:
        return bool(self.given.closed or self.given.invalidated)

    def in_transaction(self) -> bool:
        return bool(self.given.in_transaction())

    def ended_inside(self) -> bool:
        """SQLAlchemy's current transaction is no longer the one the writer began (the application's commit or
        rollback inside the block): known in memory, whatever became of the connection since."""
        return self.began is not None and self.given.sync_connection.get_transaction() is not self.began

    def check_not_autocommit(self) -> None:
        if self.given.sync_connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            raise ConfigError("connection", "uses isolation_level='AUTOCOMMIT': a dual write needs transactions")


class SqlAlchemyAsyncEdge(AsyncEdge):
    """The asyncio edge, its database half on SQLAlchemy's AsyncConnection (``facts`` told which transaction the
    writer began)."""

    facts: SqlAlchemyAsyncFacts | None = None

    async def statement(self, action: Sql) -> Any:
        """A statement, cancelled in the client as the driver does it (SQLAlchemy has no server-side cancel of its
        own to wait for)."""
        return await self.perform(action)

    async def database(self, action: Action) -> Any:
        connection = self.connection
        if isinstance(action, Sql):
            result = await connection.exec_driver_sql(action.text, action.params)
            if action.fetch is Fetch.ONE:
                row = result.fetchone()
                return None if row is None else tuple(row)
            if action.fetch is Fetch.ALL:
                return [tuple(row) for row in result.fetchall()]
            if action.fetch is Fetch.ROWCOUNT:
                return result.rowcount
            if action.fetch is Fetch.COLUMNS:
                return [str(key).lower() for key in result.keys()]  # noqa: SIM118 - iterating a result gives rows
            return None
        if isinstance(action, Savepoint):
            await connection.exec_driver_sql(action.sql)
            return None
        if isinstance(action, Begin):
            if not connection.in_transaction():
                await connection.begin()
            if self.facts is not None:
                self.facts.began = connection.sync_connection.get_transaction()
            return None
        if isinstance(action, Commit | Rollback) and self.facts is not None:
            self.facts.began = None
        if isinstance(action, Commit):
            return await connection.commit()
        if isinstance(action, Rollback):
            return await connection.rollback()
        raise TypeError(f"{action!r} is not an action to perform")
