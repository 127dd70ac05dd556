"""The fleet's gauges under prometheus_client's multiprocess mode (gunicorn, Celery): a dead worker's last value is
not reported, so an alert on the oldest expired lease or open transaction does not fire forever after it died."""

from __future__ import annotations

import os
import subprocess
import sys

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

WORKER = """
from kafka2pc import metrics
for gauge in (metrics.DUAL_WRITE_LEASED_IDS, metrics.DUAL_WRITE_EXPIRED_LEASES,
              metrics.DUAL_WRITE_OLDEST_EXPIRED_LEASE, metrics.DUAL_WRITE_OLDEST_OPEN_TRANSACTION):
    gauge.labels(prefix="orders").set(42)
import os; print(os.getpid())
"""


def test_a_dead_workers_gauges_are_not_reported(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    worker = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, check=True,
                            timeout=60)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))

    def fleet_samples() -> dict[str, float]:
        return {sample.name: sample.value for family in registry.collect() for sample in family.samples
                if sample.name.startswith("kafka2pc_dual_write_")}

    assert set(fleet_samples()) == {"kafka2pc_dual_write_leased_ids", "kafka2pc_dual_write_expired_leases",
                                    "kafka2pc_dual_write_oldest_expired_lease_seconds",
                                    "kafka2pc_dual_write_oldest_open_transaction_seconds"}
    mark_process_dead(int(worker.stdout.strip()), path=str(tmp_path))  # gunicorn's child_exit hook does this
    assert fleet_samples() == {}
