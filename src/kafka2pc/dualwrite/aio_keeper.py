"""The lease keeper of an AsyncDualWriterPool: two tasks on the pool's event loop, as the blocking pool's keeper
has two threads (:mod:`kafka2pc.dualwrite.keeper`, which also decides what they do). The watcher works on the
database alone (its own connection, made again when it breaks); the worker does what needs Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

from kafka2pc.dualwrite.aio_pool_writers import AsyncPoolWriters
from kafka2pc.dualwrite.keeper import KeeperCore
from kafka2pc.dualwrite.pool_writers import connection_broken
from kafka2pc.errors import DualWriteRecoveryError, ProducerFencedError

log = logging.getLogger("kafka2pc.dualwrite.keeper")
#: how long stop() waits for a round in progress (as the blocking keeper's thread join)
STOP_WAIT_S = 10.0


class AsyncLeaseKeeper(KeeperCore):
    """Keeps ``pool``; ``connection`` is the watcher's (closed by stop(), replaced when it breaks)."""

    def __init__(self, pool: AsyncPoolWriters, connection: Any):
        super().__init__(pool.prefix, lease_s=pool.lease_s, min_size=pool.min_size, idle_s=pool.idle_s)
        self._pool, self._connection = pool, connection
        self._work_due = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start_up(self) -> int:
        """Before the pool's first claim: the lease columns, and the fleet's adoption of ids made before them."""
        return await self._pool.run(self._connection, lambda leases: leases.adopt())

    def start_watcher(self) -> None:
        self._tasks.append(asyncio.create_task(self._watch_loop(), name=f"kafka2pc-lease-watcher-{self.prefix}"))

    def start_worker(self) -> None:
        self._tasks.append(asyncio.create_task(self._work_loop(), name=f"kafka2pc-lease-worker-{self.prefix}"))

    async def stop(self) -> None:
        """Stop the tasks once their round ends (a settle in progress finishes and gives its writer back, as the
        blocking keeper's threads are joined); one still running after STOP_WAIT_S is cancelled."""
        self._stopping.set()
        self._work_due.set()
        if self._tasks:
            _, running = await asyncio.wait(self._tasks, timeout=STOP_WAIT_S)
            for task in running:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(BaseException):
                    await task
        self._tasks = []
        with contextlib.suppress(Exception):
            await self._connection.close()

    async def _pause(self, seconds: float) -> bool:
        """Wait ``seconds``; False when the keeper is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return not self._stopping.is_set()

    async def _watch_loop(self) -> None:
        while await self._pause(self.tick_s * random.uniform(0.8, 1.0)):
            try:
                await self.watch()
            except Exception as exc:  # the database away: leases run out meanwhile, as they should
                self._failed(exc)
                await self._reconnect()

    async def watch(self) -> None:
        """Renew the leases when due, look for expired ones, plan the worker's round, report."""
        pool = self._pool
        views, tokens, opened = pool.snapshot()
        expired: list[tuple[str, float]] = []
        try:
            started = self._renew_due()
            if started is not None:
                lost = await pool.run(self._connection, lambda leases: leases.lost(tokens, pool.lease_s))
                for transactional_id in self._lost(tokens, lost, started):
                    await pool.lose(transactional_id, tokens[transactional_id])
            expired = await pool.run(self._connection, lambda leases: leases.expired())
            if self._planned(views, expired):
                self._work_due.set()
        finally:
            self._report(views, expired, opened)

    async def _reconnect(self) -> None:
        try:
            await self._connection.rollback()
            return
        except Exception:
            pass
        with contextlib.suppress(Exception):
            await self._connection.close()
        try:
            self._connection = await self._pool.connection()
            log.info("pool %r: lease keeper reconnected to the database", self.prefix)
        except Exception as exc:
            log.warning("pool %r: lease keeper cannot reconnect yet: %r", self.prefix, exc)

    async def _work_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._work_due.wait(), self.tick_s)
            self._work_due.clear()
            if self._stopping.is_set():
                return
            try:
                await self.work()
            except Exception as exc:
                self._failed(exc)

    async def work(self) -> None:
        """Carry out the last plan the watcher made."""
        plan, pool = self._take_plan(), self._pool
        for transactional_id in plan.settle:
            await self._settle(transactional_id)
        for transactional_id in plan.retire:
            writer = pool.take_idle(transactional_id)
            if writer is not None:
                log.info("%r: idle for %g s: giving the id back", transactional_id, pool.idle_s)
                await pool.retire(writer)
        reaped = 0
        while reaped < plan.reap and not self._stopping.is_set() and await pool.reap_one():
            reaped += 1
        self._reaped(reaped)

    async def _settle(self, transactional_id: str) -> None:
        pool = self._pool
        writer = pool.take_idle(transactional_id)
        if writer is None:
            return
        try:
            await writer.recover_unfinished(keep_lease=True)
            log.info("%r: settled the transaction its writer left unfinished", transactional_id)
        except ProducerFencedError as exc:
            await pool.drop(writer, exc)
            return
        except DualWriteRecoveryError as exc:
            await pool.drop(writer, exc)
            return
        except Exception as exc:
            log.warning("%r: could not settle its unfinished transaction yet (%r); retried next round",
                        transactional_id, exc)
            if connection_broken(writer, exc):
                writer = await pool.replace(writer)
            token = writer.lease_token
            if token is not None:  # the failed settle held the row without writing it: renew the lease now
                with contextlib.suppress(Exception):
                    await pool.run(writer.connection, lambda leases: leases.renew(
                        {writer.transactional_id: token}, pool.lease_s))
        await pool.release(writer)
