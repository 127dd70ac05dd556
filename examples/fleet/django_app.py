"""An order service on Django, served by gunicorn with many worker processes: each order is a row in PostgreSQL and
an event on Kafka, committed atomically by a DualWriterPool on Django's own connection (docs/dual-write-django.md).

A one-file Django project (settings, a view, the WSGI application) so it runs as it is; in a project of your own
the pool goes where this module makes it, and the view is any view.

    export DATABASE_URL=postgresql://app@db:5432/shop KAFKA_BOOTSTRAP=broker:9092
    python examples/fleet/django_app.py migrate          # the orders table and the state table, once
    gunicorn -c examples/fleet/gunicorn.conf.py django_app:application

Settings (environment): as examples/fleet/flask_app.py's. POST /orders {"id": 7, "amount": 10}: 201 created; 409
the id exists; 202 committed, its event follows shortly; 503 try again with the same id.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

import django
from django.conf import settings

from kafka2pc.dualwrite import DualWriteIncompleteError, DualWriteOutcomeUnknownError, DualWriterPool, state_table_ddl
from kafka2pc.errors import RetriableError


def database_settings(url: str) -> dict[str, object]:
    """Django's DATABASES entry for a libpq URL (postgresql://user@host:port/db?options=...)."""
    parts = urlsplit(url)
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"), "USER": parts.username or "",
            "PASSWORD": parts.password or "", "HOST": parts.hostname or "localhost", "PORT": str(parts.port or 5432),
            "OPTIONS": options,
            # a connection per request thread, kept between requests (Django closes it when it breaks)
            "CONN_MAX_AGE": 60, "CONN_HEALTH_CHECKS": True}


settings.configure(
    DEBUG=False, SECRET_KEY=os.environ.get("DJANGO_SECRET_KEY", "not-a-secret-example-only"), ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__, INSTALLED_APPS=[], MIDDLEWARE=[], USE_TZ=True,
    # ATOMIC_REQUESTS must stay off (its default) for views that dual-write: a view's outer atomic block would
    # commit the rows after Kafka. A project that turns it on decorates such views with
    # @transaction.non_atomic_requests
    DATABASES={"default": database_settings(os.environ.get("DATABASE_URL", "postgresql://localhost/shop"))})
django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402 - after settings
from django.db import IntegrityError, connection  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402

log = logging.getLogger("orders")
TOPIC = os.environ.get("ORDERS_TOPIC", "orders")
KAFKA = {
    "bootstrap.servers": os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092"),
    # the prefix of the ids the fleet leases: the SAME in every process
    "transactional.id": os.environ.get("DUAL_WRITE_PREFIX", "orders-app"),
    "max.block.ms": 10_000,
}
LEASE_S = float(os.environ.get("DUAL_WRITE_LEASE_S", "15"))
RETRY_AFTER_S = 5.0


class Writers:
    """This process's DualWriterPool on Django's connection, made on first use in the worker (never in gunicorn's
    master), and retried at the next request when it could not be made."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: DualWriterPool | None = None
        self._pid = os.getpid()
        self._failed_at = -RETRY_AFTER_S

    def pool(self) -> DualWriterPool:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with self._lock:
            if self._pid != os.getpid():
                self._pool, self._pid = None, os.getpid()
            if self._pool is None:
                if time.monotonic() - self._failed_at < RETRY_AFTER_S:
                    raise RuntimeError(f"no dual-writer pool: the last attempt failed within {RETRY_AFTER_S:g} s")
                size = int(os.environ.get("DUAL_WRITE_SIZE", "8"))
                try:
                    # each writer works on the Django connection of the request thread it is lent to
                    self._pool = DualWriterPool(connection, KAFKA, size=size, lease_s=LEASE_S)
                except Exception:
                    self._failed_at = time.monotonic()
                    raise
                log.info("pid %d: dual-writer pool ready, ids %s", os.getpid(), self._pool.transactional_ids)
            return self._pool

    def close(self) -> None:
        """Give this process's ids back: gunicorn's worker_exit hook calls it."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close()


writers = Writers()


def create_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    order_id, amount = int(body["id"]), int(body["amount"])
    event = json.dumps({"id": order_id, "amount": amount, "type": "OrderPlaced"}).encode()

    def reply(status: str, code: int) -> JsonResponse:
        return JsonResponse({"id": order_id, "pid": os.getpid(), "status": status}, status=code)

    try:
        pool = writers.pool()
    except Exception as exc:
        log.warning("no dual-writer pool: %r", exc)
        return reply("unavailable", 503)
    try:
        with pool.transaction() as tx, tx.connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order_id, amount))
            tx.produce(TOPIC, value=event, key=str(order_id).encode())
    except IntegrityError:
        return reply("exists", 409)
    except DualWriteIncompleteError:
        return reply("committed; event pending", 202)
    except (DualWriteOutcomeUnknownError, RetriableError):  # PoolTimeoutError, LeaseLostError, a lost connection
        return reply("retry with the same id", 503)
    return reply("created", 201)


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"pid": os.getpid()})


urlpatterns = [path("orders", create_order), path("healthz", healthz)]
application = get_wsgi_application()


def migrate() -> None:
    """Create the orders table and the dual writer's state table (Django's migrations' job in a real project)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, amount INTEGER NOT NULL)")
        cursor.execute(state_table_ddl())


if __name__ == "__main__":
    if sys.argv[1:] == ["migrate"]:
        migrate()
    else:
        print(__doc__)
