"""A broker's two-phase commit turned on, then off, under a running writer, on a real 4.4.0 node restarted on its own
log directory: the sink's writer and committer switch to Enable2Pc (DescribeTransactions shows
TransactionTimeoutMs 2147483647) within a minute, without a new client, and the data stays exact; and what the
broker does with a prepared two-phase transaction when two-phase commit is turned off (docs/brokers.md). ``make
chaos`` (KAFKA2PC_UPGRADE_SPARK=1) also runs the Spark streaming job through an in-place upgrade 3.9.2 -> 4.4.0."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from kafka2pc._core.initialization import VERSIONS_MAX_AGE_S
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import Kafka2pcError
from kafka2pc.producer import TwoPhaseProducer
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, SubtaskWriter, recover
from kafka2pc.testing.settings import BrokerSettings
from kafka2pc.testing.verify import create_topic, read_records
from kafka2pc.transaction_control import TransactionControl

pytestmark = pytest.mark.integration

TWO_PHASE_TIMEOUT_MS = 2**31 - 1
FALLBACK_TIMEOUT_MS = 900_000
#: the broker looks for timed-out transactions every second (10 s by default)
QUICK_REAPER = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}


def _node_control(kafka):
    if not hasattr(kafka, "restart_with"):
        pytest.skip(f"restarting a node with other settings needs the local backend, not {kafka.backend}")
    return kafka


class RunningSink:
    """The sink's writer and committer in a loop on one client, as a streaming job's subtask and driver: one
    checkpoint after another, each transaction's DescribeTransactions taken while it is prepared."""

    def __init__(self, kafka, client: ClusterClient, topic: str, prefix: str, log_dir):
        self.control = TransactionControl(client)
        self.decisions = FileDecisionLog(log_dir, prefix)
        self.writer = SubtaskWriter(kafka.client_config, prefix, 0, cluster=client)
        self.committer = Committer(self.control, self.decisions)
        self.topic, self.prefix = topic, prefix
        #: (monotonic time its producer was opened, transactional id, TransactionTimeoutMs while prepared)
        self.seen: list[tuple[float, str, int]] = []
        self.committed: list[bytes] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        checkpoint = 0
        while not self.stop.is_set():  # bounded by the test's deadline, which sets stop
            checkpoint += 1
            values = [f"{checkpoint}-{i}".encode() for i in range(5)]
            begun = time.monotonic()
            try:
                self.writer.write(self.topic, values)
                prepared = self.writer.prepare(checkpoint)
            except Kafka2pcError as exc:  # the broker restarting: this checkpoint writes nothing
                self.errors.append(f"write: {type(exc).__name__}")
                with contextlib.suppress(Kafka2pcError):  # left open, the final recovery aborts it
                    self.writer.abort()
                time.sleep(0.2)
                continue
            assert prepared is not None
            try:
                described = self.control.describe_full(prepared.transactional_id)
                self.seen.append((begun, prepared.transactional_id, described.timeout_ms))
            except Kafka2pcError as exc:
                self.errors.append(f"describe: {type(exc).__name__}")
            self._commit(Decision(checkpoint, [prepared]))
            self.committed += values

    def _commit(self, decision: Decision) -> None:
        deadline = time.monotonic() + 60
        while True:  # decided: rolled forward until it is done (bounded)
            try:
                self.writer.release(self.committer.commit(decision))
                return
            except Kafka2pcError as exc:
                self.errors.append(f"commit: {type(exc).__name__}")
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def two_phase_after(self, since: float) -> list[tuple[float, str, int]]:
        return [entry for entry in self.seen if entry[0] >= since and entry[2] == TWO_PHASE_TIMEOUT_MS]


def test_a_running_sink_writes_two_phase_transactions_within_a_minute_of_the_broker_gaining_it(
        kafka_factory, tmp_path):
    kafka = _node_control(kafka_factory(BrokerSettings(two_phase_commit=False)))  # InitProducerId up to v5
    topic = create_topic(kafka, partitions=2)
    prefix = f"gain{uuid.uuid4().hex[:6]}"
    with ClusterClient(ClientConfig.from_dict(kafka.client_config)) as client:
        sink = RunningSink(kafka, client, topic, prefix, tmp_path)
        sink.thread.start()
        deadline = time.monotonic() + 30
        while len(sink.seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = list(sink.seen)
        kafka.restart_with(BrokerSettings(two_phase_commit=True))  # on the same log directory
        back = time.monotonic()
        deadline = back + 60
        while time.monotonic() < deadline and len(sink.two_phase_after(back)) < 3:
            time.sleep(0.2)
        sink.stop.set()
        sink.thread.join(timeout=90)
        recover(sink.control, prefix, sink.decisions)  # whatever the restart left open is aborted

    assert before and {timeout for _, _, timeout in before} == {FALLBACK_TIMEOUT_MS}, before
    switched = sink.two_phase_after(back)
    assert len(switched) >= 3, (sink.seen, sink.errors)
    assert switched[0][0] - back < 60
    # from the moment the client's versions were old enough to be read again, every transaction was two-phase
    assert all(timeout == TWO_PHASE_TIMEOUT_MS for begun, _, timeout in sink.seen
               if begun > back + VERSIONS_MAX_AGE_S + 1), sink.seen
    consumed = [record.value for record in read_records(kafka, topic)]
    assert sorted(consumed) == sorted(sink.committed) and len(set(consumed)) == len(consumed)
    print(f"before the restart: {len(before)} transactions at {FALLBACK_TIMEOUT_MS}; first two-phase one begun "
          f"{switched[0][0] - back:.1f} s after the broker was back; {len(sink.seen)} transactions, "
          f"{len(consumed)} records exact; errors during the restart: {sink.errors}")


def test_two_phase_commit_turned_off_leaves_prepared_transactions_open_and_kafka2pc_says_so(
        kafka_factory, caplog):
    """Measured: the broker neither aborts nor times out a transaction prepared with Enable2Pc when two-phase commit
    is turned off (it stays Ongoing, TransactionTimeoutMs 2147483647); EndTxn still completes it. A running client's
    next producer falls back, with an ERROR that names transaction.two.phase.commit.enable."""
    kafka = _node_control(kafka_factory(BrokerSettings(two_phase_commit=True, extra=QUICK_REAPER)))
    topic = create_topic(kafka)
    config = kafka.client_config
    with ClusterClient(ClientConfig.from_dict(config)) as client:
        control = TransactionControl(client)
        states = {}
        for txn_id in ("off-commit", "off-abort"):
            producer = TwoPhaseProducer({**config, "transactional.id": txn_id}, two_phase_commit=True,
                                        cluster=client)
            producer.init_transactions()
            producer.begin_transaction()
            producer.produce(topic, txn_id.encode())
            states[txn_id] = producer.prepare_transaction()
            producer.close()
        # InitProducerId v6 no longer advertised
        kafka.restart_with(BrokerSettings(two_phase_commit=False, extra=QUICK_REAPER))
        time.sleep(3)  # the broker's timed-out-transaction check ran
        for txn_id in states:
            description = control.describe_full(txn_id)
            assert (description.state, description.timeout_ms) == ("Ongoing", TWO_PHASE_TIMEOUT_MS)
        with caplog.at_level(logging.ERROR, logger="kafka2pc.producer"):
            producer = TwoPhaseProducer({**config, "transactional.id": "off-new"}, two_phase_commit=True,
                                        cluster=client)  # the running client still holds v6
            producer.init_transactions()
            active = producer.two_phase_commit_active
            producer.close()
        assert control.commit("off-commit", states["off-commit"]).outcome.value == "committed"
        assert control.abort("off-abort", states["off-abort"]).outcome.value == "aborted"
    assert not active
    loud = [r for r in caplog.records if r.levelno == logging.ERROR and "transaction.two.phase.commit.enable"
            in r.getMessage() and "off-new" in r.getMessage()]
    assert len(loud) == 1, [r.getMessage() for r in caplog.records]
    assert [record.value for record in read_records(kafka, topic)] == [b"off-commit"]


#: ``make chaos``: the Spark streaming job through an in-place upgrade 3.9.2 -> 4.4.0 with two-phase commit on
UPGRADE_SPARK = os.environ.get("KAFKA2PC_UPGRADE_SPARK", "") not in ("", "0")
SPARK_JOB = Path(__file__).resolve().parents[2] / "examples" / "spark_job.py"


class TransactionWatch:
    """Every transaction open under a sink's prefix, described while it is open (polled on a client of its own):
    ``(start time in s since the epoch, id, TransactionTimeoutMs)`` per transaction (id, producer id, epoch).
    ``grammar_of(prefix)`` says which ids are watched (``.owns(id)``): the sink's grammar by default."""

    def __init__(self, kafka, prefix_of, grammar_of=None):
        from kafka2pc.sink.integration import TransactionalIdGrammar  # noqa: PLC0415

        self._grammar_of = grammar_of or TransactionalIdGrammar
        self._kafka, self._prefix_of = kafka, prefix_of
        self.seen: dict[tuple[str, int, int], tuple[float, str, int]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with ClusterClient(ClientConfig.from_dict(self._kafka.client_config)) as client:
            control = TransactionControl(client)
            while not self.stop.wait(0.3):  # until the test stops it
                prefix = self._prefix_of()
                if prefix is None:
                    continue
                grammar = self._grammar_of(prefix)
                try:
                    listed = [t.transactional_id for t in control.list(states=["Ongoing"])
                              if grammar.owns(t.transactional_id)]
                    for txn_id in listed:
                        found = control.describe_full(txn_id)
                        if found is not None and found.state == "Ongoing":
                            self.seen.setdefault((txn_id, found.producer_id, found.epoch),
                                                 (found.start_time_ms / 1000, txn_id, found.timeout_ms))
                except Kafka2pcError:
                    continue  # the broker restarting


@pytest.mark.skipif(not UPGRADE_SPARK, reason="make chaos (KAFKA2PC_UPGRADE_SPARK=1): a Spark job through an upgrade")
@pytest.mark.timeout(900)
def test_a_spark_job_switches_to_two_phase_commit_through_an_in_place_upgrade(kafka_factory, tmp_path):
    pytest.importorskip("pyspark")
    from kafka2pc_harness.spark import run_driver  # noqa: PLC0415

    from .spark_support import audit, open_transactions, produce_orders, sink_prefix  # noqa: PLC0415

    kafka = _node_control(kafka_factory(BrokerSettings(version="3.9.2")))
    bootstrap = kafka.bootstrap_servers
    source, sink = create_topic(kafka, partitions=3), create_topic(kafka, partitions=3)
    checkpoint = tmp_path / "checkpoint"
    orders = 3000
    produce_orders(bootstrap, source, 0, orders)  # a backlog that keeps the job busy through the upgrade
    job_args = ["--bootstrap", bootstrap, "--source", source, "--sink", sink, "--checkpoint", str(checkpoint),
                "--batch-size", "15", "--trigger-seconds", "0.5"]
    driver = run_driver(SPARK_JOB, job_args, log_dir=tmp_path / "run")

    def prefix() -> str | None:
        try:
            return sink_prefix(checkpoint)
        except AssertionError:  # not pinned yet
            return None

    watch = TransactionWatch(kafka, prefix)
    try:
        driver.wait_for_line(r"^batch \d+:", timeout_s=240)
        watch.thread.start()
        time.sleep(25)  # transactions on 3.9.2 for the watch to see: those begun 15 s or more before it is back
        kafka.restart_with(BrokerSettings(version="4.4.0", two_phase_commit=True))  # in place: same log directory
        back = time.time()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and driver.returncode is None:
            time.sleep(1)
        alive = driver.returncode is None
    finally:
        watch.stop.set()
        watch.thread.join(timeout=30)
        driver.kill_group()
    assert alive, driver.output_tail()
    final = run_driver(SPARK_JOB, [*job_args, "--until-caught-up"], log_dir=tmp_path / "final")
    assert final.wait(timeout_s=400) == 0, final.output_tail()

    seen = sorted(watch.seen.values())
    before = [timeout for started, _, timeout in seen if started < back - 15]
    after = [(started - back, timeout) for started, _, timeout in seen if started > back]
    two_phase = [delay for delay, timeout in after if timeout == TWO_PHASE_TIMEOUT_MS]
    print(f"\nbefore the upgrade: {len(before)} transactions seen, timeouts {sorted(set(before))}; after: "
          f"{len(after)} seen, {len(two_phase)} two-phase, the first begun {min(two_phase, default=-1):.1f} s after "
          f"the broker was back; after {VERSIONS_MAX_AGE_S + 20:g} s: "
          f"{sorted({t for d, t in after if d > VERSIONS_MAX_AGE_S + 20})}")
    assert before and set(before) == {FALLBACK_TIMEOUT_MS}
    assert two_phase and min(two_phase) < 60
    assert {timeout for delay, timeout in after if delay > VERSIONS_MAX_AGE_S + 20} == {TWO_PHASE_TIMEOUT_MS}
    report = audit(bootstrap, sink, orders)
    assert (report["records"], report["duplicates"], report["gaps"], report["outside_range"]) == (orders, 0, 0, 0)
    assert report["lso_pinned"] == [] and report["clean"]
    assert open_transactions(bootstrap, sink_prefix(checkpoint)) == []
