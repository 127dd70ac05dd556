"""An order service with kafka2pc's dual write: each order is a row in the service's database and an event on
Kafka, committed atomically (no outbox table, no CDC pipeline).

    python examples/dual_write.py [--bootstrap HOST:PORT] [--postgres DSN] [--orders 20]

Without --bootstrap a local Apache Kafka broker is started; without --postgres the database is a SQLite file.
One order is refused by the database (a duplicate id) and one by the application: neither reaches either side.
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from kafka2pc.dualwrite import DualWriter
from kafka2pc.testing.provider import bootstrap_or_local
from kafka2pc.testing.verify import create_topic, read_records


class OrderService:
    """Places orders: INSERT the order and produce its event in one dual-write transaction."""

    def __init__(self, connection: Any, placeholder: str, bootstrap: str, topic: str):
        self.connection, self.topic = connection, topic
        self.insert = f"INSERT INTO orders (id, customer, amount) VALUES ({', '.join([placeholder] * 3)})"
        self.writer = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": "order-service-0"})
        self.writer.recover()  # settle whatever a crashed predecessor left

    def place(self, order_id: int, customer: str, amount: float) -> None:
        with self.writer.transaction() as tx:
            tx.cursor.execute(self.insert, (order_id, customer, amount))
            if amount <= 0:
                raise ValueError(f"order {order_id}: amount must be positive")
            event = {"id": order_id, "customer": customer, "amount": amount, "type": "OrderPlaced"}
            tx.produce(self.topic, value=json.dumps(event).encode(), key=str(order_id).encode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap")
    parser.add_argument("--postgres", metavar="DSN", help="a PostgreSQL connection string (psycopg 3)")
    parser.add_argument("--orders", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)

    with bootstrap_or_local(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as work:
        if args.postgres:
            import psycopg  # noqa: PLC0415

            connection, placeholder = psycopg.connect(args.postgres), "%s"
        else:
            connection, placeholder = sqlite3.connect(Path(work) / "orders.db"), "?"
        connection.cursor().execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer TEXT, "
                                    "amount REAL)")
        connection.commit()
        topic = create_topic(bootstrap, partitions=3)
        service = OrderService(connection, placeholder, bootstrap, topic)
        print(f"two-phase commit active: {service.writer.two_phase_commit_active}; events to {topic}")
        for order_id in range(args.orders):
            service.place(order_id, f"customer-{order_id % 7}", 10.0 + order_id)
        for bad_id, amount, why in ((3, 5.0, "duplicate id"), (args.orders, -1.0, "refused by the application")):
            try:
                service.place(bad_id, "customer-x", amount)
            except Exception as exc:
                print(f"order {bad_id} ({why}): {type(exc).__name__}: {exc} -> rolled back in the DB and in Kafka")
        service.writer.close()
        ids = [row[0] for row in connection.cursor().execute("SELECT id FROM orders ORDER BY id").fetchall()]
        keys = sorted(int(r.key) for r in read_records(bootstrap, topic))
        print(f"database: {len(ids)} orders; Kafka (read_committed): {len(keys)} events; equal: {ids == keys}")
        connection.close()
        return 0 if ids == keys else 1


if __name__ == "__main__":
    sys.exit(main())
