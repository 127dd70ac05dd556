"""Decision logs and sink state on S3 (an S3-API server started by the tests: moto's), through s3fs: the commit point
is an exclusive create (``If-None-Match: *``), so of two writers racing for one decision exactly one wins; a Spark
batch write with an ``s3a://`` checkpoint location, and ``kafka2pc recover --checkpoint-location s3a://...``."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

from kafka2pc.cli import main as cli_main
from kafka2pc.errors import DecisionConflictError, SinkStateMissingError
from kafka2pc.sink.integration import Decision, FileDecisionLog, PreparedTransaction
from kafka2pc.sink.storage import open_folder
from kafka2pc.spark.state import SinkStore

pytestmark = pytest.mark.integration
ROUNDS = 6
HDFS_DRIVER_KILLS = int(os.environ.get("KAFKA2PC_HDFS_DRIVER_KILLS", "1"))


def location(s3_server, name: str) -> str:
    return f"s3a://{s3_server.bucket}/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["s3a", pytest.param("gs", marks=pytest.mark.slow),
                        pytest.param("abfss", marks=pytest.mark.slow)])
def store(request):
    """The root URL of a fresh folder on each object store: S3 (moto) in the default suite; GCS (fake-gcs-server)
    and Azure (Azurite) with make test-object-stores, their emulators being installed with go and npm."""
    folder = uuid.uuid4().hex[:8]
    if request.param == "s3a":
        return f"s3a://{request.getfixturevalue('s3_server').bucket}/{folder}"
    if request.param == "gs":
        request.getfixturevalue("gcs_server")
        bucket = f"kafka2pc-{folder}"
        open_folder(f"gs://{bucket}").fs.mkdir(bucket)
        return f"gs://{bucket}/{folder}"
    request.getfixturevalue("azure_storage")
    container = f"kafka2pc-{folder}"
    open_folder(f"abfss://{container}@devstoreaccount1.dfs.core.windows.net").fs.mkdir(container)
    return f"abfss://{container}@devstoreaccount1.dfs.core.windows.net/{folder}"


def txn(prefix: str, partition: int, epoch: int) -> PreparedTransaction:
    from kafka2pc.prepared_state import PreparedTxnState  # noqa: PLC0415

    return PreparedTransaction(f"{prefix}-{partition}-0", PreparedTxnState(1000 + partition, epoch), partition, 1)


def test_a_decision_log_on_an_object_store_records_completes_and_prunes(store):
    log = FileDecisionLog(f"{store}/log", "job", retain_done=2)
    assert log.last_checkpoint() is None and log.undone() == []
    for checkpoint in (1, 2, 3):
        log.record(Decision(checkpoint, (txn("job", 0, checkpoint),), {"n": checkpoint}))
    log.record(Decision(3, (txn("job", 0, 3),), {"n": 3}))  # the same decision again: a no-op
    assert [d.checkpoint for d in log.undone()] == [1, 2, 3]
    for checkpoint in (1, 2, 3):
        log.mark_done(checkpoint)
    assert log.undone() == [] and log.last_checkpoint() == 3
    assert log.decision(1) is None and log.decision(3).metadata == {"n": 3}  # pruned to the last two
    with pytest.raises(DecisionConflictError):
        log.record(Decision(3, (txn("job", 1, 3),)))
    with pytest.raises(DecisionConflictError):
        log.record(Decision(2, ()))


def race_for_one_decision(folder: str) -> int:
    """Two writers (each its own log object) record different decisions for checkpoint 1 at once; asserts exactly
    one won, returns which."""
    logs, start, outcomes = [FileDecisionLog(folder, "job") for _ in range(2)], threading.Barrier(2), {}

    def decide(writer: int) -> None:
        start.wait()
        try:
            logs[writer].record(Decision(1, (txn("job", writer, writer),)))
            outcomes[writer] = "won"
        except DecisionConflictError:
            outcomes[writer] = "lost"

    threads = [threading.Thread(target=decide, args=(w,)) for w in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes.values()) == ["lost", "won"], outcomes
    return next(w for w, outcome in outcomes.items() if outcome == "won")


def test_two_writers_racing_for_one_decision_on_an_object_store_exactly_one_wins(store):
    for round_number in range(ROUNDS):
        folder = f"{store}/race-{round_number}"
        winner = race_for_one_decision(folder)
        assert FileDecisionLog(folder, "job").decision(1).transactions == (txn("job", winner, winner),)


def test_an_exclusive_create_on_an_object_store_never_replaces(store):
    folder = open_folder(f"{store}/folder")
    assert folder.names() == [] and not folder.exists("a")
    assert folder.create("a", b"first") is True
    assert folder.create("a", b"second") is False
    assert folder.read("a") == b"first"
    folder.replace("a", b"third")
    assert folder.read("a") == b"third" and folder.names() == ["a"]
    folder.delete("a")
    folder.delete("a")
    assert folder.names() == []


def test_a_spark_checkpoint_on_s3_with_commits_and_no_sink_state_is_an_error(s3_server):

    checkpoint = location(s3_server, "ck")
    open_folder(checkpoint).child("commits").replace("4", b"v1\n{}")
    with pytest.raises(SinkStateMissingError, match=r"batches up to 4 committed"):
        SinkStore(checkpoint).open(None, lambda: None)


def test_a_spark_batch_write_keeps_its_decisions_on_s3_and_recover_reads_them(s3_server, kafka, topic_factory,
                                                                                tmp_path):
    pytest.importorskip("pyspark")
    from kafka2pc.spark.state import SinkStore  # noqa: PLC0415
    from kafka2pc_harness.spark import local_session, stop_session  # noqa: PLC0415

    from .spark_support import audit, open_transactions  # noqa: PLC0415

    topic = topic_factory(kafka, partitions=2)
    checkpoint = location(s3_server, "batch")
    spark = local_session("kafka2pc-s3", cores=2)  # its Python workers inherit the S3 endpoint and keys
    try:
        for first, last in ((0, 300), (300, 500)):
            (spark.range(first, last, numPartitions=3).selectExpr("to_json(named_struct('id', id)) AS value")
             .write.format("kafka2pc").mode("append").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
             .option("topic", topic).option("checkpointLocation", checkpoint).save())
    finally:
        stop_session(spark)
    report = audit(kafka.bootstrap_servers, topic, 500)
    assert (report["records"], report["duplicates"], report["gaps"], report["clean"]) == (500, 0, 0, True)
    store = SinkStore(checkpoint)
    state = store.load()
    assert state is not None and store.decision_log(state.prefix).last_checkpoint() == 2
    assert cli_main(["recover", "--bootstrap", kafka.bootstrap_servers, "--checkpoint-location", checkpoint]) == 0
    assert open_transactions(kafka.bootstrap_servers, state.prefix) == []


def test_a_decision_log_on_hdfs_is_exclusive_and_completes(hdfs):
    folder = f"{hdfs.url}/logs/{uuid.uuid4().hex[:8]}"
    for round_number in range(ROUNDS // 2):
        race_for_one_decision(f"{folder}-{round_number}")
    log = FileDecisionLog(f"{folder}-0", "job", retain_done=1)
    log.mark_done(1)
    log.record(Decision(2, (txn("job", 0, 2),), {"n": 2}))
    assert [d.checkpoint for d in log.undone()] == [2] and log.last_checkpoint() == 2
    log.mark_done(2)
    assert log.decision(1) is None and log.decision(2).metadata == {"n": 2} and log.undone() == []
    files = open_folder(f"{hdfs.url}/files/{uuid.uuid4().hex[:8]}")
    assert files.create("sink.json", b"1") and not files.create("sink.json", b"2")
    files.replace("sink.json", b"3")
    assert files.read("sink.json") == b"3" and files.names() == ["sink.json"]


@pytest.mark.slow  # make chaos; the default suite kills the HDFS job in test_storage_outages.py, after its outage
@pytest.mark.timeout(600)
def test_the_main_job_with_its_checkpoint_on_hdfs_survives_driver_kills(hdfs, kafka, topic_factory, tmp_path):
    """Spark's own checkpoint (offsets, commits: written by pyspark's Hadoop client) and kafka2pc's decisions
    (through WebHDFS) both on HDFS; the driver's process group SIGKILLed inside a transaction and restarted,
    ``KAFKA2PC_HDFS_DRIVER_KILLS`` times in ``make chaos`` (the default suite kills the same job once, after a NameNode
    outage, in test_storage_outages.py)."""
    pytest.importorskip("pyspark")
    from kafka2pc_harness.spark import run_driver  # noqa: PLC0415

    from .spark_support import audit, open_transactions, produce_orders, wait_for_open_transaction  # noqa: PLC0415

    bootstrap = kafka.bootstrap_servers
    source, sink = topic_factory(kafka, partitions=2), topic_factory(kafka, partitions=2)
    checkpoint = f"{hdfs.url}/checkpoints/{uuid.uuid4().hex[:8]}"
    produce_orders(bootstrap, source, 0, 1500)
    job = Path(__file__).resolve().parents[2] / "examples" / "spark_job.py"
    args = ["--bootstrap", bootstrap, "--source", source, "--sink", sink, "--checkpoint", checkpoint,
            "--batch-size", "150", "--trigger-seconds", "0.3"]
    for round_number in range(HDFS_DRIVER_KILLS):
        driver = run_driver(job, args, log_dir=tmp_path / f"run-{round_number}")
        try:
            driver.wait_for_line(r"^batch \d+:", timeout_s=180)
            prefix = SinkStore(checkpoint).load().prefix
            wait_for_open_transaction(bootstrap, prefix, timeout_s=60)
        finally:
            driver.kill_group()
    assert SinkStore(checkpoint).spark_commits(), "Spark's commit log is on HDFS"
    final = run_driver(job, [*args, "--until-caught-up"], log_dir=tmp_path / "final")
    assert final.wait(timeout_s=300) == 0, final.output_tail()
    report = audit(bootstrap, sink, 1500)
    assert (report["records"], report["duplicates"], report["gaps"], report["clean"]) == (1500, 0, 0, True)
    assert open_transactions(bootstrap, SinkStore(checkpoint).load().prefix) == []
