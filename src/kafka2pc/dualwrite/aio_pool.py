"""AsyncDualWriterPool: DualWriterPool's leases for asyncio services (docs/dual-write-async.md): async writers
on ids ``<transactional.id>-<n>`` leased from the state table, renewed and settled by two keeper tasks on the
pool's event loop. The leases, the bookkeeping and what happens after a failed block are decided where the
blocking pool's are (:mod:`.lease_statements`, :mod:`.slots`, :mod:`.keeper`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from kafka2pc.dualwrite.aio import AsyncDualWriter, AsyncDualWriteTransaction, LoopBinding
from kafka2pc.dualwrite.aio_keeper import AsyncLeaseKeeper
from kafka2pc.dualwrite.aio_pool_writers import AsyncPoolWriters
from kafka2pc.dualwrite.pool_writers import connection_broken
from kafka2pc.dualwrite.slots import after_block_error, pool_prefix
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.dualwrite.writer_parts import ClusterTransport
from kafka2pc.errors import ConfigError, DualWriteRecoveryError, PoolTimeoutError, ProducerFencedError, UsageError

log = logging.getLogger("kafka2pc.dualwrite.pool")


class AsyncDualWriterPool:
    """Up to ``size`` AsyncDualWriters behind one ``transaction()``, for the tasks of one event loop; every
    process of a fleet (uvicorn or gunicorn workers) can be given the same configuration.

    ``connect`` is a SQLAlchemy ``AsyncEngine`` (each writer checks one connection out for as long as it holds
    its id; the keeper one more), or a callable returning a psycopg ``AsyncConnection``, an asyncpg connection or
    SQLAlchemy's ``AsyncConnection``, or an awaitable of one (``functools.partial(asyncpg.connect, dsn)``).
    The other arguments are DualWriterPool's. Start it with ``await pool.start()`` or ``async with pool:``
    (FastAPI's lifespan); ``transaction()`` starts it too. Close it with ``await pool.close()``: it gives the ids
    back. A process killed without closing leaves its leases to expire after ``lease_s``: the fleet's live pools
    then settle them."""

    def __init__(self, connect: Callable[[], Any] | Any, config: Mapping[str, object], *, size: int,
                 min_size: int = 1, lease_s: float = 15.0, idle_s: float = 60.0, max_ids: int | None = None,
                 acquire_timeout_s: float = 30.0, two_phase_commit: bool = True,
                 state_table: str = "kafka2pc_dual_write_state", create_state_table: bool = True,
                 transport_for: Callable[[str], ClusterTransport] | None = None):
        self.prefix = pool_prefix(config, size=size, min_size=min_size, lease_s=lease_s, idle_s=idle_s,
                                  max_ids=max_ids)
        self.size, self.min_size, self.lease_s, self.idle_s, self.max_ids = size, min_size, lease_s, idle_s, max_ids
        options = {"two_phase_commit": two_phase_commit, "state_table": state_table,
                   "create_state_table": create_state_table}
        self._set = AsyncPoolWriters(self.prefix, _connector(connect), config, options, size=size, min_size=min_size,
                                     lease_s=lease_s, idle_s=idle_s, max_ids=max_ids,
                                     acquire_timeout_s=acquire_timeout_s, transport_for=transport_for)
        self.holder = self._set.holder
        #: ids taken out of service because they need an operator, with the error (DualWriterPool.benched)
        self.benched: dict[str, Exception] = self._set.benched
        self._pid = os.getpid()
        self._keeper: AsyncLeaseKeeper | None = None
        self._starting = asyncio.Lock()
        self._closed = False
        self._loop = LoopBinding(f"AsyncDualWriterPool {self.prefix!r}")

    @property
    def transactional_ids(self) -> list[str]:
        """The ids this pool holds leases on now."""
        return self._set.ids()

    async def start(self) -> None:
        """Adopt the fleet's ids of earlier releases, lease and recover ``min_size`` ids, start the keeper's tasks.
        Starting again does nothing."""
        if os.getpid() != self._pid:
            raise UsageError(f"the pool was made in process {self._pid}, before a fork: make it in each worker "
                             "process (FastAPI's lifespan)")
        self._loop.check()
        async with self._starting:
            if self._closed:
                raise UsageError(f"pool {self.prefix!r} is closed")
            if self._keeper is not None:
                return
            keeper = AsyncLeaseKeeper(self._set, await self._set.connection())
            try:
                adopted = await keeper.start_up()
                keeper.start_watcher()  # renewing from the first claim: a slow recovery must not let a lease lapse
                await self._start_writers()
            except BaseException:
                await _shielded(self._undo_start(keeper))  # the next start() (a transaction()) tries again
                raise
            self._keeper = keeper
            keeper.start_worker()
            log.info("async dual-writer pool %r (%s): %d of up to %d writers, ids %s%s", self.prefix, self.holder,
                     len(self._set.writers), self.size, self._set.ids(),
                     f"; {adopted} ids of an earlier release adopted" if adopted else "")

    async def _undo_start(self, keeper: AsyncLeaseKeeper) -> None:
        """A start failed (Kafka or the database away, or its request cancelled): stop its keeper, settle and give
        back the ids it leased, and lend again."""
        idle = await self._set.close()
        await keeper.stop()
        for writer in idle:
            await self._set.retire(writer)
        self._set.reopen()

    async def _start_writers(self) -> None:
        for _ in range(self.min_size + 2 * self.size):  # each failed round drops an id: lost meanwhile, or benched
            if len(self._set.writers) >= self.min_size:
                return
            writer = await self._set.grow()
            if writer is None:
                return
            try:
                await writer.recover_unfinished()
            except (ProducerFencedError, DualWriteRecoveryError) as exc:
                await self._set.drop(writer, exc)
                continue
            except BaseException:
                await self._set.discard(writer)  # its recovery just failed: not tried twice
                raise
            await self._set.release(writer)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncDualWriteTransaction]:
        """A writer's ``transaction()`` (AsyncDualWriter.transaction): a free one, or a new lease, waiting up to
        ``acquire_timeout_s``. A writer found fenced or needing an operator before the block began is dropped and
        the request goes on with another; one that lost its lease while the block ran raises LeaseLostError
        (a RetriableError: both sides rolled back)."""
        await self.start()
        reconnected = False
        for _ in range(self.size + 2):  # each round that lends no writer drops one
            writer: AsyncDualWriter | None = await self._set.lend()
            assert writer is not None
            writer_id = writer.transactional_id
            started = False
            try:
                async with writer.transaction() as tx:
                    started = True
                    yield tx
                return
            except Exception as exc:
                fate = after_block_error(exc, started=started, broken=connection_broken(writer, exc),
                                         lost_lease=writer.ended_by_lease_limit(exc),
                                         session_ended=StateTable.session_ended(exc))
                gave_up = False
                if fate.drop:
                    await self._set.drop(writer, exc)
                    writer = None
                elif fate.replace:
                    replaced = await self._set.replace(writer)
                    # one new connection per request: the database still away, or dropping new ones too
                    gave_up = fate.retry and (replaced is writer or reconnected)
                    writer, reconnected = replaced, reconnected or fate.retry
                error = fate.error(writer_id, self.lease_s, exc, gave_up=gave_up)
                if error is not None:
                    raise error from exc
                if not fate.retry:
                    raise
            finally:
                if writer is not None:
                    await _shielded(self._set.release(writer))
        raise PoolTimeoutError(f"pool {self.prefix!r}: every writer tried was fenced or benched; retry")

    async def settle_expired(self, limit: int = 10_000) -> int:
        """Claim and settle the fleet's expired leases now, up to ``limit``; returns how many were settled."""
        await self.start()
        settled = 0
        while settled < limit and await self._set.reap_one():
            settled += 1
        return settled

    async def close(self) -> None:
        """Stop the keeper's tasks; settle, close and give back every idle writer now, each lent one when its
        transaction ends. Closing again does nothing."""
        if self._closed or os.getpid() != self._pid:
            return
        self._loop.check()
        async with self._starting:  # a start in progress ends first (its keeper is then this close's to stop)
            await self._close()

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        idle = await self._set.close()
        if self._keeper is not None:
            await self._keeper.stop()
        for writer in idle:
            await self._set.retire(writer)

    async def __aenter__(self) -> AsyncDualWriterPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _shielded(step: Any) -> None:
    """A writer's return to the pool, run to its end even if the request is cancelled meanwhile (the cancel is
    raised then)."""
    task = asyncio.ensure_future(step)
    cancel: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.cancelled():
                raise
            cancel = cancel or exc
    task.result()
    if cancel is not None:
        raise cancel


def _connector(connect: Callable[[], Any] | Any) -> Callable[[], Any]:
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    if asyncio_ext is not None and isinstance(connect, asyncio_ext.AsyncEngine):
        return connect.connect  # type: ignore[no-any-return]
    if not callable(connect):
        raise ConfigError("connect", f"{type(connect).__name__} is neither a callable making an async connection "
                                     "nor a SQLAlchemy AsyncEngine: pass the function, not its call (for example "
                                     "functools.partial(asyncpg.connect, dsn))")
    return connect
