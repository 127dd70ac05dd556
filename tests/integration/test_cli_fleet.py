"""``kafka2pc fleet`` against a real broker and a SQLite state table: it shows each leased id's holder, heartbeat
and last transaction, Kafka's view with --bootstrap, and --settle settles an expired lease a dead process left
(its transaction committed in Kafka because the database committed it)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import uuid

import pytest

from kafka2pc.dualwrite import DualWriteIncompleteError, DualWriterPool

from .test_dual_write import kafka_keys

pytestmark = pytest.mark.integration


def fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafka2pc.cli", "fleet", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_fleet_view_and_settling_a_dead_processes_lease(kafka, topic_factory, tmp_path):
    bootstrap, topic, prefix = kafka.bootstrap_servers, topic_factory(kafka), f"cli-{uuid.uuid4().hex[:6]}"
    path = tmp_path / "app.db"

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, timeout=30, check_same_thread=False)
        connection.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        connection.commit()
        return connection

    pool = DualWriterPool(connect, {"bootstrap.servers": bootstrap, "transactional.id": prefix}, size=2, min_size=2)
    with pool.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (1)")
        tx.produce(topic, value=b"1", key=b"1")
    # order 2: the database commits, Kafka's completion is lost, and the process dies (its keeper with it)
    pool._keeper.stop()
    dead = pool.transactional_ids[-1]
    writer = pool._set.writers[dead]
    writer._protocol.producer.complete_transaction = lambda *_: (_ for _ in ()).throw(RuntimeError("process died"))
    with pytest.raises(DualWriteIncompleteError), writer.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (2)")
        tx.produce(topic, value=b"2", key=b"2")
    shown = fleet("--db", f"sqlite:{path}", "--prefix", prefix, "--bootstrap", bootstrap, "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {row["transactional_id"]: row for row in json.loads(shown.stdout)}
    print(f"\n{fleet('--db', f'sqlite:{path}', '--prefix', prefix, '--bootstrap', bootstrap).stdout}")
    assert sorted(rows) == pool.transactional_ids
    assert all(row["status"] == "leased" and row["holder"] == f"{socket.gethostname()}:{os.getpid()}"
               for row in rows.values())
    assert rows[dead]["last_transaction"].endswith("committed by the database")
    assert isinstance(rows[dead]["heartbeat_age_s"], float) and rows[dead]["problem"] is None
    assert rows[dead]["kafka"].startswith("Ongoing for ")
    assert kafka_keys(bootstrap, topic) == [1]  # order 2 is held back
    with sqlite3.connect(path) as db:  # the dead process's lease runs out
        db.execute("UPDATE kafka2pc_dual_write_state SET lease_expires = 1 WHERE transactional_id = ?", (dead,))
    refused = fleet("--db", f"sqlite:{path}", "--prefix", prefix, "--settle")
    assert refused.returncode == 1 and "--settle needs --bootstrap" in refused.stderr
    settled = fleet("--db", f"sqlite:{path}", "--prefix", prefix, "--bootstrap", bootstrap, "--settle")
    assert settled.returncode == 0, settled.stderr
    print(settled.stdout)
    assert "settled 1 expired lease(s)" in settled.stdout
    assert kafka_keys(bootstrap, topic) == [1, 2]
    after = {row["transactional_id"]: row for row in json.loads(
        fleet("--db", f"sqlite:{path}", "--prefix", prefix, "--json").stdout)}
    assert after[dead]["status"] == "free"


EXITS_WITHOUT_CLOSE = """
import sqlite3, sys
from kafka2pc.dualwrite import DualWriterPool
path, bootstrap, prefix = sys.argv[1:4]
pool = DualWriterPool(lambda: sqlite3.connect(path, timeout=30, check_same_thread=False),
                      {"bootstrap.servers": bootstrap, "transactional.id": prefix}, size=2, min_size=2)
print(",".join(pool.transactional_ids))
"""


def test_a_process_that_exits_without_closing_its_pool_gives_its_ids_back(kafka, tmp_path):
    """A gunicorn worker recycled by max_requests exits without the application closing its pool: the ids are
    free at once, not after a lease (the pool closes itself at the interpreter's exit)."""
    path, prefix = tmp_path / "app.db", f"exit-{uuid.uuid4().hex[:6]}"
    run = subprocess.run([sys.executable, "-c", EXITS_WITHOUT_CLOSE, str(path), kafka.bootstrap_servers, prefix],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == [f"{prefix}-0,{prefix}-1"]
    rows = json.loads(fleet("--db", f"sqlite:{path}", "--prefix", prefix, "--json").stdout)
    assert [row["status"] for row in rows] == ["free", "free"], rows
