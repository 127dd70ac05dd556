"""AsyncDualWriterPool against the coordinator model (no broker) and a real PostgreSQL, through psycopg's
AsyncConnection and SQLAlchemy's AsyncEngine (asyncpg): many tasks share its leased writers; a dead pool's lease
is claimed and settled by a live one; a block that outlives its lease is LeaseLostError with both sides rolled
back; close gives every id back."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from kafka2pc.dualwrite import AsyncDualWriterPool, DualWriteIncompleteError, LeaseLostError
from kafka2pc.errors import DatabaseConnectionLostError, RetriableError, UsageError

from .test_dual_write_async import Setup, insert

psycopg = pytest.importorskip("psycopg")


class Fleet(Setup):
    """Setup's schema and coordinator model, with pools of prefix ``shop`` on it."""

    def pool(self, size: int, *, refusing: list[bool] | None = None, **options: Any) -> AsyncDualWriterPool:
        """A pool of prefix ``shop``; while ``refusing[0]``, its new connections are refused (the database away)."""
        if refusing is not None:
            return self._refusing_pool(size, refusing, **options)
        if self.kind == "psycopg":
            connect: Any = functools.partial(psycopg.AsyncConnection.connect, self.dsn)
        elif self.kind == "asyncpg":
            connect = self.connect
        else:
            connect = self.engine()
        return AsyncDualWriterPool(connect, {"bootstrap.servers": "model:9092", "transactional.id": "shop",
                                             "linger.ms": 0}, size=size, transport_for=lambda _: self.transport,
                                   **options)

    def _refusing_pool(self, size: int, refusing: list[bool], **options: Any) -> AsyncDualWriterPool:
        async def connect() -> Any:
            if refusing[0]:
                raise ConnectionRefusedError(111, "Connect call failed")
            return await (psycopg.AsyncConnection.connect(self.dsn) if self.kind == "psycopg" else self.connect())

        return AsyncDualWriterPool(connect, {"bootstrap.servers": "model:9092", "transactional.id": "shop",
                                             "linger.ms": 0}, size=size, transport_for=lambda _: self.transport,
                                   **options)

    def engine(self) -> Any:
        schema = self.dsn.split("search_path=")[1][:-1]
        from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415

        engine = create_async_engine(self.url, connect_args={"server_settings": {"search_path": schema}})
        self.engines.append(engine)
        return engine

    def rows(self) -> list[tuple[str, bool]]:
        """Each id of the fleet, and whether it is leased (or expired) now."""
        with psycopg.connect(self.dsn) as connection:
            return connection.execute("SELECT transactional_id, lease_expires IS NOT NULL FROM "
                                      "kafka2pc_dual_write_state WHERE fleet = 'shop' ORDER BY fleet_index").fetchall()

    def expire(self, *transactional_ids: str) -> None:
        """Those leases run out (their process stopped renewing them)."""
        with psycopg.connect(self.dsn) as connection:
            connection.execute("UPDATE kafka2pc_dual_write_state SET lease_expires = lease_expires - 3600 WHERE "
                               "transactional_id = ANY(%s)", (list(transactional_ids),))


async def order(pool: AsyncDualWriterPool, order_id: int, *, during: Any = None) -> None:
    async with pool.transaction() as tx:
        await insert(tx, order_id)
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)
        if during is not None:
            await during()


async def incomplete_order(fleet: Fleet, pool: AsyncDualWriterPool, order_id: int) -> None:
    """An order whose Kafka completion is lost after the DB commit: DualWriteIncompleteError, its writer left
    unfinished."""
    async def lose_the_completion() -> None:
        fleet.transport.faults.dropped_requests.extend([True] * 5)

    with pytest.raises(DualWriteIncompleteError):
        await order(pool, order_id, during=lose_the_completion)
    fleet.transport.faults.dropped_requests.clear()


# asyncpg in make chaos but for its own case (the suite's time budget; the uvicorn test runs the recipe on asyncpg)
@pytest.fixture(params=["psycopg", "asyncpg", pytest.param("engine-asyncpg", marks=pytest.mark.slow)])
def fleet(postgres_dsn: str, request) -> Fleet:
    return Fleet(postgres_dsn, request.param)


def test_many_tasks_share_the_leased_writers_and_close_gives_every_id_back(fleet):
    async def scenario() -> list[str]:
        async with fleet.pool(size=4, min_size=2) as pool:
            assert pool.transactional_ids == ["shop-0", "shop-1"]
            await asyncio.gather(*(order(pool, n) for n in range(1, 41)))
            held = pool.transactional_ids
        with pytest.raises(UsageError, match="closed"):
            await order(pool, 41)
        return held

    held = asyncio.run(scenario())
    assert set(held) <= {f"shop-{n}" for n in range(4)} and len(held) >= 2, held
    assert fleet.db_ids() == fleet.kafka_ids() == list(range(1, 41))
    assert fleet.model.open_transactions() == []
    assert fleet.rows() == [(tid, False) for tid in sorted(held)]  # every id free again


def test_a_dead_pools_unfinished_transaction_is_settled_by_a_live_pool(fleet):
    """A pool's Kafka completion is lost after the DB commit (DualWriteIncompleteError), then its process dies
    (its keeper stops, nothing is closed): once its lease expires, a live pool's keeper claims the id, commits the
    prepared transaction, and frees the id."""

    async def scenario() -> None:
        dead = fleet.pool(size=1)
        await dead.start()
        await order(dead, 1)
        await incomplete_order(fleet, dead, 2)
        assert dead._keeper is not None
        await dead._keeper.stop()  # the process is gone: nothing renews, settles or closes
        assert len(fleet.model.open_transactions()) == 1
        fleet.expire("shop-0")
        async with fleet.pool(size=1, min_size=0) as live:
            assert await live.settle_expired() == 1
            assert live.transactional_ids == []

    asyncio.run(scenario())
    assert fleet.model.open_transactions() == []
    assert fleet.db_ids() == fleet.kafka_ids() == [1, 2]
    assert fleet.rows() == [("shop-0", False)]


@pytest.mark.parametrize("fleet", ["psycopg", "engine-asyncpg", "asyncpg"], indirect=True)
def test_a_block_that_outlives_its_lease_is_lease_lost_and_both_sides_roll_back(fleet):
    """PostgreSQL ends a leased writer's transaction left idle for lease_s (a frozen process must not hold the
    id's row): the block is LeaseLostError (retriable), nothing of it committed, and the pool serves on. asyncpg
    keeps no reason for a session the server ended: there it is DatabaseConnectionLostError (retriable too)."""

    async def scenario() -> None:
        async with fleet.pool(size=1, lease_s=1.0) as pool:
            with pytest.raises(RetriableError) as raised:
                await order(pool, 1, during=functools.partial(asyncio.sleep, 2.5))
            if fleet.kind == "psycopg":
                assert isinstance(raised.value, LeaseLostError) and "lease_s=1" in str(raised.value)
            else:
                assert isinstance(raised.value, DatabaseConnectionLostError), repr(raised.value)
            await order(pool, 2)

    asyncio.run(scenario())
    assert fleet.db_ids() == fleet.kafka_ids() == [2]
    assert fleet.model.open_transactions() == []


def test_a_request_cancelled_while_it_waits_for_a_writer_leaves_the_pool_whole(fleet):
    async def scenario() -> None:
        async with fleet.pool(size=1) as pool:
            inside, leave = asyncio.Event(), asyncio.Event()

            async def hold() -> None:
                inside.set()
                await leave.wait()

            holder = asyncio.create_task(order(pool, 1, during=hold))
            await inside.wait()
            waiting = asyncio.create_task(order(pool, 2))
            await asyncio.sleep(0.2)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            leave.set()
            await holder
            await order(pool, 3)
            assert pool.transactional_ids == ["shop-0"]

    asyncio.run(scenario())
    assert fleet.db_ids() == fleet.kafka_ids() == [1, 3]


def test_the_pool_refuses_another_event_loop_before_it_touches_a_connection(fleet):
    """Found by a user-level review: a def endpoint calling asyncio.run() on the app's pool drove a writer's
    connection from a second loop; the driver failed there, and later blocks of that writer committed events whose
    rows were not in the database. Another loop is now a UsageError before any writer is lent."""

    async def scenario() -> None:
        async with fleet.pool(size=1) as pool:
            await order(pool, 1)

            def from_another_loop() -> None:
                asyncio.run(order(pool, 2))

            with pytest.raises(UsageError, match="another event loop"):
                await asyncio.to_thread(from_another_loop)
            for order_id in range(3, 8):
                await order(pool, order_id)

    asyncio.run(scenario())
    assert fleet.db_ids() == fleet.kafka_ids() == [1, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("fleet", ["engine-asyncpg", "asyncpg"], indirect=True)
def test_an_application_commit_inside_the_block_then_a_lost_connection_is_never_retriable(fleet):
    """helper-48's finding for the blocking pool, on SQLAlchemy's AsyncConnection: the application commits inside
    the block, then the connection is lost. The rows stay committed without their event, so the request must not be
    told "retry" (DatabaseConnectionLostError): a retry would write the order twice. SQLAlchemy knows in memory
    that the writer's transaction ended, asyncpg keeps the server's last word on it: DualWriteUsageError."""
    from kafka2pc.dualwrite import DualWriteUsageError  # noqa: PLC0415

    async def scenario() -> BaseException:
        async with fleet.pool(size=1) as pool:
            with pytest.raises(Exception) as raised:
                async with pool.transaction() as tx:
                    bare = fleet.kind == "asyncpg"
                    backend = await tx.connection.fetchval("SELECT pg_backend_pid()") if bare else \
                        (await tx.connection.exec_driver_sql("SELECT pg_backend_pid()")).scalar()
                    await insert(tx, 1)
                    tx.produce("t", value=b"1", key=b"1", partition=0)
                    # the misuse: the order is committed here, without its event
                    await (tx.connection.execute("COMMIT") if bare else tx.connection.commit())
                    with psycopg.connect(fleet.dsn, autocommit=True) as admin:
                        admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
            return raised.value

    error = asyncio.run(scenario())
    print(f"\n{type(error).__name__}: {error!s:.160}")
    assert not isinstance(error, RetriableError), repr(error)
    assert isinstance(error, DualWriteUsageError), repr(error)
    assert fleet.db_ids() == [1] and fleet.kafka_ids() == []  # the split the misuse made, reported as such


def backend_pid(connection: Any) -> int:
    return int(connection.get_server_pid() if hasattr(connection, "get_server_pid") else connection.info.backend_pid)


@pytest.mark.parametrize("fleet", ["psycopg", "asyncpg"], indirect=True)
def test_a_connection_dropped_between_requests_is_replaced_and_the_request_goes_on(fleet):
    """Found by a user-level review: a writer's idle connection ended by the server (a restart, a failover, a
    proxy's timeout) made the next request fail with the driver's error (InterfaceError 'connection is closed',
    AdminShutdown), not retriable, though nothing of it had begun. Now the pool replaces the connection and the
    request goes on; while no new connection can be made, DatabaseConnectionLostError (retriable)."""
    refusing = [False]

    def drop(pool: AsyncDualWriterPool) -> None:
        (writer,) = pool._set.writers.values()
        with psycopg.connect(fleet.dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend_pid(writer.connection),))

    async def scenario() -> None:
        async with fleet.pool(size=1, refusing=refusing) as pool:
            await order(pool, 1)
            drop(pool)
            await order(pool, 2)
            drop(pool)
            refusing[0] = True
            with pytest.raises(DatabaseConnectionLostError, match="before the block began"):
                await order(pool, 3)
            refusing[0] = False
            await order(pool, 4)

    asyncio.run(scenario())
    assert fleet.db_ids() == fleet.kafka_ids() == [1, 2, 4]
    assert fleet.model.open_transactions() == []
