"""A rolling deploy onto a state table made by the release before leases, on PostgreSQL and a real broker: a
writer of that release keeps writing orders while the first pool of the new release adds the lease columns, and
neither fails a transaction. The old release's advice was a prefix per process, so its ids are not the new fleet's
(rows <prefix>-<n> of a fixed-prefix pool are adopted and settled, as that release's next pool start would have
recovered them). The writer that stands for the old release is a DualWriter that found the table without the lease
columns: it runs that release's statements (its SELECT and UPDATE name their columns)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kafka2pc.dualwrite import DualWriter, DualWriterPool

from .test_dual_write import create_orders, kafka_keys, schema_database
from .test_dual_write_leases import OLD_DDL

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_the_lease_columns_are_added_while_a_writer_of_the_old_release_writes(postgres_dsn, kafka, topic_factory):
    db, _ = schema_database(postgres_dsn)
    create_orders(db)
    setup = db.connect()
    setup.execute(OLD_DDL)
    setup.commit()
    bootstrap, topic, prefix = kafka.bootstrap_servers, topic_factory(kafka), f"up-{uuid.uuid4().hex[:6]}"
    old_connection = db.connect()
    # the old release's advice: a prefix per process (its pool's ids <prefix>-<host>-<n>)
    old = DualWriter(old_connection, {"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}-host1-0"})
    old.recover()
    stop, failures, written, slowest = threading.Event(), [], [], [0.0]

    def write_as_the_old_release() -> None:
        order = 1000
        while not stop.is_set() and order < 3000:  # bounded
            started = time.monotonic()
            try:
                with old.transaction() as tx:
                    tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (%s, 1)", (order,))
                    tx.produce(topic, value=b"x", key=str(order).encode())
                written.append(order)
            except Exception as exc:
                failures.append(repr(exc))
            slowest[0] = max(slowest[0], time.monotonic() - started)
            order += 1

    thread = threading.Thread(target=write_as_the_old_release)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(written) < 3 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.1)
        assert written and not old._table.leasing, failures
        before = len(written)
        pool = DualWriterPool(db.connect, {"bootstrap.servers": bootstrap, "transactional.id": prefix}, size=2)
        for order in range(1, 21):
            with pool.transaction() as tx:
                tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (%s, 1)", (order,))
                tx.produce(topic, value=b"x", key=str(order).encode())
        time.sleep(0.5)
        assert len(written) > before  # the old release still writes after the columns were added
    finally:
        stop.set()
        thread.join(timeout=60)
    pool.close()
    old.close()
    old_connection.close()
    columns = [row[0] for row in setup.execute("SELECT column_name FROM information_schema.columns WHERE "
                                               "table_name = 'kafka2pc_dual_write_state' AND table_schema = "
                                               "current_schema()")]
    setup.close()
    print(f"\nold-release writer: {len(written)} orders, {len(failures)} failed, slowest transaction "
          f"{slowest[0] * 1000:.0f} ms; pool: 20 orders; lease columns added: "
          f"{sorted(set(columns) & {'lease_owner', 'lease_expires', 'fleet'})}")
    assert failures == []
    assert {"lease_owner", "lease_expires", "heartbeat_at", "holder", "fleet", "fleet_index", "problem"} <= set(columns)
    assert db.ids() == kafka_keys(bootstrap, topic) == sorted([*range(1, 21), *written])
