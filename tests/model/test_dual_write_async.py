"""AsyncDualWriter against the coordinator model (no broker) and a real PostgreSQL through psycopg's
AsyncConnection: the protocol's outcomes on the asyncio edge, its cancellation rule, and that Kafka's calls never
block the event loop."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from kafka2pc.dualwrite import AsyncDualWriter, DualWriteUsageError
from kafka2pc.errors import ConfigError, DualWriteIncompleteError

from .coordinator import CoordinatorModel, Faults, ModelTransport

psycopg = pytest.importorskip("psycopg")
TID = "adw-0"


class Setup:
    """A schema of its own on the session's PostgreSQL, and a coordinator model."""

    def __init__(self, dsn: str, *, version: int = 2, two_phase: bool = True):
        schema = f"s_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
            admin.execute(f"CREATE TABLE {schema}.orders (id INTEGER PRIMARY KEY)")
        self.dsn = f"{dsn} options='-c search_path={schema}'"
        self.model = CoordinatorModel(transaction_version=version, two_phase_enabled=two_phase)
        self.transport = ModelTransport(self.model, Faults())

    async def writer(self) -> AsyncDualWriter:
        connection = await psycopg.AsyncConnection.connect(self.dsn)
        return AsyncDualWriter(connection, {"bootstrap.servers": "model:9092", "transactional.id": TID,
                                            "linger.ms": 0}, transport=self.transport)

    def db_ids(self) -> list[int]:
        with psycopg.connect(self.dsn) as connection:
            return [row[0] for row in connection.execute("SELECT id FROM orders ORDER BY id")]

    def kafka_ids(self) -> list[int]:
        return sorted(int(v) for v in self.model.committed_records())


async def order(writer: AsyncDualWriter, order_id: int, during: Any = None) -> None:
    async with writer.transaction() as tx:
        await tx.connection.execute("INSERT INTO orders VALUES (%s)", (order_id,))
        tx.produce("t", value=str(order_id).encode(), key=str(order_id).encode(), partition=0)
        if during is not None:
            await during()


@pytest.fixture
def setup(postgres_dsn: str) -> Setup:
    return Setup(postgres_dsn)


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
    assert setup.db_ids() == setup.kafka_ids() == [1, 3]
    assert setup.model.open_transactions() == []


def test_an_application_commit_inside_the_block_is_a_usage_error_and_kafka_is_aborted(setup):
    async def scenario() -> None:
        writer = await setup.writer()

        async def commit_inside() -> None:
            await writer.connection.commit()

        with pytest.raises(DualWriteUsageError, match="committed or rolled back inside"):
            await order(writer, 1, during=commit_inside)
        await order(writer, 2)
        await writer.close()

    asyncio.run(scenario())
    # order 1's row was committed by the application itself (split, as the error says); its event never was
    assert setup.kafka_ids() == [2]
    assert setup.db_ids() == [1, 2]
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
    assert setup.db_ids() == setup.kafka_ids() == [1, 2, 3]
    assert setup.model.open_transactions() == []


def slow_prepare(writer: AsyncDualWriter, seconds: float) -> None:
    """Kafka's prepare takes ``seconds`` (in the writer's Kafka thread)."""
    producer = writer._protocol.producer
    prepare = producer.prepare_transaction

    def slowly() -> Any:
        time.sleep(seconds)
        return prepare()

    producer.prepare_transaction = slowly


def test_a_cancel_after_the_block_waits_for_the_commit_and_then_is_raised(setup):
    """A request cancelled (a client gone, a timeout) once its block has ended: the transaction commits in full,
    then the task sees its CancelledError. Nothing is left for a recovery."""
    async def scenario() -> AsyncDualWriter:
        writer = await setup.writer()
        await writer.recover()
        slow_prepare(writer, 0.5)
        task = asyncio.ensure_future(order(writer, 1))
        await asyncio.sleep(0.2)  # the block has ended; the prepare is under way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return writer

    writer = asyncio.run(scenario())
    assert not writer.unfinished
    assert setup.db_ids() == setup.kafka_ids() == [1]
    assert setup.model.open_transactions() == []


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
    assert setup.db_ids() == setup.kafka_ids() == [2]
    assert setup.model.open_transactions() == []


def test_kafka_calls_never_block_the_event_loop(setup):
    """Kafka's prepare takes a second, in the writer's thread: a ticker on the loop goes on meanwhile."""
    async def scenario() -> float:
        writer = await setup.writer()
        await writer.recover()
        slow_prepare(writer, 1.0)
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
    async def scenario() -> None:
        writer = await setup.writer()
        async with writer.transaction():
            with pytest.raises(DualWriteUsageError, match="inside another"):
                async with writer.transaction():
                    pass
        await writer.close()
        with psycopg.connect(setup.dsn) as blocking, pytest.raises(ConfigError, match="AsyncConnection"):
            AsyncDualWriter(blocking, {"transactional.id": TID, "bootstrap.servers": "model:9092"},
                            transport=setup.transport)

    asyncio.run(scenario())
