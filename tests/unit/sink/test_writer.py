"""SubtaskWriter, Committer and recover() together, against the coordinator model: the sink core runs on any
transport, not only a real cluster."""

from __future__ import annotations

import logging

from kafka2pc.sink.integration import Committer, FileDecisionLog, SubtaskWriter, TransactionalIdPool, recover
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport

logging.getLogger("kafka2pc").setLevel(logging.ERROR)


def test_the_sink_core_runs_against_the_coordinator_model(tmp_path):
    transport = ModelTransport(CoordinatorModel(transaction_version=2, two_phase_enabled=True), Faults())
    control = TransactionControl(transport)
    committer = Committer(control, FileDecisionLog(tmp_path, "job"))
    writers = [SubtaskWriter({"bootstrap.servers": "m:1"}, "job", subtask, cluster=transport) for subtask in (0, 1)]
    for checkpoint in (1, 2, 3):
        for writer in writers:
            writer.write("t", [f"{checkpoint}-{writer.pool.subtask}".encode()], partition=0)
        prepared = [txn for writer in writers if (txn := writer.prepare(checkpoint)) is not None]
        settlement = committer.settle(checkpoint, prepared)
        for writer in writers:
            writer.release(settlement.committed)
    assert sorted(transport.model.committed_records()) == sorted(f"{c}-{s}".encode() for c in (1, 2, 3)
                                                                 for s in (0, 1))
    assert writers[0].pool == TransactionalIdPool("job", 0, next_counter=1, free=(0,))  # one id, pooled
    writers[0].write("t", [b"crashed"], partition=0)  # a crash with a transaction open: recovery aborts it
    report = recover(control, "job", committer.decision_log)
    assert report.aborted == ("job-0-0",) and transport.model.open_transactions() == []
