"""The leased DualWriterPool against the coordinator model and SQLite files, from an adversarial review: the rows of
an earlier release (or a fixed-prefix pool) are adopted as expired leases and settled by a live fleet, growth goes
past a stray row named like the next id, and the keeper benches an id that needs an operator. Each docstring says
what the review found on the first leasing version."""

from __future__ import annotations

import sqlite3
import time

import pytest

from kafka2pc.dualwrite import DualWriteIncompleteError, DualWriter

from .test_dual_write import connect, db_ids
from .test_dual_write_pool import Cluster, order, pconnect


def test_an_adopted_id_left_decided_by_a_dead_old_release_process_is_settled_by_a_live_fleet(tmp_path):
    """Finding: adopt() makes the rows of an earlier release (or a fixed-prefix pool) members of the fleet as FREE
    ids (lease_expires NULL). The keeper reaps only EXPIRED leases, so such a row is settled only if demand ever
    claims it, lowest index first. An old-release pool of 4 writers (shop-0..3) is killed while shop-3's last
    transaction is decided in the database but not completed in Kafka; the new fleet needs 1 id: it takes shop-0,
    and shop-3's decided transaction stays prepared for good (read_committed consumers pinned), nor does
    `kafka2pc fleet --settle` touch it (it settles expired leases only; the row shows as 'free')."""
    cluster, path = Cluster(), tmp_path / "a.db"
    old = [DualWriter(connect(path), {**cluster.config, "transactional.id": f"shop-{n}"}, transport=cluster.transport)
           for n in range(4)]
    for n, writer in enumerate(old):
        writer.recover()
        with writer.transaction() as tx:
            tx.cursor.execute("INSERT INTO orders VALUES (?)", (n,))
            tx.produce("t", value=str(n).encode(), key=str(n).encode(), partition=0)
    with pytest.raises(DualWriteIncompleteError), old[3].transaction() as tx:  # decided; EndTxn never arrives
        tx.cursor.execute("INSERT INTO orders VALUES (99)")
        tx.produce("t", value=b"99", key=b"99", partition=0)
        cluster.transport.faults.dropped_requests.extend([True] * 5)
    cluster.transport.faults.dropped_requests.clear()
    for writer in old:  # the old process dies (SIGKILL: nothing settled)
        writer.connection.close()
    assert len(cluster.model.open_transactions()) == 1
    pool = cluster.pool(lambda: pconnect(path), size=1, lease_s=1)
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and cluster.model.open_transactions():
            pool._keeper.tick()
            time.sleep(0.25)
        rows = {row.transactional_id: row.status for row in pool._keeper._leases.rows()}
        print(f"\nfleet ids {pool.transactional_ids}; rows {rows}; open {cluster.model.open_transactions()}")
        assert cluster.model.open_transactions() == [], "the adopted id's decided transaction is never settled"
    finally:
        pool.close()


def test_the_documented_shrink_procedure_settles_every_id_of_a_removed_prefix(tmp_path):
    """Finding: docs/dual-write.md still says 'When a service shrinks, start a pool once with each removed prefix
    (DualWriterPool(...).close()) to settle what those processes left'. Before leases a pool's start recovered all
    `size` ids; now it claims min_size (1) and adopts the rest as free rows nobody reaps: the procedure settles
    <prefix>-0 only."""
    cluster, path = Cluster(), tmp_path / "a.db"
    old = [DualWriter(connect(path), {**cluster.config, "transactional.id": f"shop-{n}"}, transport=cluster.transport)
           for n in range(4)]
    for writer in old:
        writer.recover()
    with pytest.raises(DualWriteIncompleteError), old[2].transaction() as tx:  # decided; EndTxn never arrives
        tx.cursor.execute("INSERT INTO orders VALUES (2)")
        tx.produce("t", value=b"2", key=b"2", partition=0)
        cluster.transport.faults.dropped_requests.extend([True] * 5)
    cluster.transport.faults.dropped_requests.clear()
    for writer in old:
        writer.connection.close()
    pool = cluster.pool(lambda: pconnect(path), size=4)  # the documented procedure: adopt, settle, close
    pool.settle_expired()
    pool.close()
    print(f"\nopen after the procedure: {cluster.model.open_transactions()}")
    assert cluster.model.open_transactions() == []
    assert db_ids(path) == cluster.kafka_ids() == [2]


def test_a_row_named_like_the_next_id_outside_the_fleet_does_not_stop_the_fleet_growing(tmp_path):
    """Finding: LeaseTable._insert_new inserts '<prefix>-<max fleet_index + 1>' ON CONFLICT DO NOTHING and, on a
    conflict, reads the highest fleet_index again. A row of that name that is not a fleet member (fleet IS NULL:
    made after the pool's start-up adoption by a writer of the old release, an operator's DualWriter(...).resolve()
    or recover on that id) conflicts every time: 64 attempts, then PoolTimeoutError, on every claim of a new id
    until some process restarts and adopts it; a pool that starts then fails to start."""
    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path), size=3, min_size=1, acquire_timeout_s=2)
    assert pool.transactional_ids == ["shop-0"]
    stray = DualWriter(pconnect(path), {**cluster.config, "transactional.id": "shop-1"}, transport=cluster.transport)
    stray.recover()  # e.g. an old-release writer, or an operator's recover on the id: its row, outside the fleet
    stray.close()
    busy = pool._set.lend()  # the pool's writer is lent to another request: the next one needs a new id
    try:
        order(pool, 1)
    finally:
        pool._set.release(busy)
        pool.close()
    assert db_ids(path) == [1]


def test_the_keepers_settle_benches_an_id_that_needs_an_operator(tmp_path, caplog):
    """Finding (low): the keeper's _settle catches DualWriteRecoveryError with every other error, logs it at
    DEBUG and gives the writer back; it keeps renewing the lease, the id is not benched nor marked in its row, and
    nothing at WARNING or ERROR says an id needs an operator until a request borrows the writer."""
    import logging  # noqa: PLC0415

    cluster, path = Cluster(), tmp_path / "a.db"
    pool = cluster.pool(lambda: pconnect(path), size=1)
    pool._keeper.halt()
    with pytest.raises(DualWriteIncompleteError), pool.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (1)")
        tx.produce("t", value=b"1", key=b"1", partition=0)
        cluster.transport.faults.dropped_requests.extend([True] * 5)
    cluster.transport.faults.dropped_requests.clear()
    del cluster.model.ids["shop-0"]  # the coordinator forgot the id: recovery cannot confirm order 1
    caplog.set_level(logging.DEBUG)
    pool._keeper.tick()
    try:
        with sqlite3.connect(path) as db:
            problem = db.execute("SELECT problem FROM kafka2pc_dual_write_state WHERE transactional_id = 'shop-0'"
                                 ).fetchone()[0]
        loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "shop-0" in r.getMessage()]
        print(f"\nbenched {list(pool.benched)}; problem in the row: {problem!r}; warnings: {loud}")
        assert list(pool.benched) == ["shop-0"] and problem
    finally:
        pool.close()
