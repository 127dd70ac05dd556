"""AsyncDualWriter on a bare asyncpg connection (``asyncpg.connect()``, or one acquired from an ``asyncpg`` pool).

asyncpg has no implicit transactions: the writer's transaction is asyncpg's own ``connection.transaction()``,
started and ended by the writer, so inside the block ``async with tx.connection.transaction():`` is a savepoint
(asyncpg's nesting), as with psycopg or SQLAlchemy. Statements use asyncpg's ``$1`` placeholders."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from kafka2pc.dualwrite.actions import Action, Begin, Commit, Fetch, Rollback, Savepoint, Sql
from kafka2pc.dualwrite.aio_edge import AsyncEdge
from kafka2pc.dualwrite.connection import DbapiConnection


def is_asyncpg(connection: Any) -> bool:
    """Whether ``connection`` is asyncpg's Connection, or the proxy an asyncpg pool hands out."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return False
    return isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy)


class AsyncpgFacts(DbapiConnection):
    """What the protocol reads of an asyncpg connection without I/O: its transaction, whether it is closed."""

    def __init__(self, connection: Any):
        self.given = connection
        self._dbapi = connection
        self.module = None  # no DB-API module: errors are told apart by their SQLSTATE
        self.sqlite, self.mysql = False, False
        self._block = None
        #: the writer's transaction is open (the edge began it and has not ended it)
        self.began = False

    @property
    def paramstyle(self) -> str:
        return "numeric_dollar"

    def lost(self) -> bool:
        return bool(self.given.is_closed())

    def in_transaction(self) -> bool:
        # asyncpg keeps the last status of a lost connection: a lost connection is not one to refuse as "open"
        return not self.given.is_closed() and bool(self.given.is_in_transaction())

    def ended_inside(self) -> bool:
        """The server said the writer's transaction was over (the application's COMMIT or ROLLBACK inside the
        block): asyncpg keeps the last status it was told, also once the connection is lost."""
        return self.began and not self.given.is_in_transaction()

    def check_not_autocommit(self) -> None:
        """Nothing: asyncpg has no autocommit mode to refuse (the writer begins its transactions)."""


class AsyncpgEdge(AsyncEdge):
    """The asyncio edge, its database half on an asyncpg connection. A statement a cancel interrupts is cancelled
    on the server by asyncpg itself."""

    def __init__(self, connection: Any, kafka: Any, facts: AsyncpgFacts):
        super().__init__(connection, kafka)
        self.facts = facts
        self._transaction: Any = None  # asyncpg's Transaction the writer started, while it is open

    async def statement(self, action: Sql) -> Any:
        return await self.perform(action)

    async def database(self, action: Action) -> Any:
        connection = self.connection
        if isinstance(action, Sql):
            return await _run(connection, action)
        if isinstance(action, Savepoint):
            await connection.execute(action.sql)
            return None
        if isinstance(action, Begin):
            if self._transaction is None and not connection.is_in_transaction():
                self._transaction = connection.transaction()
                await _to_its_end(self._transaction.start())
                self.facts.began = True
            return None
        if isinstance(action, Commit | Rollback):
            transaction, self._transaction = self._transaction, None
            self.facts.began = False
            if transaction is not None:
                try:
                    return await (transaction.commit() if isinstance(action, Commit) else transaction.rollback())
                except _asyncpg_interface_error() as exc:
                    # asyncpg refused: the Transaction never started (its BEGIN failed) yet stays the connection's
                    # outer one, and would turn every later BEGIN into a SAVEPOINT. Forgotten; the server's
                    # transaction, if any, rolled back (never committed: nothing of the writer's can be in it)
                    _forget_outer(connection, transaction)
                    if isinstance(action, Commit):
                        raise exc
            # a transaction the writer did not start, or one asyncpg gave up on
            if not connection.is_closed() and connection.is_in_transaction():
                await connection.execute("COMMIT" if isinstance(action, Commit) else "ROLLBACK")
            return None
        raise TypeError(f"{action!r} is not an action to perform")


async def _to_its_end(operation: Any) -> None:
    """Await ``operation`` to its end even when the task is cancelled meanwhile, then raise the cancel: a BEGIN
    cancelled on the wire would leave asyncpg's Transaction failed, and the server in a transaction."""
    running = asyncio.ensure_future(operation)
    try:
        await asyncio.shield(running)
    except asyncio.CancelledError:
        if running.cancelled():
            raise
        while not running.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([running])
        running.exception()  # its own failure, if any, goes with the cancel (retrieved: never logged as lost)
        raise


def _asyncpg_interface_error() -> type[Exception]:
    return sys.modules["asyncpg"].InterfaceError  # type: ignore[no-any-return]


def _forget_outer(connection: Any, transaction: Any) -> None:
    """Unregister a Transaction asyncpg keeps as the connection's outer one (its private ``_top_xact``; the
    underlying connection's for a pool's proxy)."""
    underlying = getattr(connection, "_con", None) or connection
    if getattr(underlying, "_top_xact", None) is transaction:
        underlying._top_xact = None


async def _run(connection: Any, action: Sql) -> Any:
    """One of the writer's statements, read as ``action.fetch`` asks."""
    params = tuple(action.params or ())
    if action.fetch is Fetch.ONE:
        row = await connection.fetchrow(action.text, *params)
        return None if row is None else tuple(row)
    if action.fetch is Fetch.ALL:
        return [tuple(row) for row in await connection.fetch(action.text, *params)]
    if action.fetch is Fetch.COLUMNS:
        prepared = await connection.prepare(action.text)
        return [attribute.name.lower() for attribute in prepared.get_attributes()]
    status = await connection.execute(action.text, *params)  # "UPDATE 1", "INSERT 0 1"
    if action.fetch is Fetch.ROWCOUNT:
        count = str(status).rsplit(" ", 1)[-1]
        return int(count) if count.isdigit() else -1
    return None
