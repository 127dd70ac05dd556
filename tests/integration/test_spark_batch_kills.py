"""A batch write (``df.write.format("kafka2pc")``) is all or nothing when its driver is SIGKILLed:

- during completion (the decision recorded, one transaction committed, the others' EndTxn never reaching the broker
  through a fault proxy): everything, once the next write with the same checkpoint location or ``kafka2pc recover``
  has run;
- before the decision (tasks still writing): nothing, and nothing left open."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from kafka.protocol.producer import EndTxnRequest

from kafka2pc.cli import main as cli_main
from kafka2pc_harness.proxy import DROP, FaultProxy
from kafka2pc_harness.spark import run_driver

from .spark_support import audit, open_transactions, sink_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
JOB = Path(__file__).with_name("spark_batch_job.py")
ROWS = 2000  # in 8 partitions: 8 transactions


def _decided(checkpoint: Path) -> list[Path]:
    decisions = checkpoint / "kafka2pc" / "decisions"
    return sorted(decisions.glob("*.decision.json")) if decisions.exists() else []


@pytest.mark.parametrize("completed_by", ["next write", "kafka2pc recover"])
def test_driver_killed_during_completion_commits_everything_once(kafka, topic_factory, tmp_path, completed_by):
    bootstrap = kafka.bootstrap_servers
    topic, checkpoint = topic_factory(kafka, partitions=3), tmp_path / "checkpoint"
    with FaultProxy(bootstrap) as proxy:
        held = proxy.on_request(EndTxnRequest, nth=2, action=DROP, times=None)  # the 1st commits, no other one does
        driver = run_driver(JOB, [proxy.bootstrap_servers, topic, str(checkpoint), "0", str(ROWS)],
                            log_dir=tmp_path / "killed")
        try:
            assert held.wait(180), driver.output_tail()
            assert _decided(checkpoint), "EndTxn is sent only after the decision is recorded"
        finally:
            driver.kill_group()
    prefix = sink_prefix(checkpoint)
    left = open_transactions(bootstrap, prefix)
    before = audit(bootstrap, topic, ROWS)
    print(f"\nafter the kill: {len(left)} transactions open, read_committed sees {before['records']} records")
    assert len(left) == 7  # decided, not yet completed: they pin the LSO, nothing past it is visible
    assert before["duplicates"] == 0 and before["lso_pinned"]

    if completed_by == "next write":
        again = run_driver(JOB, [bootstrap, topic, str(checkpoint), str(ROWS), str(ROWS)], log_dir=tmp_path / "next")
        assert again.wait(180) == 0, again.output_tail()
        expected = 2 * ROWS
    else:
        assert cli_main(["recover", "--bootstrap", bootstrap, "--checkpoint-location", str(checkpoint)]) == 0
        expected = ROWS
    report = audit(bootstrap, topic, expected)
    assert (report["records"], report["duplicates"], report["gaps"], report["outside_range"]) == (expected, 0, 0, 0)
    assert report["lso_pinned"] == [] and report["clean"]
    assert open_transactions(bootstrap, prefix) == []


def test_driver_killed_before_the_decision_leaves_nothing(kafka, topic_factory, tmp_path):
    bootstrap = kafka.bootstrap_servers
    topic, checkpoint = topic_factory(kafka, partitions=3), tmp_path / "checkpoint"
    # partition 0 stalls 20 s after its first rows: the other tasks prepare meanwhile, nothing is decided
    driver = run_driver(JOB, [bootstrap, topic, str(checkpoint), "0", str(ROWS), "20"], log_dir=tmp_path / "killed")
    try:
        driver.wait_for_line(r"^writing", 120)
        wait_for("a sink prefix", (checkpoint / "kafka2pc" / "sink.json").exists, 60)
        prefix = sink_prefix(checkpoint)
        wait_for("tasks prepared", lambda: len(open_transactions(bootstrap, prefix, settle_s=0)) >= 4, 90)
        assert not _decided(checkpoint)
    finally:
        driver.kill_group()
    assert open_transactions(bootstrap, prefix)  # prepared or ongoing: they pin the LSO until recovery
    assert cli_main(["recover", "--bootstrap", bootstrap, "--checkpoint-location", str(checkpoint)]) == 0
    report = audit(bootstrap, topic, ROWS)
    assert (report["records"], report["duplicates"], report["lso_pinned"]) == (0, 0, [])
    assert open_transactions(bootstrap, prefix) == []
