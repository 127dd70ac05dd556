"""AsyncDualWriter against the coordinator model (no broker) and a real PostgreSQL, through psycopg's
AsyncConnection and through SQLAlchemy's AsyncEngine (asyncpg) and AsyncConnection (psycopg): the protocol's
outcomes on the asyncio edge, its cancellation rule, and that Kafka's calls never block the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import pytest

from kafka2pc.dualwrite import AsyncDualWriter, DualWriter, DualWriteUsageError
from kafka2pc.dualwrite.actions import Rollback, Savepoint
from kafka2pc.errors import ConfigError, DualWriteIncompleteError, UsageError

from .coordinator import CoordinatorModel, Faults, ModelTransport

psycopg = pytest.importorskip("psycopg")
pytest.importorskip("psycopg.rows")
sqlalchemy = pytest.importorskip("sqlalchemy")
sqlalchemy_asyncio = pytest.importorskip("sqlalchemy.ext.asyncio")
asyncpg = pytest.importorskip("asyncpg")
pytest.importorskip("greenlet")
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

TID = "adw-0"


class Setup:
    """A schema of its own on the session's PostgreSQL, a coordinator model, and how writers connect (``kind``)."""

    def __init__(self, dsn: str, kind: str, *, version: int = 2, two_phase: bool = True):
        schema = f"s_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
            admin.execute(f"CREATE TABLE {schema}.orders (id INTEGER PRIMARY KEY)")
        self.dsn = f"{dsn} options='-c search_path={schema}'"
        self.kind = kind
        parts = conninfo_to_dict(dsn)
        self.url = (f"postgresql+{kind.rsplit('-', maxsplit=1)[-1]}://{parts['user']}@127.0.0.1:{parts['port']}/{parts['dbname']}")
        self.engines: list[Any] = []
        self.model = CoordinatorModel(transaction_version=version, two_phase_enabled=two_phase)
        self.transport = ModelTransport(self.model, Faults())

    async def connect(self, **options: Any) -> Any:
        """What the writer is given: a psycopg AsyncConnection, an AsyncEngine, or an AsyncConnection of one."""
        if self.kind == "psycopg":
            return await psycopg.AsyncConnection.connect(self.dsn, **options)
        schema = self.dsn.split("search_path=")[1][:-1]
        if self.kind == "asyncpg":
            return await asyncpg.connect(self.url.replace("postgresql+asyncpg", "postgresql"),
                                         server_settings={"search_path": schema}, **options)
        engine = sqlalchemy_asyncio.create_async_engine(
            self.url, connect_args={"server_settings": {"search_path": schema}} if self.kind.endswith("asyncpg")
            else {"options": f"-c search_path={schema}"})
        self.engines.append(engine)
        return engine if self.kind.startswith("engine") else await engine.connect()

    async def writer(self) -> AsyncDualWriter:
        return AsyncDualWriter(await self.connect(), {"bootstrap.servers": "model:9092", "transactional.id": TID,
                                                      "linger.ms": 0}, transport=self.transport)

    def db_ids(self) -> list[int]:
        with psycopg.connect(self.dsn) as connection:
            return [row[0] for row in connection.execute("SELECT id FROM orders ORDER BY id")]

    def kafka_ids(self) -> list[int]:
        return sorted(int(v) for v in self.model.committed_records())

    def check(self, ids: list[int]) -> None:
        """DB ids == the committed Kafka keys == ``ids``, and no transaction left open."""
        assert self.db_ids() == self.kafka_ids() == ids
        assert self.model.open_transactions() == []


async def insert(tx: Any, order_id: int) -> None:
    """The application's row, in the block: psycopg's execute, asyncpg's, or SQLAlchemy Core."""
    if hasattr(tx.connection, "fetchrow"):
        await tx.connection.execute("INSERT INTO orders VALUES ($1)", order_id)
    elif hasattr(tx.connection, "exec_driver_sql"):
        await tx.connection.execute(sqlalchemy.text("INSERT INTO orders VALUES (:id)"), {"id": order_id})
    else:
        await tx.connection.execute("INSERT INTO orders VALUES (%s)", (order_id,))


def in_transaction(connection: Any) -> bool:
    if hasattr(connection, "fetchrow"):
        return bool(connection.is_in_transaction())
    if hasattr(connection, "exec_driver_sql"):
        return bool(connection.in_transaction())
    return connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


async def order(writer: AsyncDualWriter, order_id: int, during: Any = None) -> None:
    async with writer.transaction() as tx:
        await insert(tx, order_id)
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)
        if during is not None:
            await during()


#: SQLAlchemy's AsyncConnection over psycopg runs in make chaos (the default suite's 15 minutes)
@pytest.fixture(params=["psycopg", "engine-asyncpg", "asyncpg",
                        pytest.param("connection-psycopg", marks=pytest.mark.slow)])
def setup(postgres_dsn: str, request) -> Setup:
    return Setup(postgres_dsn, request.param)


def test_blocks_commit_both_or_roll_both_back(setup):
    async def scenario() -> None:
        writer = await setup.writer()
        await writer.recover()
        await order(writer, 1)

        async def fail() -> None:
            raise RuntimeError("the application's error")

        with pytest.raises(RuntimeError, match="application's error"):
            await order(writer, 2, during=fail)
        await order(writer, 3)
        assert not writer.unfinished
        await writer.close()

    asyncio.run(scenario())
    setup.check([1, 3])


def test_an_application_commit_inside_the_block_is_refused_or_a_usage_error(setup):
    """psycopg refuses the application's commit() inside the block before it commits (the block's savepoint is
    psycopg's own transaction context): nothing split. Through SQLAlchemy, or asyncpg's COMMIT, the commit goes
    through and is caught when the block ends: DualWriteUsageError, Kafka aborted, the row committed without its
    event."""
    async def scenario() -> None:
        writer = await setup.writer()

        async def commit_inside() -> None:
            if setup.kind == "asyncpg":  # asyncpg has no commit(): the SQL
                await writer.connection.execute("COMMIT")
            else:
                await writer.connection.commit()

        refused = setup.kind == "psycopg"
        expected = (psycopg.ProgrammingError, "forbidden within a Transaction") if refused else \
            (DualWriteUsageError, "committed or rolled back inside")
        with pytest.raises(expected[0], match=expected[1]):
            await order(writer, 1, during=commit_inside)
        await order(writer, 2)
        await writer.close()

    asyncio.run(scenario())
    assert setup.kafka_ids() == [2]
    assert setup.db_ids() == ([2] if setup.kind == "psycopg" else [1, 2])
    assert setup.model.open_transactions() == []


def test_an_unfinished_completion_is_committed_by_the_next_writer(setup):
    async def scenario() -> None:
        writer = await setup.writer()
        await order(writer, 1)

        async def drop_end() -> None:
            setup.transport.faults.dropped_requests.extend([True] * 5)

        with pytest.raises(DualWriteIncompleteError):  # the DB commits order 2; its EndTxn never arrives
            await order(writer, 2, during=drop_end)
        setup.transport.faults.dropped_requests.clear()
        assert writer.unfinished
        successor = await setup.writer()
        await successor.recover()
        await order(successor, 3)
        await successor.close()

    asyncio.run(scenario())
    setup.check([1, 2, 3])


def slow(writer: AsyncDualWriter, method: str, seconds: float) -> None:
    """The producer's ``method`` takes ``seconds`` more (in the writer's Kafka thread)."""
    producer = writer._protocol.producer
    original = getattr(producer, method)

    def slowly(*args: Any) -> Any:
        time.sleep(seconds)
        return original(*args)

    setattr(producer, method, slowly)


async def order_seen(writer: AsyncDualWriter, order_id: int, seen: list[Any]) -> None:
    async with writer.transaction() as tx:
        seen.append(tx)
        await insert(tx, order_id)
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)


def test_a_cancel_before_the_commit_point_rolls_both_back(setup):
    """A request cancelled (a client gone, a timeout) after its block, while Kafka prepares: both are rolled back
    (the abort follows the prepare on the Kafka thread), then the task sees its CancelledError."""
    async def scenario() -> None:
        writer = await setup.writer()
        await writer.recover()
        slow(writer, "prepare_transaction", 0.5)
        seen: list[Any] = []
        task = asyncio.ensure_future(order_seen(writer, 1, seen))
        await asyncio.sleep(0.2)  # the block has ended; the prepare is under way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not seen[0].committed and not writer.unfinished
        await order(writer, 2)
        await writer.close()

    asyncio.run(scenario())
    setup.check([2])


def test_a_cancel_after_the_commit_point_waits_for_the_end_and_then_is_raised(setup):
    """Cancelled once the database has committed (Kafka's completion under way): the transaction completes, then
    the task sees its CancelledError, and ``tx.committed`` says it committed."""
    async def scenario() -> AsyncDualWriter:
        writer = await setup.writer()
        await writer.recover()
        slow(writer, "complete_transaction", 0.5)
        seen: list[Any] = []
        task = asyncio.ensure_future(order_seen(writer, 1, seen))
        await asyncio.sleep(0.2)  # the database has committed; the completion is under way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen[0].committed
        return writer

    writer = asyncio.run(scenario())
    assert not writer.unfinished
    setup.check([1])


def test_a_cancel_inside_the_block_rolls_both_back(setup):
    async def scenario() -> None:
        writer = await setup.writer()
        await writer.recover()

        async def wait() -> None:
            await asyncio.sleep(10)

        task = asyncio.ensure_future(order(writer, 1, during=wait))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not writer.unfinished
        await order(writer, 2)
        await writer.close()

    asyncio.run(scenario())
    setup.check([2])


def test_a_cancel_landing_as_the_protocol_reaches_the_block_rolls_both_back(setup):
    """The cancel arrives after the protocol's steps reached the block but before the task resumed (found by the
    user-level review: the writer was left inside its transaction, every later block refused)."""
    async def scenario() -> None:
        writer = await setup.writer()
        await writer.recover()
        drive, target = writer._edge.drive, []

        async def drive_then_cancel(steps: Any, reply: Any = None, error: Any = None, **kwargs: Any) -> bool:
            at_block = await drive(steps, reply, error, **kwargs)
            if at_block and target:
                target.pop().cancel()
            return at_block

        writer._edge.drive = drive_then_cancel
        task = asyncio.ensure_future(order(writer, 1))
        target.append(task)
        with pytest.raises(asyncio.CancelledError):
            await task
        writer._edge.drive = drive
        assert not writer.unfinished
        assert not in_transaction(writer.connection)
        await order(writer, 2)
        await writer.close()

    asyncio.run(scenario())
    setup.check([2])


def test_kafka_calls_never_block_the_event_loop(setup):
    """Kafka's prepare takes a second, in the writer's thread: a ticker on the loop goes on meanwhile."""
    async def scenario() -> float:
        writer = await setup.writer()
        await writer.recover()
        slow(writer, "prepare_transaction", 1.0)
        longest, running = 0.0, True

        async def tick() -> None:
            nonlocal longest
            while running:
                before = time.monotonic()
                await asyncio.sleep(0.01)
                longest = max(longest, time.monotonic() - before)

        ticker = asyncio.ensure_future(tick())
        await order(writer, 1)
        running = False
        await ticker
        await writer.close()
        return longest

    longest = asyncio.run(scenario())
    assert longest < 0.5, f"the event loop stalled {longest:.3f} s during a 1 s Kafka call"
    assert setup.db_ids() == setup.kafka_ids() == [1]


def test_a_nested_block_of_the_same_writer_and_a_wrong_connection_are_refused(setup):
    """Inside its own block, the writer refuses another block, recover() and close(), also from a task started in
    the block (each would wait for the block forever); after close() it refuses use, and closes again quietly."""
    if setup.kind != "psycopg":
        pytest.skip("one kind is enough")

    async def scenario() -> None:
        writer = await setup.writer()
        async with writer.transaction():
            for call in (lambda: writer.transaction().__aenter__(), writer.recover, writer.close):
                with pytest.raises(DualWriteUsageError, match="inside this writer's own"):
                    await call()
                with pytest.raises(DualWriteUsageError, match="inside this writer's own"):
                    await asyncio.gather(call())  # a child task
        await writer.close()
        await writer.close()
        with pytest.raises(UsageError, match="closed"):
            await writer.recover()
        with psycopg.connect(setup.dsn) as blocking, pytest.raises(ConfigError, match="AsyncConnection"):
            AsyncDualWriter(blocking, {"transactional.id": TID, "bootstrap.servers": "model:9092"},
                            transport=setup.transport)
        async_connection = await psycopg.AsyncConnection.connect(setup.dsn)
        with pytest.raises(ConfigError, match="use AsyncDualWriter"):
            DualWriter(async_connection, {"transactional.id": TID, "bootstrap.servers": "model:9092"},
                       transport=setup.transport)
        await async_connection.close()

    asyncio.run(scenario())


def test_produce_keeps_copies_and_refuses_a_record_after_the_block(setup):
    """The application reuses its buffer after produce: the record sent is the one produced. A produce after the
    block is an error, not a record silently dropped."""
    async def scenario() -> None:
        writer = await setup.writer()
        buffer = bytearray(b"1")
        async with writer.transaction() as tx:
            await insert(tx, 1)
            tx.produce("t", value=buffer, key=b"1", partition=0, headers=[("h", bytearray(b"x"))])
            buffer[:] = b"9"
        with pytest.raises(DualWriteUsageError, match="after its block"):
            tx.produce("t", value=b"2", partition=0)
        await writer.close()

    asyncio.run(scenario())
    assert setup.db_ids() == setup.kafka_ids() == [1]


def test_a_dict_row_factory_on_the_connection_is_fine(setup):
    """psycopg's dict_row on the application's connection (found by the user-level review: KeyError: 0)."""
    if setup.kind != "psycopg":
        pytest.skip("psycopg's own row factory")

    async def scenario() -> None:
        connection = await psycopg.AsyncConnection.connect(setup.dsn, row_factory=psycopg.rows.dict_row)
        writer = AsyncDualWriter(connection, {"bootstrap.servers": "model:9092", "transactional.id": TID,
                                              "linger.ms": 0}, transport=setup.transport)
        await writer.recover()
        async with writer.transaction() as tx:
            await tx.connection.execute("INSERT INTO orders VALUES (1)")
            tx.produce("t", value=b"1", key=b"1", partition=0)
            assert await (await tx.connection.execute("SELECT id FROM orders")).fetchone() == {"id": 1}
        await writer.close()

    asyncio.run(scenario())
    assert setup.db_ids() == setup.kafka_ids() == [1]


def test_an_async_session_bound_to_the_block_is_in_the_dual_write(setup):
    """FastAPI's usual way: an AsyncSession on the block's connection, joining it with a savepoint; its commit()
    releases the savepoint, the block commits (or rolls back) both."""
    if setup.kind in ("psycopg", "asyncpg"):
        pytest.skip("SQLAlchemy's")

    async def scenario() -> None:
        writer = await setup.writer()
        for order_id, fail in ((1, False), (2, True)):
            with contextlib.suppress(RuntimeError):
                async with writer.transaction() as tx:
                    async with sqlalchemy_asyncio.AsyncSession(bind=tx.connection,
                                                               join_transaction_mode="create_savepoint") as session:
                        await session.execute(sqlalchemy.text("INSERT INTO orders VALUES (:id)"), {"id": order_id})
                        await session.commit()
                    tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)
                    if fail:
                        raise RuntimeError("after the session's commit")
        await writer.close()

    asyncio.run(scenario())
    assert setup.db_ids() == setup.kafka_ids() == [1]


def slow_action(writer: AsyncDualWriter, kind: type, seconds: float) -> None:
    """The edge takes ``seconds`` longer over each ``kind`` of database action (a slow server)."""
    database = writer._edge.database

    async def slowly(action: Any) -> Any:
        if isinstance(action, kind):
            await asyncio.sleep(seconds)
        return await database(action)

    writer._edge.database = slowly


@pytest.mark.parametrize("failing", ["prepare", "block"])
def test_a_cancel_during_the_rollback_after_a_failure_still_aborts_kafka(setup, failing):
    """The block, or Kafka's prepare, failed; while the protocol rolls the database back (the savepoint's check, the
    rollback), the task is cancelled: Kafka's transaction is still aborted, the writer goes on (found by the second
    adversarial review: the LSO stayed pinned by a transaction the writer thought finished)."""
    if setup.kind != "psycopg":
        pytest.skip("one kind is enough")

    async def scenario() -> None:
        writer = await setup.writer()
        await writer.recover()

        producer = writer._protocol.producer
        prepare = producer.prepare_transaction

        def fail_once() -> Any:
            producer.prepare_transaction = prepare
            raise RuntimeError("Kafka's prepare failed")

        async def fail() -> None:
            if failing == "prepare":
                producer.prepare_transaction = fail_once
            else:
                raise RuntimeError("the block failed")

        slow_action(writer, Savepoint if failing == "block" else Rollback, 0.5)
        task = asyncio.ensure_future(order(writer, 1, during=fail))
        await asyncio.sleep(0.25)
        task.cancel()
        with pytest.raises((asyncio.CancelledError, RuntimeError)):
            await task
        assert not writer.unfinished
        assert not in_transaction(writer.connection)
        await order(writer, 2)
        await writer.close()

    asyncio.run(scenario())
    assert setup.model.open_transactions() == []
    assert setup.db_ids() == setup.kafka_ids() == [2]


def test_a_task_started_in_a_block_may_use_the_writer_once_the_block_ended(setup):
    """A background task started inside the block (it carries the block's context) writes after the block: not
    refused as 'inside the block' (found by the second adversarial review)."""
    if setup.kind != "psycopg":
        pytest.skip("one kind is enough")

    async def scenario() -> None:
        writer = await setup.writer()
        ended = asyncio.Event()

        async def later() -> None:
            await ended.wait()
            await order(writer, 2)

        async with writer.transaction() as tx:
            await insert(tx, 1)
            tx.produce("t", value=b"1", key=b"1", partition=0)
            background = asyncio.ensure_future(later())
        ended.set()
        await background
        await writer.close()

    asyncio.run(scenario())
    assert setup.db_ids() == setup.kafka_ids() == [1, 2]
