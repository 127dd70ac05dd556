"""An order service on FastAPI, served by uvicorn with many worker processes: each order is a row in PostgreSQL and
an event on Kafka, committed atomically by a DualWriterPool (docs/fleet.md).

    export DATABASE_URL=postgresql://app@db:5432/shop KAFKA_BOOTSTRAP=broker:9092
    uvicorn fastapi_app:app --app-dir examples/fleet --workers 4 --host 0.0.0.0 --port 8000

Every worker runs the same code with the same settings; each pool leases ids ``<DUAL_WRITE_PREFIX>-<n>``.
Settings (environment): DATABASE_URL (a libpq URL), KAFKA_BOOTSTRAP, ORDERS_TOPIC, DUAL_WRITE_PREFIX,
DUAL_WRITE_SIZE (writers per process, 8), DUAL_WRITE_LEASE_S (15 s). The orders table is examples/fleet/flask_app.py's
(``python examples/fleet/flask_app.py migrate``).

The dual write blocks (psycopg and the Kafka client are blocking), so it never runs on the event loop: the endpoint
is a plain ``def``, which FastAPI runs in its threadpool (40 threads by default, shared by every ``def`` endpoint
and dependency). An ``async def`` endpoint would call ``await run_in_threadpool(place, pool, order)`` instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator

import psycopg
from fastapi import FastAPI, HTTPException, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from kafka2pc.dualwrite import (
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriterPool,
    LeaseLostError,
    PoolTimeoutError,
)

log = logging.getLogger("orders")

TOPIC = os.environ.get("ORDERS_TOPIC", "orders")
KAFKA = {
    "bootstrap.servers": os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092"),
    "transactional.id": os.environ.get("DUAL_WRITE_PREFIX", "orders-app"),  # the same in every process
    "max.block.ms": 10_000,  # bounds every wait on Kafka, pool.close() at shutdown included
}
SIZE = int(os.environ.get("DUAL_WRITE_SIZE", "8"))
LEASE_S = float(os.environ.get("DUAL_WRITE_LEASE_S", "15"))
#: after a failed attempt to make the pool, requests get a 503 at once for this long
RETRY_AFTER_S = 5.0


class Writers:
    """This process's DualWriterPool: made at startup when it can be, else on first use (a lifespan startup that
    raises makes uvicorn's supervisor stop every worker), closed at shutdown."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: DualWriterPool | None = None
        self._failed_at = -RETRY_AFTER_S

    def pool(self) -> DualWriterPool:
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                if time.monotonic() - self._failed_at < RETRY_AFTER_S:
                    raise RuntimeError(f"no dual-writer pool: the last attempt failed within {RETRY_AFTER_S:g} s")
                try:
                    # a callable making connections: the pool owns them (one per leased id, one for its keeper)
                    self._pool = DualWriterPool(lambda: psycopg.connect(os.environ["DATABASE_URL"]), KAFKA,
                                                size=SIZE, lease_s=LEASE_S)
                except Exception:
                    self._failed_at = time.monotonic()
                    raise
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


writers = Writers()


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        await run_in_threadpool(writers.pool)
    except Exception as exc:
        log.warning("dual-writer pool not made yet (%r); the first request tries again", exc)
    yield
    # uvicorn ran every request to its end (or past --timeout-graceful-shutdown): give the ids back
    await run_in_threadpool(writers.close)


app = FastAPI(lifespan=lifespan)


class Order(BaseModel):
    id: int
    amount: int


def place(pool: DualWriterPool, order: Order) -> None:
    """The dual write, blocking: one DB transaction and one Kafka transaction."""
    event = json.dumps({"id": order.id, "amount": order.amount, "type": "OrderPlaced"}).encode()
    with pool.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order.id, order.amount))
        tx.produce(TOPIC, value=event, key=str(order.id).encode())


@app.post("/orders", status_code=201)
def create_order(order: Order, response: Response) -> dict[str, object]:  # def: runs in FastAPI's threadpool
    answer: dict[str, object] = {"id": order.id, "pid": os.getpid()}
    try:
        pool = writers.pool()
    except Exception as exc:  # Kafka or the database unreachable: this worker keeps serving, and tries again later
        log.warning("no dual-writer pool: %r", exc)
        raise HTTPException(503, {**answer, "status": "unavailable"},
                            headers={"Retry-After": str(int(RETRY_AFTER_S))}) from None
    try:
        place(pool, order)
    except psycopg.errors.UniqueViolation:
        raise HTTPException(409, {**answer, "status": "exists"}) from None  # the earlier order stands
    except DualWriteIncompleteError:
        response.status_code = 202  # the database committed; the pool's next recovery of the id publishes it
        return {**answer, "status": "committed; event pending"}
    except DualWriteOutcomeUnknownError:
        raise HTTPException(503, {**answer, "status": "unknown; retry with the same id"},
                            headers={"Retry-After": "2"}) from None
    except PoolTimeoutError:
        raise HTTPException(503, {**answer, "status": "busy"}, headers={"Retry-After": "1"}) from None
    except LeaseLostError:  # the block outlived lease_s (Kafka slow or away, a slow call): both rolled back
        raise HTTPException(503, {**answer, "status": "too slow"}, headers={"Retry-After": "1"}) from None
    return {**answer, "status": "created"}


@app.get("/healthz")
async def healthz() -> dict[str, int]:
    return {"pid": os.getpid()}
