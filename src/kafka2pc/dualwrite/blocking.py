"""The blocking edge of the dual-write protocol: runs its steps' actions on a DB-API (or SQLAlchemy) connection
and calls Kafka in the calling thread."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from kafka2pc.dualwrite.actions import (
    Action,
    Begin,
    Block,
    Call,
    Commit,
    Fetch,
    Rollback,
    Savepoint,
    Sleep,
    Sql,
    Steps,
)
from kafka2pc.dualwrite.connection import DbapiConnection

T = TypeVar("T")
B = TypeVar("B")


def read(cursor: Any, fetch: Fetch) -> Any:
    """A DB-API cursor's result, as ``fetch`` asks (shared by every edge whose cursors are DB-API-shaped)."""
    if fetch is Fetch.ONE:
        return cursor.fetchone()
    if fetch is Fetch.ALL:
        return cursor.fetchall()
    if fetch is Fetch.ROWCOUNT:
        return cursor.rowcount
    if fetch is Fetch.COLUMNS:
        return [str(column[0]).lower() for column in cursor.description]
    return None


def perform(action: Action, db: DbapiConnection) -> Any:
    """Carry out one action; its result, or its exception."""
    if isinstance(action, Sql):
        cursor = db.statement_cursor()
        if action.params is None:
            cursor.execute(action.text)
        else:
            cursor.execute(action.text, action.params)
        return read(cursor, action.fetch)
    if isinstance(action, Call):
        return action.function(*action.args)
    if isinstance(action, Savepoint):
        return db.savepoint(action)
    if isinstance(action, Begin):
        return db.begin()
    if isinstance(action, Commit):
        return db.commit()
    if isinstance(action, Rollback):
        return db.rollback()
    if isinstance(action, Sleep):
        return time.sleep(action.seconds)
    raise TypeError(f"{action!r} is not an action")


def run(steps: Steps[T], db: DbapiConnection) -> T:
    """Drive ``steps`` (which have no Block) to their end; their return value."""
    driven = run_with_block(steps, db, _no_block)
    try:
        while True:
            next(driven)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _no_block() -> None:
    raise TypeError("these steps have no block to hand out")


def run_with_block(steps: Steps[T], db: DbapiConnection, block: Callable[[], B]) -> Generator[B, None, T]:
    """Drive ``steps`` as a ``contextlib.contextmanager`` generator: at their Block, yield ``block()`` to the
    ``with`` body and throw in what the body raised. Returns the steps' value."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            action = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            if isinstance(action, Block):
                yield block()
                reply = ()
            else:
                reply = perform(action, db)
        except BaseException as exc:
            error = exc
