"""Adversarial review of 6be86b9 (AsyncDualWriter on a bare asyncpg connection; helper-51): cancellation at the
writer's BEGIN, a lost connection at COMMIT, lock waits, nested transactions, a pool's PoolConnectionProxy. The
BEGIN and lost-connection tests failed on 6be86b9 (UsageError 'the connection has an open transaction', or
NoActiveSQLTransactionError on every later request) and pass since the change after it; the others passed."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from kafka2pc.dualwrite import AsyncDualWriter
from kafka2pc.dualwrite.actions import Commit
from kafka2pc.errors import DualWriteOutcomeUnknownError, UsageError

from .test_dual_write_async import TID, Setup, in_transaction, insert, order

asyncpg = pytest.importorskip("asyncpg")
psycopg = pytest.importorskip("psycopg")


class CancelAtBegin(asyncpg.Connection):
    """An asyncpg connection whose next ``BEGIN`` (asyncpg's Transaction.start) is cancelled while its round trip
    is in flight: the task awaiting it is cancelled on the next loop iteration (a request timeout, a client gone)."""

    armed = False
    #: the task to cancel (the request's); None: the task running the BEGIN
    target: asyncio.Task[Any] | None = None

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        if type(self).armed and query.startswith("BEGIN"):
            type(self).armed = False
            victim = type(self).target or asyncio.current_task()
            assert victim is not None
            asyncio.get_running_loop().call_soon(victim.cancel)
        return await super().execute(query, *args, **kwargs)


def writer_on(setup: Setup, connection: Any) -> AsyncDualWriter:
    return AsyncDualWriter(connection, {"bootstrap.servers": "model:9092", "transactional.id": TID, "linger.ms": 0},
                           transport=setup.transport)


@pytest.fixture
def setup(postgres_dsn: str) -> Setup:
    return Setup(postgres_dsn, "asyncpg")


def test_a_cancel_during_the_writers_begin_leaves_the_writer_usable(setup):
    """A request cancelled while the writer's BEGIN (begin_locked) is on the wire: asyncpg marks its Transaction
    FAILED and keeps it as the connection's top transaction; the edge's Rollback then raises InterfaceError ('in
    error state') without sending ROLLBACK. The writer must still serve the next request, as on psycopg."""
    async def scenario() -> None:
        CancelAtBegin.armed = False
        connection = await setup.connect(connection_class=CancelAtBegin)
        writer = writer_on(setup, connection)
        await writer.recover()
        CancelAtBegin.armed = True
        task = asyncio.ensure_future(order(writer, 1))
        with pytest.raises(asyncio.CancelledError):
            await task
        state = (in_transaction(connection), connection._top_xact)
        try:
            await order(writer, 2)
        finally:
            await writer.close()
            await connection.close()
        assert state == (False, None)

    asyncio.run(scenario())
    setup.check([2])


def test_a_cancel_during_the_first_recoverys_begin_leaves_the_writer_usable(setup):
    """The same at a writer's first recover() (a startup timeout): _exists' Begin is outside its try, so not even
    the edge's Rollback runs; the edge keeps the FAILED transaction and asyncpg its top transaction."""
    async def scenario() -> None:
        CancelAtBegin.armed = True
        connection = await setup.connect(connection_class=CancelAtBegin)
        writer = writer_on(setup, connection)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(writer.recover())
        try:
            await writer.recover()
            await order(writer, 1)
        finally:
            await writer.close()
            await connection.close()

    asyncio.run(scenario())
    assert setup.db_ids() == setup.kafka_ids() == [1]


def test_a_cancel_while_waiting_for_the_row_lock_rolls_back_and_the_writer_goes_on(setup):
    """Sound: a cancel during SELECT ... FOR UPDATE (another session holds the id's row): asyncpg cancels it on the
    server, the protocol's ROLLBACK (shielded) runs after the cancellation is acknowledged."""
    async def scenario() -> None:
        writer = await setup.writer()
        await writer.recover()
        with psycopg.connect(setup.dsn) as holder:
            holder.execute("SELECT 1 FROM kafka2pc_dual_write_state WHERE transactional_id = %s FOR UPDATE", (TID,))
            task = asyncio.ensure_future(order(writer, 1))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            holder.rollback()
        assert not in_transaction(writer.connection)
        assert not writer.unfinished
        await order(writer, 2)
        await writer.close()

    asyncio.run(scenario())
    setup.check([2])


def kill_at_commit(writer: AsyncDualWriter, setup: Setup) -> None:
    """The writer's backend is terminated just before the transaction's COMMIT is sent."""
    database = writer._edge.database
    pid = writer.connection.get_server_pid()
    armed = [True]

    async def killing(action: Any) -> Any:
        if isinstance(action, Commit) and armed[0] and writer._facts.began:
            armed[0] = False
            with psycopg.connect(setup.dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await asyncio.sleep(0.2)
        return await database(action)

    writer._edge.database = killing


def test_a_connection_lost_at_commit_is_outcome_unknown_and_recovery_settles_it(setup):
    """Sound: the commit's outcome is unknown (DualWriteOutcomeUnknownError, Kafka prepared); a writer on a new
    connection recovers to DB == Kafka."""
    async def scenario() -> None:
        writer = await setup.writer()
        await writer.recover()
        kill_at_commit(writer, setup)
        with pytest.raises(DualWriteOutcomeUnknownError):
            await order(writer, 1)
        assert writer.unfinished and writer.connection_lost()
        await writer.close()
        successor = await setup.writer()
        await successor.recover()
        await order(successor, 2)
        await successor.close()

    asyncio.run(scenario())
    setup.check([2])


def test_the_writer_after_a_connection_lost_at_commit_does_not_blame_the_application(setup):
    """After the connection was lost at COMMIT, the bare writer's next transaction() says the *application* left
    a transaction open (UsageError: asyncpg's last status was 'in transaction'), not that the connection is gone."""
    async def scenario() -> Any:
        writer = await setup.writer()
        await writer.recover()
        kill_at_commit(writer, setup)
        with pytest.raises(DualWriteOutcomeUnknownError):
            await order(writer, 1)
        try:
            await order(writer, 2)
        except Exception as exc:
            return exc
        finally:
            await writer.close()
        return None

    error = asyncio.run(scenario())
    assert error is not None
    assert not isinstance(error, UsageError), repr(error)


def test_a_nested_asyncpg_transaction_that_fails_inside_the_block_is_a_savepoint(setup):
    """Sound: the application's own `async with connection.transaction()` in the block fails and is caught: only
    its savepoint rolls back; the dual write commits the rest."""
    async def scenario() -> None:
        writer = await setup.writer()
        await writer.recover()

        async def nested_failure() -> None:
            with pytest.raises(asyncpg.UniqueViolationError):
                async with writer.connection.transaction():
                    await writer.connection.execute("INSERT INTO orders VALUES (1)")  # a duplicate

        await order(writer, 1, during=nested_failure)
        await writer.close()

    asyncio.run(scenario())
    assert setup.db_ids() == setup.kafka_ids() == [1]


def test_a_connection_acquired_from_an_asyncpg_pool_works(setup):
    """Sound: a PoolConnectionProxy is taken (is_asyncpg), its transactions are the writer's."""
    async def scenario() -> None:
        schema = setup.dsn.split("search_path=")[1][:-1]
        pool = await asyncpg.create_pool(setup.url.replace("postgresql+asyncpg", "postgresql"), min_size=1,
                                         max_size=1, server_settings={"search_path": schema})
        async with pool.acquire() as proxy:
            writer = writer_on(setup, proxy)
            await writer.recover()
            await order(writer, 1)

            async def fail() -> None:
                raise RuntimeError("boom")

            with pytest.raises(RuntimeError):
                await order(writer, 2, during=fail)
            await order(writer, 3)
            await writer.close()
        await pool.close()

    asyncio.run(scenario())
    assert setup.db_ids() == setup.kafka_ids() == [1, 3]


def test_after_a_cancelled_begin_even_the_applications_rollback_does_not_free_the_writer(setup):
    """The wedge outlives a ROLLBACK by the application: asyncpg's connection still names the FAILED Transaction as
    its top one, so the writer's next Begin is taken for a nested one (SAVEPOINT outside any transaction)."""
    async def scenario() -> list[str]:
        CancelAtBegin.armed = False
        connection = await setup.connect(connection_class=CancelAtBegin)
        writer = writer_on(setup, connection)
        await writer.recover()
        CancelAtBegin.armed = True
        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(order(writer, 1))
        await connection.execute("ROLLBACK")  # what the UsageError asks the application to do
        errors: list[str] = []
        for n in (2, 3, 4):
            try:
                await order(writer, n)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        await writer.close()
        await connection.close()
        return errors

    assert asyncio.run(scenario()) == []
    assert setup.db_ids() == setup.kafka_ids() == [2, 3, 4]


def test_a_pool_writer_whose_begin_was_cancelled_serves_later_requests(postgres_dsn):
    """AsyncDualWriterPool on asyncpg: one request cancelled at its writer's BEGIN; the next requests (on the same,
    only, writer) must succeed, not fail with a non-retriable UsageError that blames the application."""
    from kafka2pc.dualwrite import AsyncDualWriterPool  # noqa: PLC0415

    setup = Setup(postgres_dsn, "asyncpg")

    async def scenario() -> list[str]:
        CancelAtBegin.armed = False
        pool = AsyncDualWriterPool(functools.partial(setup.connect, connection_class=CancelAtBegin),
                                   {"bootstrap.servers": "model:9092", "transactional.id": "shop", "linger.ms": 0},
                                   size=1, transport_for=lambda _: setup.transport)
        errors: list[str] = []
        async with pool:
            await pool_order(pool, 1)
            CancelAtBegin.armed = True
            with pytest.raises(asyncio.CancelledError):
                await asyncio.ensure_future(pool_order(pool, 2))
            for n in range(3, 6):
                try:
                    await pool_order(pool, n)
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
        return errors

    errors = asyncio.run(scenario())
    assert errors == []
    assert setup.db_ids() == setup.kafka_ids() == [1, 3, 4, 5]


async def pool_order(pool: Any, order_id: int) -> None:
    async with pool.transaction() as tx:
        await insert(tx, order_id)
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)


def test_a_cancel_of_the_request_while_its_begin_is_on_the_wire_rolls_back_and_the_writer_goes_on(setup):
    """The request's task (not the BEGIN's) is cancelled while BEGIN is in flight: the BEGIN runs to its end, then
    the cancel is delivered there and the protocol rolls back what it began."""
    async def scenario() -> None:
        CancelAtBegin.armed, CancelAtBegin.target = False, None
        connection = await setup.connect(connection_class=CancelAtBegin)
        writer = writer_on(setup, connection)
        await writer.recover()
        task = asyncio.ensure_future(order(writer, 1))
        CancelAtBegin.armed, CancelAtBegin.target = True, task
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not in_transaction(connection)
            await order(writer, 2)
        finally:
            CancelAtBegin.target = None
            await writer.close()
            await connection.close()

    asyncio.run(scenario())
    setup.check([2])
