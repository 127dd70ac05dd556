"""foreachBatch with a keyed kafka2pc write (``txnAppId`` + ``txnVersion`` = the batch id), its driver's process group
SIGKILLed and restarted: a read_committed consumer sees every input record once, nothing pins the LSO.

Every other round kills the driver right after a ``save()`` returned, before Spark records the micro-batch as done
(the replay case); the others kill at a random moment. The same job without the key, killed once after a save, writes
duplicates: the test can fail. The default suite kills once, right after a save (the replay case; a driver killed at a
random moment is test_spark_kills.py's); ``KAFKA2PC_FOREACH_BATCH_KILLS`` raises it (``make chaos`` runs 12, half
of them at random moments); ``KAFKA2PC_SPARK_KILL_SEED`` replays a run."""

from __future__ import annotations

import os
import random
import re
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from kafka2pc_harness.spark import run_driver

from .spark_support import audit, open_transactions, produce_orders, sink_prefix

pytestmark = pytest.mark.integration
JOB = Path(__file__).resolve().parent / "spark_foreach_batch_job.py"
KILLS = int(os.environ.get("KAFKA2PC_FOREACH_BATCH_KILLS", "1"))
INITIAL_ORDERS, ORDERS_PER_ROUND = 600, 200


def job_args(bootstrap: str, source: str, sink: str, checkpoint: Path, *extra: str) -> list[str]:
    return ["--bootstrap", bootstrap, "--source", source, "--sink", sink, "--checkpoint", str(checkpoint),
            "--batch-size", "100", "--trigger-seconds", "0.3", *extra]


def run_until_caught_up(args: list[str], log_dir: Path) -> None:
    final = run_driver(JOB, [*args, "--until-caught-up"], log_dir=log_dir)
    assert final.wait(timeout_s=300) == 0, final.output_tail()


@pytest.mark.timeout(300 + 90 * KILLS)
def test_foreach_batch_keyed_writes_survive_driver_kills_exactly_once(kafka, topic_factory, tmp_path):
    bootstrap = kafka.bootstrap_servers
    source, sink = topic_factory(kafka, partitions=3), topic_factory(kafka, partitions=3)
    checkpoint = tmp_path / "query"
    seed = int(os.environ.get("KAFKA2PC_SPARK_KILL_SEED", str(random.SystemRandom().randrange(10**6))))
    rng = random.Random(seed)
    print(f"\nseed {seed}, {KILLS} kills")
    produce_orders(bootstrap, source, 0, INITIAL_ORDERS)
    orders = INITIAL_ORDERS
    args = job_args(bootstrap, source, sink, checkpoint)
    kills_after_save = 0
    for round_number in range(KILLS):
        after_save = round_number % 2 == 0
        extra = ["--kill-after-save", str(rng.randint(1, 3))] if after_save else []
        driver = run_driver(JOB, [*args, *extra], log_dir=tmp_path / f"run-{round_number}")
        feeder = threading.Thread(target=produce_orders, args=(bootstrap, source, orders, ORDERS_PER_ROUND),
                                  kwargs={"over_s": 2.0})
        try:
            driver.wait_for_line(r"^saved batch \d+", timeout_s=180)
            feeder.start()
            if after_save:
                assert driver.wait(timeout_s=120) == -9, driver.output_tail()  # it killed itself after a save
                kills_after_save += 1
            else:
                time.sleep(rng.uniform(0.0, 2.0))
        finally:
            killed = driver.kill_group()
            if feeder.is_alive():
                feeder.join(timeout=60)
        orders += ORDERS_PER_ROUND
        saved = [int(m[1]) for m in re.finditer(r"^saved batch (\d+)", driver.stdout_path.read_text(), re.M)]
        print(f"kill {round_number + 1} ({'right after save()' if after_save else 'random moment'}): "
              f"{len(killed)} processes; batches saved in this run: {saved}")

    run_until_caught_up(args, tmp_path / "final")
    report = audit(bootstrap, sink, orders)
    print(f"{orders} orders; {kills_after_save} kills right after save(); audit: {report['records']} records, "
          f"{report['duplicates']} duplicates, {report['gaps']} gaps, pinned {report['lso_pinned']}")
    assert (report["records"], report["duplicates"], report["gaps"], report["outside_range"]) == (orders, 0, 0, 0)
    assert report["lso_pinned"] == [] and report["clean"]
    assert open_transactions(bootstrap, sink_prefix(Path(f"{checkpoint}-kafka2pc"))) == []
    assert kills_after_save >= 1


# the control of the keyed test above (without a key the same kill does duplicate: the audit can see it), 45 s:
# make chaos runs it (-m slow), out of the default suite's time budget
@pytest.mark.slow
def test_foreach_batch_without_a_key_writes_a_replayed_batch_twice(kafka, topic_factory, tmp_path):
    bootstrap = kafka.bootstrap_servers
    source, sink = topic_factory(kafka, partitions=3), topic_factory(kafka, partitions=3)
    produce_orders(bootstrap, source, 0, INITIAL_ORDERS)
    args = job_args(bootstrap, source, sink, tmp_path / "query", "--unkeyed")
    driver = run_driver(JOB, [*args, "--kill-after-save", "1"], log_dir=tmp_path / "killed")
    try:
        assert driver.wait(timeout_s=180) == -9, driver.output_tail()
    finally:
        driver.kill_group()
    run_until_caught_up(args, tmp_path / "final")
    report = audit(bootstrap, sink, INITIAL_ORDERS)
    print(f"\nunkeyed: {report['records']} records, {report['duplicates']} duplicates, {report['gaps']} gaps")
    assert report["gaps"] == 0 and report["duplicates"] > 0
