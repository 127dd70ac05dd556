"""The block's savepoint on psycopg, taken with psycopg's own transaction context: while one is open, psycopg
refuses the connection's ``commit()`` and ``rollback()`` (``ProgrammingError``) before they do anything, so an
application that commits inside a dual-write block gets an error and nothing is split. Blocking and asyncio."""

from __future__ import annotations

import contextlib
from typing import Any

from kafka2pc.dualwrite.actions import Savepoint


class BlockGone(Exception):
    """The block's savepoint is not held (released already)."""


class PsycopgBlock:
    """The open savepoint context of one connection's block, if any."""

    def __init__(self) -> None:
        self._context: Any = None

    def take(self, connection: Any, action: Savepoint) -> None:
        self._context = connection.transaction(savepoint_name=action.name)
        self._context.__enter__()

    def end(self, connection: Any, action: Savepoint) -> None:
        """Release it (the context's end), or roll back to it: a plain statement, whose error keeps its SQLSTATE
        (psycopg's own rollback only logs one); the context is then let go by the transaction's rollback."""
        if action.op == "rollback_to":
            connection.execute(action.sql)
            return
        context, self._context = self._context, None
        if context is None:
            raise BlockGone("the block's savepoint is not held")
        context.__exit__(None, None, None)

    def drop(self) -> None:
        """Before the transaction's own commit or rollback: a savepoint still held is let go (rolled back to)."""
        context, self._context = self._context, None
        if context is not None:
            with contextlib.suppress(Exception):
                context.__exit__(*_rollback_of(context))

    async def take_async(self, connection: Any, action: Savepoint) -> None:
        self._context = connection.transaction(savepoint_name=action.name)
        await self._context.__aenter__()

    async def end_async(self, connection: Any, action: Savepoint) -> None:
        if action.op == "rollback_to":
            await connection.execute(action.sql)
            return
        context, self._context = self._context, None
        if context is None:
            raise BlockGone("the block's savepoint is not held")
        await context.__aexit__(None, None, None)

    async def drop_async(self) -> None:
        context, self._context = self._context, None
        if context is not None:
            with contextlib.suppress(Exception):
                await context.__aexit__(*_rollback_of(context))


def _rollback_of(context: Any) -> tuple[Any, Any, None]:
    from psycopg import Rollback  # noqa: PLC0415 - only on psycopg

    rollback = Rollback(context)
    return type(rollback), rollback, None

