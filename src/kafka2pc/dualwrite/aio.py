"""AsyncDualWriter: the dual-write protocol's asyncio edge (docs/dual-write-async.md).

The same steps as DualWriter's (:mod:`kafka2pc.dualwrite.protocol`), driven with ``await`` by
:class:`~kafka2pc.dualwrite.aio_edge.AsyncEdge`: the database through psycopg's ``AsyncConnection``, asyncpg's
(:mod:`kafka2pc.dualwrite.aio_asyncpg`) or SQLAlchemy's (:mod:`kafka2pc.dualwrite.aio_sqlalchemy`) on the event
loop, Kafka's blocking calls on the writer's own thread (one at a time, so its producer is never used by two
threads). ``tx.produce`` keeps copies of the records until the block ends; they are produced and prepared in one
hand-off."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kafka2pc.dualwrite.actions import Steps
from kafka2pc.dualwrite.aio_asyncpg import AsyncpgEdge, AsyncpgFacts, is_asyncpg
from kafka2pc.dualwrite.aio_edge import AsyncEdge
from kafka2pc.dualwrite.aio_sqlalchemy import SqlAlchemyAsyncEdge, SqlAlchemyAsyncFacts, async_sqlalchemy_kind
from kafka2pc.dualwrite.connection import DbapiConnection
from kafka2pc.dualwrite.lease_statements import Lease
from kafka2pc.dualwrite.protocol import Record, WriterProtocol
from kafka2pc.dualwrite.state_table import StateTable, state_table_ddl
from kafka2pc.dualwrite.writer_parts import ClusterTransport, WriterCluster, transactional_id_of, writer_protocol
from kafka2pc.errors import ConfigError, DualWriteUsageError, UsageError
from kafka2pc.producer import as_bytes, as_headers

T = TypeVar("T")
#: what one block may keep back for Kafka (records are held in memory until the block ends)
MAX_KEPT_BACK_BYTES = 64 * 1024 * 1024
#: the blocks (a marker each) the current task, or a task it started, is inside
_INSIDE: contextvars.ContextVar[frozenset[object]] = contextvars.ContextVar("kafka2pc_async_blocks",
                                                                            default=frozenset())


class AsyncDualWriteTransaction:
    """The inside of ``async with writer.transaction() as tx``: ``tx.connection`` (the writer's psycopg
    ``AsyncConnection``: ``await tx.connection.execute(...)``) or ``tx.cursor()`` for the database, ``tx.produce``
    for Kafka (kept, not sent, until the block ends: it never blocks the event loop). ``tx.committed`` tells,
    after the block, whether the database committed it (the dual write's commit point)."""

    def __init__(self, connection: Any):
        self.connection = connection
        self.committed = False
        self._records: list[Record] = []
        self._bytes = 0
        self._open = True

    def cursor(self) -> Any:
        """A new cursor of the block's connection."""
        return self.connection.cursor()

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
                headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None = None) -> None:
        """Add a record to the Kafka transaction (TwoPhaseProducer.produce's arguments). A copy is kept and sent
        when the block ends, so a record Kafka refuses (too large, an unknown topic) rolls both back there."""
        if not self._open:
            raise DualWriteUsageError("tx.produce() after its block ended: the transaction is over")
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)):
            raise TypeError(f"partition must be an int or None, not {partition!r}")
        value, key = as_bytes("value", value), as_bytes("key", key)  # copies: the caller may reuse its buffers
        header_list = as_headers(headers)
        self._bytes += len(value or b"") + len(key or b"") + sum(len(k) + len(v or b"") for k, v in header_list or ())
        if self._bytes > MAX_KEPT_BACK_BYTES:
            raise DualWriteUsageError(f"one async dual-write block produced more than {MAX_KEPT_BACK_BYTES} bytes; "
                                      "its records are held in memory until the block ends: split the work")
        self._records.append((topic, value, key, partition, header_list))

    def _end(self) -> tuple[Record, ...]:
        """The block ended: no more records; those kept."""
        self._open = False
        return tuple(self._records)


class AsyncDualWriter:
    """Commits the transaction of a psycopg ``AsyncConnection``, an asyncpg connection, or SQLAlchemy's
    ``AsyncConnection`` or ``AsyncEngine`` (asyncpg or psycopg; the writer checks one connection out of an engine
    for its lifetime), and a
    Kafka transaction atomically, under one transactional id: DualWriter's protocol, state table and recovery, with
    ``await``.

    ``config`` is a TwoPhaseProducer configuration (``bootstrap.servers``, ``transactional.id``, ...). One writer
    per transactional id at a time; one block at a time per writer. ``transport`` replaces the network (a
    coordinator model, in tests). ``lease`` and ``lease_s`` are set by AsyncDualWriterPool."""

    def __init__(self, connection: Any, config: Mapping[str, object], *, two_phase_commit: bool = True,
                 state_table: str = "kafka2pc_dual_write_state", create_state_table: bool = True,
                 transport: ClusterTransport | None = None, lease: Lease | None = None, lease_s: float = 15.0):
        self.transactional_id = transactional_id_of(config)
        self._lease, self._lease_s = lease, lease_s
        psycopg = sys.modules.get("psycopg")
        self._kind = "psycopg" if psycopg is not None and isinstance(connection, psycopg.AsyncConnection) else \
            "asyncpg" if is_asyncpg(connection) else async_sqlalchemy_kind(connection)
        if self._kind is None:
            raise ConfigError("connection", f"{type(connection).__name__} is not a psycopg AsyncConnection, an "
                                            "asyncpg connection, nor SQLAlchemy's AsyncConnection or AsyncEngine "
                                            "(DualWriter takes DB-API and SQLAlchemy's blocking connections)")
        state_table_ddl(state_table)  # a bad name is a ConfigError now, not at first use
        self._given, self._state_table, self._create_state_table = connection, state_table, create_state_table
        # settings checked now; the cluster client (which connects) is made on the Kafka thread at first use, as is
        # an AsyncEngine's connection (on the loop)
        self._cluster = WriterCluster(config, two_phase_commit=two_phase_commit, transport=transport)
        self._kafka = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kafka2pc-{self.transactional_id}")
        self._connection: Any = None if self._kind == "engine" else connection
        self._protocol: WriterProtocol | None = None
        self._table: StateTable | None = None
        self._facts: DbapiConnection | None = None
        self._edge: AsyncEdge = AsyncEdge(connection, self._kafka)
        self._lock = asyncio.Lock()
        self._closed = False
        #: the marker of the block open now, if one is (tasks inside it carry it in _INSIDE)
        self._open_block: object | None = None
        self._loop = LoopBinding(f"AsyncDualWriter {self.transactional_id!r}")

    @property
    def connection(self) -> Any:
        """The connection the writer works through: the one it was given, or the one it checked out of an
        AsyncEngine (None before its first call)."""
        return self._connection

    @property
    def two_phase_commit_active(self) -> bool:
        """Whether Kafka prepared transactions are free of the broker's timeout (see TwoPhaseProducer)."""
        return self._protocol is not None and self._protocol.producer.two_phase_commit_active

    @property
    def unfinished(self) -> bool:
        """Whether a transaction of this writer may be left open in Kafka until a recovery settles it (True until
        the first recovery)."""
        return self._protocol is None or self._protocol.needs_recovery

    @property
    def lease_token(self) -> str | None:
        """The token of the lease this writer holds its id by (a pool's writer), else None."""
        return None if self._lease is None else self._lease.token

    def connection_lost(self) -> bool:
        """Whether the writer's database connection is known to be gone."""
        return self._facts is not None and self._facts.lost()

    def ended_by_lease_limit(self, exc: BaseException) -> bool:
        """Whether ``exc`` is PostgreSQL ending this writer's transaction for the idle limit its lease sets."""
        return self._lease is not None and self._table is not None and self._table.ended_by_own_limit(exc)

    async def recover_unfinished(self, *, keep_lease: bool = False) -> None:
        """Settle this writer's unfinished transaction (DualWriter.recover_unfinished)."""
        async with self._using("recover()"):
            await self._run((await self._opened()).recover_unfinished(keep_lease=keep_lease))

    async def recover(self) -> None:
        """Settle what the id has left unfinished, then own it (DualWriter.recover)."""
        async with self._using("recover()"):
            await self._run((await self._opened()).recover())

    async def resolve(self, reason: str) -> None:
        """Operator action after a DualWriteRecoveryError (DualWriter.resolve)."""
        if not reason.strip():
            raise ValueError("a resolution needs a reason")
        async with self._using("resolve()"):
            await self._run((await self._opened()).resolve(reason))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncDualWriteTransaction]:
        """One DB transaction and one Kafka transaction, committed together on leaving the block; an exception
        inside rolls both back and is re-raised. Concurrent calls take turns (one block at a time)."""
        async with self._using("transaction()"):
            steps = (await self._opened()).transaction()
            if not await self._edge.drive(steps):
                raise AssertionError("the protocol ended before its block")  # pragma: no cover
            tx = AsyncDualWriteTransaction(self._connection)
            self._open_block = marker = object()
            inside = _INSIDE.set(_INSIDE.get() | {marker})
            try:
                yield tx
            except BaseException as exc:
                tx._end()
                _INSIDE.reset(inside)
                await self._edge.drive(steps, None, exc, block=tx)
                raise
            finally:
                self._open_block = None
            tx_records = tx._end()
            _INSIDE.reset(inside)
            await self._edge.drive(steps, tx_records, block=tx)

    async def close(self) -> None:
        """Mark the last transaction complete in the row when it is, and release the producer, its thread and the
        Kafka connections (not the DB connection, which the caller owns). Closing again does nothing."""
        if self._closed:
            return
        async with self._using("close()"):
            if self._closed:
                return
            self._closed = True
            try:
                if self._protocol is not None:
                    await self._run(self._protocol.close())
            finally:
                with contextlib.suppress(Exception):
                    await self._edge.call(self._cluster.close)
                self._kafka.shutdown(wait=False)
                if self._kind == "engine" and self._connection is not None:
                    await self._connection.close()  # the writer's own, checked out of the engine

    async def __aenter__(self) -> AsyncDualWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def _using(self, what: str) -> AsyncIterator[None]:
        """The writer, one call at a time: refused when closed, or from inside its own block (it would wait for
        itself)."""
        if self._open_block is not None and self._open_block in _INSIDE.get():
            raise DualWriteUsageError(f"{self.transactional_id!r}: {what} inside this writer's own transaction() "
                                      "block (or a task started in it); one block is one DB transaction")
        if self._closed:
            raise UsageError(f"{self.transactional_id!r}: {what} on a closed AsyncDualWriter")
        self._loop.check()
        async with self._lock:
            if self._closed and what != "close()":
                raise UsageError(f"{self.transactional_id!r}: {what} on a closed AsyncDualWriter")
            yield

    async def _opened(self) -> WriterProtocol:
        """The protocol, made at the first call: the cluster client on the Kafka thread (it connects: never on the
        event loop), an AsyncEngine's connection checked out."""
        if self._protocol is None:
            if self._kind == "engine" and self._connection is None:
                self._connection = await self._given.connect()
            facts, self._edge = async_database(self._connection, self._kafka)
            table = StateTable(facts, self._state_table, create=self._create_state_table)
            await self._edge.call(self._cluster.connect)
            self._protocol = writer_protocol(facts, table, self._cluster, lease=self._lease, lease_s=self._lease_s)
            self._table, self._facts = table, facts
        return self._protocol

    async def _run(self, steps: Any) -> None:
        await run_async(self._edge, steps)


class LoopBinding:
    """The event loop an asyncio object was first used on: another loop (a thread's ``asyncio.run``) is refused
    before it touches a connection that belongs to the first (asyncpg's and psycopg's are bound to their loop)."""

    def __init__(self, what: str):
        self.what = what
        self._loop: asyncio.AbstractEventLoop | None = None

    def check(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise UsageError(f"{self.what} is used on another event loop than the one it started on (a def endpoint "
                             "or thread calling asyncio.run(), a second loop): its connections belong to the first. "
                             "Use it from async code on that loop, or give the other loop a pool of its own")


async def run_async(edge: AsyncEdge, steps: Steps[T]) -> T:
    """Drive ``steps`` (which have no Block) on ``edge`` to their end; their value."""
    result: list[T] = []

    def collect() -> Steps[None]:
        result.append((yield from steps))

    if await edge.drive(collect()):
        raise TypeError("these steps have no block to hand out")
    return result[0]


def async_database(connection: Any, kafka: ThreadPoolExecutor | None) -> tuple[DbapiConnection, AsyncEdge]:
    """What the protocol reads of an async connection (psycopg's, asyncpg's, or SQLAlchemy's AsyncConnection), and
    the edge that carries its steps out on it (Kafka's calls on ``kafka``)."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(connection, psycopg.AsyncConnection):
        return DbapiConnection(connection), AsyncEdge(connection, kafka)
    if is_asyncpg(connection):
        told = AsyncpgFacts(connection)
        return told, AsyncpgEdge(connection, kafka, told)
    facts, edge = SqlAlchemyAsyncFacts(connection), SqlAlchemyAsyncEdge(connection, kafka)
    edge.facts = facts
    return facts, edge
