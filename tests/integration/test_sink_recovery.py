"""The sink core under crashes: decided checkpoints exactly once, undecided ones never, nothing left open, few ids."""

import json
import uuid
from collections import defaultdict

import pytest

from kafka2pc import abort_lingering
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import DecisionLogCorruptError
from kafka2pc.sink.integration import FileDecisionLog, TransactionalIdGrammar, recover
from kafka2pc.testing.verify import end_offsets, read_records
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl
from tests.integration.sink_support import leave_lingering, run_with_crashes, workload_command

pytestmark = pytest.mark.integration


@pytest.fixture(params=["newest", "pre2pc"])
def broker(request):
    return request.getfixturevalue("kafka" if request.param == "newest" else "kafka_pre2pc")


def control_for(bootstrap: str) -> tuple[ClusterClient, TransactionControl]:
    client = ClusterClient(ClientConfig.for_bootstrap(bootstrap))
    return client, TransactionControl(client)


def ids_of(control: TransactionControl, prefix: str, states=()) -> list[str]:
    grammar = TransactionalIdGrammar(prefix)
    return [t.transactional_id for t in control.list(states=states) if grammar.owns(t.transactional_id)]


def check_exactly_once(bootstrap: str, topic: str, log: FileDecisionLog, *, checkpoints: int, subtasks: int,
                       records: int) -> None:
    seen = defaultdict(list)
    for record in read_records(bootstrap, topic, timeout_s=120):
        body = json.loads(record.value)
        seen[body["c"]].append(body)
    assert sorted(seen) == list(range(1, checkpoints + 1))
    for checkpoint, bodies in seen.items():
        decided_attempt = log.decision(checkpoint).metadata["attempt"]
        assert {b["a"] for b in bodies} == {decided_attempt}, f"checkpoint {checkpoint}: undecided attempt visible"
        keys = [(b["s"], b["i"]) for b in bodies]
        assert sorted(keys) == [(s, i) for s in range(subtasks) for i in range(records)], \
            f"checkpoint {checkpoint}: records missing or duplicated"


@pytest.mark.parametrize(("checkpoints", "crashes"), [(200, 20)])
def test_pooling_workload_survives_random_crashes(kafka, topic_factory, tmp_path, checkpoints, crashes):
    prefix, subtasks = f"chaos{uuid.uuid4().hex[:6]}", 4
    topic = topic_factory(kafka, partitions=4)
    log_dir = tmp_path / "decisions"
    cmd = workload_command(kafka.bootstrap_servers, prefix, topic, log_dir, subtasks=subtasks,
                           checkpoints=checkpoints, records=5)
    killed, events = run_with_crashes(cmd, crashes=crashes, seed=939)
    assert killed == crashes, f"only {killed} of {crashes} runs were killed before finishing"
    assert any(e["event"] == "finished" for e in events)
    rolled = sum(len(e["rolled_forward"]) for e in events if e["event"] == "recovered")
    aborted = sum(len(e["aborted"]) for e in events if e["event"] == "recovered")
    print(f"\n{killed} kills, {rolled} checkpoints rolled forward, {aborted} lingering transactions aborted")

    log = FileDecisionLog(log_dir, prefix, retain_done=None)
    check_exactly_once(kafka.bootstrap_servers, topic, log, checkpoints=checkpoints, subtasks=subtasks, records=5)
    client, control = control_for(kafka.bootstrap_servers)
    with client:
        assert ids_of(control, prefix, OPEN_STATES) == []
        used = ids_of(control, prefix)
    print(f"transactional ids used with POOLING: {len(used)} for P={subtasks}")
    assert len(used) <= 3 * subtasks


def test_incrementing_uses_one_id_per_checkpoint_and_subtask(kafka, topic_factory, tmp_path):
    prefix, subtasks, checkpoints = f"incr{uuid.uuid4().hex[:6]}", 4, 15
    topic = topic_factory(kafka)
    cmd = workload_command(kafka.bootstrap_servers, prefix, topic, tmp_path / "log", subtasks=subtasks,
                           checkpoints=checkpoints, records=2, strategy="incrementing")
    run_with_crashes(cmd, crashes=0, seed=1)
    client, control = control_for(kafka.bootstrap_servers)
    with client:
        assert len(ids_of(control, prefix)) == checkpoints * subtasks


def test_pre2pc_workload_survives_crashes(kafka_pre2pc, topic_factory, tmp_path):
    prefix, subtasks, checkpoints = f"old{uuid.uuid4().hex[:6]}", 4, 40
    topic = topic_factory(kafka_pre2pc, partitions=2)
    log_dir = tmp_path / "decisions"
    cmd = workload_command(kafka_pre2pc.bootstrap_servers, prefix, topic, log_dir, subtasks=subtasks,
                           checkpoints=checkpoints, records=3)
    run_with_crashes(cmd, crashes=5, seed=311)
    check_exactly_once(kafka_pre2pc.bootstrap_servers, topic, FileDecisionLog(log_dir, prefix, retain_done=None),
                       checkpoints=checkpoints, subtasks=subtasks, records=3)
    client, control = control_for(kafka_pre2pc.bootstrap_servers)
    with client:
        assert ids_of(control, prefix, OPEN_STATES) == []
        assert len(ids_of(control, prefix)) <= 3 * subtasks


def test_recovery_aborts_exactly_the_prefix_lingering_transactions(broker, topic_factory, tmp_path):
    tag = uuid.uuid4().hex[:6]
    prefix = f"job{tag}-1"
    ours = [f"{prefix}-0-0", f"{prefix}-3-7"]
    look_alikes = [f"job{tag}-10-0-3", f"job{tag}-1x-0-0", f"{prefix}-0-03", f"other{tag}-0-0"]
    our_topic, their_topic = topic_factory(broker), topic_factory(broker)
    leave_lingering(broker.bootstrap_servers, our_topic, ours)
    leave_lingering(broker.bootstrap_servers, their_topic, look_alikes)
    assert end_offsets(broker.bootstrap_servers, our_topic) == {0: 0}  # pinned by the lingering transactions

    client, control = control_for(broker.bootstrap_servers)
    with client:
        report = recover(control, prefix, FileDecisionLog(tmp_path / "log", prefix))
        assert sorted(report.aborted) == sorted(ours)
        assert ids_of(control, prefix, OPEN_STATES) == []
        still_open = {t.transactional_id for t in control.list(states=["Ongoing"])}
        assert set(look_alikes) <= still_open  # other prefixes, look-alikes included, untouched
        # the LSO moved past the aborted transactions: a read_committed consumer reaches the end
        assert end_offsets(broker.bootstrap_servers, our_topic) == end_offsets(
            broker.bootstrap_servers, our_topic, isolation="read_uncommitted")
        assert end_offsets(broker.bootstrap_servers, their_topic) == {0: 0}
        # the function form, and clean-up of the look-alikes for the other tests on this broker
        for lookalike in look_alikes:
            name = lookalike.rsplit("-", 2)[0]
            if TransactionalIdGrammar(name).owns(lookalike):
                assert abort_lingering({"bootstrap.servers": broker.bootstrap_servers}, name) == [lookalike]
        for leftover in ids_of_all_open(control, look_alikes):
            control.abort_ongoing(leftover)
    assert read_records(broker.bootstrap_servers, our_topic) == []


def ids_of_all_open(control: TransactionControl, wanted: list[str]) -> list[str]:
    return [t.transactional_id for t in control.list(states=["Ongoing"]) if t.transactional_id in wanted]


def test_corrupt_decision_record_stops_recovery_before_any_abort(kafka, topic_factory, tmp_path):
    prefix = f"corrupt{uuid.uuid4().hex[:6]}"
    topic = topic_factory(kafka)
    leave_lingering(kafka.bootstrap_servers, topic, [f"{prefix}-0-0"])
    log = FileDecisionLog(tmp_path / "log", prefix)
    bad = tmp_path / "log" / f"{5:020d}.decision.json"
    bad.parent.mkdir()
    bad.write_text("{ not json")
    client, control = control_for(kafka.bootstrap_servers)
    with client:
        with pytest.raises(DecisionLogCorruptError, match=str(bad)):
            recover(control, prefix, log)
        assert ids_of(control, prefix, OPEN_STATES) == [f"{prefix}-0-0"]  # nothing was aborted
        control.abort_ongoing(f"{prefix}-0-0")


def test_recorded_decision_is_rolled_forward_after_a_crash(broker, topic_factory, tmp_path):
    """The crash window that matters most: the decision is durable, its transactions are not completed yet."""
    from kafka2pc.sink.integration import Decision, SubtaskWriter  # noqa: PLC0415

    prefix = f"fwd{uuid.uuid4().hex[:6]}"
    topic = topic_factory(broker)
    log = FileDecisionLog(tmp_path / "log", prefix)
    client, control = control_for(broker.bootstrap_servers)
    with client:
        writers = [SubtaskWriter({"bootstrap.servers": broker.bootstrap_servers}, prefix, s, cluster=client)
                   for s in range(2)]
        for subtask, writer in enumerate(writers):
            writer.write(topic, [f"s{subtask}-{i}".encode() for i in range(3)])
        prepared = [w.prepare(1) for w in writers]
        log.record(Decision(1, prepared))  # ... and the coordinator dies here
        assert read_records(broker.bootstrap_servers, topic, settle_s=0) == []  # decided, not completed

        report = recover(control, prefix, log)
        assert report.checkpoints_rolled_forward == (1,)
        assert sorted(report.rolled_forward) == sorted(p.transactional_id for p in prepared)
        assert report.aborted == ()
        assert log.undone() == []
        again = recover(control, prefix, log)  # idempotent
        assert again.checkpoints_rolled_forward == () and again.aborted == ()
    assert sorted(r.value for r in read_records(broker.bootstrap_servers, topic)) == sorted(
        f"s{s}-{i}".encode() for s in range(2) for i in range(3))
