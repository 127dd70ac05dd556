"""The asyncio section of benchmarks/dual_write.py (``--sections asyncio``): AsyncDualWriter against its peers in one
process and one event loop, on PostgreSQL through SQLAlchemy's AsyncEngine over asyncpg, at 1 and 32 concurrent
requests (tasks):

- async SQLAlchemy, DB only: ``async with engine.begin()``, INSERT the order, COMMIT (the engine's pool: one
  connection per task);
- confluent-kafka, Kafka only: a transactional producer per task, begin/produce/commit run in a thread
  (``asyncio.to_thread``: its calls block), the plain Kafka transaction an asyncio service would make;
- async dual write: an AsyncDualWriter per task (ids ``<prefix>-0..n-1``, one connection of the engine each),
  INSERT the order and produce its event in one block; then the same through an AsyncDualWriterPool;
- the same on asyncpg without SQLAlchemy: asyncpg's DB-only transaction (``async with connection.transaction()``),
  and an AsyncDualWriter per task on a bare asyncpg connection each.

Each figure: ``transactions`` spread over the tasks, timed from a common start to the last task's end, best of
``rounds`` after a warm-up round; p50/p99 over every transaction of the counted rounds; this process's CPU per
transaction; and the event loop's longest stall while the contender ran (a task sleeping 1 ms at a time: the
longest it overslept), which shows whether anything blocked the loop. ``--gc-freeze``: gc.freeze() once each
contender is set up, as a service would once started (Python's full collections run on the loop's thread).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Producer

from kafka2pc.dualwrite import AsyncDualWriter, AsyncDualWriterPool

#: one transaction: awaited with the order id
AsyncTransaction = Callable[[int], Awaitable[None]]


async def _stall_watch(stop: asyncio.Event) -> float:
    """The longest a 1 ms sleep overslept until ``stop``: how long the loop was kept from running tasks."""
    longest = 0.0
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(0.001)
        longest = max(longest, time.perf_counter() - before - 0.001)
    return longest


async def measure(workers: list[AsyncTransaction], transactions: int,
                  first_id: int) -> tuple[float, list[float], float, float]:
    """tx/s from a common start to the last end, the latencies, CPU ms per transaction, the loop's longest stall."""
    share = transactions // len(workers)
    latencies: list[float] = []

    async def work(index: int, worker: AsyncTransaction) -> None:
        for n in range(share):
            began = time.perf_counter()
            await worker(first_id + index * share + n)
            latencies.append(time.perf_counter() - began)

    stop = asyncio.Event()
    watch = asyncio.ensure_future(_stall_watch(stop))
    cpu, began = os.times(), time.perf_counter()
    await asyncio.gather(*(work(index, worker) for index, worker in enumerate(workers)))
    elapsed, after = time.perf_counter() - began, os.times()
    stop.set()
    stall = await watch
    done = share * len(workers)
    return done / elapsed, latencies, 1000 * ((after.user + after.system) - (cpu.user + cpu.system)) / done, stall


async def best_of(workers: list[AsyncTransaction], transactions: int, rounds: int, ids: Any) -> dict[str, float]:
    """One contender: a warm-up round, then ``rounds``; the best rate, latencies of all, the loop's longest stall."""
    rates, latencies, cpus, stalls = [], [], [], []
    for round_ in range(rounds + 1):
        rate, round_latencies, cpu, stall = await measure(workers, transactions, next(ids))
        if round_ == 0:
            continue  # warm-up
        rates.append(rate)
        latencies += round_latencies
        cpus.append(cpu)
        stalls.append(stall)
    return {"tx_per_s": max(rates), "p50_ms": 1000 * percentile(latencies, 0.5),
            "p99_ms": 1000 * percentile(latencies, 0.99), "cpu_ms_per_tx": statistics.median(cpus),
            "loop_stall_ms": 1000 * max(stalls)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_asyncio(url: str, schema: str, bootstrap: str, topic: str, *, concurrencies: list[int],
                      transactions: int, rounds: int, gc_freeze: bool = False) -> dict[str, Any]:
    from sqlalchemy import text  # noqa: PLC0415
    from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415

    # asyncio.to_thread's executor: room for every task's Kafka call at once (the default has min(32, cores + 4))
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2 * max(concurrencies)))
    def engine(tasks: int) -> Any:
        """An engine of ``tasks`` connections (the test server takes 50 clients in all)."""
        return create_async_engine(url, pool_size=tasks, max_overflow=0,
                                   connect_args={"server_settings": {"search_path": schema}})

    insert = text("INSERT INTO orders (id, amount) VALUES (:id, 1)")
    event = json.dumps({"type": "OrderPlaced", "amount": 12.5, "pad": "x" * 40}).encode()
    results: dict[str, Any] = {}
    print(f"\nasyncio, one process and one event loop, PostgreSQL through SQLAlchemy's AsyncEngine (asyncpg); "
          f"{transactions} transactions per round, best of {rounds} after a warm-up; gc.freeze() after each "
          f"contender's set-up: {gc_freeze}; {os.cpu_count()} cores, 1-min load average {os.getloadavg()[0]:.1f}")
    print(f"  {'contender':34s} {'tasks':>5s} {'tx/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'CPU ms/tx':>9s} "
          f"{'loop stall ms':>13s}")
    ids = iter(range(10**6, 10**9, 10**5))

    async def report(name: str, tasks: int, workers: list[AsyncTransaction]) -> None:
        if gc_freeze:  # what a service does once started: the objects alive now are never collected again
            gc.collect()
            gc.freeze()
        figures = await best_of(workers, transactions, rounds, ids)
        results[f"{name} x{tasks}"] = figures
        print(f"  {name:34s} {tasks:5d} {figures['tx_per_s']:8.0f} {figures['p50_ms']:8.2f} "
              f"{figures['p99_ms']:8.2f} {figures['cpu_ms_per_tx']:9.2f} {figures['loop_stall_ms']:13.2f}")

    for tasks in concurrencies:
        db_engine = engine(tasks)

        async def db_only(order: int, db_engine: Any = db_engine) -> None:
            async with db_engine.begin() as connection:
                await connection.execute(insert, {"id": order})

        await report("async SQLAlchemy, DB only", tasks, [db_only] * tasks)
        await db_engine.dispose()
        producers = [Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                               "transactional.id": f"ck-{uuid.uuid4().hex[:8]}-{n}"}) for n in range(tasks)]
        await asyncio.gather(*(asyncio.to_thread(producer.init_transactions, 30) for producer in producers))

        def kafka_transaction(producer: Producer, order: int) -> None:
            producer.begin_transaction()
            producer.produce(topic, value=event, key=str(order).encode())
            producer.commit_transaction(30)

        await report("confluent-kafka, Kafka only", tasks, [
            (lambda order, producer=producer: asyncio.to_thread(kafka_transaction, producer, order))
            for producer in producers])
        for producer in producers:
            producer.flush(10)
        writer_engine = engine(tasks)
        prefix = f"adw-{uuid.uuid4().hex[:6]}"
        writers = [AsyncDualWriter(writer_engine, {"bootstrap.servers": bootstrap,
                                                   "transactional.id": f"{prefix}-{n}"}) for n in range(tasks)]
        await asyncio.gather(*(writer.recover() for writer in writers))

        def dual_write(writer: AsyncDualWriter | AsyncDualWriterPool) -> AsyncTransaction:
            async def transaction(order: int) -> None:
                async with writer.transaction() as tx:
                    await tx.connection.execute(insert, {"id": order})
                    tx.produce(topic, value=event, key=str(order).encode())
            return transaction

        await report("AsyncDualWriter (dual write)", tasks, [dual_write(writer) for writer in writers])
        await asyncio.gather(*(writer.close() for writer in writers))
        await writer_engine.dispose()
        await run_pool(url, schema, bootstrap, tasks, report=report, dual_write=dual_write)
        await run_bare_asyncpg(url, schema, bootstrap, topic, tasks, report=report, event=event)
        ours = results[f"AsyncDualWriter (dual write) x{tasks}"]
        for peer in ("async SQLAlchemy, DB only", "confluent-kafka, Kafka only"):
            theirs = results[f"{peer} x{tasks}"]
            print(f"  dual write / {peer}, x{tasks}: tx/s {ours['tx_per_s'] / theirs['tx_per_s']:.2f}, "
                  f"p50 {ours['p50_ms'] / theirs['p50_ms']:.2f}")
    print(json.dumps({"bench": "dual-write-asyncio", "gc_freeze": gc_freeze, **results}))
    return results


async def run_pool(url: str, schema: str, bootstrap: str, tasks: int, *, report: Any,
                   dual_write: Callable[[AsyncDualWriterPool], AsyncTransaction]) -> None:
    """The same dual write through an AsyncDualWriterPool of ``tasks`` leased writers, ``tasks`` requests at once."""
    from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415

    engine = create_async_engine(url, pool_size=tasks + 1, max_overflow=1,  # the writers, and the keeper's
                                 connect_args={"server_settings": {"search_path": schema}})
    async with AsyncDualWriterPool(engine, {"bootstrap.servers": bootstrap,
                                            "transactional.id": f"adp-{uuid.uuid4().hex[:6]}"},
                                   size=tasks, min_size=tasks) as pool:
        await report(f"AsyncDualWriterPool (size {tasks})", tasks, [dual_write(pool)] * tasks)
    await engine.dispose()


async def run_bare_asyncpg(url: str, schema: str, bootstrap: str, topic: str, tasks: int, *, report: Any,
                           event: bytes) -> None:
    """asyncpg without SQLAlchemy: its DB-only transaction, then an AsyncDualWriter per task on a connection each."""
    import asyncpg  # noqa: PLC0415

    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    insert = "INSERT INTO orders (id, amount) VALUES ($1, 1)"
    connections = [await asyncpg.connect(dsn, server_settings={"search_path": schema}) for _ in range(tasks)]

    def db_only(connection: Any) -> AsyncTransaction:
        async def transaction(order: int) -> None:
            async with connection.transaction():
                await connection.execute(insert, order)
        return transaction

    await report("asyncpg, DB only", tasks, [db_only(connection) for connection in connections])
    prefix = f"apg-{uuid.uuid4().hex[:6]}"
    writers = [AsyncDualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}-{n}"})
               for n, connection in enumerate(connections)]
    await asyncio.gather(*(writer.recover() for writer in writers))

    def dual_write(writer: AsyncDualWriter) -> AsyncTransaction:
        async def transaction(order: int) -> None:
            async with writer.transaction() as tx:
                await tx.connection.execute(insert, order)
                tx.produce(topic, value=event, key=str(order).encode())
        return transaction

    await report("AsyncDualWriter (bare asyncpg)", tasks, [dual_write(writer) for writer in writers])
    await asyncio.gather(*(writer.close() for writer in writers))
    await asyncio.gather(*(connection.close() for connection in connections))
