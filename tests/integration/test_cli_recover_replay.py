"""`kafka2pc recover --resolve N --replay` on a real broker: a checkpoint whose transactions were all aborted is
abandoned and its replay commits; one with a committed transaction is refused, and nothing is ended."""

import subprocess
import sys
import uuid

import pytest

from kafka2pc import TwoPhaseProducer
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, PreparedTransaction
from kafka2pc.testing.verify import read_records, values
from kafka2pc.transaction_control import TransactionControl

pytestmark = pytest.mark.integration


def prepare(bootstrap: str, topic: str, txn_id: str, value: bytes, checkpoint: int) -> PreparedTransaction:
    with TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id}, two_phase_commit=True) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, value, partition=0)
        state = p.prepare_transaction()
    return PreparedTransaction(txn_id, state, int(txn_id.split("-")[-2]), checkpoint)


def recover_cli(bootstrap: str, log_dir: str, prefix: str, checkpoint: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafka2pc.cli", "recover", "--bootstrap", bootstrap, "--log-dir",
                           log_dir, "--prefix", prefix, "--resolve", str(checkpoint), "--reason", "rows lost",
                           "--replay"], capture_output=True, text=True, timeout=180, check=False)


def test_recover_replay_abandons_a_lost_checkpoint_and_refuses_a_committed_one(kafka, topic_factory, tmp_path):
    bootstrap, topic, prefix = kafka.bootstrap_servers, topic_factory(kafka), f"rp{uuid.uuid4().hex[:6]}"
    log = FileDecisionLog(tmp_path, prefix)
    with ClusterClient(ClientConfig.for_bootstrap(bootstrap)) as client:
        control = TransactionControl(client)
        lost = prepare(bootstrap, topic, f"{prefix}-0-0", b"lost", 1)
        log.record(Decision(1, [lost]))
        control.abort(lost.transactional_id, lost.state)  # as a broker timeout does without two-phase commit
        done = recover_cli(bootstrap, str(tmp_path), prefix, 1)
        assert done.returncode == 0, done.stdout + done.stderr
        assert log.decision(1) is None
        Committer(control, log).commit(Decision(1, [prepare(bootstrap, topic, f"{prefix}-0-1", b"replayed", 1)]))

        committed, open_ = (prepare(bootstrap, topic, f"{prefix}-{p}-2", v, 2) for p, v in ((0, b"in"), (1, b"open")))
        log.record(Decision(2, [committed, open_]))
        control.commit(committed.transactional_id, committed.state)  # its committer died after this one
        refused = recover_cli(bootstrap, str(tmp_path), prefix, 2)
        assert refused.returncode == 1 and "committed" in refused.stderr, refused.stdout + refused.stderr
        assert log.decision(2) is not None and control.describe(open_.transactional_id).state == "Ongoing"
        Committer(control, log).roll_forward(log.decision(2))  # nothing was ended: the decision still completes
    assert sorted(values(read_records(bootstrap, topic))) == [b"in", b"open", b"replayed"]
