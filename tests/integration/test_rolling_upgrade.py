"""Issue 32, part 2 on the 3-node KRaft cluster (``make chaos``, KAFKA2PC_ROLLING_UPGRADE=1): a cluster on 3.9.2 (no
KIP-939: the sink falls back to pooled ids and LISTING, the dual writers to timeout-bound transactions) is upgraded
in place to 4.4.0, one node at a time; then ``transaction.two.phase.commit.enable`` is turned on, one node at a time;
then metadata.version and ``transaction.version`` are raised (kafka-features' UpdateFeatures). Each node waits for
the one before to be back in every in-sync replica set (RF 3, min.insync.replicas 2). All the while:

- the Spark streaming job (examples/spark_job.py: Kafka source -> kafka2pc), fed orders without a pause;
- a DualWriterPool under load (THREADS threads on PostgreSQL, each order a row and a record in every partition).

DescribeTransactions of both prefixes' open transactions (TransactionTimeoutMs 2147483647: two-phase) shows when each
switched; no job or pool is restarted. At the end: the sink topic holds every fed order once, the pool's database ids
are the keys in every partition, the pool's application saw only RetriableError, and nothing is open or pinned. The
default suite has the short versions: one node upgraded in place and 2PC turned on and off
(test_broker_gains_2pc.py), transaction.version raised (test_transaction_version_upgrade.py)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient

from kafka2pc.dualwrite import DualWriterPool
from kafka2pc.testing.settings import BrokerSettings
from kafka2pc.testing.verify import create_topic, read_records
from tests.integration.test_broker_gains_2pc import FALLBACK_TIMEOUT_MS, TWO_PHASE_TIMEOUT_MS, TransactionWatch
from tests.integration.test_dual_write import create_orders, schema_database
from tests.integration.test_rolling_restart import (
    PARTITIONS,
    TRANSACTION_STATE,
    PoolLoad,
    elect_preferred_leaders,
    open_under,
    wait_in_sync,
)
from tests.integration.test_soak import Feeder
from tests.integration.test_transaction_version_upgrade import _set_transaction_version

ROLLING_UPGRADE = os.environ.get("KAFKA2PC_ROLLING_UPGRADE", "") not in ("", "0")
pytestmark = [pytest.mark.integration, pytest.mark.cluster,
              pytest.mark.skipif(not ROLLING_UPGRADE, reason="make chaos (KAFKA2PC_ROLLING_UPGRADE=1)")]
SPARK_JOB = Path(__file__).resolve().parents[2] / "examples" / "spark_job.py"
SWITCH_WITHIN_S = 60.0  # the bound: two-phase transactions within a minute of 2PC turned on
WATCH_AFTER_S = 90.0
AFTER_FEATURES_S = 30.0


class IdsUnder:
    """The pool's ids, ``<prefix>-<n>`` (TransactionWatch's grammar)."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def owns(self, transactional_id: str) -> bool:
        return transactional_id.startswith(f"{self.prefix}-")


def roll(kafka: Any, settings: BrokerSettings, topics: list[str]) -> list[str]:
    """Every node in turn restarted with ``settings`` on its own log directory; the next once it is back in every
    ISR and leading its preferred partitions."""
    lines = []
    for node in kafka.node_ids:
        began = time.monotonic()
        kafka.restart_with(settings, [node])
        wait_in_sync(kafka, [*topics, TRANSACTION_STATE], within_s=180)
        elect_preferred_leaders(kafka, [*topics, TRANSACTION_STATE])
        lines.append(f"node {node} -> {settings.version}, 2PC {'on' if settings.two_phase_commit else 'off'}: "
                     f"{time.monotonic() - began:.1f} s until back in every ISR")
    return lines


def switch(watch: TransactionWatch, began: float, enabled: float) -> tuple[set[int], int, float | None, set[int]]:
    """(timeouts before the upgrade began, transactions begun after 2PC was on everywhere, seconds from then to the
    first two-phase one, timeouts of those begun more than SWITCH_WITHIN_S after)."""
    seen = sorted(watch.seen.values())
    before = {timeout for started, _, timeout in seen if started < began}
    after = [(started - enabled, timeout) for started, _, timeout in seen if started > enabled]
    first = min((delay for delay, timeout in after if timeout == TWO_PHASE_TIMEOUT_MS), default=None)
    late = {timeout for delay, timeout in after if delay > SWITCH_WITHIN_S}
    return before, len(after), first, late


class UpgradeRun:
    """The Spark job, the pool and the watches on ``kafka`` (3.9.2 at first) through the upgrade's steps."""

    def __init__(self, kafka: Any, db: Any, tmp_path: Path):
        from .spark_support import sink_prefix  # noqa: PLC0415

        self.kafka, self.db, self.tmp_path = kafka, db, tmp_path
        bootstrap = kafka.bootstrap_servers
        self.topics = [create_topic(kafka, partitions=PARTITIONS, replication_factor=3) for _ in range(3)]
        source, sink, orders = self.topics
        self.checkpoint = tmp_path / "checkpoint"
        self.pool_prefix = f"upg{uuid.uuid4().hex[:6]}"
        self.pool = DualWriterPool(db.connect, {"bootstrap.servers": bootstrap, "transactional.id": self.pool_prefix,
                                                "linger.ms": 0}, size=3, min_size=3)
        self.load = PoolLoad(self.pool, orders, db.sql("INSERT INTO orders (id, amount) VALUES (?, ?)"))
        self.feeder = Feeder(bootstrap, source)
        self.job_args = ["--bootstrap", bootstrap, "--source", source, "--sink", sink, "--checkpoint",
                         str(self.checkpoint), "--batch-size", "200", "--trigger-seconds", "0.5"]

        def spark_prefix() -> str | None:
            try:
                return sink_prefix(self.checkpoint)
            except AssertionError:  # not pinned yet
                return None

        self.watches = {"Spark sink": TransactionWatch(kafka, spark_prefix),
                        "DualWriterPool": TransactionWatch(kafka, lambda: self.pool_prefix, IdsUnder)}
        self.lines: list[str] = []
        self.driver: Any = None
        self.alive = False
        self.began = self.enabled = 0.0

    def run(self) -> None:
        from kafka2pc_harness.spark import run_driver  # noqa: PLC0415

        try:
            self.feeder.thread.start()
            self.driver = run_driver(SPARK_JOB, self.job_args, log_dir=self.tmp_path / "run")
            self.driver.wait_for_line(r"^batch \d+:", timeout_s=240)
            self.load.start()
            for watch in self.watches.values():
                watch.thread.start()
            time.sleep(15)
            self.began = time.time()
            self.lines += roll(self.kafka, BrokerSettings(version="4.4.0", two_phase_commit=False), self.topics)
            time.sleep(15)
            self.lines += roll(self.kafka, BrokerSettings(version="4.4.0", two_phase_commit=True), self.topics)
            self.enabled = time.time()
            time.sleep(WATCH_AFTER_S)
            self._raise_features()
            time.sleep(AFTER_FEATURES_S)
            self.alive = self.driver.returncode is None
        finally:
            self.feeder.finish()
            self.load.finish()
            self.pool.close()
            for watch in self.watches.values():
                watch.stop.set()
                watch.thread.join(timeout=30)

    def _raise_features(self) -> None:
        with contextlib.closing(KafkaAdminClient(bootstrap_servers=self.kafka.bootstrap_servers)) as admin:
            newest = admin.describe_features()["metadata.version"]["supported"][1]
            assert admin.update_features({"metadata.version": newest}) == {"metadata.version": "OK"}
            _set_transaction_version(admin, 2)
        self.lines.append(f"metadata.version {newest} and transaction.version 2 finalized "
                          f"{time.time() - self.enabled:.0f} s after 2PC was on everywhere")

    def settle(self) -> dict[str, Any]:
        """The Spark job caught up (restarted from its checkpoint if it died: the report says so); its audit."""
        from kafka2pc_harness.spark import run_driver  # noqa: PLC0415

        from .spark_support import audit  # noqa: PLC0415

        bootstrap, sink, fed = self.kafka.bootstrap_servers, self.topics[1], self.feeder.sent
        deadline = time.monotonic() + 300
        while self.alive and audit(bootstrap, sink, fed)["records"] < fed and time.monotonic() < deadline:  # bounded
            time.sleep(5)
        if self.driver is not None:
            self.driver.kill_group()  # caught up and idle by now: nothing of it is open
        if not self.alive:
            final = run_driver(SPARK_JOB, [*self.job_args, "--until-caught-up"], log_dir=self.tmp_path / "final")
            assert final.wait(timeout_s=600) == 0, final.output_tail()
        return audit(bootstrap, sink, fed)


@pytest.mark.timeout(1800)
def test_a_rolling_upgrade_from_3_9_to_two_phase_commit_under_the_spark_job_and_a_pool(
        kafka_factory, postgres_dsn, tmp_path, record_property):
    pytest.importorskip("pyspark")
    from .spark_support import open_transactions, sink_prefix  # noqa: PLC0415

    kafka = kafka_factory(BrokerSettings(version="3.9.2"), nodes=3)
    if not hasattr(kafka, "restart_with"):
        pytest.skip(f"restarting nodes on another release needs the local backend, not {kafka.backend}")
    db, _ = schema_database(postgres_dsn)
    create_orders(db)
    run = UpgradeRun(kafka, db, tmp_path)
    run.run()
    report = run.settle()
    lines, fed, bootstrap = run.lines, run.feeder.sent, kafka.bootstrap_servers
    for name, watch in run.watches.items():
        before, after, first, late = switch(watch, run.began, run.enabled)
        lines.append(f"{name}: before the upgrade TransactionTimeoutMs {sorted(before)}; {after} transactions begun "
                     f"after 2PC was on everywhere, the first two-phase one "
                     f"{'never' if first is None else f'{first:.1f} s'} after; those begun more than "
                     f"{SWITCH_WITHIN_S:g} s after: {sorted(late)}")
    spark_left = open_transactions(bootstrap, sink_prefix(run.checkpoint))
    pool_left = open_under(kafka, run.pool_prefix)
    db_ids = db.ids()
    records = read_records(kafka, run.topics[2], timeout_s=120)
    keys = {p: [int(r.key) for r in records if r.partition == p] for p in range(PARTITIONS)}
    lines += [f"Spark streaming job: {'ALIVE through every step' if run.alive else 'FAILED, restarted'}; fed {fed}, "
              f"sink {report['records']} records, {report['duplicates']} duplicates, {report['gaps']} gaps, pinned "
              f"{report['lso_pinned']}, open {spark_left}",
              f"DualWriterPool: {len(run.load.commits)} committed, failures "
              f"{dict(Counter(f.error for f in run.load.failures)) or 'none'}; DB {len(db_ids)} rows, keys per "
              f"partition {[len(k) for k in keys.values()]}, open {pool_left}"]
    print("\n" + "\n".join(lines))
    record_property("ci_summary", "\n".join(lines))
    assert run.alive, run.driver.output_tail(200)
    assert (report["records"], report["duplicates"], report["gaps"], report["outside_range"]) == (fed, 0, 0, 0)
    assert report["lso_pinned"] == [] and spark_left == [] and pool_left == []
    assert all(f.retriable for f in run.load.failures), run.load.failures[:5]
    for partition_keys in keys.values():
        assert sorted(partition_keys) == db_ids
    for name, watch in run.watches.items():
        before, _, first, late = switch(watch, run.began, run.enabled)
        assert TWO_PHASE_TIMEOUT_MS not in before, f"{name}: two-phase on 3.9.2"
        assert first is not None and first < SWITCH_WITHIN_S, f"{name}: no two-phase transaction within a minute"
        assert late == {TWO_PHASE_TIMEOUT_MS}, f"{name}: {late}"
    assert FALLBACK_TIMEOUT_MS in switch(run.watches["Spark sink"], run.began, run.enabled)[0]
