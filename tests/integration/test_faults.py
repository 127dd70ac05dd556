"""Faults between kafka2pc and a real broker, injected by FaultProxy: lost answers, unreachable coordinators and
failing listings. Each fault is checked against the broker's side, read directly (not through the proxy), and
against what a read_committed consumer (confluent-kafka) sees."""

import contextlib
import logging
import threading
import time
import uuid

import pytest
from kafka.protocol.admin.transactions import DescribeTransactionsRequest, ListTransactionsRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import EndTxnRequest, InitProducerIdRequest

from kafka2pc import PreparedTxnState, TransactionOutcome, TwoPhaseProducer
from kafka2pc._core.states import State
from kafka2pc.cluster import ClusterClient
from kafka2pc.config import ClientConfig
from kafka2pc.errors import BrokerUnavailableError, IncompleteListingError, Kafka2pcError, TransactionStateError
from kafka2pc.sink.integration import FileDecisionLog, recover
from kafka2pc.testing.verify import create_topic, end_offsets, read_records, values
from kafka2pc.transaction_control import OPEN_STATES, TransactionControl
from kafka2pc_harness.proxy import CUT, DROP, FaultProxy
from tests.integration.producer_support import new_txn_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REQUEST_TIMEOUT_MS = 1500
#: short client timeouts keep every fault bounded: a lost answer costs one request.timeout.ms
FAST = {"request.timeout.ms": REQUEST_TIMEOUT_MS, "max.block.ms": 15_000}


@pytest.fixture(params=["newest", "pre2pc"])
def broker(request):
    """Apache Kafka 4.4.0 (2PC on, transaction protocol v2) and 3.9.2 (protocol v1, no 2PC)."""
    return request.getfixturevalue("kafka" if request.param == "newest" else "kafka_pre2pc")


@pytest.fixture
def proxy(broker):
    with FaultProxy(broker.bootstrap_servers) as fault_proxy:
        yield fault_proxy
        assert fault_proxy.errors == []


@pytest.fixture
def direct(broker):
    """A TransactionControl on the broker's own address: the broker's side of every fault, unfiltered."""
    with ClusterClient(ClientConfig.for_bootstrap(broker.bootstrap_servers)) as client:
        yield TransactionControl(client, timeout_s=30)


def two_phase_producer(bootstrap: str, txn_id: str, **overrides) -> TwoPhaseProducer:
    return TwoPhaseProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, **FAST, **overrides},
                            two_phase_commit=True)


def observed(control: TransactionControl, txn_id: str) -> tuple[str, int, int] | None:
    found = control.describe(txn_id)
    return None if found is None else (found.state, found.producer_id, found.epoch)


class Watcher:
    """Once ``rule`` has fired, reads the transaction's state on the broker directly, while the client is still
    waiting for the answer it will never get."""

    def __init__(self, rule, control: TransactionControl, txn_id: str):
        self.seen: tuple[str, int, int] | None = None
        self._thread = threading.Thread(target=self._run, args=(rule, control, txn_id), daemon=True)
        self._thread.start()

    def _run(self, rule, control, txn_id):
        if rule.wait(30):
            self.seen = observed(control, txn_id)

    def join(self) -> tuple[str, int, int] | None:
        self._thread.join(35)
        return self.seen


# -- 1. a lost EndTxn answer -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", [(DROP, "complete"), (CUT, "complete"), (DROP, "commit")],
                         ids=["drop-complete", "cut-complete", "drop-commit"])
def test_lost_end_txn_answer_is_retried_and_commits_exactly_once(broker, proxy, direct, topic_factory, fault):
    action, call = fault
    topic = topic_factory(broker, partitions=2)
    txn_id = new_txn_id("lost-endtxn")
    payloads = [f"endtxn-{i:04d}".encode() for i in range(300)]
    with two_phase_producer(proxy.bootstrap_servers, txn_id) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce_batch(topic, payloads[:150], partition=0)
        p.produce_batch(topic, payloads[150:], partition=1)
        state = p.prepare_transaction() if call == "complete" else None
        rule = proxy.on_response(EndTxnRequest, action=action)
        watcher = Watcher(rule, direct, txn_id) if action is DROP else None
        started = time.monotonic()
        if call == "complete":
            assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
        else:
            p.commit_transaction()
        elapsed = time.monotonic() - started
        assert rule.fire_count == 1
        assert proxy.requests_seen(EndTxnRequest) == 2  # the first, whose answer was lost, and the transport's retry
        assert proxy.responses_seen(EndTxnRequest) == 2  # the broker answered both: it acted on the first
        if watcher is not None:
            # while the client still waited, the broker had already decided the first EndTxn: a commit
            assert watcher.join() is not None
            assert watcher.seen[0] in ("PrepareCommit", "CompleteCommit"), watcher.seen
            assert elapsed >= REQUEST_TIMEOUT_MS / 1000 * 0.9  # the retry came after the request timed out
        assert p.state is State.READY
        # the retried EndTxn left the producer with a usable identity: its next transaction commits
        p.begin_transaction()
        p.produce(topic, value=b"next", partition=0)
        p.commit_transaction()
    seen = values(read_records(broker.bootstrap_servers, topic))
    assert sorted(seen) == sorted([*payloads, b"next"])
    assert observed(direct, txn_id)[0] not in OPEN_STATES


def test_commit_whose_answers_stay_lost_until_the_timeout_is_retried_later(broker, proxy, direct, topic_factory):
    """Every EndTxn answer lost until max.block.ms: the broker committed, the producer cannot know it. It stays
    COMMITTING; a later retry of the same decision reports COMMITTED and writes nothing twice."""
    topic = topic_factory(broker)
    txn_id = new_txn_id("lost-endtxns")
    payloads = [f"late-{i:04d}".encode() for i in range(100)]
    with two_phase_producer(proxy.bootstrap_servers, txn_id, **{"max.block.ms": 4000}) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce_batch(topic, payloads)
        state = p.prepare_transaction()
        rule = proxy.on_response(EndTxnRequest, action=DROP, times=None)
        with pytest.raises(BrokerUnavailableError):
            p.complete_transaction(state)
        assert rule.fire_count >= 1
        assert p.state is State.COMMITTING
        with pytest.raises(TransactionStateError):  # only the same decision may follow
            p.abort_transaction()
        assert values(read_records(broker.bootstrap_servers, topic)) == payloads  # the broker did commit
        proxy.remove_rule(rule)
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert p.state is State.READY
        p.begin_transaction()
        p.produce(topic, value=b"next")
        p.commit_transaction()
    assert values(read_records(broker.bootstrap_servers, topic)) == [*payloads, b"next"]


@pytest.mark.parametrize("again_by", ["same-producer", "successor"])
def test_completing_again_after_a_retried_commit_reports_committed(broker, proxy, topic_factory, again_by):
    """docs/producer.md, "Idempotent completion": completing an already committed transaction again reports
    COMMITTED and writes nothing, also from another producer process. After a commit whose first answer was lost,
    an application that is not sure the commit went through completes the stored state again."""
    topic = topic_factory(broker)
    txn_id = new_txn_id("again")
    payloads = [f"again-{i:03d}".encode() for i in range(50)]
    with two_phase_producer(proxy.bootstrap_servers, txn_id) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce_batch(topic, payloads)
        state = p.prepare_transaction()
        rule = proxy.on_response(EndTxnRequest, action=DROP)
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert rule.fire_count == 1
        if again_by == "same-producer":
            assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
    if again_by == "successor":
        with two_phase_producer(proxy.bootstrap_servers, txn_id) as successor:
            assert successor.init_transactions(keep_prepared_txn=True) is None
            assert successor.complete_transaction(str(state)) is TransactionOutcome.COMMITTED
    assert values(read_records(broker.bootstrap_servers, topic)) == payloads


# -- 2. the coordinator unreachable while completing -----------------------------------------------------------------

def test_complete_with_coordinator_unreachable_raises_then_commits_once_back(broker, proxy, direct, topic_factory):
    topic = topic_factory(broker)
    txn_id = new_txn_id("blackhole")
    payloads = [f"bh-{i:04d}".encode() for i in range(200)]
    with two_phase_producer(proxy.bootstrap_servers, txn_id, **{"max.block.ms": 4000}) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce_batch(topic, payloads)
        state = p.prepare_transaction()
        ongoing = observed(direct, txn_id)
        assert ongoing == ("Ongoing", state.producer_id, state.epoch)

        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(BrokerUnavailableError):
            p.complete_transaction(state)
        assert time.monotonic() - started < 15  # bounded by max.block.ms, not by the broker
        assert p.state is State.COMMITTING
        assert proxy.requests_seen(EndTxnRequest) == 0  # nothing got through
        # a commit in progress can only be retried: neither an abort nor another state may interrupt it
        with pytest.raises(TransactionStateError):
            p.abort_transaction()
        with pytest.raises(TransactionStateError):
            p.complete_transaction(PreparedTxnState(state.producer_id, state.epoch + 1))
        assert p.state is State.COMMITTING
        assert observed(direct, txn_id) == ongoing  # the broker still holds it, untouched
        assert end_offsets(broker.bootstrap_servers, topic) == {0: 0}

        proxy.restore()
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert proxy.requests_seen(EndTxnRequest) == 1
    assert values(read_records(broker.bootstrap_servers, topic)) == payloads


def test_resumed_transaction_commit_survives_unreachable_coordinator(broker, proxy, direct, topic_factory):
    """The successor's protocol-level resume: EndTxn under the prepared transaction's own producer id and epoch,
    and the retry after an outage must do exactly that again, never an InitProducerId (which would abort it)."""
    topic = topic_factory(broker)
    txn_id = new_txn_id("resume-bh")
    payloads = [f"resume-{i:04d}".encode() for i in range(200)]
    with two_phase_producer(broker.bootstrap_servers, txn_id) as first:
        first.init_transactions()
        first.begin_transaction()
        first.produce_batch(topic, payloads)
        stored = str(first.prepare_transaction())
    # closed without completing: the prepared transaction stays open on the broker
    prepared = PreparedTxnState.parse(stored)
    assert observed(direct, txn_id) == ("Ongoing", prepared.producer_id, prepared.epoch)

    with two_phase_producer(proxy.bootstrap_servers, txn_id, **{"max.block.ms": 4000}) as successor:
        assert str(successor.init_transactions(keep_prepared_txn=True)) == stored
        assert successor.state is State.RECOVERED_PREPARED
        inits = proxy.requests_seen(InitProducerIdRequest)

        proxy.blackhole()
        with pytest.raises(BrokerUnavailableError):
            successor.complete_transaction(stored)
        assert successor.state is State.COMMITTING
        with pytest.raises(TransactionStateError):
            successor.abort_transaction()
        assert observed(direct, txn_id) == ("Ongoing", prepared.producer_id, prepared.epoch)
        assert read_records(broker.bootstrap_servers, topic, settle_s=0) == []

        proxy.restore()
        assert successor.complete_transaction(stored) is TransactionOutcome.COMMITTED
        assert proxy.requests_seen(InitProducerIdRequest) == inits  # no bump before the EndTxn: nothing aborted it
        assert proxy.requests_seen(EndTxnRequest) == 1
        assert successor.state is State.RECOVERED_IDLE
        successor.begin_transaction()  # and it carries on under an identity of its own
        successor.produce(topic, value=b"after-resume")
        successor.commit_transaction()
    assert values(read_records(broker.bootstrap_servers, topic)) == [*payloads, b"after-resume"]


def test_an_abort_whose_answers_are_lost_still_fences_the_writer(broker, proxy, direct, topic_factory):
    """A recovery aborts a transaction whose writer is alive (LISTING, or a resumed one nothing decided), and every
    EndTxn answer is lost. The writer must not reopen a transaction at the aborted epoch: on 4.4.0 the abort of a
    described, ongoing transaction is EndTxn v5 (it bumps the epoch as it ends it); on 3.9.2 the v4 abort is looked up
    and fenced all the same. Before, the abort stopped at the lost answer, unfenced, and the writer's next partition
    opened a second transaction at that epoch, which it then committed without its first records."""
    topic = topic_factory(broker, partitions=2)
    txn_id = new_txn_id("lost-abort")
    writer = two_phase_producer(broker.bootstrap_servers, txn_id)
    try:
        writer.init_transactions()
        writer.begin_transaction()
        writer.produce(topic, value=b"before-the-abort", partition=0)
        writer.flush()
        listed = PreparedTxnState(*writer.producer_id_and_epoch)  # what a listing or a describe reports: no protocol
        rule = proxy.on_response(EndTxnRequest, action=DROP, times=None)
        config = ClientConfig.from_dict({"bootstrap.servers": proxy.bootstrap_servers,
                                         "request.timeout.ms": REQUEST_TIMEOUT_MS})
        with ClusterClient(config) as client:
            control = TransactionControl(client, timeout_s=5)
            try:
                settled = control.abort(txn_id, listed)
                assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is True, settled
            except BrokerUnavailableError:
                assert control.transaction_version >= 2  # v5 ended it with a bump: nothing more to send
        assert rule.fire_count >= 1
        proxy.remove_rule(rule)
        state, producer_id, epoch = observed(direct, txn_id)
        # aborted, and the epoch moved past the writer's: by the v5 abort, or by the fence (Empty after its bump)
        assert state in ("CompleteAbort", "Empty") and producer_id == listed.producer_id and epoch > listed.epoch
        with pytest.raises(Kafka2pcError):  # fenced: no second transaction at the aborted epoch
            writer.produce(topic, value=b"after-the-abort", partition=1)
            writer.flush()
            writer.commit_transaction()
    finally:
        writer.close()
    assert observed(direct, txn_id)[0] not in OPEN_STATES
    assert read_records(broker.bootstrap_servers, topic) == []
    assert end_offsets(broker.bootstrap_servers, topic) == end_offsets(broker.bootstrap_servers, topic,
                                                                       isolation="read_uncommitted")


# -- 3. a lost Produce answer ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", [("response", DROP), ("response", CUT), ("request", DROP)],
                         ids=["answer-dropped", "answer-cut", "request-dropped"])
def test_lost_produce_answer_is_retried_with_the_same_sequence(broker, proxy, topic_factory, fault, caplog):
    """A Produce answer lost after the broker wrote the batch: resent with the same sequence, the broker knows it
    and writes nothing twice. (And a Produce request that never arrived: resent, so nothing is missing.)"""
    direction, action = fault
    topic = topic_factory(broker, partitions=3)
    txn_id = new_txn_id("lost-produce")
    payloads = [f"produce-{i:05d}".encode() for i in range(3000)]
    # small batches: several send rounds, so the lost answer is followed by batches that must not overtake it
    with caplog.at_level(logging.DEBUG, logger="kafka2pc._data.sender"), \
            two_phase_producer(proxy.bootstrap_servers, txn_id, **{"batch.size": 4096}) as p:
        p.init_transactions()
        p.begin_transaction()
        add_rule = proxy.on_response if direction == "response" else proxy.on_request
        rule = add_rule(ProduceRequest, nth=2, action=action)
        for partition in range(3):
            p.produce_batch(topic, payloads[partition * 1000:(partition + 1) * 1000], partition=partition)
        state = p.prepare_transaction()
        assert rule.fire_count == 1
        never_arrived = 1 if direction == "request" else 0
        # the broker answered every request it got, the resent one included
        assert proxy.requests_seen(ProduceRequest) == proxy.responses_seen(ProduceRequest) + never_arrived
        assert any("failed" in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records)
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
    records = read_records(broker.bootstrap_servers, topic)
    seen = values(records)
    assert len(seen) == len(set(seen)), "a retried batch was written twice"
    assert sorted(seen) == payloads  # no gap either
    for partition in range(3):  # and in order within each partition
        expected = payloads[partition * 1000:(partition + 1) * 1000]
        assert [r.value for r in records if r.partition == partition] == expected


# -- 4. recovery whose listing or describing fails -------------------------------------------------------------------

@contextlib.contextmanager
def left_prepared(bootstrap: str, direct: TransactionControl, topic: str, txn_ids: list[str]):
    """Prepare one transaction per id and close each producer without completing it; yields what the broker holds
    for each. Afterwards whatever is still open is aborted: with 2PC they would never time out."""
    held = {}
    try:
        for txn_id in txn_ids:
            with two_phase_producer(bootstrap, txn_id) as p:
                p.init_transactions()
                p.begin_transaction()
                p.produce(topic, value=txn_id.encode())
                state = p.prepare_transaction()
            held[txn_id] = ("Ongoing", state.producer_id, state.epoch)
        yield held
    finally:
        for txn_id in txn_ids:
            with contextlib.suppress(Kafka2pcError):
                direct.abort_ongoing(txn_id)


@pytest.mark.parametrize("fault", [(api, action) for api in (ListTransactionsRequest, DescribeTransactionsRequest)
                                   for action in (DROP, CUT)],
                         ids=["list-transactions-drop", "list-transactions-cut", "describe-transactions-drop",
                              "describe-transactions-cut"])
def test_recovery_whose_coordinator_reads_fail_raises_and_aborts_nothing(broker, proxy, direct, tmp_path, fault):
    api, action = fault
    topic = create_topic(broker.client_config)
    prefix = f"faulty{uuid.uuid4().hex[:8]}"
    txn_ids = [f"{prefix}-{subtask}-0" for subtask in range(3)]
    with left_prepared(broker.bootstrap_servers, direct, topic, txn_ids) as held:
        assert {txn_id: observed(direct, txn_id) for txn_id in txn_ids} == held

        rule = proxy.on_response(api, action=action, times=None)
        config = ClientConfig.from_dict({"bootstrap.servers": proxy.bootstrap_servers,
                                         "request.timeout.ms": REQUEST_TIMEOUT_MS})
        started = time.monotonic()
        with ClusterClient(config) as client:
            control = TransactionControl(client, timeout_s=3)
            with pytest.raises(BrokerUnavailableError) as raised:
                recover(control, prefix, FileDecisionLog(tmp_path / "log", prefix))
        elapsed = time.monotonic() - started
        assert rule.fired.is_set()
        if api is ListTransactionsRequest:
            assert isinstance(raised.value, IncompleteListingError)
        assert proxy.requests_seen(EndTxnRequest) == 0
        assert proxy.requests_seen(InitProducerIdRequest) == 0
        assert {txn_id: observed(direct, txn_id) for txn_id in txn_ids} == held  # nothing was aborted
        assert end_offsets(broker.bootstrap_servers, topic) == {0: 0}
        print(f"\nrecovery failed after {elapsed:.1f} s: {raised.value}")

        # once the coordinators answer, the same recovery aborts exactly the lingering transactions
        proxy.remove_rule(rule)
        report = recover(direct, prefix, FileDecisionLog(tmp_path / "log", prefix))
        assert sorted(report.aborted) == txn_ids
        assert all(observed(direct, txn_id)[0] != "Ongoing" for txn_id in txn_ids)
    assert read_records(broker.bootstrap_servers, topic) == []
    assert end_offsets(broker.bootstrap_servers, topic) == end_offsets(broker.bootstrap_servers, topic,
                                                                       isolation="read_uncommitted")


def test_recovery_listing_is_bounded_by_the_control_timeout(broker, proxy, tmp_path):
    """TransactionControl(timeout_s=3): a broker that never answers ListTransactions must fail the listing in about
    timeout_s (plus the request in flight), not in a fixed 30 s per broker."""
    proxy.on_response(ListTransactionsRequest, action=DROP, times=None)
    prefix = f"bounded{uuid.uuid4().hex[:8]}"
    config = ClientConfig.from_dict({"bootstrap.servers": proxy.bootstrap_servers,
                                     "request.timeout.ms": REQUEST_TIMEOUT_MS})
    with ClusterClient(config) as client:
        control = TransactionControl(client, timeout_s=3)
        started = time.monotonic()
        with pytest.raises(IncompleteListingError):
            recover(control, prefix, FileDecisionLog(tmp_path / "log", prefix))
        elapsed = time.monotonic() - started
    assert elapsed < 3 + REQUEST_TIMEOUT_MS / 1000 + 2, f"listing gave up only after {elapsed:.1f} s"
