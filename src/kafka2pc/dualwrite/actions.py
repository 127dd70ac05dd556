"""What the dual-write protocol asks its I/O edge to do (sans-IO, in the spirit of h11).

The protocol's steps are generators: each ``yield`` hands the edge one action and receives its result, or has the
action's exception thrown in where it was yielded. So the same steps run on a blocking connection
(:mod:`kafka2pc.dualwrite.blocking`) and on an asyncio one (:mod:`kafka2pc.dualwrite.aio`); neither edge decides
anything."""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import attrs

T = TypeVar("T")


class Fetch(enum.Enum):
    """What a statement's result is read as."""

    NOTHING = "nothing"
    ONE = "one"  # the first row, or None
    ALL = "all"  # every row
    ROWCOUNT = "rowcount"  # rows the statement changed (matched, for UPDATE)
    COLUMNS = "columns"  # the result's column names, lower case


@attrs.frozen
class Sql:
    """Run one statement in the connection's current transaction; the reply is what ``fetch`` reads."""

    text: str
    params: tuple[Any, ...] | None = None
    fetch: Fetch = Fetch.NOTHING


@attrs.frozen
class Begin:
    """Begin a transaction (DB-API drivers begin implicitly: then nothing)."""


@attrs.frozen
class Commit:
    """Commit the connection's transaction."""


@attrs.frozen
class Rollback:
    """Roll the connection's transaction back."""


@attrs.frozen
class Savepoint:
    """Take (``take``), release (``release``) or roll back to (``rollback_to``) the block's savepoint, ``name``. On
    psycopg the edge takes it with psycopg's own transaction context, so that the application's ``commit()`` or
    ``rollback()`` inside the block is refused before it does anything; elsewhere it is plain SQL."""

    op: str = attrs.field(validator=attrs.validators.in_(("take", "release", "rollback_to")))
    name: str = "kafka2pc_dual_write_block"

    @property
    def sql(self) -> str:
        verb = {"take": "SAVEPOINT", "release": "RELEASE SAVEPOINT", "rollback_to": "ROLLBACK TO SAVEPOINT"}[self.op]
        return f"{verb} {self.name}"


@attrs.frozen
class Sleep:
    """Wait before a retry."""

    seconds: float


@attrs.frozen(eq=False)
class Call:
    """A blocking call on the Kafka side (a producer's or a control's method): an asyncio edge runs it off the
    event loop. The reply is its return value."""

    function: Callable[..., Any]
    args: tuple[Any, ...] = ()


@attrs.frozen
class Block:
    """Hand the application its block. The reply is the records an edge kept back until the block ended (an asyncio
    edge, whose ``tx.produce`` must not block the loop); a blocking edge produces at once and replies ()."""


Action = Sql | Begin | Commit | Rollback | Savepoint | Sleep | Call | Block
#: a protocol step: yields actions, receives their results, returns a T
Steps = Generator[Action, Any, T]
