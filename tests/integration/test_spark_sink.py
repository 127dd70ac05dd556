"""The kafka2pc data source in real PySpark (local[2]) against a real Kafka 4.4.0 broker: exactly-once streaming and
batch writes, replays, empty partitions, and the errors it gives before anything is written."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import attrs
import pytest
from confluent_kafka import Producer as ConfluentProducer

pyspark = pytest.importorskip("pyspark")

from pyspark.taskcontext import TaskContext  # noqa: E402

from kafka2pc.cli import main as cli_main  # noqa: E402
from kafka2pc.errors import BatchOverError, IdInUseError, WriteConflictError  # noqa: E402
from kafka2pc.sink.integration import FileDecisionLog, TransactionNamingStrategy  # noqa: E402
from kafka2pc.spark.columns import Columns  # noqa: E402
from kafka2pc.spark.driver import SinkDriver  # noqa: E402
from kafka2pc.spark.options import SinkOptions  # noqa: E402
from kafka2pc.spark.task import TaskPlan, write_partition  # noqa: E402
from kafka2pc.testing.verify import end_offsets, read_records  # noqa: E402
from kafka2pc_harness.spark import local_session, stop_session  # noqa: E402

from .spark_support import audit, open_transactions, sink_prefix  # noqa: E402

pytestmark = pytest.mark.integration
ROWS_PER_BATCH = 200


@pytest.fixture(scope="module")
def spark():
    """local[2] with Spark's own Kafka connector, so jobs can read with format("kafka") as users' jobs do."""
    session = local_session("kafka2pc-tests", cores=2, kafka_connector=True,
                            conf={"spark.sql.streaming.stopTimeout": "30s"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    stop_session(session)


def settle_after_stop(spark, bootstrap: str, checkpoint: Path) -> None:
    """A query stopped mid-batch leaves that batch's transactions to the next run (or ``kafka2pc recover``), once
    its cancelled tasks are gone."""
    tracker, deadline = spark.sparkContext.statusTracker(), time.monotonic() + 60
    while (tracker.getActiveJobsIds() or tracker.getActiveStageIds()) and time.monotonic() < deadline:
        time.sleep(0.2)
    # a cancelled task's Python worker can still be writing after its stage is gone (a zombie; Spark stops it up to
    # 2 s later): once the recovery moved the write window it stops, aborting what it opened, or the next recovery
    # aborts it. So look only after that time, and recover again while something is open, a bounded number of times
    for _ in range(5):
        assert cli_main(["recover", "--bootstrap", bootstrap, "--checkpoint-location", str(checkpoint)]) == 0
        time.sleep(3)
        if not open_transactions(bootstrap, sink_prefix(checkpoint)):
            return


def written_through(checkpoint: Path) -> int:
    """The last micro-batch whose rows read_committed consumers may see: the last one Spark committed, or the one
    after it when the query was stopped between the sink's commit and Spark's commit log (Spark runs it again on a
    restart and the sink skips it as decided)."""
    committed = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    decided = FileDecisionLog(checkpoint / "kafka2pc" / "decisions", sink_prefix(checkpoint)).last_checkpoint()
    assert decided in (committed, committed + 1), (decided, committed)
    return decided


def run_batches(spark, bootstrap: str, topic: str, checkpoint: Path, batches: int, **options):
    """rate-micro-batch rows (ids 0, 1, 2 ... by batch) into kafka2pc until ``batches`` batches have committed."""
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS_PER_BATCH)
          .option("numPartitions", 2).load()
          .selectExpr("CAST(value AS STRING) AS key", "to_json(named_struct('id', value)) AS value"))
    writer = (df.writeStream.format("kafka2pc").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
              .option("checkpointLocation", str(checkpoint)))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            progress = query.lastProgress
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            if progress is not None and progress["batchId"] >= batches - 1 and progress["numInputRows"] >= 0:
                committed = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
                if committed and committed[-1] >= batches - 1:
                    return query
            time.sleep(0.2)
        raise AssertionError("the query did not reach its batches in time")
    finally:
        query.stop()


def test_streaming_writes_every_row_exactly_once(spark, kafka, topic_factory, tmp_path):
    topic = topic_factory(kafka, partitions=3)
    checkpoint = tmp_path / "ck"
    run_batches(spark, kafka.bootstrap_servers, topic, checkpoint, batches=4)
    settle_after_stop(spark, kafka.bootstrap_servers, checkpoint)
    last = written_through(checkpoint)
    report = audit(kafka.bootstrap_servers, topic, ROWS_PER_BATCH * (last + 1))
    assert (report["duplicates"], report["gaps"], report["lso_pinned"], report["clean"]) == (0, 0, [], True), report
    prefix = sink_prefix(checkpoint)
    assert open_transactions(kafka.bootstrap_servers, prefix) == []
    assert FileDecisionLog(checkpoint / "kafka2pc" / "decisions", prefix).undone() == []


def test_a_replayed_batch_is_not_written_twice(spark, kafka, topic_factory, tmp_path):
    """A driver that died after the sink committed batch N but before Spark wrote commits/N: Spark runs batch N
    again with the same rows. The sink finds N decided and aborts the replay's transactions."""
    topic = topic_factory(kafka, partitions=2)
    checkpoint = tmp_path / "ck"
    run_batches(spark, kafka.bootstrap_servers, topic, checkpoint, batches=3)
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    # as if the driver died right after the sink's commit of batch `last`: its commits entry is missing, and no
    # later batch was planned (offsets log ends at `last`)
    for log_dir, first in (("commits", last), ("offsets", last + 1)):
        for entry in (checkpoint / log_dir).iterdir():
            number = entry.name.strip(".").split(".")[0]
            if number.isdigit() and int(number) >= first:
                entry.unlink()
    decided = FileDecisionLog(checkpoint / "kafka2pc" / "decisions", sink_prefix(checkpoint)).decision(last)
    run_batches(spark, kafka.bootstrap_servers, topic, checkpoint, batches=last + 2)
    settle_after_stop(spark, kafka.bootstrap_servers, checkpoint)
    assert (checkpoint / "commits" / str(last)).exists()  # Spark ran batch `last` again, and committed it
    log = FileDecisionLog(checkpoint / "kafka2pc" / "decisions", sink_prefix(checkpoint))
    assert log.decision(last) == decided  # the first decision stands: the replay's transactions were aborted
    report = audit(kafka.bootstrap_servers, topic, ROWS_PER_BATCH * (written_through(checkpoint) + 1))
    assert (report["duplicates"], report["gaps"], report["clean"]) == (0, 0, True), report
    assert open_transactions(kafka.bootstrap_servers, sink_prefix(checkpoint)) == []


def test_batch_write_commits_all_rows_once_and_empty_partitions_hand_over_nothing(spark, kafka, topic_factory,
                                                                                     tmp_path):
    topic = topic_factory(kafka, partitions=2)
    checkpoint = tmp_path / "ck"
    df = spark.range(0, 6, numPartitions=8).selectExpr("to_json(named_struct('id', id)) AS value")  # 2 empty
    df.write.format("kafka2pc").option("kafka.bootstrap.servers", kafka.bootstrap_servers) \
        .option("topic", topic).option("checkpointLocation", str(checkpoint)).mode("append").save()
    more = spark.range(6, 1000, numPartitions=3).selectExpr("to_json(named_struct('id', id)) AS value")
    more.write.format("kafka2pc").option("kafka.bootstrap.servers", kafka.bootstrap_servers) \
        .option("topic", topic).option("checkpointLocation", str(checkpoint)).mode("append").save()
    report = audit(kafka.bootstrap_servers, topic, 1000)
    assert (report["records"], report["duplicates"], report["gaps"], report["clean"]) == (1000, 0, 0, True)
    prefix = sink_prefix(checkpoint)
    log = FileDecisionLog(checkpoint / "kafka2pc" / "decisions", prefix)
    first = log.decision(1)
    assert first is not None and 1 <= len(first.transactions) < 8  # empty partitions handed over nothing
    assert all(not t.state.is_empty for t in first.transactions)
    assert log.last_checkpoint() == 2 and log.undone() == []


def test_a_kafka_source_job_with_a_topic_option_writes_to_that_topic_not_back_to_its_source(spark, kafka,
                                                                                              topic_factory, tmp_path):
    # rows read with format("kafka") carry a topic column (their source); Spark's Kafka sink lets the topic option
    # override it, and so must kafka2pc, or this job feeds its output back into its input
    source, enriched = topic_factory(kafka, partitions=2), topic_factory(kafka, partitions=2)
    producer = ConfluentProducer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(50):
        producer.produce(source, key=str(i).encode(), value=f"order-{i}".encode())
    assert producer.flush(30) == 0
    source_ends = end_offsets(kafka.bootstrap_servers, source)

    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("subscribe", source).load()
            .selectExpr("topic", "key", "upper(CAST(value AS STRING)) AS value"))
    assert rows.filter(f"topic = '{source}'").count() == 50
    rows.write.format("kafka2pc").option("kafka.bootstrap.servers", kafka.bootstrap_servers) \
        .option("topic", enriched).option("checkpointLocation", str(tmp_path / "ck")).mode("append").save()

    written = read_records(kafka.bootstrap_servers, enriched)
    assert sorted(r.value for r in written) == sorted(f"ORDER-{i}".encode() for i in range(50))
    assert end_offsets(kafka.bootstrap_servers, source) == source_ends, "the source topic got new records"


@pytest.mark.parametrize(("change", "problem"), [
    ({"checkpointLocation": None}, "checkpointLocation"),
    ({"kafka.acks": "0"}, "kafka.acks"),
    ({"startingOffsets": "earliest"}, "startingoffsets"),
    ({"transactionNamingStrategy": "probing"}, "transactionNamingStrategy"),
])
def test_bad_options_fail_before_any_write(spark, kafka, topic_factory, tmp_path, change, problem):  # noqa: PLR0917
    topic = topic_factory(kafka)
    df = spark.range(5).selectExpr("CAST(id AS STRING) AS value")
    options = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
               "checkpointLocation": str(tmp_path / "ck"), **change}
    writer = df.write.format("kafka2pc").mode("append")
    for key, value in options.items():
        if value is not None:
            writer = writer.option(key, value)
    with pytest.raises(Exception, match=problem):
        writer.save()
    assert audit(kafka.bootstrap_servers, topic, 1)["records"] == 0


@pytest.mark.parametrize(("select", "problem"), [
    ("CAST(id AS STRING) AS key", "needs a 'value' column"),
    ("id AS value", "column 'value' must be string or binary, not bigint"),
    ("CAST(id AS STRING) AS value, id AS partition", "column 'partition' must be int"),
])
def test_wrong_columns_fail_before_any_write(spark, kafka, topic_factory, tmp_path, select, problem):  # noqa: PLR0917
    topic = topic_factory(kafka)
    with pytest.raises(Exception, match=problem):
        spark.range(5).selectExpr(*select.split(", ")).write.format("kafka2pc") \
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers).option("topic", topic) \
            .option("checkpointLocation", str(tmp_path / "ck")).mode("append").save()


def test_a_prefix_belongs_to_one_checkpoint(spark, kafka, topic_factory, tmp_path):
    topic = topic_factory(kafka)
    prefix = f"owned{uuid.uuid4().hex[:6]}"
    df = spark.range(3).selectExpr("to_json(named_struct('id', id)) AS value")

    def write(checkpoint: Path, chosen: str):
        df.write.format("kafka2pc").option("kafka.bootstrap.servers", kafka.bootstrap_servers) \
            .option("topic", topic).option("checkpointLocation", str(checkpoint)) \
            .option("transactionalIdPrefix", chosen).mode("append").save()

    write(tmp_path / "first", prefix)
    with pytest.raises(Exception, match=r"already has .* transactional ids on the cluster .*: another query"):
        write(tmp_path / "second", prefix)  # another checkpoint, same prefix
    with pytest.raises(Exception, match=r"differs from .* which the checkpoint"):
        write(tmp_path / "first", f"{prefix}x")  # the same checkpoint, another prefix
    with pytest.raises(Exception, match="mode\\('append'\\)"):
        df.write.format("kafka2pc").option("kafka.bootstrap.servers", kafka.bootstrap_servers) \
            .option("topic", topic).option("checkpointLocation", str(tmp_path / "x")).mode("overwrite").save()


def test_spark_refuses_async_progress_tracking_and_real_time_mode(spark, kafka, topic_factory, tmp_path):
    topic = topic_factory(kafka)
    df = spark.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS value")
    base = df.writeStream.format("kafka2pc").option("kafka.bootstrap.servers", kafka.bootstrap_servers) \
        .option("topic", topic)
    with pytest.raises(Exception, match="async progress tracking"):
        base.option("checkpointLocation", str(tmp_path / "a")).option("asyncProgressTrackingEnabled", "true").start()
    with pytest.raises(Exception, match=r"REAL_TIME_MODE|real-time"):
        base.option("checkpointLocation", str(tmp_path / "b")).trigger(realTime="5 seconds") \
            .outputMode("update").start()


def zombie(plan: TaskPlan, partition: int, attempt: int, batch: int, values: list[bytes]):
    """A task attempt of ``batch`` that starts late, in this process (a TaskContext as Spark's workers set it)."""
    import pyarrow as pa  # noqa: PLC0415

    TaskContext._setTaskContext(None)
    TaskContext._setTaskContext(TaskContext(stageId=0, partitionId=partition, attemptNumber=attempt,
                                            taskAttemptId=10_000 + attempt, cpus=1, resources={},
                                            localProperties={"streaming.sql.batchId": str(batch)}))
    try:
        return write_partition(plan, iter([pa.record_batch({"value": pa.array(values, pa.binary())})]))
    finally:
        TaskContext._setTaskContext(None)


def test_zombie_attempts_never_touch_a_decided_or_running_transaction(spark, kafka, topic_factory, tmp_path):
    """A zombie attempt of a decided batch writes and prepares late: its transaction is never decided (the batch is
    done) and the next planning aborts it; one on an id a live attempt holds stops without touching it."""
    topic = topic_factory(kafka)
    checkpoint = tmp_path / "ck"
    run_batches(spark, kafka.bootstrap_servers, topic, checkpoint, batches=2)
    settle_after_stop(spark, kafka.bootstrap_servers, checkpoint)
    prefix = sink_prefix(checkpoint)
    done = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    plan = TaskPlan({"bootstrap.servers": kafka.bootstrap_servers}, prefix, TransactionNamingStrategy.POOLING, True,
                    topic, Columns(), None)
    late = zombie(plan, 0, 0, done, [b'{"id": -1}'])  # a late attempt of the decided batch
    assert late.state  # it could prepare: on its own id, touching nothing decided
    with pytest.raises(IdInUseError):  # a second attempt with the same id (a stage re-attempt) finds it in use
        zombie(plan, 0, 0, done, [b'{"id": -2}'])
    assert open_transactions(kafka.bootstrap_servers, prefix) == [late.transactional_id]
    run_batches(spark, kafka.bootstrap_servers, topic, checkpoint, batches=done + 3)  # its planning cleans up
    settle_after_stop(spark, kafka.bootstrap_servers, checkpoint)
    assert open_transactions(kafka.bootstrap_servers, prefix) == []
    report = audit(kafka.bootstrap_servers, topic, ROWS_PER_BATCH * (written_through(checkpoint) + 1))
    assert (report["duplicates"], report["gaps"], report["outside_range"], report["clean"]) == (0, 0, 0, True), report
    shutil.rmtree(checkpoint, ignore_errors=True)


def test_format_kafka2pc_is_registered_without_a_call(spark):
    assert spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("kafka2pc") is True


def test_two_batch_writes_racing_on_one_location_fail_loudly_never_silently(kafka, topic_factory, tmp_path):
    """Both planned checkpoint k before either decided. The second planning moved the write window, so the first
    write's tasks refuse to write (loudly, with nothing left open); were they done already, the second to commit
    finds k decided by the first and fails saying none of its rows were written, never as if it had written them."""
    topic = topic_factory(kafka)
    options = SinkOptions.from_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                                        "checkpointLocation": str(tmp_path / "ck")}, streaming=False)
    plan_a, plan_b = SinkDriver(options).plan(Columns(), streaming=False), SinkDriver(options).plan(Columns(),
                                                                                                    streaming=False)
    assert plan_a.checkpoint == plan_b.checkpoint == 1
    with pytest.raises(BatchOverError):
        zombie(plan_a, 0, 0, 1, [b'{"id": 0}'])
    first = zombie(plan_b, 0, 1, 1, [b'{"id": 0}'])
    second = zombie(attrs.evolve(plan_a, window=""), 1, 0, 1, [b'{"id": 1}'])  # as if done before the move
    assert SinkDriver(options).commit_write([first]) is not None
    with pytest.raises(WriteConflictError, match="none of its rows were written"):
        SinkDriver(options).commit_write([second])
    report = audit(kafka.bootstrap_servers, topic, 1)
    assert (report["records"], report["duplicates"], report["outside_range"]) == (1, 0, 0)
    assert open_transactions(kafka.bootstrap_servers, plan_a.prefix) == []


def test_an_attempt_that_starts_after_its_batch_is_over_leaves_nothing_open(kafka, topic_factory, tmp_path):
    """The CI failure this guards: after the last batch of a query (here a batch write), a speculative loser that
    had not written yet opened its transaction after the commit's cleanup; with 2PC it stayed open and pinned the
    LSO. The commit moves the write window before its cleanup: such an attempt refuses to write."""
    topic = topic_factory(kafka)
    options = SinkOptions.from_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                                        "checkpointLocation": str(tmp_path / "ck")}, streaming=False)
    plan = SinkDriver(options).plan(Columns(), streaming=False)
    winner = zombie(plan, 0, 1, 1, [b'{"id": 0}'])
    assert SinkDriver(options).commit_write([winner]) is not None
    with pytest.raises(BatchOverError, match="is over"):
        zombie(plan, 0, 0, 1, [b'{"id": 0}'])  # the loser, late
    assert open_transactions(kafka.bootstrap_servers, plan.prefix) == []
    report = audit(kafka.bootstrap_servers, topic, 1)
    assert (report["records"], report["duplicates"], report["lso_pinned"]) == (1, 0, [])


def test_an_attempt_whose_batch_ends_while_it_writes_leaves_nothing_open(kafka, topic_factory, tmp_path):
    """The other side of the write window: a loser whose first write was acknowledged before the commit moved the
    window is in the commit's cleanup listing (aborted there); it stops, never prepares anything that stays open."""
    import pyarrow as pa  # noqa: PLC0415

    topic = topic_factory(kafka)
    options = SinkOptions.from_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                                        "checkpointLocation": str(tmp_path / "ck")}, streaming=False)
    plan = SinkDriver(options).plan(Columns(), streaming=False)
    winner = zombie(plan, 0, 1, 1, [b'{"id": 0}'])

    def loser_rows():
        yield pa.record_batch({"value": pa.array([b'{"id": 0}'], pa.binary())})
        assert open_transactions(kafka.bootstrap_servers, plan.prefix, settle_s=0) != []  # the loser's is open
        assert SinkDriver(options).commit_write([winner]) is not None  # the batch ends while the loser writes
        yield pa.record_batch({"value": pa.array([b'{"id": 0}'], pa.binary())})

    TaskContext._setTaskContext(TaskContext(stageId=0, partitionId=0, attemptNumber=0, taskAttemptId=7, cpus=1,
                                            resources={}, localProperties={}))
    try:
        with pytest.raises(Exception, match=r"is over|fenced|owned by a newer"):
            write_partition(plan, loser_rows())
    finally:
        TaskContext._setTaskContext(None)
    assert open_transactions(kafka.bootstrap_servers, plan.prefix) == []
    report = audit(kafka.bootstrap_servers, topic, 1)
    assert (report["records"], report["duplicates"], report["lso_pinned"]) == (1, 0, [])


def test_kafka2pc_recover_on_a_checkpoint_stops_late_attempts_of_the_stopped_query(kafka, topic_factory, tmp_path):
    topic = topic_factory(kafka)
    checkpoint = tmp_path / "ck"
    options = SinkOptions.from_options({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                                        "checkpointLocation": str(checkpoint)}, streaming=False)
    plan = SinkDriver(options).plan(Columns(), streaming=False)  # and the driver dies before its tasks ran
    assert cli_main(["recover", "--bootstrap", kafka.bootstrap_servers, "--checkpoint-location", str(checkpoint)]) == 0
    with pytest.raises(BatchOverError):
        zombie(plan, 0, 0, 1, [b'{"id": 0}'])
    assert open_transactions(kafka.bootstrap_servers, plan.prefix) == []


def _java_scram_options(secured) -> dict[str, str]:
    """What a user of Spark's Kafka sink writes for SASL_SSL/SCRAM-SHA-512 with a private CA."""
    return {"kafka.bootstrap.servers": secured.sasl_ssl, "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                      'username="alice" password="alice-secret";',
            "kafka.ssl.truststore.location": str(secured.pki.truststore_p12),
            "kafka.ssl.truststore.type": "PKCS12", "kafka.ssl.truststore.password": secured.pki.store_password}


def _client_config(options: dict[str, str]) -> dict[str, str]:
    return {key.removeprefix("kafka."): value for key, value in options.items()}


def test_batch_and_streaming_writes_over_sasl_ssl_scram_with_java_keys(spark, secured_kafka, topic_factory,
                                                                       tmp_path):
    options = _java_scram_options(secured_kafka)
    batch_topic = topic_factory(secured_kafka.service, partitions=2)
    df = spark.range(0, 500, numPartitions=4).selectExpr("to_json(named_struct('id', id)) AS value")
    df.write.format("kafka2pc").options(**options).option("topic", batch_topic) \
        .option("checkpointLocation", str(tmp_path / "batch")).mode("append").save()
    report = audit(_client_config(options), batch_topic, 500)
    assert (report["records"], report["duplicates"], report["gaps"], report["clean"]) == (500, 0, 0, True)

    stream_topic = topic_factory(secured_kafka.service, partitions=2)
    checkpoint = tmp_path / "stream"
    run_batches(spark, secured_kafka.sasl_ssl, stream_topic, checkpoint, batches=3,
                **{k: v for k, v in options.items() if k != "kafka.bootstrap.servers"})
    plaintext = secured_kafka.service.bootstrap_servers  # the same cluster's internal listener, for the operator tools
    settle_after_stop(spark, plaintext, checkpoint)
    report = audit(_client_config(options), stream_topic, ROWS_PER_BATCH * (written_through(checkpoint) + 1))
    assert (report["duplicates"], report["gaps"], report["lso_pinned"], report["clean"]) == (0, 0, [], True), report
    assert open_transactions(plaintext, sink_prefix(checkpoint)) == []
