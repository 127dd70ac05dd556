"""The kafka2pc sink on a Spark standalone cluster (Master + 2 Workers on loopback): speculation on, with a forced
straggler in every batch, and an executor (its JVM and its Python workers) SIGKILLed mid-batch. What a read_committed
consumer sees afterwards must be every input record exactly once, with no transaction left open under the prefix."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from kafka2pc.spark.state import SinkStore
from kafka2pc_harness.spark import run_driver
from kafka2pc_harness.spark_cluster import StandaloneSparkCluster, alive

from .spark_straggler_job import STRAGGLE_S
from .spark_support import audit, open_transactions, produce_orders, sink_prefix, wait_for

pytestmark = pytest.mark.integration
JOB = Path(__file__).with_name("spark_straggler_job.py")
ORDERS = 2400  # 6 batches of 400 (maxOffsetsPerTrigger): the kill is after the first, each batch straggles 4 s


@pytest.mark.timeout(600)
def test_executor_killed_mid_batch_with_speculative_stragglers(
        spark_standalone: StandaloneSparkCluster, kafka, topic_factory, tmp_path):
    cluster, bootstrap = spark_standalone, kafka.bootstrap_servers
    source, sink = topic_factory(kafka, partitions=4), topic_factory(kafka, partitions=3)
    checkpoint, markers = tmp_path / "checkpoint", tmp_path / "markers"
    markers.mkdir()
    produce_orders(bootstrap, source, 0, ORDERS)
    driver = run_driver(JOB, [cluster.master_url, json.dumps(cluster.driver_conf()), bootstrap, source, sink,
                              str(checkpoint), str(markers)], log_dir=tmp_path / "driver")
    try:
        app_id = driver.wait_for_line(r"app_id=(\S+)", 90)[1]
        driver.wait_for_line(r"^batch [1-9]\d*:", 240)  # batches flow, each with a straggler
        sleeping: list[int] = []

        def straggler_sleeps() -> bool:
            fresh = time.time() - STRAGGLE_S + 1.0
            sleeping[:] = [int(m.name) for m in markers.iterdir() if m.stat().st_mtime > fresh and alive(int(m.name))]
            return bool(sleeping)

        wait_for("a straggler holding an open transaction", straggler_sleeps, 60)
        executors = [e for e in cluster.executor_pids(app_id) if sleeping[0] in cluster.python_worker_pids(e)]
        assert len(executors) == 1, (sleeping, cluster.executor_pids(app_id))
        victim = executors[0]
        killed = cluster.kill_executor(victim)
        assert victim in killed and not [p for p in killed if alive(p)]
        print(f"\nkilled executor {victim} (running the straggler {sleeping[0]}) and its Python workers: {killed}")
        assert driver.wait(timeout_s=420) == 0, driver.output_tail()
    finally:
        if driver.returncode is None:
            driver.kill_group()

    prefix = sink_prefix(checkpoint)
    decisions = SinkStore(str(checkpoint)).decision_log(prefix)
    committed_attempts = [tuple(a) for c in range(decisions.last_checkpoint() + 1)
                          if (d := decisions.decision(c)) is not None for a in d.metadata["attempts"]]
    # partition 0's first attempt always straggles: what committed it was a speculative copy or a retry
    later_attempts = sorted((partition, attempt) for partition, attempt, _ in committed_attempts if attempt > 0)
    report = audit(bootstrap, sink, ORDERS)
    print(f"{decisions.last_checkpoint() + 1} batches; committed (partition, attempt > 0): {later_attempts}; audit: "
          f"{report['records']} records, {report['duplicates']} duplicates, {report['gaps']} gaps")
    assert (0, 1) in later_attempts or (0, 2) in later_attempts
    assert (report["records"], report["duplicates"], report["gaps"], report["outside_range"]) == (ORDERS, 0, 0, 0)
    assert report["lso_pinned"] == [] and report["clean"]
    assert open_transactions(bootstrap, prefix) == []
