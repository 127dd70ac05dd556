"""The InitProducerId requests around a producer's transactions: a fresh one for a producer without an id of its own,
transaction protocol v1's two epoch bumps between transactions, and a producer-id rotation before an epoch whose end
would exhaust it. Sans-IO machines.

A bump names the producer's own identity, and Kafka checks only the producer id of that when a transaction is
Ongoing — then it aborts the transaction, whoever's it is. A fenced producer that bumped blindly could abort its
successor's prepared transaction. So every bump is *guarded*: DescribeTransactions first, and the bump is sent only
while the id is at exactly this producer's identity and in no transaction, once (a lost or busy answer is looked at
again, never re-sent blindly). A fenced producer's begin thus sends nothing but the look, and raises.

A producer without an identity of its own (recovered at the protocol level, or after completing a resumed
transaction) takes the id over after looking: it refuses an open transaction it does not hold (it may be a
successor's, decided), and otherwise sends a fresh InitProducerId, which fences every earlier producer. It never
bumps the identity it only saw: Kafka answers a bump whose expected epoch is the one just bumped from as a retry of
that bump, so two producers taking the id over from one look would share the next epoch and one transaction.
"""

from __future__ import annotations

import attrs

from kafka2pc._core import codes
from kafka2pc._core.judge import MAX_TRANSACTION_EPOCH
from kafka2pc._core.looks import Looks
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    IN_FLUX,
    Answer,
    Command,
    Described,
    DescribeTransaction,
    InitAnswer,
    NoAnswer,
    ObservedTransaction,
    ProducerIdentity,
)
from kafka2pc._core.setup import TransactionSetup, fenced, init_error
from kafka2pc._core.states import InTransaction, Ready, Unowned
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    ConfigError,
    ProducerFencedError,
    TransactionLostError,
    UnsupportedByBrokerError,
)

#: a bump to this epoch or beyond rotates the producer id; a retry of it cannot be told from another producer's init
EXHAUSTED_EPOCH = 32766
#: errors after which the producer can only be closed
FATAL = (ProducerFencedError, AuthorizationError, ConfigError, TransactionLostError)


def fresh_bumps(transaction_version: int) -> int:
    """Bumps due after a fresh InitProducerId. v1: it moved the epoch once past the id's last transaction; one more
    makes the two that keep "pid:epoch" unique (see judge.py). v2 bumps at every end by itself."""
    return 1 if transaction_version < 2 else 0


def identity_after_handover(held: ProducerIdentity, observed: ObservedTransaction | None,
                            transaction_version: int) -> ProducerIdentity | None:
    """The identity a producer may go on with, without an InitProducerId, after another process (a committer) ended
    the transaction it prepared at ``held``; None when it must not (a new producer takes the id over instead).

    Only under protocol v2, whose end bumps the epoch, and only when ``observed`` (a look taken after the end) shows
    exactly that end: the same producer id, ``Complete*`` at ``held``'s epoch + 1. Nobody else can hold that epoch:
    the end's sender never writes, and an InitProducerId since (a new holder) would have left the id ``Empty`` or at
    a later epoch. A look older than the id's latest change can only be one that makes this producer's first write
    fenced, never one that lets two producers share an epoch. This rests on no other process ever sending an
    InitProducerId that names ``held`` (Kafka answers it as a retry of the end's bump: the same epoch, unbumped);
    kafka2pc's never do (docs/spark.md, "Producers kept between tasks")."""
    if transaction_version < 2 or observed is None or observed.state not in (COMPLETE_COMMIT, COMPLETE_ABORT):
        return None
    following = ProducerIdentity(held.producer_id, held.epoch + 1)
    if observed.identity != following or following.epoch > MAX_TRANSACTION_EPOCH:
        return None
    return following


def needs_bump(ready: Ready) -> bool:
    """Whether ``ready`` must bump before its next transaction."""
    return ready.bumps_due > 0 or ready.identity.epoch > MAX_TRANSACTION_EPOCH


class Bumping:
    """Guarded bumps of ``state`` until none is due, finishing with a
    :class:`~kafka2pc._core.states.Ready` with nothing due. Raises ProducerFencedError when the id is no longer this
    producer's, BrokerUnavailableError on a lost answer (:attr:`state` then says what is still due)."""

    def __init__(self, transactional_id: str, state: Ready):
        self.transactional_id = transactional_id
        self.state = state
        self._looks = Looks()

    @property
    def setup(self) -> TransactionSetup:
        """The producer's transaction setup."""
        return self.state.setup

    def start(self, now: float | None = None) -> Command | Finished[Ready]:
        """Look before the first bump (or finish at once when none is due)."""
        if not needs_bump(self.state):
            return Finished(self.state)
        return self._look()

    def _look(self) -> DescribeTransaction:
        look = self._looks.next()
        if look is None:
            raise BrokerUnavailableError(f"transactional id {self.transactional_id!r} stayed busy; the bump of "
                                         f"{self.state.identity} may be retried")
        return look

    def on_answer(self, answer: Answer, now: float | None = None) -> Command | Finished[Ready]:
        """The next command, or where the producer stands once nothing is due."""
        mine = self.state.identity
        if isinstance(answer, NoAnswer):
            self.state = attrs.evolve(self.state, bump_in_doubt=True)
            raise BrokerUnavailableError(f"transactional id {self.transactional_id!r}: {answer.reason}; the bump of "
                                         f"{mine} may be retried") from answer.cause
        if isinstance(answer, Described):
            observed = answer.observed
            if observed is None:  # expired; a fresh InitProducerId could abort a successor's new transaction
                raise fenced(self.transactional_id, "the coordinator no longer knows the id (it expired); a new "
                                                    "producer must take it over; no bump was sent")
            if observed.identity == mine and observed.state in IN_FLUX:
                return self._look()  # this producer's own end is still writing its markers
            following = ProducerIdentity(mine.producer_id, mine.epoch + 1)
            if self.state.bump_in_doubt and observed.state == EMPTY and observed.identity == following \
                    and following.epoch < EXHAUSTED_EPOCH:
                # our lost bump landed, or someone else's InitProducerId did: Kafka tells them apart (KIP-360's
                # retry returns the bumped epoch unchanged; after another producer's init it answers fenced)
                return self.setup.init(expected=mine)
            if observed.identity != mine or observed.state not in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT):
                raise fenced(self.transactional_id, f"the coordinator reports {observed}; no bump was sent")
            return self.setup.init(expected=mine)
        if not isinstance(answer, InitAnswer):
            raise TypeError(f"unexpected answer {answer!r}")
        if codes.kind(answer.error) is codes.Kind.DONE and answer.identity is not None:
            self.state = Ready(self.setup, answer.identity, max(0, self.state.bumps_due - 1))
            return self.start()
        if codes.kind(answer.error) is codes.Kind.UNSUPPORTED:
            raise UnsupportedByBrokerError(
                f"transactional id {self.transactional_id!r}: the bump of {mine} cannot be sent (InitProducerId "
                "with Enable2Pc is no longer spoken: two-phase commit turned off?); close this producer and "
                "initialise a new one")
        error = init_error(self.transactional_id, answer.error, self.setup.timeout_ms)
        if isinstance(error, FATAL):
            raise error
        # busy, a moved coordinator (it may have acted before it noticed), anything else: the bump may or may not
        # have landed; look again, never start afresh (a fresh InitProducerId is checked against nothing)
        self.state = attrs.evolve(self.state, bump_in_doubt=True)
        return self._look()


class Beginning:
    """Drives ``begin_transaction`` from ``state`` to the open
    :class:`~kafka2pc._core.states.InTransaction`. :attr:`state` is where the producer stands meanwhile (a failure
    leaves it there); a fatal error is raised for the caller to record."""

    def __init__(self, transactional_id: str, state: Ready | Unowned):
        assert state.setup is not None
        self.transactional_id = transactional_id
        self.setup: TransactionSetup = state.setup
        self.state: Ready | Unowned = state
        self._bumping: Bumping | None = None
        self._looks = Looks()

    def start(self, now: float | None = None) -> Command | Finished[InTransaction]:
        """The first command, or the open transaction when none is needed."""
        if isinstance(self.state, Unowned):
            return self._look_to_take_over()
        return self._bump(self.state)

    def _look_to_take_over(self) -> DescribeTransaction:
        look = self._looks.next()
        if look is None:
            raise BrokerUnavailableError(f"transactional id {self.transactional_id!r} stayed busy; "
                                         "begin_transaction() may be retried")
        return look

    def _take_over(self, answer: Described) -> Command:
        observed = answer.observed
        if observed is None:  # unknown to the coordinator: nothing to abort
            return self.setup.init()
        if observed.state in IN_FLUX:
            return self._look_to_take_over()  # an end (this producer's own, perhaps) is writing its markers
        if observed.state not in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT):
            raise fenced(self.transactional_id, f"the coordinator reports {observed}, a transaction this producer "
                                                "does not hold; no InitProducerId was sent")
        # nothing open: a fresh InitProducerId takes the id over and fences every earlier producer. Never a bump
        # of the identity seen: two producers that both saw it would both get the next epoch (Kafka answers the
        # second as a retry of the first) and write into one transaction
        return self.setup.init()

    def _bump(self, ready: Ready) -> Command | Finished[InTransaction]:
        self.state = ready
        self._bumping = Bumping(self.transactional_id, ready)
        return self._after_bumping(self._bumping.start())

    def _after_bumping(self, step: Command | Finished[Ready]) -> Command | Finished[InTransaction]:
        if isinstance(step, Finished):
            return Finished(InTransaction(self.setup, step.result.identity))
        return step

    def on_answer(self, answer: Answer, now: float | None = None) -> Command | Finished[InTransaction]:
        """The next command, or the open transaction."""
        if self._bumping is not None:
            try:
                step = self._bumping.on_answer(answer, now)
            finally:
                self.state = self._bumping.state
            return self._after_bumping(step)
        if isinstance(answer, NoAnswer):
            raise BrokerUnavailableError(f"transactional id {self.transactional_id!r}: {answer.reason}") \
                from answer.cause
        if isinstance(answer, Described):
            return self._take_over(answer)
        if not isinstance(answer, InitAnswer):
            raise TypeError(f"unexpected answer {answer!r}")
        if codes.kind(answer.error) is not codes.Kind.DONE or answer.identity is None:
            raise init_error(self.transactional_id, answer.error, self.setup.timeout_ms)
        return self._bump(Ready(self.setup, answer.identity, fresh_bumps(self.setup.transaction_version)))
