"""One process of an order-service fleet for the fleet kill test (test_dual_write_fleet.py, issue 29): every process
is started with the SAME configuration ``{"bootstrap.servers": ..., "transactional.id": PREFIX, "linger.ms": 0}`` and
writes through a DualWriterPool of SIZE writers with THREADS threads, orders ``base``, ``base + 1``, ... (the test
gives every launch its own base, so order ids are unique across the fleet).

    python fleet_job.py DB BOOTSTRAP TOPIC PREFIX BASE OUT LEASE_S THREADS SIZE WORK_S PAUSE_S

Each request holds its transaction open for WORK_S after its INSERT and its record (the rest of a request's work),
then the thread waits PAUSE_S before the next one.

DB is ``sqlite:PATH`` or a libpq connection string. OUT is this process's record, one line per event, flushed as it
is written (a SIGKILL loses nothing written before it):

    start <host:pid> <path>     the process began (before the pool is made), with kafka2pc from <path>
    ready <monotonic>           the pool is made
    startfail <class> <msg>     making the pool raised (the process exits 3)
    ok <order>                  the ``with pool.transaction()`` block exited without an error: acknowledged
    decided <order>             DualWriteIncompleteError: the database committed (Kafka is completed by a recovery)
    fail <order> <class>        any other error of the request (its order id is not reused)
    closed                      SIGTERM: the threads stopped and pool.close() returned

kafka2pc's log goes to stderr (level KAFKA2PC_FLEET_LOG, default WARNING); SIGUSR1 dumps every thread's stack there.

SIGTERM stops it gracefully: the threads finish their request in progress, then ``pool.close()``. The pool gets only
the keyword arguments its DualWriterPool accepts (``inspect.signature``), so the job also runs against a release
without leases (whose pool has no ``min_size``/``lease_s``)."""

from __future__ import annotations

import faulthandler
import inspect
import itertools
import logging
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
from typing import Any

import kafka2pc
from kafka2pc.dualwrite import DualWriterPool
from kafka2pc.errors import DualWriteIncompleteError


def connect(db: str) -> Any:
    if db.startswith("sqlite:"):
        # a pool's connections are used by its threads and its lease keeper
        return sqlite3.connect(db.removeprefix("sqlite:"), timeout=30, check_same_thread=False)
    import psycopg  # noqa: PLC0415

    return psycopg.connect(db)


def pool_kwargs(**wanted: Any) -> dict[str, Any]:
    """The keyword arguments of ``wanted`` this DualWriterPool accepts."""
    accepted = inspect.signature(DualWriterPool.__init__).parameters
    return {name: value for name, value in wanted.items() if name in accepted}


class Record:
    """OUT, appended line by line from several threads, each line flushed to the OS at once."""

    def __init__(self, path: str):
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def main() -> int:
    db, bootstrap, topic, prefix, base_text, out = sys.argv[1:7]
    lease_s, threads, size = float(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
    work_s, pause_s = float(sys.argv[10]), float(sys.argv[11])
    base = int(base_text)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka2pc").setLevel(os.environ.get("KAFKA2PC_FLEET_LOG", "WARNING"))
    record = Record(out)
    record.write(f"start {socket.gethostname()}:{os.getpid()} {kafka2pc.__file__}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # the same for every process; linger.ms 0 sends a record when it is produced, so a request's Kafka transaction is
    # open (holding back read_committed consumers) for the rest of the request, not only from its prepare on
    config = {"bootstrap.servers": bootstrap, "transactional.id": prefix, "linger.ms": 0}
    try:
        pool = DualWriterPool(lambda: connect(db), config,
                              **pool_kwargs(size=size, min_size=size, lease_s=lease_s, idle_s=60.0))
    except Exception as exc:
        record.write(f"startfail {type(exc).__name__} {str(exc)[:300]!r}")
        return 3
    record.write(f"ready {time.monotonic():.3f}")
    insert = "INSERT INTO orders (id, amount) VALUES (?, ?)" if db.startswith("sqlite:") else \
        "INSERT INTO orders (id, amount) VALUES (%s, %s)"
    numbers = itertools.count(base)
    numbers_lock = threading.Lock()

    def serve() -> None:
        while not stop.is_set():
            with numbers_lock:
                order = next(numbers)
            try:
                with pool.transaction() as tx:
                    tx.cursor.execute(insert, (order, order % 100))
                    tx.produce(topic, value=b'{"id": %d}' % order, key=str(order).encode())
                    time.sleep(work_s)
            except DualWriteIncompleteError:
                record.write(f"decided {order}")
            except Exception as exc:
                record.write(f"fail {order} {type(exc).__name__}")
                stop.wait(0.05)  # a fleet whose writers all fail must not spin
            else:
                record.write(f"ok {order}")
            stop.wait(pause_s)

    workers = [threading.Thread(target=serve, name=f"request-{n}", daemon=True) for n in range(threads)]
    for worker in workers:
        worker.start()
    while not stop.wait(0.2):
        pass
    for worker in workers:
        worker.join(timeout=60)
    pool.close()
    record.write("closed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
