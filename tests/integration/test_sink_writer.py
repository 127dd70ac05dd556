"""The writer/committer cycle in one process, the live-id cap, and the metrics that show it."""

import uuid

import pytest

from kafka2pc import metrics
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import IdPoolExhaustedError
from kafka2pc.sink.integration import Committer, Decision, FileDecisionLog, SubtaskWriter
from kafka2pc.testing.verify import read_records, values
from kafka2pc.transaction_control import TransactionControl

pytestmark = pytest.mark.integration


def test_cap_on_live_ids_raises_and_shows_in_metrics(kafka, topic_factory, tmp_path):
    prefix = f"cap{uuid.uuid4().hex[:6]}"
    labels = {"prefix": prefix, "subtask": "0"}
    topic = topic_factory(kafka)
    with ClusterClient(ClientConfig.for_bootstrap(kafka.bootstrap_servers)) as client:
        writer = SubtaskWriter({"bootstrap.servers": kafka.bootstrap_servers}, prefix, 0, cluster=client,
                               max_live_ids=2)
        committer = Committer(TransactionControl(client), FileDecisionLog(tmp_path, prefix))
        assert metrics.sample("kafka2pc_sink_live_transactional_ids_max", **labels) == 2
        pending = []
        for checkpoint in (1, 2):  # the committer is "stuck": nothing is completed
            writer.write(topic, [f"c{checkpoint}".encode()])
            pending.append(writer.prepare(checkpoint))
        assert metrics.sample("kafka2pc_sink_live_transactional_ids", **labels) == 2
        with pytest.raises(IdPoolExhaustedError, match="already has 2 transactional ids in use"):
            writer.write(topic, [b"c3"])
        assert metrics.sample("kafka2pc_sink_id_pool_exhausted_total", **labels) == 1

        committed_before = metrics.sample("kafka2pc_transactions_ended_total", outcome="committed") or 0
        for checkpoint, prepared in zip((1, 2), pending, strict=True):
            writer.release(committer.commit(Decision(checkpoint, [prepared])))
        assert metrics.sample("kafka2pc_transactions_ended_total", outcome="committed") == committed_before + 2
        assert metrics.sample("kafka2pc_sink_live_transactional_ids", **labels) == 0
        writer.write(topic, [b"c3"])  # ids are free again: the cycle continues on a reused id
        writer.release(committer.commit(Decision(3, [writer.prepare(3)])))
        assert writer.pool.known_ids == [f"{prefix}-0-0", f"{prefix}-0-1"]
    assert values(read_records(kafka.bootstrap_servers, topic)) == [b"c1", b"c2", b"c3"]
    assert b"kafka2pc_sink_id_pool_exhausted_total" in metrics.render()
