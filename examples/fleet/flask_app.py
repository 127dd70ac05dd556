"""An order service on Flask and SQLAlchemy, served by gunicorn with many worker processes: each order is a row in
PostgreSQL or MariaDB and an event on Kafka, committed atomically by a DualWriterPool (docs/fleet.md; MariaDB:
docs/dual-write.md, "MySQL and MariaDB").

Every worker of every host runs this same code with the same settings: the pool in each worker leases
transactional ids ``<DUAL_WRITE_PREFIX>-<n>`` from the state table, so there is no per-worker id to configure.

    export DATABASE_URL=postgresql://app@db:5432/shop KAFKA_BOOTSTRAP=broker:9092   # or mysql://app@db:3306/shop
    python examples/fleet/flask_app.py migrate          # the orders table and the state table, once
    gunicorn -c examples/fleet/gunicorn.conf.py flask_app:app

Settings (environment): DATABASE_URL (a libpq URL, or mysql:// for MariaDB through PyMySQL), KAFKA_BOOTSTRAP,
ORDERS_TOPIC, DUAL_WRITE_PREFIX (the same for the whole fleet), DUAL_WRITE_SIZE (writers per process;
gunicorn.conf.py makes it gunicorn's threads), DUAL_WRITE_LEASE_S (15 s).

POST /orders {"id": 7, "amount": 10}: 201 created; 409 the id exists (so a client may retry with the same id after
any error or a lost answer); 202 committed, its event follows shortly; 503 try again (the pool is busy or not made
yet, the commit's outcome is unknown, or the block outlived its lease: retry with the same id).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

import sqlalchemy as sa
from flask import Flask, jsonify, request

from kafka2pc.dualwrite import (
    DualWriteIncompleteError,
    DualWriteOutcomeUnknownError,
    DualWriterPool,
    LeaseLostError,
    PoolTimeoutError,
    state_table_ddl,
)
from kafka2pc.errors import RetriableError

log = logging.getLogger("orders")
# time, pid and logger on every line (gunicorn's own logging does not cover the application's): which worker said it
logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s")

TOPIC = os.environ.get("ORDERS_TOPIC", "orders")
KAFKA = {
    "bootstrap.servers": os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092"),
    # the prefix of the ids the fleet leases: the SAME in every process (never a host name or a worker number)
    "transactional.id": os.environ.get("DUAL_WRITE_PREFIX", "orders-app"),
    # bounds every wait on Kafka (a recovery at pool.close() included), so a worker stops within graceful_timeout
    "max.block.ms": 10_000,
}
LEASE_S = float(os.environ.get("DUAL_WRITE_LEASE_S", "15"))
#: after a failed attempt to make the pool, requests get a 503 at once for this long, rather than each waiting for
#: the broker's or the database's timeout
RETRY_AFTER_S = 5.0

metadata = sa.MetaData()
orders = sa.Table("orders", metadata,
                  sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
                  sa.Column("amount", sa.Integer, nullable=False))


def database_url() -> sa.engine.URL:
    """DATABASE_URL for SQLAlchemy: postgresql://... with psycopg 3, mysql://... (MariaDB) with PyMySQL."""
    url = sa.engine.make_url(os.environ["DATABASE_URL"])
    return url.set(drivername="mysql+pymysql" if url.get_backend_name() in ("mysql", "mariadb")
                   else "postgresql+psycopg")


class Writers:
    """This process's DualWriterPool, made on first use, in the worker (never in gunicorn's master: a pool refuses
    use after a fork), and retried at the next request when it could not be made (the broker or the database away)
    rather than failing the worker's boot, which would stop the whole gunicorn."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: DualWriterPool | None = None
        self._engine: sa.Engine | None = None
        self._pid = os.getpid()
        self._failed_at = -RETRY_AFTER_S

    def pool(self) -> DualWriterPool:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with self._lock:
            if self._pid != os.getpid():  # made before a fork (gunicorn --preload): the child makes its own
                self._pool, self._engine, self._pid = None, None, os.getpid()
            if self._pool is None:
                if time.monotonic() - self._failed_at < RETRY_AFTER_S:
                    raise RuntimeError(f"no dual-writer pool: the last attempt failed within {RETRY_AFTER_S:g} s")
                # one writer per request thread of the worker (gunicorn.conf.py's post_fork sets it to --threads)
                size = int(os.environ.get("DUAL_WRITE_SIZE", "8"))
                # an Engine of its own: each writer holds one of its connections for as long as it holds an id, the
                # lease keeper one more, and one more while the keeper settles a dead process's id (size + 2); the
                # app's own queries use `engine` below, so they never wait for a connection a writer holds
                self._engine = sa.create_engine(database_url(), pool_size=size + 2, max_overflow=2,
                                                pool_pre_ping=True)
                try:
                    self._pool = DualWriterPool(self._engine, KAFKA, size=size, lease_s=LEASE_S)
                except Exception:
                    self._failed_at = time.monotonic()
                    self._engine.dispose()
                    self._engine = None
                    raise
                log.info("pid %d: dual-writer pool ready, ids %s", os.getpid(), self._pool.transactional_ids)
            return self._pool

    def close(self) -> None:
        """Give this process's ids back (settling what its writers left): gunicorn's worker_exit hook calls it."""
        with self._lock:
            pool, engine, self._pool, self._engine = self._pool, self._engine, None, None
        if self._pid != os.getpid():
            return  # the parent's pool and connections, inherited through a fork: not this process's to close
        if pool is not None:
            pool.close()
        if engine is not None:
            engine.dispose()


writers = Writers()
app = Flask(__name__)
#: the application's own queries (reads here), on connections of their own
engine = sa.create_engine(database_url(), pool_size=2, pool_pre_ping=True) if "DATABASE_URL" in os.environ else None


@app.post("/orders")
def create_order():  # type: ignore[no-untyped-def]
    body = request.get_json(force=True)
    order_id, amount = int(body["id"]), int(body["amount"])
    event = json.dumps({"id": order_id, "amount": amount, "type": "OrderPlaced"}).encode()

    def reply(status: str, code: int, retry_after: int | None = None):  # type: ignore[no-untyped-def]
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        return jsonify(id=order_id, pid=os.getpid(), status=status), code, headers

    try:
        pool = writers.pool()
    except Exception as exc:  # no pool yet: Kafka or the database unreachable; this worker keeps serving
        log.warning("no dual-writer pool: %r", exc)
        return reply("unavailable", 503, retry_after=int(RETRY_AFTER_S))
    try:
        with pool.transaction() as tx:
            tx.connection.execute(orders.insert().values(id=order_id, amount=amount))
            tx.produce(TOPIC, value=event, key=str(order_id).encode())
    except sa.exc.IntegrityError:
        return reply("exists", 409)  # both rolled back; the earlier order with this id stands
    except DualWriteIncompleteError:
        return reply("committed; event pending", 202)  # decided: the pool's next recovery of the id publishes it
    except DualWriteOutcomeUnknownError:
        return reply("unknown; retry with the same id", 503, retry_after=2)  # a retry gets 201 or 409
    except PoolTimeoutError:
        return reply("busy", 503, retry_after=1)
    except LeaseLostError:  # the block outlived lease_s (Kafka slow or away, a slow call): both rolled back
        return reply("too slow; retry", 503, retry_after=1)
    except RetriableError:  # the database connection lost inside the block, before the commit: nothing committed
        return reply("retry", 503, retry_after=1)
    except sa.exc.DBAPIError as exc:
        if not retriable(exc):
            raise
        return reply("database busy or away; retry", 503, retry_after=1)  # both rolled back
    return reply("created", 201)


def retriable(exc: sa.exc.DBAPIError) -> bool:
    """A lost connection (a database restart; on MariaDB also a block that outlived lease_s), a deadlock or a lock
    wait timeout: nothing of the block was committed, and the same request may be sent again."""
    code = getattr(exc.orig, "sqlstate", None) or (exc.orig.args[0] if exc.orig is not None and exc.orig.args else None)
    return bool(exc.connection_invalidated) or code in ("40P01", "40001", "55P03", 1205, 1213)


@app.get("/orders/<int:order_id>")
def get_order(order_id: int):  # type: ignore[no-untyped-def]
    assert engine is not None
    with engine.connect() as connection:
        amount = connection.execute(sa.select(orders.c.amount).where(orders.c.id == order_id)).scalar()
    if amount is None:
        return jsonify(id=order_id, status="not found"), 404
    return jsonify(id=order_id, amount=amount)


@app.get("/healthz")
def healthz():  # type: ignore[no-untyped-def]
    """Liveness and readiness: the worker serves (it does not wait for Kafka: a pool is made on demand)."""
    return jsonify(pid=os.getpid())


def migrate() -> None:
    """Create the orders table and the dual writer's state table (a migration tool's job in production)."""
    with sa.create_engine(database_url()).begin() as connection:
        metadata.create_all(connection)
        connection.exec_driver_sql(state_table_ddl())


if __name__ == "__main__":
    if sys.argv[1:] == ["migrate"]:
        migrate()
    else:
        print(__doc__)
