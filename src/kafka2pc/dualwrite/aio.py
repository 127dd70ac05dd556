"""AsyncDualWriter: the dual-write protocol's asyncio edge (docs/dual-write-async.md).

The same steps as DualWriter's (:mod:`kafka2pc.dualwrite.protocol`), driven with ``await``: the database through
psycopg's ``AsyncConnection`` on the event loop, Kafka's blocking calls handed to the writer's own thread (one at a
time, so its producer is never used by two threads). ``tx.produce`` keeps records back until the block ends; they
are produced and prepared in one hand-off. Once the protocol runs, a cancellation waits for it to reach the block
or its end (a commit is never cut in half), then is raised."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kafka2pc.dualwrite.actions import Action, Begin, Block, Call, Commit, Fetch, Rollback, Sleep, Sql, Steps
from kafka2pc.dualwrite.connection import DbapiConnection
from kafka2pc.dualwrite.protocol import Record
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.dualwrite.writer_parts import ClusterTransport, WriterCluster, transactional_id_of, writer_protocol
from kafka2pc.errors import ConfigError, DualWriteUsageError

T = TypeVar("T")
#: what one block may keep back for Kafka (records are held in memory until the block ends)
MAX_KEPT_BACK_BYTES = 64 * 1024 * 1024


class AsyncDualWriteTransaction:
    """The inside of ``async with writer.transaction() as tx``: ``tx.connection`` (the writer's psycopg
    ``AsyncConnection``: ``await tx.connection.execute(...)``) or ``tx.cursor()`` for the database, ``tx.produce``
    for Kafka (kept back, not sent, until the block ends: it never blocks the event loop)."""

    def __init__(self, connection: Any):
        self.connection = connection
        self.kept_back: list[Record] = []
        self._bytes = 0

    def cursor(self) -> Any:
        """A new cursor of the block's connection."""
        return self.connection.cursor()

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
                headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None = None) -> None:
        """Add a record to the Kafka transaction (TwoPhaseProducer.produce's arguments). It is sent when the block
        ends, so a record Kafka refuses (too large, an unknown topic) rolls both back there."""
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        for name, data in (("value", value), ("key", key)):
            if data is not None and not isinstance(data, bytes | bytearray | memoryview):
                raise TypeError(f"{name} must be bytes or None, not {type(data).__name__}")
        self._bytes += len(value or b"") + len(key or b"")
        if self._bytes > MAX_KEPT_BACK_BYTES:
            raise DualWriteUsageError(f"one async dual-write block produced more than {MAX_KEPT_BACK_BYTES} bytes; "
                                      "its records are held in memory until the block ends: split the work")
        self.kept_back.append((topic, value, key, partition, headers))


class AsyncDualWriter:
    """Commits a psycopg ``AsyncConnection``'s transaction and a Kafka transaction atomically, under one
    transactional id: DualWriter's protocol, state table and recovery, with ``await``.

    ``config`` is a TwoPhaseProducer configuration (``bootstrap.servers``, ``transactional.id``, ...). One writer
    per transactional id at a time; one block at a time per writer. ``transport`` replaces the network (a
    coordinator model, in tests)."""

    def __init__(self, connection: Any, config: Mapping[str, object], *, two_phase_commit: bool = True,
                 state_table: str = "kafka2pc_dual_write_state", create_state_table: bool = True,
                 transport: ClusterTransport | None = None):
        self.transactional_id = transactional_id_of(config)
        psycopg = sys.modules.get("psycopg")
        if psycopg is None or not isinstance(connection, psycopg.AsyncConnection):
            raise ConfigError("connection", f"{type(connection).__name__} is not a psycopg AsyncConnection (the "
                                            "one asyncio connection AsyncDualWriter takes; DualWriter takes DB-API "
                                            "and SQLAlchemy connections)")
        self._connection = connection
        # the protocol reads facts of the connection (autocommit, its transaction's status) through the DB-API
        # view: those need no I/O; every statement goes through this edge
        self._facts = DbapiConnection(connection)
        self._table = StateTable(self._facts, state_table, create=create_state_table)
        self._cluster = WriterCluster(config, two_phase_commit=two_phase_commit, transport=transport)
        self._protocol = writer_protocol(self._facts, self._table, self._cluster, lease=None, lease_s=0.0)
        self._kafka = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kafka2pc-{self.transactional_id}")
        self._lock = asyncio.Lock()
        #: the task inside a block of this writer (a nested block in it would wait for itself)
        self._holder: asyncio.Task[Any] | None = None

    @property
    def connection(self) -> Any:
        """The psycopg AsyncConnection the writer works through."""
        return self._connection

    @property
    def two_phase_commit_active(self) -> bool:
        """Whether Kafka prepared transactions are free of the broker's timeout (see TwoPhaseProducer)."""
        return self._protocol.producer.two_phase_commit_active

    @property
    def unfinished(self) -> bool:
        """Whether a transaction of this writer may be left open in Kafka until a recovery settles it."""
        return self._protocol.needs_recovery

    async def recover(self) -> None:
        """Settle what the id has left unfinished, then own it (DualWriter.recover)."""
        async with self._lock:
            await self._run(self._protocol.recover())

    async def resolve(self, reason: str) -> None:
        """Operator action after a DualWriteRecoveryError (DualWriter.resolve)."""
        if not reason.strip():
            raise ValueError("a resolution needs a reason")
        async with self._lock:
            await self._run(self._protocol.resolve(reason))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncDualWriteTransaction]:
        """One DB transaction and one Kafka transaction, committed together on leaving the block; an exception
        inside rolls both back and is re-raised."""
        if self._lock.locked() and asyncio.current_task() is self._holder:
            raise DualWriteUsageError(f"{self.transactional_id!r}: transaction() inside another transaction() block "
                                      "of the same writer; one block is one DB transaction")
        async with self._lock:
            self._holder = asyncio.current_task()
            try:
                steps = self._protocol.transaction()
                if not await self._advance(steps, None, None):
                    raise AssertionError("the protocol ended before its block")  # pragma: no cover
                tx = AsyncDualWriteTransaction(self._connection)
                try:
                    yield tx
                except BaseException as exc:
                    await self._advance(steps, None, exc)
                    raise
                await self._advance(steps, tx.kept_back, None)
            finally:
                self._holder = None

    async def close(self) -> None:
        """Mark the last transaction complete in the row when it is, and release the producer, its thread and the
        Kafka connections (not the DB connection, which the caller owns)."""
        async with self._lock:
            try:
                await self._run(self._protocol.close())
            finally:
                await asyncio.get_running_loop().run_in_executor(self._kafka, self._cluster.close)
                self._kafka.shutdown(wait=False)

    async def __aenter__(self) -> AsyncDualWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the edge ----------------------------------------------------------------------------------------------------

    async def _run(self, steps: Steps[Any]) -> None:
        if await self._advance(steps, None, None):
            await self._advance(steps, None, TypeError("these steps have no block to hand out"))

    async def _advance(self, steps: Steps[Any], reply: Any, error: BaseException | None) -> bool:
        """Drive ``steps`` to their Block (True) or their end (False), shielded from cancellation: a cancel waits
        for that point, rolls back a block not yet entered, and is raised then."""
        driving = asyncio.ensure_future(self._drive(steps, reply, error))
        cancelled: asyncio.CancelledError | None = None
        while True:
            try:
                at_block = await asyncio.shield(driving)
                break
            except asyncio.CancelledError as exc:
                if driving.done():
                    raise  # the protocol itself was cancelled (the loop is closing)
                cancelled = exc
        if cancelled is not None:
            if at_block:
                await self._advance(steps, None, cancelled)
            raise cancelled
        return at_block

    async def _drive(self, steps: Steps[Any], reply: Any, error: BaseException | None) -> bool:
        while True:
            try:
                action = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration:
                return False
            if isinstance(action, Block):
                return True
            reply, error = None, None
            try:
                reply = await self._perform(action)
            except BaseException as exc:  # thrown back in where the action was yielded
                error = exc

    async def _perform(self, action: Action) -> Any:
        connection = self._connection
        if isinstance(action, Sql):
            cursor = connection.cursor()
            await cursor.execute(action.text, action.params)
            return await _read(cursor, action.fetch)
        if isinstance(action, Call):
            call = functools.partial(contextvars.copy_context().run, action.function, *action.args)
            return await asyncio.get_running_loop().run_in_executor(self._kafka, call)
        if isinstance(action, Commit):
            return await connection.commit()
        if isinstance(action, Rollback):
            return await connection.rollback()
        if isinstance(action, Sleep):
            return await asyncio.sleep(action.seconds)
        if isinstance(action, Begin):
            return None  # psycopg begins with the first statement
        raise TypeError(f"{action!r} is not an action")


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
