"""DualWriter on Django's own connection and transaction management, against a real broker and PostgreSQL: the four
failure modes in writer processes, and what Django lets an application do inside the block (on_commit,
set_rollback, its own commit, nested atomic blocks, an outer atomic block), each ending with nothing split."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from kafka2pc.dualwrite import DualWriter, DualWriterPool, DualWriteUsageError
from kafka2pc.errors import UsageError

from .test_dual_write import Database, create_orders, kafka_keys, kill_and_recover, schema_database

django = pytest.importorskip("django")
psycopg = pytest.importorskip("psycopg")
pytestmark = pytest.mark.integration
KILLS_PER_MODE = int(os.environ.get("KAFKA2PC_DUAL_WRITE_KILLS", "3"))


@pytest.fixture(scope="module")
def django_db(postgres_dsn) -> Database:
    """Django configured (once per process) on a schema of its own, with the orders table."""
    from django.conf import settings  # noqa: PLC0415

    from kafka2pc_harness.postgres import configure_django  # noqa: PLC0415

    db, _ = schema_database(postgres_dsn)
    create_orders(db)
    if settings.configured:
        pytest.skip("Django was configured for another database in this process")
    configure_django(db.url)
    return Database(f"django:{db.url}", db.connect, "%s")


@pytest.fixture
def clean(django_db):
    connection = django_db.connect()
    connection.execute("DELETE FROM orders")
    connection.commit()
    connection.close()
    return django_db


def writer(bootstrap: str, transactional_id: str | None = None) -> DualWriter:
    from django.db import connection  # noqa: PLC0415

    return DualWriter(connection, {"bootstrap.servers": bootstrap,
                                   "transactional.id": transactional_id or f"dj-{uuid.uuid4().hex[:6]}"})


def insert(tx, order: int, topic: str) -> None:
    with tx.connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order, order % 100))
    tx.produce(topic, value=str(order).encode(), key=str(order).encode())


def recover_django(db: Database, bootstrap: str, transactional_id: str, config=None) -> None:
    dual = writer(bootstrap, transactional_id)
    dual.recover()
    dual.close()


@pytest.mark.timeout(600)
def test_django_writers_killed_in_every_failure_mode_leave_db_and_kafka_equal(clean, kafka, topic_factory):
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=3)
    kills = kill_and_recover(clean, bootstrap, topic, [mode for mode in "abcd" for _ in range(KILLS_PER_MODE)],
                             seed=int(os.environ.get("KAFKA2PC_DUAL_WRITE_SEED", "17")), recover=recover_django)
    keys = kafka_keys(bootstrap, topic)
    assert keys == clean.ids() and len(set(keys)) == len(keys)
    print(f"\n{sum(kills.values())} kills {dict(sorted(kills.items()))} through Django: DB ids == Kafka keys, "
          f"nothing open, after each recovery ({len(keys)} orders, no duplicates)")


def test_misuse_inside_the_block_ends_it_with_nothing_split(clean, kafka, topic_factory):
    from django.db import connection, transaction  # noqa: PLC0415

    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    dual = writer(bootstrap)
    with pytest.raises(DualWriteUsageError, match="on_commit"), dual.transaction() as tx:
        insert(tx, 1, topic)
        transaction.on_commit(lambda: None)
    with pytest.raises(DualWriteUsageError, match="set_rollback"), dual.transaction() as tx:
        insert(tx, 2, topic)
        transaction.set_rollback(True)
    with pytest.raises(transaction.TransactionManagementError), dual.transaction() as tx:
        insert(tx, 3, topic)
        transaction.commit()  # Django refuses it inside an atomic block: nothing commits
    with pytest.raises(RuntimeError, match="durable"), dual.transaction() as tx:
        insert(tx, 4, topic)
        with transaction.atomic(durable=True):
            pass
    with dual.transaction() as tx:  # a nested atomic block is a savepoint: fine
        insert(tx, 5, topic)
        with transaction.atomic():
            insert(tx, 6, topic)
        try:
            with transaction.atomic():
                insert(tx, 5, topic)  # a duplicate: the savepoint rolls it back, the block goes on
        except django.db.IntegrityError:
            pass
    # as the ORM's save() does, Django marks the block on a duplicate: the application's own error, not a usage error
    with pytest.raises(django.db.IntegrityError), dual.transaction() as tx, transaction.mark_for_rollback_on_error():
        insert(tx, 5, topic)
    with transaction.atomic(), pytest.raises(UsageError, match="non_atomic_requests"), dual.transaction():
        pass  # a dual write inside an outer atomic block (ATOMIC_REQUESTS) is refused before it begins
    assert not connection.in_atomic_block
    dual.close()
    assert clean.ids() == kafka_keys(bootstrap, topic) == [5, 6]


def test_a_commit_the_application_sends_itself_is_caught_after_the_fact(clean, kafka, topic_factory):
    """A raw COMMIT through the cursor goes past Django: the block's savepoint is gone, DualWriteUsageError, and
    the row stays committed without its event (as the error says)."""
    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka)
    dual = writer(bootstrap)
    with pytest.raises(DualWriteUsageError, match="committed or rolled back inside"), dual.transaction() as tx:
        insert(tx, 1, topic)
        with tx.connection.cursor() as cursor:
            cursor.execute("COMMIT")
    with dual.transaction() as tx:
        insert(tx, 2, topic)
    dual.close()
    assert kafka_keys(bootstrap, topic) == [2]
    assert clean.ids() == [1, 2]


def test_a_pool_on_djangos_connection_serves_request_threads(clean, kafka, topic_factory):
    """DualWriterPool(django.db.connection): each writer works on the Django connection of the thread it is lent to
    (Django's connections are per thread), so the ORM's statements in the block are in the dual write."""
    from django.db import connection, connections  # noqa: PLC0415

    bootstrap, topic = kafka.bootstrap_servers, topic_factory(kafka, partitions=3)
    config = {"bootstrap.servers": bootstrap, "transactional.id": f"djp-{uuid.uuid4().hex[:6]}"}
    pool = DualWriterPool(connection, config, size=3, lease_s=5)
    failures: list[str] = []

    def serve(first: int) -> None:
        try:
            for order in range(first, first + 10):
                with pool.transaction() as tx:
                    insert(tx, order, topic)
        except Exception as exc:  # reported below
            failures.append(repr(exc))
        finally:
            connections.close_all()  # as Django does at a request's end

    threads = [threading.Thread(target=serve, args=(n * 100,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    pool.close()
    assert failures == []
    assert clean.ids() == kafka_keys(bootstrap, topic) == sorted(n * 100 + k for n in range(4) for k in range(10))
