"""``transaction.version`` raised from 1 to 2 (KIP-890's transaction protocol, UpdateFeatures as kafka-features does
it) on a real 4.4.0 node while three writers keep writing: the sink's SubtaskWriter and Committer, a DualWriter on
SQLite, and a TwoPhaseProducer of the application's own that never initialises again. Each transaction's protocol
is read twice: as the writer recorded it (the prepared state's ``transaction_version``) and as the broker shows it
(protocol 2's EndTxn bumps the epoch, so DescribeTransactions after the commit shows the prepared epoch + 1; protocol
1's leaves it). Then the read_committed audit: exact, nothing pinned, the DB rows == the Kafka keys.
The second test raises it on a node upgraded in place from 3.9.2, under a sink whose client connected to 3.9.2
(docs/brokers.md, "transaction.version raised under a running job")."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import pytest
from kafka.admin import KafkaAdminClient

from kafka2pc._core import initialization
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.dualwrite import DualWriter
from kafka2pc.errors import Kafka2pcError
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.producer import TwoPhaseProducer
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, SubtaskWriter, recover
from kafka2pc.sink.recovery import RecoveryReport
from kafka2pc.testing.cluster import KafkaService
from kafka2pc.testing.settings import BrokerSettings
from kafka2pc.testing.verify import create_topic, end_offsets, read_records
from kafka2pc.transaction_control import ObservedTransaction, TransactionControl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

#: the kept producers' decision (DualWriter) stands this long here, 30 s in production
DECISION_STANDS_S = 3.0
#: how long a writer may take to switch after the feature is raised: its next initialisation, plus one transaction
SINK_SWITCH_S = 2.0
DUAL_SWITCH_S = DECISION_STANDS_S + 2.0


@attrs.frozen
class Txn:
    """One committed transaction: when it began (monotonic), the protocol its writer recorded, and the epochs it was
    prepared at and DescribeTransactions showed once it was committed."""

    begun: float
    recorded_version: int | None
    prepared_epoch: int
    described_epoch: int

    @property
    def broker_version(self) -> int:
        """Protocol 2's EndTxn bumps the epoch; protocol 1's does not."""
        return 2 if self.described_epoch == self.prepared_epoch + 1 else 1


class Loop:
    """A writer's loop on a thread of its own until ``stop``: ``step`` writes and commits one transaction and returns
    it, or raises (counted under ``errors``, the loop goes on)."""

    def __init__(self, name: str, step: Callable[[], Txn]):
        self.name, self._step = name, step
        self.txns: list[Txn] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():  # bounded by the test's deadline, which sets stop
            try:
                self.txns.append(self._step())
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
                time.sleep(0.2)
            time.sleep(0.02)

    def after(self, since: float) -> list[Txn]:
        return [t for t in self.txns if t.begun >= since]


def _finalized(admin: KafkaAdminClient) -> int:
    """The finalized transaction.version as kafka-python's admin reads it (the test's own look, not kafka2pc's)."""
    finalized = admin.describe_features().get("transaction.version", {}).get("finalized")
    return int(finalized[1]) if finalized else 0


def _set_transaction_version(admin: KafkaAdminClient, level: int) -> float:
    """Finalize ``transaction.version`` at ``level`` (kafka-features' UpdateFeatures); when this look saw it (up to
    one poll after the broker finalized it: a writer may begin under the new level a little before this time, but not
    before UpdateFeatures was sent)."""
    kind = "UPGRADE" if level >= _finalized(admin) else "SAFE_DOWNGRADE"
    assert admin.update_features({"transaction.version": (kind, level)}) == {"transaction.version": "OK"}
    deadline = time.monotonic() + 10
    while _finalized(admin) != level:  # bounded
        assert time.monotonic() < deadline, f"transaction.version not {level} after 10 s"
        time.sleep(0.05)
    return time.monotonic()


class SinkWriter:
    """(a) The sink: a new producer per checkpoint on pooled ids, the committer completing each decision."""

    def __init__(self, config: dict[str, object], client: ClusterClient, control: TransactionControl, *,
                 topic: str, prefix: str, decisions: FileDecisionLog, two_phase_commit: bool = True):
        self.writer = SubtaskWriter(config, prefix, 0, cluster=client, two_phase_commit=two_phase_commit)
        self.committer, self.control, self.topic = Committer(control, decisions), control, topic
        self.committed: list[bytes] = []
        self.checkpoint = 0

    def step(self) -> Txn:
        self.checkpoint += 1
        values = [f"{self.checkpoint}-{i}".encode() for i in range(5)]
        begun = time.monotonic()
        try:
            self.writer.write(self.topic, values)
            prepared = self.writer.prepare(self.checkpoint)
        except Kafka2pcError:
            with contextlib.suppress(Kafka2pcError):
                self.writer.abort()
            raise
        assert prepared is not None
        decision, deadline = Decision(self.checkpoint, [prepared]), time.monotonic() + 60
        while True:  # decided: rolled forward until it is done (a broker restarting), bounded
            try:
                self.writer.release(self.committer.commit(decision))
                break
            except Kafka2pcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.committed.extend(values)
        return _settled(self.control, prepared.transactional_id, begun, prepared.state)


class DualWriting:
    """(b) A DualWriter on SQLite: it keeps its producer between transactions, initialising again once its decision
    is DECISION_STANDS_S old. Its protocol is the one its state row records."""

    def __init__(self, config: dict[str, object], control: TransactionControl, topic: str, database: Path,
                 transactional_id: str):
        with sqlite3.connect(database) as setup:
            setup.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
        self.connection = sqlite3.connect(database, timeout=30, check_same_thread=False)
        self.writer = DualWriter(self.connection, {**config, "transactional.id": transactional_id})
        self.writer.recover()
        self.control, self.topic, self.database, self.id = control, topic, database, transactional_id
        self.order = 0

    def step(self) -> Txn:
        self.order += 1
        begun = time.monotonic()
        with self.writer.transaction() as tx:
            tx.cursor.execute("INSERT INTO orders (id, amount) VALUES (?, 1)", (self.order,))
            tx.produce(self.topic, value=b"x", key=str(self.order).encode())
        prepared, version = self.connection.execute(
            "SELECT prepared_state, transaction_version FROM kafka2pc_dual_write_state WHERE transactional_id = ?",
            (self.id,)).fetchone()
        self.connection.rollback()  # the SELECT's read transaction, if any
        return _settled(self.control, self.id, begun, PreparedTxnState.parse(prepared, transaction_version=version))

    def rows(self) -> list[int]:
        with sqlite3.connect(self.database) as db:
            return [row[0] for row in db.execute("SELECT id FROM orders ORDER BY id")]

    def close(self) -> None:
        self.writer.close()
        self.connection.close()


class OwnProducer:
    """(c) An application's own producer, initialised once, going on transaction after transaction."""

    def __init__(self, config: dict[str, object], client: ClusterClient, control: TransactionControl, topic: str,
                 transactional_id: str):
        self.producer = TwoPhaseProducer({**config, "transactional.id": transactional_id}, two_phase_commit=True,
                                         cluster=client)
        self.producer.init_transactions()
        self.control, self.topic, self.id = control, topic, transactional_id
        self.committed: list[bytes] = []

    def step(self) -> Txn:
        value = f"o{len(self.committed)}".encode()
        begun = time.monotonic()
        self.producer.begin_transaction()
        self.producer.produce(self.topic, value)
        state = self.producer.prepare_transaction()
        self.producer.commit_transaction()
        self.committed.append(value)
        return _settled(self.control, self.id, begun, state)


def _settled(control: TransactionControl, transactional_id: str, begun: float, prepared: PreparedTxnState) -> Txn:
    """The committed transaction as the broker shows it once its markers are written."""
    described = control.wait_until_settled(transactional_id, within_s=10)
    assert described is not None and described.state == "CompleteCommit", described
    return Txn(begun, prepared.transaction_version, prepared.epoch, described.epoch)


def _run(loops: list[Loop], admin: KafkaAdminClient) -> tuple[float, float]:
    """Run the writers at transaction.version 1, raise it to 2, and go on until the sink and the dual writer have
    each begun 3 transactions under protocol 2 past their switch time (bounded); when UpdateFeatures was sent, and
    when the test saw the broker had it at 2."""
    try:
        for loop in loops:
            loop.thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(len(loop.txns) < 3 for loop in loops):  # bounded
            time.sleep(0.05)
        asked = time.monotonic()
        upgraded = _set_transaction_version(admin, 2)
        deadline = upgraded + 25
        while time.monotonic() < deadline and (  # bounded
                time.monotonic() < upgraded + DUAL_SWITCH_S + 1
                or any(len([t for t in loop.after(upgraded + DUAL_SWITCH_S) if t.recorded_version == 2]) < 3
                       for loop in loops[:2])):
            time.sleep(0.05)
        return asked, upgraded
    finally:
        for loop in loops:
            loop.stop.set()
        for loop in loops:
            loop.thread.join(timeout=60)


def _audit(kafka: KafkaService, topic: str, expected: Sequence[object], *, keys: bool = False) -> tuple[int, ...]:
    """(records, duplicates, gaps, records read that were never committed, LSO pinned) of ``topic`` read
    read_committed, against what was committed (values, or keys as ints)."""
    consumed = read_records(kafka, topic)
    seen = [int(r.key or b"") if keys else r.value for r in consumed]
    pinned = end_offsets(kafka, topic, settle_s=5) != end_offsets(kafka, topic, isolation="read_uncommitted")
    seen_set, expected_set = set(seen), set(expected)
    return (len(seen), len(seen) - len(seen_set), len(expected_set - seen_set), len(seen_set - expected_set),
            int(pinned))


def _crash_and_recover(config: dict[str, object], client: ClusterClient, control: TransactionControl,
                       sink: SinkWriter, crashed_id: str) -> tuple[PreparedTxnState, RecoveryReport,
                                                                   ObservedTransaction | None]:
    """A subtask that dies after the upgrade with its transaction prepared and no decision, and the recovery, by the
    control that has been running since transaction.version was 1: what was prepared, what the recovery did, and
    what the id shows after it."""
    crashed = TwoPhaseProducer({**config, "transactional.id": crashed_id}, two_phase_commit=True, cluster=client)
    crashed.init_transactions()
    crashed.begin_transaction()
    crashed.produce(sink.topic, b"never")
    crashed_state = crashed.prepare_transaction()  # then the process is gone: nothing closes it
    recovery = recover(control, sink.writer.pool.prefix, sink.committer.decision_log)
    return crashed_state, recovery, control.wait_until_settled(crashed_id, within_s=10)


def test_transaction_version_raised_from_1_to_2_under_running_writers_stays_exact(
        kafka_factory, tmp_path, monkeypatch):
    monkeypatch.setattr(initialization, "DECISION_STANDS_S", DECISION_STANDS_S)
    kafka = kafka_factory(BrokerSettings())  # 4.4.0, two-phase commit on, transaction.version 2 as formatted
    config = dict(kafka.client_config)
    sink_topic, dual_topic, own_topic = (create_topic(kafka, partitions=2) for _ in range(3))
    prefix, dual_id, own_id = (f"{name}{uuid.uuid4().hex[:6]}" for name in ("tvs", "tvd", "tvo"))
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    client = ClusterClient(ClientConfig.from_dict(config))
    _set_transaction_version(admin, 1)
    control = TransactionControl(client)  # one control for the whole run, as a streaming job's driver has
    decisions = FileDecisionLog(tmp_path / "decisions", prefix)
    sink = SinkWriter(config, client, control, topic=sink_topic, prefix=prefix, decisions=decisions)
    dual = DualWriting(config, control, dual_topic, tmp_path / "app.db", dual_id)
    own = OwnProducer(config, client, control, own_topic, own_id)
    loops = [Loop("sink", sink.step), Loop("dual", dual.step), Loop("own", own.step)]
    asked, upgraded = _run(loops, admin)
    own.producer.close()
    dual.close()
    sink.writer.close()
    crashed_id = f"{prefix}-0-{sink.writer.pool.max_live + 7}"  # an id of the prefix the writer never took
    crashed_state, recovery, after_recovery = _crash_and_recover(config, client, control, sink, crashed_id)
    left_open = [t.transactional_id for t in control.list(states=["Ongoing"])
                 if t.transactional_id.startswith((prefix, dual_id, own_id))]
    client.close()
    admin.close()

    print(f"\ntransaction.version 1 -> 2 at t=0 (UpdateFeatures); DECISION_STANDS_S={DECISION_STANDS_S:g}")
    for loop in loops:
        v2 = [t for t in loop.txns if t.recorded_version == 2]
        first = f"{v2[0].begun - upgraded:+.2f} s" if v2 else "never"
        print(f"  {loop.name}: {len(loop.txns)} transactions ({len(loop.after(upgraded))} begun after), "
              f"{len(loop.txns) - len(v2)} under protocol 1, {len(v2)} under 2, the first begun at {first}; "
              f"broker's view agrees: {all(t.broker_version == t.recorded_version for t in loop.txns)}; "
              f"errors {loop.errors}")
    print(f"  a subtask's transaction prepared under protocol 2 ({crashed_state}) and left undecided: recovery "
          f"aborted {recovery.aborted}; the id now {after_recovery}")
    for loop in loops:
        before = [t for t in loop.txns if t.begun < asked]
        assert len(before) >= 3 and {(t.recorded_version, t.broker_version) for t in before} == {(1, 1)}, \
            (loop.name, before)
        # what the writer recorded is what the broker ran: the commit of a recorded 1 never bumped, of a 2 always
        assert all(t.broker_version == t.recorded_version for t in loop.txns), (loop.name, loop.txns)
        assert loop.errors == [], loop.name
    sink_loop, dual_loop, own_loop = loops
    # the sink initialises a producer per checkpoint: protocol 2 from its first checkpoint once the feature is raised
    assert {t.recorded_version for t in sink_loop.after(upgraded + SINK_SWITCH_S)} == {2}, sink_loop.txns
    # the dual writer once its decision no longer stands (one recovery and a new producer)
    assert {t.recorded_version for t in dual_loop.after(upgraded + DUAL_SWITCH_S)} == {2}, dual_loop.txns
    assert len(dual_loop.after(upgraded + DUAL_SWITCH_S)) >= 3
    # a producer that never initialises again goes on with the protocol it learnt, and stays exact
    assert {t.recorded_version for t in own_loop.txns} == {1}
    assert crashed_state.transaction_version == 2
    assert (recovery.stuck, recovery.aborted) == ((), (crashed_id,)), recovery
    # aborted, and its writer fenced: a later epoch (the audit shows its record never became visible)
    assert after_recovery is not None and after_recovery.state in ("CompleteAbort", "Empty") and \
        after_recovery.epoch > crashed_state.epoch, after_recovery
    assert left_open == []

    rows = dual.rows()
    figures = {"sink": _audit(kafka, sink_topic, sink.committed), "own": _audit(kafka, own_topic, own.committed),
               "dual": _audit(kafka, dual_topic, rows, keys=True)}
    print("  read_committed audit (records, duplicates, gaps, never committed, LSO pinned): "
          + ", ".join(f"{name} {figure}" for name, figure in figures.items()) + f"; DB rows {len(rows)}")
    for name, (_, *faults) in figures.items():
        assert faults == [0, 0, 0, 0], (name, figures[name])
    assert figures["dual"][0] == len(rows)  # DB rows == Kafka keys


@pytest.mark.timeout(300)
def test_a_sink_that_connected_to_3_9_follows_transaction_version_raised_after_an_in_place_upgrade(
        kafka_factory, tmp_path):
    """The sink's writer without two-phase commit (the versions a client holds are read again by nothing else) runs
    on 3.9.2, through an in-place restart onto 4.4.0, then metadata.version and transaction.version are raised:
    protocol 2 from the first checkpoint after, exact (about 13 s). Before KafkaTransport.cluster_facts read the
    versions again, it stayed on protocol 1 (Produce v11, learnt on 3.9.2) for ever."""
    kafka = kafka_factory(BrokerSettings(version="3.9.2"))
    if not hasattr(kafka, "restart_with"):
        pytest.skip(f"restarting a node on another release needs the local backend, not {kafka.backend}")
    config = dict(kafka.client_config)
    topic, prefix = create_topic(kafka, partitions=2), f"tvu{uuid.uuid4().hex[:6]}"
    client = ClusterClient(ClientConfig.from_dict(config))
    control = TransactionControl(client)
    decisions = FileDecisionLog(tmp_path / "decisions", prefix)
    sink = SinkWriter(config, client, control, topic=topic, prefix=prefix, decisions=decisions,
                      two_phase_commit=False)
    loop = Loop("sink", sink.step)
    try:
        loop.thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(loop.txns) < 3:  # bounded
            time.sleep(0.05)
        kafka.restart_with(BrokerSettings(version="4.4.0", two_phase_commit=False))  # same log directory
        back = time.monotonic()
        deadline = back + 60
        while time.monotonic() < deadline and len(loop.after(back)) < 3:  # bounded
            time.sleep(0.05)
        with contextlib.closing(KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)) as admin:
            newest = admin.describe_features()["metadata.version"]["supported"][1]
            assert admin.update_features({"metadata.version": newest}) == {"metadata.version": "OK"}
            asked = time.monotonic()
            upgraded = _set_transaction_version(admin, 2)
        deadline = upgraded + 30
        while time.monotonic() < deadline and len(  # bounded
                [t for t in loop.after(upgraded + SINK_SWITCH_S) if t.recorded_version == 2]) < 5:
            time.sleep(0.05)
    finally:
        loop.stop.set()
        loop.thread.join(timeout=90)
    sink.writer.close()
    recovery = recover(control, prefix, decisions)
    client.close()

    v2 = [t for t in loop.txns if t.recorded_version == 2]
    figures = _audit(kafka, topic, sink.committed)
    print(f"\n3.9.2 -> 4.4.0 in place, then transaction.version 2 at t=0: {len(loop.txns)} transactions, "
          f"{len(loop.after(back))} after the restart, {len(v2)} under protocol 2, the first begun at "
          f"{f'{v2[0].begun - upgraded:+.2f} s' if v2 else 'never'}; broker's view agrees: "
          f"{all(t.broker_version == t.recorded_version for t in loop.txns)}; errors during the restart: "
          f"{len(loop.errors)}; recovery aborted {len(recovery.aborted)}; read_committed audit (records, "
          f"duplicates, gaps, never committed, LSO pinned): {figures}")
    # begun before UpdateFeatures was sent: protocol 1 (one begun between it and the test's look may have 2: in CI,
    # the first was begun 0.01 s before the look)
    assert {t.recorded_version for t in loop.txns if t.begun < asked} == {1}
    assert len(loop.after(back)) >= 3  # protocol 1 on 4.4.0 before the feature is raised
    assert {t.recorded_version for t in loop.after(upgraded + SINK_SWITCH_S)} == {2}, loop.txns
    assert len(v2) >= 5
    assert all(t.broker_version == t.recorded_version for t in loop.txns), loop.txns
    assert recovery.stuck == ()
    assert figures[1:] == (0, 0, 0, 0), figures
