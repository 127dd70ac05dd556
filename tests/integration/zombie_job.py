"""A fleet process that freezes itself (SIGSTOP) at an exact point of its first dual-write transaction, for the
zombie tests, then goes on when the test sends SIGCONT:

    lock:      inside the block: the row lock held, the order's row and record written, nothing prepared
    prepared:  Kafka prepared and the row written, the database commit not sent
    committed: the database committed, Kafka's completion not sent

    python zombie_job.py DSN BOOTSTRAP TOPIC PREFIX LEASE_S POINT FIRST COUNT

It prints ``paused <transactional id>`` before it stops, then one line per order: ``order N ok`` or ``order N
<error class>``. Its pool has the fleet's configuration (the same prefix as every other process)."""

from __future__ import annotations

import os
import signal
import sys
import time

import psycopg

from kafka2pc.dualwrite import DualWriterPool

POINT = ""
HELD: list[str] = []


def freeze(transactional_id: str) -> None:
    print(f"paused {transactional_id}", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


class Freezing(psycopg.Connection):  # type: ignore[type-arg]
    """commit() freezes the process before or after committing, once, when armed: on the block's own connection
    only (armed on the class, the pool's keeper committing a lease renewal on its connection in between froze the
    process before the block's commit)."""

    armed: str | None = None

    def commit(self) -> None:
        point, self.armed = self.armed, None
        if point == "prepared":
            freeze(HELD[0])
        super().commit()
        if point == "committed":
            freeze(HELD[0])


def main() -> int:
    dsn, bootstrap, topic, prefix = sys.argv[1:5]
    lease_s, point = float(sys.argv[5]), sys.argv[6]
    first, count = int(sys.argv[7]), int(sys.argv[8])
    pool = DualWriterPool(lambda: Freezing.connect(dsn), {"bootstrap.servers": bootstrap, "transactional.id": prefix},
                          size=1, lease_s=lease_s)
    for order in range(first, first + count):
        try:
            with pool.transaction() as tx:
                tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order, 1))
                tx.produce(topic, value=b'{"id": %d}' % order, key=str(order).encode())
                if order == first:
                    HELD[:] = pool.transactional_ids
                    if point == "lock":
                        # records are sent when a later one finds them lingering: the order's record reaches the
                        # broker, and the transaction is open on its partition when the process freezes
                        time.sleep(0.1)
                        tx.produce(f"{topic}-aux", value=b"filler")
                        time.sleep(1.0)  # the send round, on the transport's thread
                        freeze(HELD[0])
                    else:
                        tx.connection.armed = point
            print(f"order {order} ok", flush=True)
        except Exception as exc:
            print(f"order {order} {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
