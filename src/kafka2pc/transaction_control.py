"""Operations on transactional ids through their coordinators, without owning a producer: describe, list, commit a
decided transaction, abort one exactly. Shared by the sink's committer and recovery, the dual writer and the CLI.

Every ending goes through :class:`~kafka2pc.completion.Completion`, the one interpreter of how a transaction ends,
driven over a transport (:class:`~kafka2pc.transport.KafkaTransport` on a real cluster).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from kafka2pc.cluster_client import ClusterClient
from kafka2pc.completion import Completion, Goal, Settled, TransactionOutcome, end_version
from kafka2pc.coordinator_messages import ONGOING, ObservedTransaction, ProducerIdentity
from kafka2pc.errors import TransactionOutcomeUnknownError
from kafka2pc.listing import IncompleteListingError, TransactionListing
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.transport import KafkaTransport, TransactionDescription, init_producer_id

log = logging.getLogger(__name__)

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")

__all__ = ["OPEN_STATES", "IncompleteListingError", "TransactionControl", "TransactionDescription",
           "TransactionListing", "init_producer_id", "settle"]


def settle_all(transport: Any, completions: Sequence[Completion]) -> list[Settled | Exception]:
    """Drive several completions at once: each round sends every pending command together (the transport's
    ``execute_all``, one round trip, where it has one). Returns, in order, each one's Settled or the error it ended
    with; one failing never stops the others."""
    results: list[Settled | Exception | None] = [None] * len(completions)
    steps: dict[int, Any] = {}
    for index, completion in enumerate(completions):
        steps[index] = completion.start()
    while steps:  # bounded: every Completion settles or raises after a bounded number of commands
        pending = sorted(steps)
        commands = [(completions[i].transactional_id, steps[i]) for i in pending]
        answers = _execute_each(transport, commands)
        for index, answer in zip(pending, answers, strict=True):
            if isinstance(answer, Exception):
                results[index] = answer
                del steps[index]
                continue
            try:
                step = completions[index].on_answer(answer)
            except Exception as exc:
                results[index] = exc
                del steps[index]
                continue
            if isinstance(step, Settled):
                results[index] = step
                del steps[index]
            else:
                steps[index] = step
    return [r for r in results if r is not None]


def _execute_each(transport: Any, commands: list[tuple[str, Any]]) -> list[Any]:
    """Answers to ``commands`` (all at once where the transport can); an error belongs to its own command only."""
    execute_all = getattr(transport, "execute_all", None)
    if execute_all is not None:
        try:
            return list(execute_all(commands))
        except Exception as exc:  # e.g. one id's coordinator cannot be found: ask each on its own
            log.debug("concurrent round failed (%r); one by one", exc)
    answers: list[Any] = []
    for txn_id, command in commands:
        try:
            answers.append(transport.execute(txn_id, command))
        except Exception as exc:
            answers.append(exc)
    return answers


def settle(transport: Any, transactional_id: str, completion: Completion) -> Settled:
    """Send ``completion``'s commands over ``transport`` until it settles."""
    step = completion.start()
    while True:
        outcome = completion.on_answer(transport.execute(transactional_id, step))
        if isinstance(outcome, Settled):
            return outcome
        step = outcome


class TransactionControl:
    """Coordinator-side operations on transactional ids.

    ``transport`` is a :class:`~kafka2pc.cluster_client.ClusterClient` (wrapped in a KafkaTransport) or any object
    with KafkaTransport's methods (the model-based tests pass a coordinator model). ``transaction_version`` is the
    protocol of transactions whose handle does not record it (default: the cluster's current one).
    """

    def __init__(self, transport: ClusterClient | Any, *, transaction_version: int | None = None,
                 timeout_s: float = 60.0):
        if isinstance(transport, ClusterClient):
            transport = KafkaTransport(transport, timeout_s=timeout_s)
        self.transport = transport
        self._transaction_version = transaction_version

    @property
    def transaction_version(self) -> int:
        """The cluster's transaction protocol (1 or 2)."""
        if self._transaction_version is None:
            self._transaction_version = int(self.transport.cluster_facts().transaction_version)
        return self._transaction_version

    def _version_of(self, transaction: PreparedTxnState, *, commit: bool) -> int:
        return end_version(transaction, commit, self.transaction_version)

    def _recorded(self, transaction: PreparedTxnState) -> PreparedTxnState:
        """``transaction`` with its protocol filled in where it is certain: a v1 cluster never ran a v2 one."""
        if transaction.transaction_version is None and self.transaction_version == 1:
            return attrs.evolve(transaction, transaction_version=1)
        return transaction

    # -- reading -----------------------------------------------------------------------------------------------------

    def describe_full(self, transactional_id: str) -> TransactionDescription | None:
        """Everything DescribeTransactions says of ``transactional_id``; None if the coordinator does not know it."""
        found: TransactionDescription | None = self.transport.describe_full(transactional_id)
        return found

    def describe(self, transactional_id: str) -> ObservedTransaction | None:
        """State, producer id and epoch of ``transactional_id``; None if unknown."""
        found = self.describe_full(transactional_id)
        return None if found is None else ObservedTransaction(found.state, found.producer_id, found.epoch)

    def list(self, *, states: Iterable[str] = (), pattern: str | None = None,
             running_longer_than_ms: int | None = None) -> list[TransactionListing]:
        """ListTransactions on every broker: complete, or :class:`~kafka2pc.listing.IncompleteListingError`."""
        listed: list[TransactionListing] = self.transport.list_transactions(
            states=list(states), pattern=pattern, running_longer_than_ms=running_longer_than_ms)
        return listed

    def broker_config(self, name: str) -> str | None:
        """A broker config's value; None where it cannot be read."""
        value: str | None = self.transport.broker_config(name)
        return value

    # -- ending ------------------------------------------------------------------------------------------------------

    def commit(self, transactional_id: str, transaction: PreparedTxnState) -> Settled:
        """Commit exactly ``transaction`` (idempotent: an already committed one reports so). Raises
        :class:`~kafka2pc.errors.TransactionLostError` if it was aborted or never ran, and
        :class:`~kafka2pc.errors.TransactionOutcomeUnknownError` if its fate cannot be known."""
        transaction = self._recorded(transaction)
        completion = Completion(transactional_id, transaction, Goal.COMMIT, self._version_of(transaction, commit=True))
        return settle(self.transport, transactional_id, completion)

    def commit_all(self, transactions: Sequence[tuple[str, PreparedTxnState]]) -> Sequence[Settled | Exception]:
        """:meth:`commit` for many transactions at once (one round trip when all goes well); in order, each one's
        Settled or the error it ended with."""
        recorded = [(txn_id, self._recorded(state)) for txn_id, state in transactions]
        return settle_all(self.transport, [Completion(txn_id, state, Goal.COMMIT, self._version_of(state, commit=True))
                                           for txn_id, state in recorded])

    def abort_all(self, transactions: Sequence[tuple[str, PreparedTxnState]]) -> Sequence[Settled | Exception]:
        """:meth:`abort` for many transactions at once."""
        recorded = [(txn_id, self._recorded(state)) for txn_id, state in transactions]
        return settle_all(self.transport, [
            Completion.aborting(txn_id, state, self.transaction_version, writer_may_live=True)
            for txn_id, state in recorded])

    def complete(self, transactional_id: str, transaction: PreparedTxnState) -> bool:
        """:meth:`commit`; True once committed."""
        return self.commit(transactional_id, transaction).outcome is TransactionOutcome.COMMITTED

    def abort(self, transactional_id: str, transaction: PreparedTxnState) -> Settled:
        """Abort exactly ``transaction``, conditional on its producer id and epoch: a later transaction of the id is
        never touched. The settled outcome says ABORTED (now or before, or it never ran) or COMMITTED (it had
        already committed: nothing was done). Protocol v1 (no epoch bump on abort) also fences the identity, after
        looking that the id is still at it (``settled.fenced`` says whether that worked)."""
        transaction = self._recorded(transaction)
        completion = Completion.aborting(transactional_id, transaction, self.transaction_version, writer_may_live=True)
        return settle(self.transport, transactional_id, completion)

    def abort_ongoing(self, transactional_id: str, *, producer_id: int | None = None) -> ObservedTransaction | None:
        """Abort the transaction open on ``transactional_id`` now (only if its producer id is ``producer_id``,
        when given), conditional on the producer id and epoch DescribeTransactions reports for it; returns what
        was aborted, or None when nothing open matched or it ended meanwhile."""
        observed = self.describe(transactional_id)
        if observed is None or observed.state != ONGOING:
            return None
        if producer_id is not None and observed.producer_id != producer_id:
            log.info("%r is now open under producer id %d, not the listed %d: left alone", transactional_id,
                     observed.producer_id, producer_id)
            return None
        target = observed.identity.state()  # only described: which protocol it ran under is not known
        try:
            settled = self.abort(transactional_id, target)
        except TransactionOutcomeUnknownError as exc:
            log.info("%s of %r ended before it could be aborted: %s", target, transactional_id, exc.reason)
            return None
        if settled.outcome is not TransactionOutcome.ABORTED:
            log.info("%s of %r committed before it could be aborted; left as it is", target, transactional_id)
            return None
        if settled.fenced is False:
            log.warning("%s of %r aborted but not fenced (%s): a live writer of it could still start another "
                        "transaction at that epoch; abort again once it is stopped", target, transactional_id,
                        settled.detail)
        return observed


def identity_of(observed: ObservedTransaction) -> ProducerIdentity:
    """The producer id and epoch of an observed transaction."""
    return observed.identity
