"""Celery tasks that place orders with a dual write: a row in PostgreSQL and an event on Kafka, committed atomically
by a DualWriterPool in each prefork child (docs/fleet.md, "Celery prefork").

    export DATABASE_URL=postgresql://app@db:5432/shop KAFKA_BOOTSTRAP=broker:9092 CELERY_BROKER_URL=amqp://mq//
    celery -A celery_app worker --workdir examples/fleet --pool prefork --concurrency 4 --max-tasks-per-child 1000

    celery_app.place_order.delay(7, 10)     # from the producer side (the web application)

Every child of every worker host runs this with the same settings; each child's pool leases ids
``<DUAL_WRITE_PREFIX>-<n>``. Settings (environment): DATABASE_URL (a libpq URL), KAFKA_BOOTSTRAP, ORDERS_TOPIC,
DUAL_WRITE_PREFIX, DUAL_WRITE_LEASE_S (15 s), CELERY_BROKER_URL; CELERY_BROKER_FOLDER for kombu's filesystem
transport (CELERY_BROKER_URL=filesystem://, one machine, as the tests use it).

A task is redelivered when its child dies (acks_late, reject_on_worker_lost), so it must be idempotent: the order id
is the key, and a redelivered order that the database already committed ends with "exists".
"""

from __future__ import annotations

import json
import logging
import os
import threading

import psycopg
from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown

from kafka2pc.dualwrite import DualWriteIncompleteError, DualWriteOutcomeUnknownError, DualWriterPool
from kafka2pc.errors import RetriableError

log = logging.getLogger("orders")

TOPIC = os.environ.get("ORDERS_TOPIC", "orders")
KAFKA = {
    "bootstrap.servers": os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092"),
    "transactional.id": os.environ.get("DUAL_WRITE_PREFIX", "orders-tasks"),  # the same in every child and host
    "max.block.ms": 10_000,
}
LEASE_S = float(os.environ.get("DUAL_WRITE_LEASE_S", "15"))


def _broker_options() -> dict[str, object]:
    folder = os.environ.get("CELERY_BROKER_FOLDER")
    if not folder:
        return {}
    return {"data_folder_in": folder, "data_folder_out": folder, "control_folder": os.path.join(folder, "control"),
            "polling_interval": 0.1}


app = Celery("orders", broker=os.environ.get("CELERY_BROKER_URL", "amqp://localhost//"))
app.conf.update(
    broker_transport_options=_broker_options(),
    task_acks_late=True,  # acknowledge after the task ran: a task whose child died is delivered again...
    task_reject_on_worker_lost=True,  # ...also when the child was killed (SIGKILL, OOM, a hard time limit)
    worker_prefetch_multiplier=1,
    # worker_process_init makes the pool (a recovery: a Kafka round trip or two); Celery kills a child that has not
    # reported for duty within this (4 s by default)
    worker_proc_alive_timeout=30,
)


class Writers:
    """The child's DualWriterPool. A prefork child runs one task at a time: one writer (size=1)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: DualWriterPool | None = None

    def pool(self) -> DualWriterPool:
        with self._lock:
            if self._pool is None:
                self._pool = DualWriterPool(lambda: psycopg.connect(os.environ["DATABASE_URL"]), KAFKA, size=1,
                                            lease_s=LEASE_S)
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


writers = Writers()


@worker_process_init.connect
def make_pool(**_: object) -> None:
    """In each child, after the fork: the pool (made here, not in the parent; a pool refuses use after a fork). A
    failure is logged; the first task tries again."""
    try:
        writers.pool()
    except Exception as exc:
        log.warning("dual-writer pool not made yet (%r); the first task tries again", exc)


@worker_process_shutdown.connect
def close_pool(**_: object) -> None:
    """In each child before it exits (warm shutdown, --max-tasks-per-child): settle and give the ids back. A child
    killed instead loses its ids after lease_s; a live pool settles them."""
    writers.close()


#: errors after which the same order is simply tried again (the id makes that safe): the broker or the database away
#: (RetriableError includes PoolTimeoutError, and LeaseLostError: a block that outlived its lease), a commit whose
#: outcome is unknown
RETRIED = (RetriableError, DualWriteOutcomeUnknownError, psycopg.OperationalError)


@app.task(name="orders.place_order", autoretry_for=RETRIED, retry_backoff=True, max_retries=8)
def place_order(order_id: int, amount: int) -> str:
    event = json.dumps({"id": order_id, "amount": amount, "type": "OrderPlaced"}).encode()
    try:
        with writers.pool().transaction() as tx:
            tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order_id, amount))
            tx.produce(TOPIC, value=event, key=str(order_id).encode())
    except psycopg.errors.UniqueViolation:
        return "exists"  # delivered again after it committed (or retried after an unknown outcome): done already
    except DualWriteIncompleteError:
        return "committed; event pending"  # decided: the pool's next recovery of the id publishes the event
    return "created"
