"""Zombies: a fleet process frozen (SIGSTOP) at an exact point of a dual-write transaction for longer than its
lease, on PostgreSQL and a real broker, while a live pool of the fleet (same prefix, in this process) runs. The
test makes no recovery call: the live pool's keeper settles the frozen process's id, read_committed consumers are
unpinned while it is still frozen, and once it goes on (SIGCONT) it commits nothing of that transaction on either
side, serves its next orders under a fresh lease, and the database equals the topic.

    lock:      frozen inside the block (row lock held): PostgreSQL ends its session after a lease idle in the
               transaction, the live pool claims the expired lease and aborts the open Kafka transaction
    prepared:  frozen after Kafka's prepare, before the database commit: the same, a prepared transaction aborted
    committed: frozen after the database commit, before Kafka's completion: the live pool claims the expired lease
               and commits the prepared transaction (the database decided it)

SQLite is not here: a process frozen inside its transaction holds SQLite's database write lock, and no other
process can write until it goes on or dies (docs/fleet.md)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from kafka2pc.dualwrite import DualWriterPool
from kafka2pc.testing.verify import create_topic

from .test_dual_write import create_orders, kafka_keys, open_transaction_count, schema_database

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
JOB = Path(__file__).with_name("zombie_job.py")
LEASE_S = 3.0
#: how long after the freeze the frozen process's transaction may still hold back read_committed consumers: a lease
#: for the session to end (or the lease to run out), a keeper tick, a recovery
UNPIN_WITHIN_S = LEASE_S + 10.0


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "T"


@pytest.mark.parametrize("point", ["lock", "prepared", "committed"])
def test_a_frozen_process_is_settled_by_the_live_fleet_and_commits_nothing_after(postgres_dsn, kafka, topic_factory,
                                                                                point):
    db, _ = schema_database(postgres_dsn)
    create_orders(db)
    bootstrap, topic, prefix = kafka.bootstrap_servers, topic_factory(kafka, partitions=2), f"z-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.client_config, f"{topic}-aux")
    config = {"bootstrap.servers": bootstrap, "transactional.id": prefix}
    live = DualWriterPool(db.connect, config, size=1, min_size=0, lease_s=LEASE_S)  # claims nothing until needed
    zombie = subprocess.Popen([sys.executable, str(JOB), db.url, bootstrap, topic, prefix, str(LEASE_S), point, "1",
                               "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = zombie.stdout.readline()
        assert line.startswith("paused "), line + zombie.stderr.read()[-3000:]
        frozen_at, held = time.monotonic(), line.split()[1]
        deadline = frozen_at + 5
        while not stopped(zombie.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stopped(zombie.pid)
        assert open_transaction_count(bootstrap, held) == 1
        while open_transaction_count(bootstrap, held) and time.monotonic() - frozen_at < UNPIN_WITHIN_S + 20:
            time.sleep(0.2)
        unpinned_s = time.monotonic() - frozen_at
        assert stopped(zombie.pid), "the process went on by itself"
        decided = point == "committed"
        print(f"\n{point}: frozen process's {held} unpinned {unpinned_s:.1f} s after it froze (lease {LEASE_S:g} s); "
              f"DB {db.ids()}, Kafka {kafka_keys(bootstrap, topic)}")
        assert unpinned_s <= UNPIN_WITHIN_S, f"{held} still pinned {unpinned_s:.1f} s after the freeze"
        assert db.ids() == kafka_keys(bootstrap, topic) == ([1] if decided else [])
        zombie.send_signal(18)  # SIGCONT
        out, err = zombie.communicate(timeout=90)
    finally:
        if zombie.poll() is None:
            zombie.kill()
        live.close()
    results = dict(line.split(" ", 2)[1:3] for line in out.splitlines() if line.startswith("order "))
    print(f"after SIGCONT: {results}")
    assert zombie.returncode == 0, err[-3000:]
    assert all(results[str(order)] == "ok" for order in (2, 3, 4)), results  # a fresh lease serves them
    if not decided:
        assert results["1"] != "ok", results  # its transaction was ended for it: never committed on either side
    ids, keys = db.ids(), kafka_keys(bootstrap, topic)
    assert ids == keys == ([1, 2, 3, 4] if decided else [2, 3, 4]), (ids, keys)
    with psycopg.connect(db.url) as connection:
        fleet = [row[0] for row in connection.execute("SELECT transactional_id FROM kafka2pc_dual_write_state")]
    assert all(open_transaction_count(bootstrap, transactional_id) == 0 for transactional_id in fleet)
