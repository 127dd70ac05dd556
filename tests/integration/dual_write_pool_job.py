"""The order service of dual_write_job.py served by a DualWriterPool: THREADS threads write orders at once, thread
``t`` the orders ``first + t, first + t + THREADS, ...`` below ``first + count``, and the process SIGKILLs itself at
order ``kill_at`` in failure mode MODE (a, b, c, d as in dual_write_job.py) while the other threads are wherever they
are in their own transactions.

    python dual_write_pool_job.py DB BOOTSTRAP TOPIC PREFIX THREADS FIRST COUNT KILL_AT MODE

The pool leases ids PREFIX-<n>; a live pool settles what the killed process left once its leases run out."""

from __future__ import annotations

import sys
import threading

from dual_write_job import connect, die  # beside this file (run as a script)

from kafka2pc.dualwrite import DualWriterPool


def main() -> int:
    db, bootstrap, topic, prefix = sys.argv[1:5]
    threads, first, count, kill_at = map(int, sys.argv[5:9])
    mode = sys.argv[9]
    pool = DualWriterPool(lambda: connect(db), {"bootstrap.servers": bootstrap, "transactional.id": prefix},
                          size=threads, min_size=threads, lease_s=2.0)  # short leases: the test waits them out
    insert = "INSERT INTO orders (id, amount) VALUES (?, ?)" if db.startswith("sqlite:") else \
        "INSERT INTO orders (id, amount) VALUES (%s, %s)"

    def write(offset: int) -> None:
        for order in range(first + offset, first + count, threads):
            with pool.transaction() as tx:
                tx.cursor.execute(insert, (order, order % 100))
                tx.produce(topic, value=b'{"id": %d}' % order, key=str(order).encode())
                if order == kill_at:
                    if mode == "a":
                        die()
                    tx.connection.arm = mode if mode in ("b", "c") else None
            if order == kill_at and mode == "d":
                die()

    workers = [threading.Thread(target=write, args=(offset,)) for offset in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
