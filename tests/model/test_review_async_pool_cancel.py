"""Adversarial review of AsyncDualWriterPool (1452f1e): cancellation at the pool's own await points, against the
coordinator model and a real PostgreSQL. Each test showed a finding (it failed before the fix, with the error in
its docstring); the DualWriterPool test beside the first shows the blocking pool keeps the same guarantee."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from typing import Any

import pytest

from kafka2pc.dualwrite import DualWriteIncompleteError, DualWriterPool
from kafka2pc.errors import UsageError

from .test_dual_write_async_pool import Fleet, incomplete_order, order

psycopg = pytest.importorskip("psycopg")


class Gate:
    """The coordinator model behind a gate: while shut, a Kafka request waits for it (a broker slow to answer,
    within max.block.ms). ``waiting`` is set once a request waits."""

    def __init__(self, transport: Any):
        self._transport = transport
        self.opened, self.waiting = threading.Event(), threading.Event()
        self.opened.set()

    def shut(self) -> None:
        self.waiting.clear()
        self.opened.clear()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._transport, name)
        if name not in ("execute", "execute_all"):
            return attribute

        def gated(*args: Any, **kwargs: Any) -> Any:
            if not self.opened.is_set():
                self.waiting.set()
                self.opened.wait(15)
            return attribute(*args, **kwargs)

        return gated


@pytest.fixture(params=["psycopg", pytest.param("engine-asyncpg", marks=pytest.mark.slow)])  # asyncpg: make chaos
def fleet(postgres_dsn: str, request) -> Fleet:
    made = Fleet(postgres_dsn, request.param)
    made.transport = Gate(made.transport)  # type: ignore[assignment]
    return made


async def _sweep(pool: Any) -> list[str]:
    """The ids of the writers a closed pool still holds (lost: lent to nobody), each closed now, on the loop, so
    that their connections are not left to the garbage collector after the loop has closed."""
    left = sorted(pool._set.writers)
    for writer in list(pool._set.writers.values()):
        await pool._set.close_writer(writer)
    gc.collect()
    return left


def test_close_while_the_keeper_settles_an_unfinished_writer_settles_it_and_frees_the_id(fleet):
    """The database committed order 2 and Kafka's completion was lost (DualWriteIncompleteError): the writer is
    idle and unfinished, and the keeper's worker takes it to settle it. The broker answers slowly; close() comes
    meanwhile and the broker answers 0.3 s later. DualWriterPool's close waits for its worker, which gives the writer
    back, and the writer is retired (settled, id freed). The async pool cancels the worker: the writer is lost,
    order 2 stays prepared in Kafka (pinning the LSO) and the id stays leased by nobody until lease_s runs out and
    another live pool of the fleet reaps it (none, if this was the last process)."""
    gate: Gate = fleet.transport  # type: ignore[assignment]
    lost: list[str] = []

    async def scenario() -> None:
        pool = fleet.pool(size=1, lease_s=4.0)
        await pool.start()
        await order(pool, 1)
        await incomplete_order(fleet, pool, 2)
        gate.shut()  # no await since the error: the keeper has not run yet
        assert await asyncio.to_thread(gate.waiting.wait, 10), "the keeper never settled the unfinished writer"
        asyncio.get_running_loop().call_later(0.3, gate.opened.set)
        await pool.close()
        await asyncio.sleep(0.5)
        lost.extend(await _sweep(pool))  # what close() left behind (empty when every writer was retired)

    asyncio.run(scenario())
    gate.opened.set()
    assert (fleet.model.open_transactions(), lost) == ([], [])
    assert fleet.rows() == [("shop-0", False)]  # given back
    assert fleet.db_ids() == fleet.kafka_ids() == [1, 2]


def test_the_blocking_pool_settles_and_frees_the_id_in_the_same_case(postgres_dsn):
    """The same interleaving on DualWriterPool (psycopg, blocking): close() joins the worker, which gives the
    writer back; it is retired, its transaction committed in Kafka and its id freed."""
    fleet = Fleet(postgres_dsn, "psycopg")
    gate = Gate(fleet.transport)

    def sync_order(pool: DualWriterPool, order_id: int, during: Any = None) -> None:
        with pool.transaction() as tx:
            tx.cursor.execute("INSERT INTO orders VALUES (%s)", (order_id,))
            tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)
            if during is not None:
                during()

    pool = DualWriterPool(lambda: psycopg.connect(fleet.dsn), {"bootstrap.servers": "model:9092",
                                                               "transactional.id": "shop", "linger.ms": 0},
                          size=1, lease_s=4.0, transport_for=lambda _: gate)
    sync_order(pool, 1)
    with pytest.raises(DualWriteIncompleteError):
        sync_order(pool, 2, during=lambda: fleet.transport.faults.dropped_requests.extend([True] * 5))
    fleet.transport.faults.dropped_requests.clear()
    gate.shut()
    assert gate.waiting.wait(10), "the keeper never settled the unfinished writer"
    opener = threading.Timer(0.3, gate.opened.set)
    opener.start()
    started = time.monotonic()
    pool.close()
    opener.join()
    assert time.monotonic() - started < 10
    assert fleet.model.open_transactions() == []
    assert fleet.rows() == [("shop-0", False)]
    assert fleet.db_ids() == fleet.kafka_ids() == [1, 2]


def test_a_request_cancelled_while_it_starts_the_pool_leaves_the_pool_usable(fleet):
    """transaction() starts a pool not started yet. The first request is cancelled (its client went away, a
    request timeout) while the start recovers shop-0 on a slow broker: the next request must still be served;
    it gets UsageError 'pool is closed' instead, and so does every later one."""
    gate: Gate = fleet.transport  # type: ignore[assignment]

    async def scenario() -> None:
        pool = fleet.pool(size=1)
        gate.shut()
        first = asyncio.create_task(order(pool, 1))
        assert await asyncio.to_thread(gate.waiting.wait, 10), "the start never reached Kafka"
        first.cancel()
        gate.opened.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        try:
            await order(pool, 2)
        finally:
            await pool.close()
            await _sweep(pool)

    try:
        asyncio.run(scenario())
    finally:
        gate.opened.set()
    assert fleet.db_ids() == fleet.kafka_ids() == [2]


def test_a_request_cancelled_as_its_new_lease_joins_the_pool_leaves_the_pool_whole(fleet):
    """A request grows the pool (a new lease). Just as its claim is done, the pool's condition lock is busy (here a
    task holds it for 0.2 s, as waiters woken by notify_all hold it in turn under load), and the request is
    cancelled while it waits for the lock. The writer it leased stays in the pool, never lent and renewed for
    ever, and the growth slot is never given back: a pool of size 1 serves nothing again."""

    async def scenario() -> None:
        pool = fleet.pool(size=1, min_size=0, acquire_timeout_s=1.0)
        async with pool:
            cv = pool._set._cv
            request = asyncio.create_task(order(pool, 1))
            for _ in range(200):
                if pool._set._slots.growing:  # the request leases a new id
                    break
                await asyncio.sleep(0)
            await cv.acquire()  # the lock busy as the claim ends
            try:
                for _ in range(200):
                    if pool.transactional_ids:  # the claim is done: the request waits for the lock
                        break
                    await asyncio.sleep(0.01)
                assert pool.transactional_ids == ["shop-0"]
                await asyncio.sleep(0.05)
                request.cancel()
                await asyncio.sleep(0.05)
            finally:
                cv.release()
            with contextlib.suppress(asyncio.CancelledError):  # cancelled here, or served before the cancel came
                await request
            try:
                await order(pool, 2)  # size 1: the only writer, or a new lease
            finally:
                await pool.close()
                await _sweep(pool)

    asyncio.run(scenario())
    assert 2 in fleet.db_ids() and fleet.db_ids() == fleet.kafka_ids()
    assert fleet.model.open_transactions() == []


def test_a_pool_whose_start_failed_on_kafka_starts_at_the_next_transaction(fleet):
    """Kafka unreachable at startup: the lifespan logs start()'s error and goes on, as the FastAPI recipe does.
    Kafka comes back; the next transaction() must start the pool and serve."""

    async def scenario() -> None:
        pool = fleet.pool(size=1)
        fleet.transport.faults.dropped_requests.extend([True] * 50)
        with pytest.raises(Exception) as failed:
            await pool.start()
        assert not isinstance(failed.value, UsageError), failed.value
        fleet.transport.faults.dropped_requests.clear()
        try:
            await order(pool, 1)
        finally:
            await pool.close()
            await _sweep(pool)

    asyncio.run(scenario())
    assert fleet.db_ids() == fleet.kafka_ids() == [1]
