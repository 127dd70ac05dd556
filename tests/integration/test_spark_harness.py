"""The Spark test harness itself: the Kafka connector's jars, a local session reading Kafka, a standalone cluster whose
executors are SIGKILLed mid-job, and drivers killed with their whole process group."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'kafka2pc[spark]'")

from confluent_kafka import Producer

from kafka2pc.testing import HarnessSetupError, KafkaService
from kafka2pc_harness.spark import _artifact, run_driver, spark_kafka_jars
from kafka2pc_harness.spark_cluster import (
    StandaloneSparkCluster,
    alive,
    proc_info,
    pyspark_home,
)

from .spark_support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# A driver for a standalone cluster: 4 partitions of a range, each task sleeping in a Python worker, so a test can
# kill an executor while its Python workers run.
STANDALONE_DRIVER = """
import json, sys, time
from kafka2pc_harness.spark import new_session

master, conf, sleep_s = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
spark = new_session(master, "harness-probe", conf=conf)
sc = spark.sparkContext
print(f"app_id={sc.applicationId}", flush=True)

def part(rows):
    time.sleep(sleep_s)
    yield sum(rows)

print(f"result={sc.parallelize(range(1000), 4).mapPartitions(part).sum()}", flush=True)
spark.stop()
"""

# A local-mode driver that keeps its Python workers (pyspark's daemon, in a process group of its own) alive.
LOCAL_DRIVER = """
import time
from kafka2pc_harness.spark import local_session

spark = local_session("harness-kill-group", cores=1)
print(f"sum={spark.sparkContext.parallelize(range(10), 1).map(lambda x: x).sum()}", flush=True)
print("ready", flush=True)
time.sleep(300)
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _is_pyspark_daemon(pid: int) -> bool:
    info = proc_info(pid)
    return info is not None and "pyspark.daemon" in info.cmdline


def _is_java(pid: int) -> bool:
    info = proc_info(pid)
    return info is not None and bool(info.cmdline) and Path(info.cmdline[0]).name == "java"


def test_connector_jars_resolve_without_duplicates() -> None:
    started = time.monotonic()
    jars = [Path(p) for p in spark_kafka_jars()]
    shipped = {_artifact(p.name) for p in (pyspark_home() / "jars").glob("*.jar")}

    artifacts = {_artifact(p.name) for p in jars}
    assert {"spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients",
            "commons-pool2"} <= artifacts
    assert not artifacts & shipped, f"jars pyspark ships itself: {artifacts & shipped}"
    assert all(p.is_file() for p in jars)
    warm_started = time.monotonic()
    assert [Path(p) for p in spark_kafka_jars()] == jars
    assert time.monotonic() - warm_started < 2.0, "a resolved connector comes from the cache"
    print(f"connector jars in {time.monotonic() - started:.1f} s: {[p.name for p in jars]}")


def test_unresolvable_connector_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HarnessSetupError, match=r"Maven could not resolve org.apache.spark:spark-sql-kafka"):
        spark_kafka_jars("0.0.1", cache_dir=tmp_path)
    assert not list(tmp_path.iterdir()), "no half-resolved folder is left"


def test_local_session_reads_kafka(spark_local, kafka: KafkaService, topic_factory) -> None:
    topic = topic_factory(kafka, partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(5):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0

    rows = (spark_local.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("subscribe", topic)
            .load()
            .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "partition")
            .collect())

    assert sorted((r.k, r.v, r.partition) for r in rows) == [(f"k{i}", f"v{i}", i % 2) for i in range(5)]
    # Python workers run this interpreter (the venv's), not whatever python3 is on PATH
    assert spark_local.sparkContext.parallelize([0], 1).map(lambda _: sys.executable).collect() == [sys.executable]


# the harness's own behaviour, not kafka2pc's: make chaos runs it (-m slow), out of the default suite's time budget
@pytest.mark.slow
def test_standalone_job_survives_executor_kill(spark_standalone: StandaloneSparkCluster, tmp_path: Path) -> None:
    cluster = spark_standalone
    script = _write(tmp_path, "standalone_driver.py", STANDALONE_DRIVER)
    driver = run_driver(script, [cluster.master_url, json.dumps(cluster.driver_conf()), "5"], log_dir=tmp_path)
    try:
        app_id = driver.wait_for_line(r"app_id=(\S+)", 60)[1]
        executors: list[int] = []

        def every_executor_runs_python() -> bool:
            executors[:] = cluster.executor_pids(app_id)
            return len(executors) == 2 and all(len(cluster.python_worker_pids(e)) >= 2 for e in executors)

        # both executors run a task in a forked Python worker (daemon + worker): the job is mid-way
        wait_for("a Python task on both executors", every_executor_runs_python, 30)
        victim = executors[0]
        python_workers = cluster.python_worker_pids(victim)
        assert all(_is_pyspark_daemon(p) for p in python_workers)

        killed = cluster.kill_executor(victim)

        assert set(killed) == {victim, *python_workers}
        assert not [p for p in killed if alive(p)]
        assert driver.wait_for_line(r"result=(\d+)", 60)[1] == str(sum(range(1000)))
        assert driver.wait(30) == 0
        assert victim not in cluster.executor_pids()
    finally:
        if driver.returncode is None:
            driver.kill_group()


# the harness's own behaviour, not kafka2pc's: make chaos runs it (-m slow), out of the default suite's time budget
@pytest.mark.slow
def test_close_and_kill_worker_leave_no_process(tmp_path: Path) -> None:
    cluster = StandaloneSparkCluster(workers=2, workdir=tmp_path / "cluster").start()
    script = _write(tmp_path, "standalone_driver.py", STANDALONE_DRIVER)
    driver = run_driver(script, [cluster.master_url, json.dumps(cluster.driver_conf()), "300"], log_dir=tmp_path)
    try:
        app_id = driver.wait_for_line(r"app_id=(\S+)", 60)[1]
        # pyspark's daemon under every executor (a fork below an executor is not the daemon until it has exec'd)
        wait_for("pyspark's daemon under every executor", lambda: len(cluster.executor_pids(app_id)) == 2 and all(
            any(_is_pyspark_daemon(p) for p in cluster.python_worker_pids(e)) for e in cluster.executor_pids(app_id)),
            30)
        before = cluster.all_pids()
        worker0 = cluster.workers[0].pid
        under_worker0 = [p for p in before if p == worker0 or worker0 in _ancestors(p)]
        assert len(under_worker0) >= 3, "worker, executor, Python daemon"
        assert sum(_is_java(p) for p in before) >= 4, "master, workers, executors"
        assert sum(_is_pyspark_daemon(p) for p in before) >= 2, "a Python daemon under each executor"

        assert set(cluster.kill_worker(0)) == set(under_worker0)
        assert not [p for p in under_worker0 if alive(p)]
        cluster.close()

        assert not [p for p in before if alive(p)], "close() left processes"
    finally:
        cluster.close()
        driver.kill_group()


def test_kill_group_kills_driver_jvm_and_python_workers(tmp_path: Path) -> None:
    script = _write(tmp_path, "local_driver.py", LOCAL_DRIVER)
    driver = run_driver(script, log_dir=tmp_path)
    try:
        driver.wait_for_line(r"^ready$", 60)
        group = driver.group_pids()
        assert driver.pid in group
        assert any(_is_java(p) for p in group), "the driver's JVM"
        assert any(_is_pyspark_daemon(p) for p in group), "pyspark's daemon (its own process group)"

        killed = driver.kill_group()

        assert set(group) <= set(killed)
        assert not [p for p in killed if alive(p)]
        assert driver.returncode == -9
    finally:
        if driver.returncode is None:
            driver.kill_group()


def _ancestors(pid: int) -> list[int]:
    found = []
    info = proc_info(pid)
    for _ in range(64):  # bounded walk up the tree
        if info is None or info.ppid <= 1:
            break
        found.append(info.ppid)
        info = proc_info(info.ppid)
    return found
