"""Model-based tests: random sequences of client calls, crashes, faults and coordinator events, run by the real
TwoPhaseProducer and TransactionControl against a model of Kafka's coordinator (tests/model/coordinator.py), for both
transaction protocols, with and without 2PC.

After every step: every outcome kafka2pc reported is true of the model's ground truth; no two transactions ever share
a producer id and epoch; with 2PC active a decided transaction is never aborted; an undecided transaction is never
committed. At the end a recovery completes the last decision: every decided transaction is committed exactly once
(with 2PC), nothing is left open to pin the LSO, and every committed transaction holds exactly the records the
application wrote in it.

KAFKA2PC_MODEL_EXAMPLES sets the number of sequences (``make chaos`` runs many more).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kafka2pc import PreparedTxnState, TransactionOutcome, TwoPhaseProducer
from kafka2pc._core.messages import ProducerIdentity
from kafka2pc._core.states import State
from kafka2pc.errors import (
    BrokerUnavailableError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionLostError,
    TransactionOutcomeUnknownError,
    TransactionStateError,
)
from kafka2pc.transaction_control import TransactionControl
from tests.model.coordinator import ONGOING, CoordinatorModel, Faults, ModelTransport, Txn
from tests.model.moves import Checked

logging.getLogger("kafka2pc").setLevel(logging.ERROR)  # fallback WARNINGs are expected here, thousands of them
TXN_ID = "app-0"
EXAMPLES = int(os.environ.get("KAFKA2PC_MODEL_EXAMPLES", "2000"))  # 48 s at 5000 on 2 cores; make chaos: 50000
#: every (state, operation, state) the producers moved through, across all sequences of this run (each one checked
#: against the transition table as it happens: tests/model/moves.py)
MOVES: set = set()
#: errors a step may legitimately end with; they change nothing the invariants check
EXPECTED = (BrokerUnavailableError, ProducerFencedError, TransactionAbortableError, TransactionLostError,
            TransactionOutcomeUnknownError, TransactionStateError)


@attrs.define
class Claim:
    """Something kafka2pc said about a transaction."""

    identity: ProducerIdentity
    said: str  # "committed", "aborted" (never committed, never will), "lost" (aborted)
    where: str


class ProducerAgainstModel(RuleBasedStateMachine):
    """One application (one transactional id) with a durable store of its last decision, like the dual writer."""

    @initialize(version=st.sampled_from([1, 2]), two_phase=st.booleans(),
                first_epoch=st.sampled_from([-1, -1, 32760]))
    def setup(self, version: int, two_phase: bool, first_epoch: int) -> None:
        self.model = CoordinatorModel(transaction_version=version, two_phase_enabled=two_phase,
                                      first_epoch=first_epoch)
        self.faults = Faults()
        self.transport = ModelTransport(self.model, self.faults)
        self.control = TransactionControl(self.transport)
        self.two_phase = two_phase  # 2PC on transaction protocol v1 too: a 4.x cluster with transaction.version=1
        self.producer: TwoPhaseProducer | None = None
        self.replaced: list[TwoPhaseProducer] = []  # earlier processes, still alive: zombies
        self.stored = PreparedTxnState.empty()      # the store's last decided transaction
        self.decided: set[ProducerIdentity] = set()
        self.prepared: PreparedTxnState | None = None
        self.snapshot: PreparedTxnState | None = None  # LISTING: described, not yet aborted
        self.look: tuple[object] | None = None  # a producer's look at its id, used later (by producer_continues)
        self.claims: list[Claim] = []
        self.written: dict[ProducerIdentity, list[bytes]] = {}
        self.values = itertools.count()

    # -- helpers -----------------------------------------------------------------------------------------------------

    def _new_producer(self) -> TwoPhaseProducer:
        producer = TwoPhaseProducer({"bootstrap.servers": "model:9092", "transactional.id": TXN_ID, "linger.ms": 0,
                                     "retry.backoff.ms": 0}, two_phase_commit=True, transport=self.transport)
        return Checked(producer, MOVES)  # type: ignore[return-value]  # every move checked against the table

    def _claim(self, requested: PreparedTxnState, outcome: TransactionOutcome, where: str) -> None:
        if not requested.is_empty:
            self.claims.append(Claim(ProducerIdentity.of(requested), outcome.value, where))

    def _complete(self, producer: TwoPhaseProducer, requested: PreparedTxnState, where: str) -> None:
        try:
            self._claim(requested, producer.complete_transaction(requested), where)
        except TransactionLostError as exc:
            self.claims.append(Claim(ProducerIdentity(exc.producer_id, exc.epoch), "lost", where))

    def _decide(self, identity: ProducerIdentity) -> None:
        """Record a decision to commit. One taken after the transaction was already aborted can never hold; kafka2pc
        must then report it lost, which :meth:`every_claim_is_true` checks."""
        txn = next((t for t in self.model.txns if t.identity == identity), None)
        if txn is None or txn.fate != "aborted":
            self.decided.add(identity)

    def _stored_may_be_open(self) -> bool:
        if self.stored.is_empty:
            return False
        identity = ProducerIdentity.of(self.stored)
        return any(t.identity == identity and t.fate is None for t in self.model.txns)

    def _open_txn(self) -> Txn | None:
        meta = self.model.ids.get(TXN_ID)
        return meta.txn if meta is not None and meta.state == ONGOING else None

    # -- the application ---------------------------------------------------------------------------------------------

    @rule(keep=st.booleans())
    def start(self, keep: bool) -> None:
        """A new process: the old one (if any) is gone without closing; recover with the stored decision.

        The application's contract (docs/producer.md): a process whose store holds a decided transaction that may
        still be open recovers with ``keep_prepared_txn=True``; ``keep_prepared_txn=False`` aborts whatever is open
        on the id, as KIP-939 specifies, so it is only the choice of an application with nothing decided."""
        if not keep and self._stored_may_be_open():
            keep = True
        if self.producer is not None:
            self.replaced = [self.producer, *self.replaced][:2]
        producer = self.producer = self._new_producer()
        self.prepared = None
        try:
            producer.init_transactions(keep_prepared_txn=keep)
            if keep:
                self._complete(producer, self.stored, "recovery")
        except EXPECTED:
            pass

    @precondition(lambda self: self.producer is not None)
    @rule()
    def begin(self) -> None:
        assert self.producer is not None
        with contextlib.suppress(EXPECTED):
            self.producer.begin_transaction()

    @precondition(lambda self: self.producer is not None and self.producer.state is State.IN_TRANSACTION)
    @rule(count=st.integers(1, 3), batch=st.booleans(), partition=st.sampled_from([0, 1, None]))
    def produce(self, count: int, batch: bool, partition: int | None) -> None:
        assert self.producer is not None
        identity = ProducerIdentity(*self.producer.producer_id_and_epoch)
        values = [f"v{next(self.values)}".encode() for _ in range(count)]
        self.written.setdefault(identity, []).extend(values)
        try:
            if batch:
                self.producer.produce_batch("t", values, partition=partition)
            else:
                for value in values:
                    self.producer.produce("t", value, partition=partition)
            self.producer.flush()
        except EXPECTED:
            pass

    @precondition(lambda self: self.producer is not None and self.producer.state is State.IN_TRANSACTION)
    @rule()
    def prepare(self) -> None:
        assert self.producer is not None
        with contextlib.suppress(EXPECTED):
            self.prepared = self.producer.prepare_transaction()

    @precondition(lambda self: self.prepared is not None and not self.prepared.is_empty)
    @rule()
    def decide(self) -> None:
        """The commit point: the store durably records the prepared transaction (a DB commit, a decision log)."""
        assert self.prepared is not None
        if self.snapshot == self.prepared:
            return  # the contract: recovery's LISTING never races with deciding the transaction it aborts
        self.stored = self.prepared
        self._decide(ProducerIdentity.of(self.prepared))

    @precondition(lambda self: self.producer is not None)
    @rule(stored=st.booleans())
    def complete(self, stored: bool) -> None:
        """complete_transaction with the stored decision (or with the prepared one, not decided: an abort)."""
        assert self.producer is not None
        requested = self.stored if stored or self.prepared is None else self.prepared
        if not stored and self.prepared is not None and ProducerIdentity.of(self.prepared) not in self.decided:
            requested = PreparedTxnState.empty()
        with contextlib.suppress(EXPECTED):
            self._complete(self.producer, requested, "complete")

    @precondition(lambda self: self.producer is not None)
    @rule()
    def commit(self) -> None:
        """commit_transaction: deciding and committing the producer's own transaction in one call."""
        assert self.producer is not None
        producer = self.producer
        identity = ProducerIdentity(*producer.producer_id_and_epoch)
        open_txn = self._open_txn()
        if producer.state in (State.IN_TRANSACTION, State.PREPARED, State.COMMITTING) and open_txn is not None \
                and open_txn.identity == identity:  # a transaction that wrote nothing decides nothing
            if self.snapshot is not None and ProducerIdentity.of(self.snapshot) == identity:
                return
            self._decide(identity)
            if identity in self.decided:
                self.stored = identity.state()  # the store records what the application decided
        with contextlib.suppress(EXPECTED):
            producer.commit_transaction()

    @precondition(lambda self: self.producer is not None)
    @rule()
    def abort(self) -> None:
        """abort_transaction, which an application never calls on a transaction it has decided to commit."""
        assert self.producer is not None
        open_txn = self._open_txn()
        if open_txn is not None and open_txn.identity in self.decided:
            return
        with contextlib.suppress(EXPECTED):
            self.producer.abort_transaction()

    @rule()
    def producer_looks(self) -> None:
        """A Spark task's look at its id before it takes its cached producer (other steps may come in between)."""
        with contextlib.suppress(EXPECTED):
            self.look = (self.control.describe(TXN_ID),)

    @precondition(lambda self: self.producer is not None and self.producer.state is State.PREPARED
                  and self.look is not None)
    @rule()
    def producer_continues(self) -> None:
        """continue_after_completion on that look: the cached producer goes on without an InitProducerId when the
        look shows its transaction ended by another process (here: the committer, or LISTING) and nothing since."""
        assert self.producer is not None and self.look is not None
        self.producer.continue_after_completion(self.look[0])  # type: ignore[arg-type]

    @precondition(lambda self: self.producer is not None)
    @rule()
    def close(self) -> None:
        assert self.producer is not None
        self.producer.close()
        self.producer = None

    @precondition(lambda self: bool(self.replaced))
    @rule(which=st.integers(0, 1), act=st.sampled_from(["begin", "produce", "prepare", "abort"]),
          partition=st.sampled_from([0, 1]))
    def zombie_acts(self, which: int, act: str, partition: int = 0) -> None:
        """An earlier process that does not know it was replaced carries on. It decides nothing (deciding is the
        store's: the dual writer's database, the sink's decision log), and never aborts what it holds once that is
        decided; anything else it may try."""
        zombie = self.replaced[min(which, len(self.replaced) - 1)]
        open_txn = self._open_txn()
        if act == "abort" and open_txn is not None and open_txn.identity in self.decided:
            return
        with contextlib.suppress(EXPECTED):
            if act == "begin":
                zombie.begin_transaction()
            elif act == "produce":
                zombie.produce("t", f"z{next(self.values)}".encode(), partition=partition)  # 1: maybe a new one
                zombie.flush()
            elif act == "prepare":
                zombie.prepare_transaction()
            else:
                zombie.abort_transaction()

    # -- committer and recovery (TransactionControl) ------------------------------------------------------------------

    @precondition(lambda self: not self.stored.is_empty)
    @rule()
    def committer_rolls_forward(self) -> None:
        try:
            settled = self.control.commit(TXN_ID, self.stored)
            self._claim(self.stored, settled.outcome or TransactionOutcome.ABORTED, "committer")
        except TransactionLostError as exc:
            self.claims.append(Claim(ProducerIdentity(exc.producer_id, exc.epoch), "lost", "committer"))
        except EXPECTED:
            pass

    @rule()
    def listing_describes(self) -> None:
        """LISTING, first half: an open, undecided transaction is found."""
        txn = self._open_txn()
        if txn is not None and txn.identity not in self.decided:
            self.snapshot = txn.identity.state()

    @precondition(lambda self: self.snapshot is not None)
    @rule()
    def listing_aborts(self) -> None:
        """LISTING, second half: the abort, conditional on the described producer id and epoch."""
        assert self.snapshot is not None
        snapshot, self.snapshot = self.snapshot, None
        try:
            settled = self.control.abort(TXN_ID, snapshot)
        except EXPECTED:
            return
        self._claim(snapshot, settled.outcome or TransactionOutcome.ABORTED, "listing")

    # -- the coordinator and the network ------------------------------------------------------------------------------

    @rule()
    def transaction_times_out(self) -> None:
        self.model.time_out(TXN_ID)

    @rule()
    def id_expires(self) -> None:
        self.model.expire(TXN_ID)

    @rule()
    def zombie_initialises(self) -> None:
        """Another producer's InitProducerId (not keeping prepared transactions): fences everyone. Under the
        contract it never hits a decided, unresolved transaction."""
        txn = self._open_txn()
        if txn is None or txn.identity not in self.decided:
            from kafka2pc._core.messages import InitProducerId  # noqa: PLC0415

            self.transport.execute(TXN_ID, InitProducerId(60_000, enable_2pc=self.two_phase))

    @rule(kind=st.sampled_from(["lost", "dropped", "retried", "produce", "end acted", "end refused"]))
    def network_fault(self, kind: str) -> None:
        if kind.startswith("end"):  # an EndTxn answered with an error that says nothing about it
            self.faults.end_errors.append(kind.split()[1])
            return
        queue = {"lost": self.faults.lost_answers, "dropped": self.faults.dropped_requests,
                 "retried": self.faults.retried_answers, "produce": self.faults.lost_produce}[kind]
        queue.append(True)

    # -- invariants ----------------------------------------------------------------------------------------------------

    @invariant()
    def every_claim_is_true(self) -> None:
        for claim in getattr(self, "claims", ()):
            txns = [t for t in self.model.txns if t.identity == claim.identity]
            fate = txns[0].fate if txns else None
            if claim.said == "committed":
                assert fate == "committed", f"{claim} but the transaction is {fate} ({txns})"
            else:
                assert fate != "committed", f"{claim} but the transaction committed"

    @invariant()
    def identities_are_unique(self) -> None:
        seen = [t.identity for t in getattr(getattr(self, "model", None), "txns", ())]
        assert len(seen) == len(set(seen)), f"two transactions under one producer id and epoch: {seen}"

    @invariant()
    def decisions_hold(self) -> None:
        for txn in getattr(getattr(self, "model", None), "txns", ()):
            if txn.fate == "committed":
                assert txn.identity in self.decided, f"undecided transaction committed: {txn}"
            if self.two_phase and txn.identity in self.decided:
                assert txn.fate != "aborted", f"decided transaction aborted: {txn}"

    def teardown(self) -> None:
        if not hasattr(self, "model"):
            return
        self.faults.lost_answers.clear()
        self.faults.dropped_requests.clear()
        self.faults.retried_answers.clear()
        self.faults.lost_produce.clear()
        self.faults.end_errors.clear()
        final = self._new_producer()
        final.init_transactions(keep_prepared_txn=True)
        with contextlib.suppress(TransactionOutcomeUnknownError):
            self._complete(final, self.stored, "final recovery")
        self.every_claim_is_true()
        self.decisions_hold()
        assert self.model.open_transactions() == [], "a transaction is left open, pinning the LSO"
        stored = next((t for t in self.model.txns if t.identity == ProducerIdentity.of(self.stored)), None) \
            if not self.stored.is_empty else None
        if self.two_phase and stored is not None and stored.identity in self.decided:
            assert stored.fate == "committed", f"the last decision was not committed: {stored}"
        for txn in self.model.txns:
            if txn.fate == "committed":
                assert txn.records == self.written.get(txn.identity, []), \
                    f"{txn}: committed records differ from what was written: {self.written.get(txn.identity)}"
        committed = self.model.committed_records()
        assert len(committed) == len(set(committed)), "a record is visible twice"


ProducerAgainstModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_producer_against_coordinator_model = pytest.mark.model(ProducerAgainstModel.TestCase)

