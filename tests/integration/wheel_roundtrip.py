"""Run by tests/integration/test_wheel.py with the Python of a clean venv that has only the kafka2pc wheel: a
TwoPhaseProducer round trip and a DualWriter round trip on SQLite, as the README shows them. It imports nothing but
kafka2pc and the standard library, and prints one JSON line of what it did; the test checks it from outside with a
read_committed consumer.

    python -I wheel_roundtrip.py BOOTSTRAP PRODUCER_TOPIC DUAL_WRITE_TOPIC SQLITE_FILE
"""

from __future__ import annotations

import json
import sqlite3
import sys
import uuid

from kafka2pc import TwoPhaseProducer
from kafka2pc.dualwrite import DualWriter


def main(bootstrap: str, producer_topic: str, dual_write_topic: str, database: str) -> dict[str, object]:
    run = uuid.uuid4().hex[:8]
    producer = TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": f"wheel-2pc-{run}"},
                                two_phase_commit=True)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce_batch(producer_topic, [b"a", b"b"])
        state = producer.prepare_transaction()
        outcome = producer.complete_transaction(str(state))
        two_phase = producer.two_phase_commit_active
    finally:
        producer.close()

    connection = sqlite3.connect(database)
    connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount REAL)")
    connection.commit()
    writer = DualWriter(connection, {"bootstrap.servers": bootstrap, "transactional.id": f"wheel-dual-{run}"})
    try:
        writer.recover()
        for order in (1, 2, 3):
            with writer.transaction() as tx:
                tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (?, ?)", (order, order * 1.5))
                tx.produce(dual_write_topic, key=str(order).encode(), value=json.dumps({"id": order}).encode())
        dual_two_phase = writer.two_phase_commit_active
    finally:
        writer.close()
        connection.close()
    return {"outcome": outcome.name, "two_phase_commit_active": two_phase, "dual_write_two_phase": dual_two_phase}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
