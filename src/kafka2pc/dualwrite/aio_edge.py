"""The asyncio edge of the dual-write protocol: carries out its steps' actions with ``await`` on a psycopg
``AsyncConnection``, and Kafka's blocking calls on one thread of its own.

Cancellation is delivered into the protocol once, at the action it interrupted, as the exception that action
raised: the protocol then rolls back as after any failure. From the database commit on (the commit point), and
while the protocol rolls back after a delivered cancel, further cancels wait: the protocol runs to its end and the
task's CancelledError is raised then. The Kafka thread runs one call at a time, so a call still running when its
await was cancelled is always followed, never overtaken, by the protocol's next one (an abort after a prepare)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from kafka2pc.dualwrite.actions import Action, Begin, Block, Call, Commit, Fetch, Rollback, Savepoint, Sleep, Sql, Steps
from kafka2pc.dualwrite.psycopg_block import PsycopgBlock

T = TypeVar("T")


class CommitSeen(Protocol):
    """What the edge tells of the block it drives: whether the database committed it."""

    committed: bool


class AsyncEdge:
    """Runs protocol steps on ``connection`` (psycopg ``AsyncConnection``) and ``kafka`` (a one-thread executor)."""

    def __init__(self, connection: Any, kafka: ThreadPoolExecutor | None):
        self.connection = connection
        self.kafka = kafka
        self._tuple_row = _tuple_row_factory()
        #: the block's savepoint, psycopg's transaction context: the application's commit() is refused in it
        self._block = PsycopgBlock()

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the Kafka thread, in a copy of this task's context (metrics labels ride along)."""
        if self.kafka is None:
            raise TypeError("this edge runs database steps only")
        call = functools.partial(contextvars.copy_context().run, function, *args)
        return await asyncio.get_running_loop().run_in_executor(self.kafka, call)

    async def drive(self, steps: Steps[Any], reply: Any = None, error: BaseException | None = None, *,
                    block: CommitSeen | None = None) -> bool:
        """Drive ``steps`` to their Block (True) or their end (False); ``block``, after the application's block, is
        told when the database commit succeeded."""
        deferred: BaseException | None = None  # a cancel that waits for the protocol's end
        # past the commit point, or rolling back: once an error is in the protocol (the block's, a cancel among them,
        # or an action's after the block) it only rolls back, and a further cancel must not cut that short
        finishing = error is not None
        while True:
            try:
                action = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration:
                if block is not None:
                    block.committed = True  # the transaction's steps end normally only once the database committed
                if deferred is not None:
                    raise deferred from None
                return False
            except BaseException as exc:
                if deferred is not None and exc is not deferred:
                    raise deferred from exc
                raise
            reply, error = None, None
            if isinstance(action, Block):
                if deferred is None:
                    return True
                error, deferred, finishing = deferred, None, True  # cancelled before the block: roll back there
                continue
            # sticky only at the transaction's own commit point (after the block); a recovery's commit is shielded
            # alone, so a later lock wait stays cancellable
            finishing = finishing or (isinstance(action, Commit) and block is not None)
            if finishing or isinstance(action, Commit):
                reply, error, cancel = await self._uncancellable(action)
                deferred = deferred or cancel
            else:
                try:
                    reply = await (self.statement(action) if isinstance(action, Sql) else self.perform(action))
                except asyncio.CancelledError as exc:
                    error, finishing = exc, True  # delivered: the protocol rolls back, further cancels wait
                except BaseException as exc:
                    error = exc
                    finishing = finishing or block is not None  # after the block an error means the rollback
            if block is not None and isinstance(action, Commit) and error is None:
                block.committed = True

    async def _uncancellable(self, action: Action) -> tuple[Any, BaseException | None, BaseException | None]:
        """The action's result or exception, and a cancel that came meanwhile (the action ran to its end)."""
        running = asyncio.ensure_future(self.perform(action))
        cancel: BaseException | None = None
        while True:
            try:
                return await asyncio.shield(running), None, cancel
            except asyncio.CancelledError as exc:
                if running.cancelled():
                    raise  # the action itself was cancelled: the loop is closing
                cancel = exc  # the action ran on, or has just ended: its own outcome is awaited again
            except Exception as exc:
                return None, exc, cancel

    async def statement(self, action: Sql) -> Any:
        """A statement that a cancel interrupts on the server (psycopg's cancel_safe), never in the client: psycopg
        closes a connection whose own cancellation is cancelled again (anyio's cancel scopes do that). The
        statement's end is awaited whatever further cancels come; then the first cancel is raised."""
        running = asyncio.ensure_future(self.perform(action))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError as exc:
            if running.cancelled():
                raise
            first = exc
        interrupt = asyncio.ensure_future(self.connection.cancel_safe())
        while not (running.done() and interrupt.done()):
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(asyncio.gather(running, interrupt, return_exceptions=True))
        raise first

    async def perform(self, action: Action) -> Any:
        """Carry out one action; its result, or its exception."""
        if isinstance(action, Call):
            return await self.call(action.function, *action.args)
        if isinstance(action, Sleep):
            return await asyncio.sleep(action.seconds)
        return await self.database(action)

    async def database(self, action: Action) -> Any:
        """A statement, begin, commit or rollback on psycopg's AsyncConnection."""
        connection = self.connection
        if isinstance(action, Sql):
            cursor = connection.cursor(row_factory=self._tuple_row)  # whatever row factory the application set
            try:
                await cursor.execute(action.text, action.params)
                return await _read(cursor, action.fetch)
            finally:
                await cursor.close()
        if isinstance(action, Savepoint):
            if action.op == "take":
                return await self._block.take_async(connection, action)
            return await self._block.end_async(connection, action)
        if isinstance(action, Commit):
            await self._block.drop_async()  # never held here (the protocol releases it first)
            return await connection.commit()
        if isinstance(action, Rollback):
            await self._block.drop_async()
            return await connection.rollback()
        if isinstance(action, Begin):
            return None  # psycopg begins with the first statement
        raise TypeError(f"{action!r} is not an action to perform")


def _tuple_row_factory() -> Any:
    psycopg_rows = sys.modules.get("psycopg.rows")  # loaded with psycopg (an edge on SQLAlchemy needs none)
    return None if psycopg_rows is None else psycopg_rows.tuple_row


async def _read(cursor: Any, fetch: Fetch) -> Any:
    if fetch is Fetch.ONE:
        return await cursor.fetchone()
    if fetch is Fetch.ALL:
        return await cursor.fetchall()
    if fetch is Fetch.ROWCOUNT:
        return cursor.rowcount
    if fetch is Fetch.COLUMNS:
        return [str(column[0]).lower() for column in cursor.description]
    return None
