"""A running writer follows the cluster's two-phase commit, both ways, against the coordinator model: the sink's
writer and committer, and a dual writer. The transport keeps the ApiVersions it learnt first, as kafka-python does,
until it is asked to read them again (ReadClusterFacts): without that, an upgraded cluster is never used."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from kafka2pc._core.initialization import DECISION_STANDS_S, VERSIONS_MAX_AGE_S
from kafka2pc._core.messages import ClusterFacts, FactsAnswer, ReadClusterFacts
from kafka2pc.dualwrite import DualWriter
from kafka2pc.dualwrite import writer_parts as dual_writer
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, SubtaskWriter
from kafka2pc.transaction_control import TransactionControl

from .coordinator import TWO_PC_TIMEOUT, CoordinatorModel, ModelTransport

CONFIG = {"bootstrap.servers": "model:9092", "linger.ms": 0}


class KeptVersions(ModelTransport):
    """The model behind a client that keeps the ApiVersions it learnt when it connected (kafka-python's clamp):
    InitProducerId v6 is seen only once ReadClusterFacts reads them again."""

    def __init__(self, model: CoordinatorModel):
        super().__init__(model)
        self.learnt = self._advertised()
        self.read_at: float | None = None
        self.reads = 0

    def _advertised(self) -> int:
        return 6 if self.model.two_phase_enabled else 5

    def cluster_facts(self) -> ClusterFacts:
        age = None if self.read_at is None else self.clock - self.read_at
        return ClusterFacts(self.learnt, self.model.transaction_version, versions_age_s=age)

    def execute(self, transactional_id, command):
        if isinstance(command, ReadClusterFacts):
            self.sent.append(command)
            self.reads += 1
            self.learnt, self.read_at = self._advertised(), self.clock
            return FactsAnswer(self.cluster_facts())
        return super().execute(transactional_id, command)


def timeouts(transport: ModelTransport, transactional_ids) -> list[int]:
    control = TransactionControl(transport)
    return [control.describe_full(txn_id).timeout_ms for txn_id in transactional_ids]


@pytest.mark.parametrize("version", [1, 2])
def test_the_sinks_writer_uses_two_phase_commit_once_the_cluster_gains_it(tmp_path, version):
    model = CoordinatorModel(transaction_version=version, two_phase_enabled=False)
    transport = KeptVersions(model)
    writer = SubtaskWriter(CONFIG, "up", 0, cluster=transport)
    committer = Committer(TransactionControl(transport), FileDecisionLog(tmp_path, "up"))
    prepared_timeouts = []

    def checkpoint(number):
        writer.write("t", [f"v{number}".encode()])
        prepared = writer.prepare(number)
        prepared_timeouts.append(timeouts(transport, [prepared.transactional_id])[0])
        writer.release(committer.commit(Decision(number, [prepared])))

    for number in (1, 2):
        checkpoint(number)
    model.two_phase_enabled = True  # the upgrade: the brokers now advertise InitProducerId v6 and accept Enable2Pc
    checkpoint(3)  # the versions were read at checkpoint 1, a moment ago: this one still falls back
    transport.clock += VERSIONS_MAX_AGE_S + 1
    for number in (4, 5):
        checkpoint(number)
    assert prepared_timeouts == [900_000] * 3 + [TWO_PC_TIMEOUT] * 2
    assert transport.reads == 2  # at the first fallback, then once they were old
    assert model.committed_records() == [f"v{n}".encode() for n in range(1, 6)]
    assert model.open_transactions() == []


def order(writer: DualWriter, number: int) -> None:
    with writer.transaction() as tx:
        tx.cursor.execute("INSERT INTO orders VALUES (?)", (number,))
        tx.produce("t", value=str(number).encode(), partition=0)


@pytest.mark.parametrize("gains", [True, False])
def test_a_dual_writer_follows_the_cluster_once_its_decision_is_old(tmp_path, monkeypatch, caplog, gains):
    """It gains two-phase commit (an upgrade), or loses it (turned off); the transactions in between are exact."""
    clock = [1000.0]
    monkeypatch.setattr(dual_writer, "_now", lambda: clock[0])
    model = CoordinatorModel(transaction_version=2, two_phase_enabled=not gains)
    transport = KeptVersions(model)
    connection = sqlite3.connect(tmp_path / "db.sqlite")
    connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    connection.commit()
    writer = DualWriter(connection, {**CONFIG, "transactional.id": "dw"}, transport=transport)
    order(writer, 1)
    before = writer.two_phase_commit_active
    model.two_phase_enabled = gains
    transport.clock += VERSIONS_MAX_AGE_S + 1
    order(writer, 2)  # its decision stands: the producer goes on as it was
    during = writer.two_phase_commit_active
    clock[0] += DECISION_STANDS_S
    with caplog.at_level(logging.ERROR, logger="kafka2pc.producer"):
        order(writer, 3)
    assert (before, during, writer.two_phase_commit_active) == (not gains, not gains, gains)
    assert timeouts(transport, ["dw"]) == [TWO_PC_TIMEOUT if gains else 900_000]
    turned_off = [r for r in caplog.records if "transaction.two.phase.commit.enable=false" in r.getMessage()]
    assert len(turned_off) == (0 if gains else 1)
    assert model.committed_records() == [b"1", b"2", b"3"]
    assert [row[0] for row in connection.execute("SELECT id FROM orders ORDER BY id")] == [1, 2, 3]
    assert model.open_transactions() == []
    writer.close()
