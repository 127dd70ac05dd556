"""The writers of an AsyncDualWriterPool and their leases: :class:`~kafka2pc.dualwrite.slots.WriterSlots` under an
``asyncio.Condition``, and the operations on them that requests and the keeper's tasks share, with ``await``
(the blocking pool's are :class:`~kafka2pc.dualwrite.pool_writers.PoolWriters`)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kafka2pc.dualwrite.actions import Steps
from kafka2pc.dualwrite.aio import AsyncDualWriter, async_database, run_async
from kafka2pc.dualwrite.lease_statements import Lease, LeaseStatements
from kafka2pc.dualwrite.slots import Wait, WriterSlots
from kafka2pc.dualwrite.state_table import StateTable
from kafka2pc.dualwrite.upkeep import WriterView
from kafka2pc.dualwrite.writer_parts import ClusterTransport
from kafka2pc.errors import DualWriteRecoveryError, ProducerFencedError

log = logging.getLogger("kafka2pc.dualwrite.pool")
T = TypeVar("T")


class AsyncPoolWriters:
    """Up to ``size`` async writers on leased ids under ``prefix``, each lent to one task at a time."""

    def __init__(self, prefix: str, connect: Callable[[], Any], config: Mapping[str, object], options: dict[str, Any],
                 *, size: int, min_size: int, lease_s: float, idle_s: float, max_ids: int | None,
                 acquire_timeout_s: float, transport_for: Callable[[str], ClusterTransport] | None):
        self.prefix, self.size, self.min_size, self.lease_s, self.idle_s = prefix, size, min_size, lease_s, idle_s
        self.max_ids, self.acquire_timeout_s = max_ids, acquire_timeout_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self._connect, self._config, self._options, self._transport_for = connect, dict(config), options, transport_for
        self._cv = asyncio.Condition()
        self._waking: set[asyncio.Task[None]] = set()
        self._slots: WriterSlots[AsyncDualWriter] = WriterSlots(prefix, size, max_ids, acquire_timeout_s)
        self.writers = self._slots.writers
        self.benched = self._slots.benched

    def ids(self) -> list[str]:
        return self._slots.ids()

    def snapshot(self) -> tuple[list[WriterView], dict[str, str], list[float]]:
        return self._slots.snapshot(time.monotonic())

    async def connection(self) -> Any:
        """A new connection (``connect()``, awaited if it returns an awaitable: an AsyncEngine's connect())."""
        made = self._connect()
        return await made if inspect.isawaitable(made) else made

    async def run(self, connection: Any, steps: Callable[[LeaseStatements], Steps[T]]) -> T:
        """Lease steps on ``connection``'s state table."""
        facts, edge = async_database(connection, None)
        table = StateTable(facts, self._options["state_table"], create=self._options["create_state_table"])
        return await run_async(edge, steps(LeaseStatements(table, self.prefix, lease_s=self.lease_s)))

    async def lend(self) -> AsyncDualWriter:
        """A free writer, or one on a newly leased id, waiting up to ``acquire_timeout_s``."""
        deadline = time.monotonic() + self.acquire_timeout_s
        while True:
            async with self._cv:
                found = self._slots.lend(time.monotonic())
                while found is Wait.WAIT:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._slots.busy()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._cv.wait(), left)
                    found = self._slots.lend(time.monotonic())
            if found is not Wait.GROW:
                return found
            writer = None
            try:
                writer = await self.grow()
            finally:  # at once, not under the lock: a cancel while waiting for it must not keep the slot
                self._slots.growth_ended(writer, time.monotonic())
                if writer is None:
                    self._wake()  # the slot is free for a waiting request
            if writer is not None:
                return writer
            if time.monotonic() >= deadline:  # the fleet holds max_ids ids: wait for one of ours, or one freed
                raise self._slots.fleet_full()
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    async def release(self, writer: AsyncDualWriter) -> None:
        retire = self._slots.put_back(writer, time.monotonic())
        await self._notify()
        if retire:
            await self.retire(writer)

    async def _notify(self) -> None:
        async with self._cv:
            self._cv.notify_all()

    def _wake(self) -> None:
        """Wake the waiting requests without waiting for the lock here (from a finally a cancel may interrupt)."""
        task = asyncio.get_running_loop().create_task(self._notify())
        self._waking.add(task)
        task.add_done_callback(self._waking.discard)

    def take_idle(self, transactional_id: str) -> AsyncDualWriter | None:
        return self._slots.take_idle(transactional_id)

    async def discard(self, writer: AsyncDualWriter) -> None:
        """Forget and close a writer whose id was not given back (its recovery failed: the lease expires)."""
        self._slots.forget(writer)
        await self._notify()
        await self.close_writer(writer)

    async def close(self) -> list[AsyncDualWriter]:
        idle = self._slots.close()
        await self._notify()
        return idle

    def reopen(self) -> None:
        """After a failed start: lend again (the start's writers were retired)."""
        self._slots.closed = False

    async def grow(self, *, expired_only: bool = False) -> AsyncDualWriter | None:
        """A writer on a newly leased id, on a new connection (its first transaction() recovers the id); None when
        the fleet has nothing to lease."""
        connection = await self.connection()
        try:
            lease = await self.run(connection, lambda leases: leases.claim(
                uuid.uuid4().hex, self.holder, self.lease_s, max_ids=self.max_ids, expired_only=expired_only))
            if lease is None:
                await _close_connection(connection)
                return None
            writer = self._new_writer(connection, lease)
        except BaseException:
            await _close_connection(connection)
            raise
        if lease.taken_from is not None:
            whose = "this process's own" if lease.taken_from == self.holder else f"the lease of {lease.taken_from}"
            log.warning("%r: took over %s (expired %.1f s ago); recovering what it left", lease.transactional_id,
                        whose, lease.expired_s or 0.0)
        self._slots.grown(writer, lease)
        return writer

    def _new_writer(self, connection: Any, lease: Lease) -> AsyncDualWriter:
        transport = self._transport_for(lease.transactional_id) if self._transport_for is not None else None
        return AsyncDualWriter(connection, {**self._config, "transactional.id": lease.transactional_id},
                               transport=transport, lease=lease, lease_s=self.lease_s, **self._options)

    async def drop(self, writer: AsyncDualWriter, exc: Exception) -> None:
        """Stop using a writer: fenced (the new holder settles what it left), or benched (needs an operator)."""
        transactional_id, token = writer.transactional_id, writer.lease_token
        needs_operator = isinstance(exc, DualWriteRecoveryError)
        self._slots.forget(writer)
        if needs_operator:
            self._slots.benched[transactional_id] = exc
            if token is not None:
                with contextlib.suppress(Exception):
                    await self.run(writer.connection, lambda leases: leases.set_problem(transactional_id, token,
                                                                                        str(exc)))
            log.error("%r: benched until an operator resolves it (AsyncDualWriter.resolve): %r", transactional_id,
                      exc)
        else:
            log.warning("%r: fenced (%s); the pool leases another id", transactional_id, exc)
        await self._notify()
        await self.close_writer(writer)

    async def lose(self, transactional_id: str, token: str) -> None:
        """The lease ``token`` held is no longer ours: its idle writer goes (not a writer of a later lease)."""
        writer = self._slots.take_idle(transactional_id, token)
        if writer is not None:
            await self.drop(writer, ProducerFencedError(f"{transactional_id!r}: the lease was taken over"))

    async def replace(self, writer: AsyncDualWriter) -> AsyncDualWriter:
        """A writer on a new connection, with the same lease, for one whose connection broke."""
        lease = self._slots.lease_of(writer, writer.lease_token)
        if lease is None:
            return writer
        try:
            connection = await self.connection()
        except Exception as exc:  # the database is still away: the old writer stays, and recovers when it can
            log.warning("%r: could not reconnect (%r); keeping the old connection", writer.transactional_id, exc)
            return writer
        try:
            successor = self._new_writer(connection, lease)
        except BaseException:
            await _close_connection(connection)
            raise
        await self.close_writer(writer)
        self._slots.writers[writer.transactional_id] = successor
        return successor

    async def retire(self, writer: AsyncDualWriter) -> None:
        """Close a writer and give its id back; one left unfinished is settled first (if that fails, the lease is
        kept until it expires, for another pool to settle)."""
        if writer.unfinished:
            try:
                await writer.recover_unfinished()
            except Exception as exc:
                log.warning("%r: could not settle its unfinished transaction at close (%r): its lease expires in "
                            "%g s and a live pool of the fleet settles it", writer.transactional_id, exc,
                            self.lease_s)
        finished = not writer.unfinished
        self._slots.forget(writer)
        await self._notify()
        await self.close_writer(writer, give_back=finished)

    async def close_writer(self, writer: AsyncDualWriter, *, give_back: bool = False) -> None:
        """Close the writer (and ``give_back`` its lease, once it has closed), then its connection."""
        try:
            await writer.close()
            token = writer.lease_token
            if give_back and token is not None:
                await self.run(writer.connection, lambda leases: leases.release(writer.transactional_id, token))
        except Exception as exc:
            log.debug("%r: closing failed: %r", writer.transactional_id, exc)
        await _close_connection(writer.connection)

    async def reap_one(self) -> bool:
        """Claim one expired lease of the fleet, settle its id, give it back; False when there is none (or it
        could not be settled now: its lease expires again, and is retried)."""
        writer = await self.grow(expired_only=True)
        if writer is None:
            return False
        try:
            await writer.recover()
        except DualWriteRecoveryError as exc:
            await self.drop(writer, exc)
            return True
        except Exception as exc:
            log.warning("%r: could not settle the expired lease now (%r); retried when it expires again",
                        writer.transactional_id, exc)
            await self.discard(writer)
            return False
        await self.retire(writer)
        return True


async def _close_connection(connection: Any) -> None:
    with contextlib.suppress(Exception):
        await connection.close()
