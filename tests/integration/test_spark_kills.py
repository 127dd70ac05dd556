"""The main job (``examples/spark_job.py``: Kafka source -> transformation -> kafka2pc sink) in local[2], its driver's
whole process group SIGKILLed and restarted from its checkpoint each time; then what a read_committed consumer sees
must be every input record exactly once, with nothing pinning the LSO.

Until a kill has landed inside a transaction, each round kills the moment ListTransactions shows one open under the
sink's prefix (so the case that matters most is covered every run, not by luck); the other rounds kill at a random
moment. The default suite kills once, inside a transaction (test_storage_outages.py kills the same job again, on
HDFS and S3, when it rides out an outage); ``KAFKA2PC_SPARK_KILLS`` raises it (``make chaos`` runs 30) and
``KAFKA2PC_SPARK_KILL_SEED`` replays a run (the seed is printed)."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from kafka2pc.spark.state import SinkStore
from kafka2pc_harness.spark import run_driver

from .spark_support import audit, open_transactions, produce_orders, sink_prefix, wait_for_open_transaction

pytestmark = pytest.mark.integration
JOB = Path(__file__).resolve().parents[2] / "examples" / "spark_job.py"
KILLS = int(os.environ.get("KAFKA2PC_SPARK_KILLS", "1"))
INITIAL_ORDERS, ORDERS_PER_ROUND = 2000, 400


@pytest.mark.timeout(240 + 90 * KILLS)
def test_driver_killed_at_random_moments_writes_every_order_exactly_once(kafka, topic_factory, tmp_path):
    bootstrap = kafka.bootstrap_servers
    source, sink = topic_factory(kafka, partitions=3), topic_factory(kafka, partitions=3)
    checkpoint = tmp_path / "checkpoint"
    seed = int(os.environ.get("KAFKA2PC_SPARK_KILL_SEED", str(random.SystemRandom().randrange(10**6))))
    rng = random.Random(seed)
    print(f"\nseed {seed}, {KILLS} kills")
    produce_orders(bootstrap, source, 0, INITIAL_ORDERS)
    orders = INITIAL_ORDERS
    job_args = ["--bootstrap", bootstrap, "--source", source, "--sink", sink, "--checkpoint", str(checkpoint),
                "--batch-size", "150", "--trigger-seconds", "0.3"]
    kills_mid_transaction = kills_mid_completion = 0
    for round_number in range(KILLS):
        driver = run_driver(JOB, job_args, log_dir=tmp_path / f"run-{round_number}")
        feeder = threading.Thread(target=produce_orders, args=(bootstrap, source, orders, ORDERS_PER_ROUND),
                                  kwargs={"over_s": 3.0})
        try:
            # The first batch of a run includes Spark's start-up; kill once batches flow (new orders arriving
            # meanwhile): inside a transaction until one kill has landed there, else at a random moment.
            driver.wait_for_line(r"^batch \d+:", timeout_s=180)
            feeder.start()
            if kills_mid_transaction:
                time.sleep(rng.uniform(0.0, 3.0))
            else:
                wait_for_open_transaction(bootstrap, sink_prefix(checkpoint), timeout_s=30)
            assert driver.returncode is None, driver.output_tail()
        finally:
            killed = driver.kill_group()
            if feeder.is_alive():
                feeder.join(timeout=60)
        orders += ORDERS_PER_ROUND
        store = SinkStore(str(checkpoint))
        state = store.load()
        left_open = open_transactions(bootstrap, state.prefix, settle_s=0) if state is not None else []
        undecided = [d.checkpoint for d in store.decision_log(state.prefix).undone()] if state is not None else []
        kills_mid_transaction += bool(left_open)
        kills_mid_completion += bool(undecided)
        print(f"kill {round_number + 1}: {len(killed)} processes; open under the prefix: {left_open}; decided, not "
              f"completed: {undecided}")

    final = run_driver(JOB, [*job_args, "--until-caught-up"], log_dir=tmp_path / "final")
    assert final.wait(timeout_s=300) == 0, final.output_tail()
    prefix = sink_prefix(checkpoint)
    report = audit(bootstrap, sink, orders)
    print(f"{orders} orders; kills that left a transaction open: {kills_mid_transaction}/{KILLS}, a decided batch "
          f"not completed: {kills_mid_completion}/{KILLS}; audit: "
          f"{report['records']} records, {report['duplicates']} duplicates, {report['gaps']} gaps, "
          f"pinned {report['lso_pinned']}")
    assert (report["records"], report["duplicates"], report["gaps"], report["outside_range"]) == (orders, 0, 0, 0)
    assert report["lso_pinned"] == [] and report["clean"]
    assert open_transactions(bootstrap, prefix) == []
    # The targeted kills must have landed inside a transaction at least once, or the loop proves little.
    assert kills_mid_transaction >= 1
