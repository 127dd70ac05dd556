"""An order service on FastAPI with async SQLAlchemy (asyncpg), served by uvicorn with many worker processes: each
order is a row in PostgreSQL and an event on Kafka, committed atomically by an AsyncDualWriterPool
(docs/dual-write-async.md).

    export DATABASE_URL=postgresql://app@db:5432/shop KAFKA_BOOTSTRAP=broker:9092
    uvicorn fastapi_async_app:app --app-dir examples/fleet --workers 4 --host 0.0.0.0 --port 8000

Every worker runs the same code with the same settings; each pool leases ids ``<DUAL_WRITE_PREFIX>-<n>`` (a worker
killed without closing leaves its ids to expire after DUAL_WRITE_LEASE_S; the other workers settle them).
Settings (environment): DATABASE_URL (a libpq URL; ``?options=-csearch_path%3D<schema>`` is honoured),
KAFKA_BOOTSTRAP, ORDERS_TOPIC, DUAL_WRITE_PREFIX, DUAL_WRITE_SIZE (writers per process, 8), DUAL_WRITE_LEASE_S
(15 s). The orders table is examples/fleet/flask_app.py's (``python examples/fleet/flask_app.py migrate``).

The endpoint is ``async def``: the database work is awaited on the event loop, and Kafka's calls run on each
writer's own thread, so the loop never waits on Kafka.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

from fastapi import FastAPI, HTTPException, Request, Response
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from kafka2pc.dualwrite import (
    AsyncDualWriterPool,
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    LeaseLostError,
    PoolTimeoutError,
)
from kafka2pc.errors import RetriableError

log = logging.getLogger("orders")

TOPIC = os.environ.get("ORDERS_TOPIC", "orders")
KAFKA = {
    "bootstrap.servers": os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092"),
    "transactional.id": os.environ.get("DUAL_WRITE_PREFIX", "orders-app"),  # the same in every process
    "max.block.ms": 10_000,  # bounds every wait on Kafka, pool.close() at shutdown included
}
SIZE = int(os.environ.get("DUAL_WRITE_SIZE", "8"))
LEASE_S = float(os.environ.get("DUAL_WRITE_LEASE_S", "15"))


def async_engine_for(libpq_url: str) -> AsyncEngine:
    """asyncpg's engine for a libpq URL: its ``options=-csearch_path=...`` becomes asyncpg's server setting."""
    parts = urlsplit(libpq_url)
    settings = {}
    for option in parse_qs(parts.query).get("options", []):
        name, _, value = option.removeprefix("-c").partition("=")
        settings[name] = value
    url = parts._replace(scheme="postgresql+asyncpg", query="").geturl()
    return create_async_engine(url, connect_args={"server_settings": settings} if settings else {})


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine = async_engine_for(os.environ["DATABASE_URL"])
    # the pool checks one connection out of the engine per leased id, and one for its keeper; making it does no I/O
    pool = app.state.pool = AsyncDualWriterPool(engine, KAFKA, size=SIZE, lease_s=LEASE_S)
    try:
        await pool.start()
    except Exception as exc:  # never raise from startup: uvicorn's supervisor would stop every worker
        log.warning("dual-writer pool not started yet (%r); the first request tries again", exc)
    yield  # uvicorn runs every request to its end (or past --timeout-graceful-shutdown), then the ids go back
    await pool.close()
    await engine.dispose()


app = FastAPI(lifespan=lifespan)


class Order(BaseModel):
    id: int
    amount: int


async def place(pool: AsyncDualWriterPool, order: Order) -> None:
    """The dual write: one DB transaction (an AsyncSession on the block's connection) and one Kafka transaction."""
    event = json.dumps({"id": order.id, "amount": order.amount, "type": "OrderPlaced"}).encode()
    async with pool.transaction() as tx:
        async with AsyncSession(bind=tx.connection, join_transaction_mode="create_savepoint") as session:
            await session.execute(text("INSERT INTO orders (id, amount) VALUES (:id, :amount)"),
                                  {"id": order.id, "amount": order.amount})
            await session.commit()  # releases the session's savepoint; the block commits both
        tx.produce(TOPIC, value=event, key=str(order.id).encode())


@app.post("/orders", status_code=201)
async def create_order(order: Order, request: Request, response: Response) -> dict[str, object]:
    answer: dict[str, object] = {"id": order.id, "pid": os.getpid()}
    try:
        await place(request.app.state.pool, order)
    except IntegrityError:
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
    except RetriableError as exc:  # Kafka unreachable (a pool not started yet starts at the next request), or
        # DatabaseConnectionLostError: the database connection lost before the commit (on asyncpg also a block that
        # outlived lease_s), nothing committed, the pool replaced the connection
        raise HTTPException(503, {**answer, "status": f"unavailable: {type(exc).__name__}"},
                            headers={"Retry-After": "5"}) from None
    return {**answer, "status": "created"}


@app.get("/healthz")
async def healthz() -> dict[str, int]:
    return {"pid": os.getpid()}
