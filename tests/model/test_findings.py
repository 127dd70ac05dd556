"""The numbered findings of the "core correctness" issue as fixed scenarios: the real TwoPhaseProducer and
TransactionControl against the coordinator model (tests/model/coordinator.py). Each was checked to fail with its
fix taken out (the retry ending locally, a single bump, no exhaustion guard, an unconditional abort, an eager
re-initialisation)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from kafka2pc import (
    BrokerUnavailableError,
    PreparedTxnState,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionLostError,
    TransactionOutcome,
    TransactionOutcomeUnknownError,
    TwoPhaseProducer,
)
from kafka2pc import broker_errors as codes
from kafka2pc.completion import Completion, Goal, Settled
from kafka2pc.coordinator_messages import DescribeTransaction, EndTxn, InitProducerId, ProducerIdentity
from kafka2pc.listing import IncompleteListingError
from kafka2pc.producer_states import State
from kafka2pc.sink import Committer, Decision, FileDecisionLog, PreparedTransaction, RecoveryIncompleteError, recover
from kafka2pc.transaction_control import TransactionControl
from kafka2pc.transport import KafkaTransport
from tests.model.coordinator import CoordinatorModel, Faults, ModelTransport

TXN_ID = "app-0"
logging.getLogger("kafka2pc").setLevel(logging.ERROR)


def cluster(version: int, *, first_epoch: int = -1) -> ModelTransport:
    return ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=version >= 2,
                                           first_epoch=first_epoch), Faults())


def producer(transport: ModelTransport) -> TwoPhaseProducer:
    return TwoPhaseProducer({"bootstrap.servers": "model:9092", "transactional.id": TXN_ID, "linger.ms": 0},
                            two_phase_commit=True, transport=transport)


def prepared(transport: ModelTransport, *values: bytes) -> PreparedTxnState:
    p = producer(transport)
    p.init_transactions()
    p.begin_transaction()
    p.produce_batch("t", list(values), partition=0)
    return p.prepare_transaction()  # and the process dies: the transaction stays prepared


def committed(transport: ModelTransport, *values: bytes) -> None:
    """A producer commits ``values`` and goes away: the id is idle, at an identity it no longer holds."""
    p = producer(transport)
    p.init_transactions()
    p.begin_transaction()
    p.produce_batch("t", list(values), partition=0)
    p.commit_transaction()


def fate(transport: ModelTransport, state: PreparedTxnState) -> str | None:
    found = [t for t in transport.model.txns if t.identity == ProducerIdentity.of(state)]
    assert len(found) == 1
    return found[0].fate


@pytest.mark.parametrize("version", [1, 2])
def test_finding_1_a_resumed_commit_that_timed_out_is_retried_not_aborted(version):
    transport = cluster(version)
    decided = prepared(transport, b"a", b"b")
    successor = producer(transport)
    assert successor.init_transactions(keep_prepared_txn=True) == decided
    transport.faults.dropped_requests.append(True)  # the EndTxn never arrives; the call times out
    with pytest.raises(BrokerUnavailableError):
        successor.complete_transaction(decided)
    assert successor.state is State.COMMITTING
    successor.commit_transaction()  # the retry: the same EndTxn under the resumed producer id and epoch
    successor.begin_transaction()   # its InitProducerId comes only now, after the commit
    successor.produce("t", b"c", partition=0)
    successor.commit_transaction()
    assert fate(transport, decided) == "committed"
    assert transport.model.committed_records() == [b"a", b"b", b"c"]


def test_finding_2_v1_successor_transactions_never_reuse_a_predecessor_epoch():
    """Before: the successor's single InitProducerId bump put its first transaction at e + 1, where its abort
    (CompleteAbort at e + 1) made the predecessor's committed transaction e look aborted: TransactionLostError, and
    an application resending on "lost" duplicates."""
    transport = cluster(1)
    first = producer(transport)
    first.init_transactions()
    first.begin_transaction()
    first.produce("t", b"committed-once", partition=0)
    committed = first.prepare_transaction()
    assert first.complete_transaction(committed) is TransactionOutcome.COMMITTED
    successor = producer(transport)
    successor.init_transactions(keep_prepared_txn=True)
    successor.begin_transaction()
    successor.produce("t", b"aborted", partition=0)
    successor.abort_transaction()
    assert successor.producer_id_and_epoch[1] >= committed.epoch + 2
    late = producer(transport)
    late.init_transactions(keep_prepared_txn=True)
    with pytest.raises(TransactionOutcomeUnknownError):  # never "lost", never "aborted": it did commit
        late.complete_transaction(committed)
    assert fate(transport, committed) == "committed"


def test_finding_3_epoch_exhaustion_never_hides_a_commit():
    """Before: an EndTxn at epoch 32766 rotated the producer id and the committed transaction was reported as nothing
    pending / lost. Every transaction here is confirmed committed right after, across the rotation."""
    transport = cluster(2, first_epoch=32758)
    control = TransactionControl(transport)
    p = producer(transport)
    p.init_transactions()
    producer_ids = set()
    for index in range(12):
        p.begin_transaction()
        p.produce("t", f"r{index}".encode(), partition=0)
        state = p.prepare_transaction()
        assert state.epoch <= 32765
        producer_ids.add(state.producer_id)
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
        assert p.complete_transaction(state) is TransactionOutcome.COMMITTED    # and again: still known
        assert control.commit(TXN_ID, state).outcome is TransactionOutcome.COMMITTED  # by the committer too
    assert len(producer_ids) == 2  # the producer id rotated once, before a transaction, never under one
    assert transport.model.committed_records() == [f"r{i}".encode() for i in range(12)]


@pytest.mark.parametrize("version", [1, 2])
def test_finding_4_listing_abort_is_conditional_on_what_was_listed(version):
    """LISTING finds a lingering transaction; before its abort, a live writer takes the id over and prepares a
    transaction that gets decided. The abort, conditional on the listed producer id and epoch, must leave it be."""
    transport = cluster(version)
    control = TransactionControl(transport)
    lingering = prepared(transport, b"lingering")
    listed = control.describe(TXN_ID)
    assert listed is not None and listed.identity == ProducerIdentity.of(lingering)
    writer = producer(transport)
    writer.init_transactions()  # aborts the lingering one itself, and fences it
    writer.begin_transaction()
    writer.produce("t", b"decided", partition=0)
    decided = writer.prepare_transaction()
    assert control.abort_ongoing(TXN_ID, producer_id=listed.producer_id + 1) is None  # another producer id listed
    with pytest.raises(TransactionOutcomeUnknownError) as info:  # the abort of the listed (pid, epoch)
        control.abort(TXN_ID, lingering)
    assert info.value.other_pending == str(decided)  # seen, and left alone: the EndTxn named the listed epoch
    assert fate(transport, lingering) == "aborted"   # (the writer's own InitProducerId aborted it)
    assert fate(transport, decided) is None           # still open, untouched
    assert control.commit(TXN_ID, decided).outcome is TransactionOutcome.COMMITTED
    assert transport.model.committed_records() == [b"decided"]


def test_finding_4_listing_is_complete_or_fails_loudly():
    """ListTransactions is asked again while a coordinator loads; one that never answers makes the listing fail."""
    loading, ok = codes.COORDINATOR_LOAD_IN_PROGRESS, codes.NONE
    answers = {1: [loading, loading, ok], 2: [ok]}

    class Client:
        def broker_max_version(self, request):
            return 2

        def partition_leaders(self, topic):
            return {0: 1, 1: 2}

        def broker_ids(self):
            return [1, 2]

        def send_idempotent(self, make_request, node_id=None, what="", timeout_s=30.0):
            code = answers[node_id].pop(0) if answers[node_id] else loading
            entries = [SimpleNamespace(transactional_id=f"x-{node_id}", producer_id=node_id,
                                       transaction_state="Ongoing")]
            return SimpleNamespace(error_code=code, transaction_states=entries if code == ok else [])

    transport = KafkaTransport(Client(), timeout_s=1.0)  # type: ignore[arg-type]
    assert [t.transactional_id for t in transport.list_transactions(states=["Ongoing"])] == ["x-1", "x-2"]
    answers[1] = []  # broker 1 keeps loading
    with pytest.raises(IncompleteListingError, match="broker 1 kept answering COORDINATOR_LOAD_IN_PROGRESS"):
        transport.list_transactions(states=["Ongoing"])
    answers[1], answers[2] = [ok, ok], [ok, ok]
    moves = iter([{0: 1, 1: 2}, {0: 2, 1: 2}, {0: 2, 1: 2}, {0: 2, 1: 2}])  # partition 0 moves mid-listing
    Client.partition_leaders = lambda self, topic: next(moves)  # type: ignore[method-assign]
    assert len(transport.list_transactions()) == 2  # listed again once the leaders held still
    with pytest.raises(StopIteration):
        next(moves)
    leaders = {0: 1, 1: 3}  # a coordinator partition led by a broker not in the cluster
    Client.partition_leaders = lambda self, topic: leaders  # type: ignore[method-assign]
    with pytest.raises(IncompleteListingError, match=r"partitions \[1\] have no available leader"):
        transport.list_transactions()


def test_finding_5_complete_transaction_reports_a_commit_even_if_re_initialisation_would_fail():
    """Before: after committing a resumed transaction the producer re-initialised at once, and a failure there made
    complete_transaction raise after the commit had succeeded."""
    transport = cluster(2)
    decided = prepared(transport, b"x")
    successor = producer(transport)
    successor.init_transactions(keep_prepared_txn=True)
    transport.model.two_phase_enabled = False  # any InitProducerId with Enable2Pc would now be refused
    assert successor.complete_transaction(decided) is TransactionOutcome.COMMITTED
    assert fate(transport, decided) == "committed"
    assert not any(isinstance(c, InitProducerId) for c in transport.sent[-2:])


def test_finding_5_commit_of_a_timed_out_transaction_is_lost_without_2pc():
    transport = ModelTransport(CoordinatorModel(transaction_version=1, two_phase_enabled=False), Faults())
    decided = prepared(transport, b"late")
    transport.model.time_out(TXN_ID)
    with pytest.raises(TransactionLostError, match="the broker aborted it"):
        TransactionControl(transport).commit(TXN_ID, decided)


# -- found by the adversarial review of this change ----------------------------------------------------------------

def test_review_1_a_fenced_v1_producer_never_aborts_its_successors_decided_transaction():
    """A commits (its two bumps are due before its next transaction). B takes the id over, prepares, and the decision
    is recorded. A (a zombie) begins: its bump would be an InitProducerId that Kafka answers by aborting B's
    transaction (only the producer id is checked while one is Ongoing). A looks first, and sends nothing."""
    transport = cluster(1)
    a = producer(transport)
    a.init_transactions()
    a.begin_transaction()
    a.produce("t", b"a", partition=0)
    a.commit_transaction()
    b = producer(transport)
    b.init_transactions(keep_prepared_txn=True)
    b.begin_transaction()
    b.produce("t", b"b", partition=0)
    decided = b.prepare_transaction()
    with pytest.raises(ProducerFencedError, match="no bump was sent"):
        a.begin_transaction()
    assert b.complete_transaction(decided) is TransactionOutcome.COMMITTED
    assert transport.model.committed_records() == [b"a", b"b"]


def test_review_2_the_v1_fence_after_an_abort_never_lands_on_a_newer_transaction():
    transport = cluster(1)
    lingering = prepared(transport, b"lingering")
    completion = Completion(TXN_ID, lingering, Goal.ABORT, 1, fence_after_abort=True)
    step = completion.start()
    step = completion.on_answer(transport.execute(TXN_ID, step))  # the abort; the fence comes next
    writer = producer(transport)  # meanwhile a new writer takes the id over and prepares a decided transaction
    writer.init_transactions()
    writer.begin_transaction()
    writer.produce("t", b"decided", partition=0)
    decided = writer.prepare_transaction()
    while not isinstance(step, Settled):
        step = completion.on_answer(transport.execute(TXN_ID, step))
    assert step.outcome is TransactionOutcome.ABORTED and step.fenced is True  # fenced by the new owner's init
    assert not any(isinstance(c, InitProducerId) and c.expected == ProducerIdentity.of(lingering)
                   for c in transport.sent)
    assert writer.complete_transaction(decided) is TransactionOutcome.COMMITTED
    assert transport.model.committed_records() == [b"decided"]


def test_review_3_a_v1_fence_that_failed_is_reported_not_hidden():
    transport = cluster(1)
    lingering = prepared(transport, b"lingering")
    transport.faults.dropped_requests.extend([False, True])  # the abort arrives; the fence does not
    transport.faults.failed_describes.extend([False] + [True] * 100)  # and no look after it gets an answer
    settled = TransactionControl(transport).abort(TXN_ID, lingering)
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is False


def test_review4_a_resumed_v1_abort_whose_fence_look_is_lost_looks_again_and_fences():
    """Review finding: after a resumed v1 abort (EndTxn v4, no bump), ONE lost DescribeTransactions answer before
    the fence settled it as aborted-but-not-fenced, silently, and the writer reopened a transaction at the aborted
    epoch. Now it looks again (bounded) and fences; were every look to fail, the producer logs a warning."""
    transport = cluster(1)
    held = prepared(transport, b"w1")  # its writer lives on, unaware
    recovering = producer(transport)
    assert recovering.init_transactions(keep_prepared_txn=True) == held
    transport.faults.failed_describes.append(True)  # the fence's look gets no answer
    assert recovering.complete_transaction(PreparedTxnState.empty()) is TransactionOutcome.ABORTED
    identity = ProducerIdentity.of(held)
    assert transport.model.add_partitions(TXN_ID, identity, {("t", 1)}) != codes.NONE
    assert transport.model.ids[TXN_ID].epoch > identity.epoch


def test_review4_an_unfenced_abort_is_logged_by_the_producer(caplog):
    transport = cluster(1)
    held = prepared(transport, b"w1")
    recovering = producer(transport)
    assert recovering.init_transactions(keep_prepared_txn=True) == held
    transport.faults.failed_describes.extend([True] * 100)
    with caplog.at_level(logging.WARNING, logger="kafka2pc"):
        assert recovering.complete_transaction(PreparedTxnState.empty()) is TransactionOutcome.ABORTED
    assert "could not be fenced" in caplog.text


@pytest.mark.parametrize("fault", ["dropped_requests", "lost_answers"])
def test_a_v1_fence_without_an_answer_is_looked_up_and_completed(fault):
    transport = cluster(1)
    lingering = prepared(transport, b"lingering")
    getattr(transport.faults, fault).extend([False, True])  # the fence never arrives / its answer is lost
    settled = TransactionControl(transport).abort(TXN_ID, lingering)
    assert settled.outcome is TransactionOutcome.ABORTED and settled.fenced is True
    assert transport.model.ids[TXN_ID].epoch > lingering.epoch


def test_review_8_a_stuck_decision_does_not_stop_the_rest_of_recovery(tmp_path):
    """A decided transaction the broker timed out (no 2PC) can never commit: recovery still rolls the other
    decisions forward and aborts what lingers, then says which checkpoint is stuck; an operator's resolution
    (recorded with its reason) unsticks it."""
    transport = ModelTransport(CoordinatorModel(transaction_version=2, two_phase_enabled=False), Faults())
    control = TransactionControl(transport)
    states = {}
    for txn_id in ("job-0-0", "job-1-0", "job-2-0"):
        p = TwoPhaseProducer({"bootstrap.servers": "m:1", "transactional.id": txn_id}, transport=transport)
        p.init_transactions()
        p.begin_transaction()
        p.produce("t", txn_id.encode(), partition=0)
        states[txn_id] = p.prepare_transaction()
    log = FileDecisionLog(tmp_path, "job")
    log.record(Decision(1, [PreparedTransaction("job-0-0", states["job-0-0"], 0, 1)]))
    log.record(Decision(2, [PreparedTransaction("job-1-0", states["job-1-0"], 1, 2)]))
    transport.model.time_out("job-0-0")  # decided, then lost: fallback mode, past transaction.timeout.ms
    with pytest.raises(RecoveryIncompleteError, match="checkpoint 1") as info:
        recover(control, "job", log)
    assert info.value.report.checkpoints_rolled_forward == (2,)
    assert info.value.report.aborted == ("job-2-0",)  # the undecided one, lingering: aborted all the same
    assert [d.checkpoint for d in log.undone()] == [1]
    log.resolve(1, "lost by timeout; replayed upstream")
    assert recover(control, "job", log).stuck == ()
    assert transport.model.committed_records() == [b"job-1-0"]


# -- second review -------------------------------------------------------------------------------------------------

def test_review2_f3_aborting_a_bare_handle_never_hides_a_v1_commit_after_an_upgrade():
    """A v1 transaction commits; the cluster moves to transaction.version=2; an abort of its bare "pid:epoch" must
    not be sent as EndTxn v5 (accepted as an empty abort at the current epoch, it would read as "aborted")."""
    transport = cluster(1)
    p = producer(transport)
    p.init_transactions()
    p.begin_transaction()
    p.produce("t", b"decided-row", partition=0)
    state = p.prepare_transaction()
    assert p.complete_transaction(state) is TransactionOutcome.COMMITTED
    transport.model.transaction_version = 2
    bare = PreparedTxnState.parse(str(state))
    control = TransactionControl(transport, transaction_version=2)
    try:
        settled = control.abort(TXN_ID, bare)
        assert settled.outcome is TransactionOutcome.COMMITTED
    except TransactionOutcomeUnknownError:
        pass  # also honest: under v1 it is its commit, under v2 it never ran
    assert fate(transport, state) == "committed"
    assert all(not (isinstance(c, EndTxn) and c.transaction_version == 2 and not c.commit) for c in transport.sent)


def test_review2_f4_aborting_a_resumed_v1_transaction_fences_its_old_writer():
    transport = cluster(1)
    writer = producer(transport)
    writer.init_transactions()
    writer.begin_transaction()
    writer.produce("t", b"part-1", partition=0)
    writer.flush()
    successor = producer(transport)
    assert successor.init_transactions(keep_prepared_txn=True) is not None
    assert successor.complete_transaction("") is TransactionOutcome.ABORTED  # nothing of it was decided
    with pytest.raises((ProducerFencedError, TransactionAbortableError)):  # the old writer cannot reopen it
        writer.produce("t", b"part-2", partition=1)
        writer.flush()
        writer.commit_transaction()
    assert transport.model.committed_records() == []


def test_review2_f7_a_lost_look_before_recording_decides_nothing_and_aborts_nothing(tmp_path):
    transport = cluster(2)
    offered = [PreparedTransaction(TXN_ID, prepared(transport, b"x"), 0, 1)]
    transport.faults.failed_describes.append(True)
    with pytest.raises(BrokerUnavailableError, match="nothing was recorded"):
        Committer(TransactionControl(transport), FileDecisionLog(tmp_path, "app")).settle(1, offered)
    assert transport.model.open_transactions()  # still open, to be decided by a retry


# -- found by the model-based test after issue 8 and 9 ---------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("how", ["nothing kept", "resumed and completed"])
def test_a_producer_without_an_identity_never_aborts_a_successors_decided_transaction(version, how):
    """A recovers at the protocol level (keep_prepared_txn=True where the broker cannot keep, so no InitProducerId):
    either nothing was open, or it completes the transaction it resumed. Either way it has no producer id of its own.
    B takes the id over, prepares, and the decision is recorded. A (a zombie) begins: a fresh InitProducerId would
    abort B's transaction. A looks first and, seeing a transaction it does not hold, sends nothing."""
    transport = ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=False), Faults())
    lingering = prepared(transport, b"lingering") if how == "resumed and completed" else None
    a = producer(transport)
    assert a.init_transactions(keep_prepared_txn=True) == lingering
    if lingering is not None:
        assert a.complete_transaction(PreparedTxnState.empty()) is TransactionOutcome.ABORTED
    b = producer(transport)
    b.init_transactions(keep_prepared_txn=True)
    b.begin_transaction()
    b.produce("t", b"decided", partition=0)
    decided = b.prepare_transaction()
    with pytest.raises(ProducerFencedError, match="does not hold"):
        a.begin_transaction()
    assert b.complete_transaction(decided) is TransactionOutcome.COMMITTED
    assert transport.model.committed_records() == [b"decided"]


@pytest.mark.parametrize("version", [1, 2])
def test_a_producer_without_an_identity_takes_the_id_over_with_a_fresh_init_after_looking(version):
    """Nothing open on an id in use: A's first begin looks, then sends a fresh InitProducerId (never a bump of the
    identity it only saw, see the next test); on v1 its second bump is its own, guarded. Its transactions commit."""
    transport = ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=False), Faults())
    committed(transport, b"earlier")
    since = len(transport.sent)
    a = producer(transport)
    a.init_transactions(keep_prepared_txn=True)
    a.begin_transaction()
    a.produce("t", b"a", partition=0)
    assert a.complete_transaction(a.prepare_transaction()) is TransactionOutcome.COMMITTED
    inits = [c for c in transport.sent[since:] if isinstance(c, InitProducerId)]
    assert [c.expected is None for c in inits] == [True] + [False] * (version == 1)
    assert transport.model.committed_records() == [b"earlier", b"a"]


class _AfterFirstLook(ModelTransport):
    """A transport that runs ``meanwhile`` (once set) once, right after the next DescribeTransactions it answers."""

    def __init__(self, model: CoordinatorModel):
        super().__init__(model, Faults())
        self.meanwhile = None

    def execute(self, transactional_id, command):
        answer = super().execute(transactional_id, command)
        if isinstance(command, DescribeTransaction) and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
        return answer


@pytest.mark.parametrize("ending", ["A commits", "A aborts"])
@pytest.mark.parametrize("version", [1, 2])
def test_review4_two_takeovers_from_one_look_never_share_an_identity(version, ending):
    """Review finding: A and B (no identity of their own) both look at the idle id; B takes it over, then A's bump
    of the identity it saw arrives. Kafka answers a bump from the epoch just bumped from as a retry: before the fix
    A got B's new epoch, A's undecided records went into B's decided transaction, and A's abort aborted it. Now A's
    fresh InitProducerId fences B instead: B can neither write nor prepare, and nothing of it is decided."""
    model = CoordinatorModel(transaction_version=version, two_phase_enabled=False)
    committed(ModelTransport(model, Faults()), b"earlier")
    b = producer(ModelTransport(model, Faults()))
    b.init_transactions(keep_prepared_txn=True)
    hooked = _AfterFirstLook(model)
    a = producer(hooked)
    a.init_transactions(keep_prepared_txn=True)
    hooked.meanwhile = b.begin_transaction  # B takes the id over between A's look and A's InitProducerId
    a.begin_transaction()
    assert b.producer_id_and_epoch != a.producer_id_and_epoch
    with pytest.raises(ProducerFencedError):
        b.produce("t", b"B", partition=0)
        b.prepare_transaction()
    a.produce("t", b"A", partition=1)
    if ending == "A commits":
        assert a.complete_transaction(a.prepare_transaction()) is TransactionOutcome.COMMITTED
        assert model.committed_records() == [b"earlier", b"A"]
    else:
        a.abort_transaction()
        assert model.committed_records() == [b"earlier"]
    assert [t.fate for t in model.txns if b"B" in t.records] in ([], ["aborted"])


def _writer_carries_on(writer: TwoPhaseProducer, partition: int) -> None:
    """The aborted transaction's writer, alive and unaware, writes on: to a partition it added before, or a new
    one (which on protocol v1 sends AddPartitionsToTxn at its epoch)."""
    try:
        writer.produce("t", b"after-abort", partition=partition)
        writer.flush()
    except (ProducerFencedError, TransactionAbortableError):
        pass


@pytest.mark.parametrize("partition", [0, 1])
@pytest.mark.parametrize("version", [1, 2])
def test_a_resumed_abort_whose_answer_is_lost_still_fences_its_writer(version, partition):
    """The model-based counterexample (v2, no 2PC): B resumes at the protocol level and aborts the writer A's open
    transaction; the abort's answer is lost. Before: B stopped there, with a v4 abort (no epoch bump) and no fence,
    so A's next write reopened a transaction at the aborted epoch: two transactions under one producer id and epoch,
    the second missing what A wrote before it, and A could commit it."""
    transport = ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=False), Faults())
    a = producer(transport)
    a.init_transactions()
    a.begin_transaction()
    a.produce("t", b"before-abort", partition=0)
    a.flush()
    open_identity = ProducerIdentity(*a.producer_id_and_epoch)
    b = producer(transport)
    assert b.init_transactions(keep_prepared_txn=True) == open_identity.state()
    transport.faults.lost_answers.append(True)
    try:
        assert b.complete_transaction(PreparedTxnState.empty()) is TransactionOutcome.ABORTED
    except BrokerUnavailableError:
        assert version == 2  # v5's abort bumps the epoch as it ends the transaction: nothing more to send
    _writer_carries_on(a, partition)
    identities = [t.identity for t in transport.model.txns]
    assert identities.count(open_identity) == 1, transport.model.txns
    with pytest.raises((ProducerFencedError, TransactionAbortableError)):
        a.commit_transaction()
    assert transport.model.committed_records() == []


@pytest.mark.parametrize("partition", [0, 1])
@pytest.mark.parametrize("version", [1, 2])
def test_a_listing_abort_whose_answer_is_lost_still_fences_the_writer(version, partition):
    transport = ModelTransport(CoordinatorModel(transaction_version=version, two_phase_enabled=False), Faults())
    a = producer(transport)
    a.init_transactions()
    a.begin_transaction()
    a.produce("t", b"before-abort", partition=0)
    a.flush()
    listed = ProducerIdentity(*a.producer_id_and_epoch)
    transport.faults.lost_answers.append(True)
    control = TransactionControl(transport)
    try:
        assert control.abort(TXN_ID, listed.state()).outcome is TransactionOutcome.ABORTED
    except BrokerUnavailableError:
        assert version == 2
    _writer_carries_on(a, partition)
    assert [t.identity for t in transport.model.txns].count(listed) == 1, transport.model.txns
    assert [t.fate for t in transport.model.txns] == ["aborted"]


def test_an_abort_of_a_bare_handle_on_v2_ends_it_with_a_bump_when_it_is_ongoing():
    transport = cluster(2)
    a = producer(transport)
    a.init_transactions()
    a.begin_transaction()
    a.produce("t", b"x", partition=0)
    a.flush()
    listed = ProducerIdentity(*a.producer_id_and_epoch)
    since = len(transport.sent)
    settled = TransactionControl(transport).abort(TXN_ID, listed.state())
    assert settled.outcome is TransactionOutcome.ABORTED
    assert [c for c in transport.sent[since:] if isinstance(c, EndTxn)] == [EndTxn(listed, False, 2)]
    assert transport.model.ids[TXN_ID].epoch == listed.epoch + 1
