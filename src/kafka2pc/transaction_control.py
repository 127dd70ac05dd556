"""Operations on transactional ids through their coordinators, without owning a producer: describe, list, fence,
commit a decided transaction, abort one exactly. Used by the sink's committer and recovery, the dual writer, the
Spark sink and the CLI.

A public module: :class:`TransactionControl` (also exported by :mod:`kafka2pc`) and every value its methods return
(:class:`Settled` and its :class:`Fate`, :class:`ObservedTransaction`, :class:`ProducerIdentity`, ...) are exported
here; docs/integration-api.md describes them. :class:`ControlTransport` is the seam the model-based tests plug a
coordinator model into, not part of the API.

Every ending goes through the core's :class:`~kafka2pc._core.completion.Completion`, the one machine that decides
how a transaction ends, driven by the one driver over a transport (the wire's KafkaTransport on a real cluster, a
coordinator model in the model-based tests).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

import attrs

from kafka2pc._core.completion import Completion, Goal, Settled
from kafka2pc._core.driver import CoordinatorTransport, drive, drive_all
from kafka2pc._core.initialization import versions_too_old
from kafka2pc._core.judge import Fate, TransactionOutcome, end_version
from kafka2pc._core.machine import Machine
from kafka2pc._core.messages import (
    IN_FLUX,
    ONGOING,
    OPEN_STATES,
    ClusterFacts,
    ConfigValue,
    Described,
    DescribeTransaction,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ObservedTransaction,
    ProducerIdentity,
    ReadBrokerConfig,
    TransactionDescription,
    TransactionListing,
)
from kafka2pc._core.requests import LookUntilSettled, Request
from kafka2pc._core.resend import Resending
from kafka2pc._core.retry import COORDINATOR_RETRY, SETTLE_LOOKS
from kafka2pc._core.setup import FENCE_TIMEOUT_MS, init_error
from kafka2pc._wire.cluster_client import ClusterClient
from kafka2pc._wire.kafka_transport import KafkaTransport
from kafka2pc.errors import BrokerUnavailableError, TransactionOutcomeUnknownError
from kafka2pc.prepared_state import PreparedTxnState

log = logging.getLogger(__name__)
R = TypeVar("R")
#: what :meth:`TransactionControl.abort_all_ongoing` reports of each id: what it aborted, None, or an error
Aborted = ObservedTransaction | None | Exception

__all__ = ["IN_FLUX", "ONGOING", "OPEN_STATES", "Fate", "InitAnswer", "ObservedTransaction",
           "ProducerIdentity", "Settled", "TransactionControl", "TransactionDescription", "TransactionListing",
           "TransactionOutcome"]


class ControlTransport(CoordinatorTransport, Protocol):
    """What :class:`TransactionControl` needs of a cluster."""

    def cluster_facts(self) -> ClusterFacts:
        """The protocol versions and features that decide how transactions run."""
        ...

    def list_transactions(self, *, states: Sequence[str] = (), pattern: str | None = None,
                          running_longer_than_ms: int | None = None) -> list[TransactionListing]:
        """ListTransactions on every broker: complete, or IncompleteListingError."""
        ...


class TransactionControl:
    """Coordinator-side operations on transactional ids.

    ``cluster`` is a :class:`~kafka2pc.cluster.ClusterClient`, or any :class:`ControlTransport` (the model-based
    tests pass a coordinator model). ``transaction_version`` is the protocol of transactions whose handle does not
    record it (default: the cluster's current one). Requests that may be repeated are sent again for up to
    ``timeout_s``.
    """

    def __init__(self, cluster: ClusterClient | ControlTransport, *, transaction_version: int | None = None,
                 timeout_s: float = 60.0):
        self.transport: ControlTransport = KafkaTransport(cluster, timeout_s=timeout_s) \
            if isinstance(cluster, ClusterClient) else cluster
        self._transaction_version = transaction_version
        self._fixed = transaction_version is not None
        self._read_at = 0.0
        self._retry = attrs.evolve(COORDINATOR_RETRY, timeout_s=timeout_s)

    @property
    def transaction_version(self) -> int:
        """The cluster's transaction protocol (1 or 2): its finalized ``transaction.version``, whatever the versions
        this client holds can send (transactions others began are under it). A 1 is read again once it is
        ``VERSIONS_MAX_AGE_S`` old (the cluster may have raised it since); one given to the constructor stands."""
        now = time.monotonic()
        if self._transaction_version is None or (
                self._transaction_version == 1 and not self._fixed and versions_too_old(now - self._read_at)):
            facts = self.transport.cluster_facts()
            self._transaction_version = int(facts.finalized_transaction_version or facts.transaction_version)
            self._read_at = now
        return self._transaction_version

    def _run(self, transactional_id: str, machine: Machine[R]) -> R:
        return drive(self.transport, transactional_id, Resending(machine, self._retry))

    def _run_all(self, machines: Sequence[tuple[str, Machine[R]]]) -> list[R | Exception]:
        return drive_all(self.transport, [(txn_id, Resending(machine, self._retry)) for txn_id, machine in machines])

    def _recorded(self, transaction: PreparedTxnState) -> PreparedTxnState:
        """``transaction`` with its protocol filled in where it is certain: a v1 cluster never ran a v2 one."""
        if transaction.transaction_version is None and self.transaction_version == 1:
            return attrs.evolve(transaction, transaction_version=1)
        return transaction

    # -- reading -----------------------------------------------------------------------------------------------------

    def _described(self, transactional_id: str) -> Described:
        return _as_described(transactional_id, self._run(transactional_id, Request(DescribeTransaction())))

    def describe_full(self, transactional_id: str) -> TransactionDescription | None:
        """Everything DescribeTransactions says of ``transactional_id``; None if the coordinator does not know it."""
        return self._described(transactional_id).description

    def describe(self, transactional_id: str) -> ObservedTransaction | None:
        """State, producer id and epoch of ``transactional_id``; None if unknown."""
        return self._described(transactional_id).observed

    def describe_all(self, transactional_ids: Sequence[str]) -> list[ObservedTransaction | Exception | None]:
        """:meth:`describe` of many ids at once (one round trip when all goes well); in order, each one's state or
        the error it could not be read with."""
        answers = self._run_all([(txn_id, Request(DescribeTransaction())) for txn_id in transactional_ids])
        return [_observed_or_error(txn_id, answer) for txn_id, answer in zip(transactional_ids, answers, strict=True)]

    def wait_until_settled(self, transactional_id: str, within_s: float) -> ObservedTransaction | None:
        """:meth:`describe`, looking again (for up to ``within_s``) while the id's last transaction is still writing
        its markers; returns what was seen last."""
        policy = attrs.evolve(SETTLE_LOOKS, timeout_s=within_s)
        return self._run(transactional_id, LookUntilSettled(transactional_id, policy))

    def list(self, *, states: Iterable[str] = (), pattern: str | None = None,
             running_longer_than_ms: int | None = None) -> list[TransactionListing]:
        """ListTransactions on every broker: complete, or :class:`~kafka2pc.errors.IncompleteListingError`."""
        return self.transport.list_transactions(states=list(states), pattern=pattern,
                                                running_longer_than_ms=running_longer_than_ms)

    def broker_config(self, name: str) -> str | None:
        """A broker config's value; None where it cannot be read."""
        answer = self._run("", Request(ReadBrokerConfig(name)))
        return answer.value if isinstance(answer, ConfigValue) else None

    # -- fencing -----------------------------------------------------------------------------------------------------

    def fence(self, transactional_id: str) -> ProducerIdentity:
        """A fresh InitProducerId for ``transactional_id`` with no transaction after it: every earlier producer of
        the id is fenced (an open transaction of it is aborted). Returns the new producer id and epoch."""
        answer = self._run(transactional_id, Request(InitProducerId(FENCE_TIMEOUT_MS)))
        if isinstance(answer, NoAnswer):
            raise BrokerUnavailableError(f"InitProducerId of {transactional_id!r}: {answer.reason}") from answer.cause
        assert isinstance(answer, InitAnswer)
        if answer.identity is None or answer.error:
            raise init_error(transactional_id, answer.error, FENCE_TIMEOUT_MS)
        return answer.identity

    def probe_init(self, transactional_id: str, *, enable_2pc: bool, keep_prepared: bool) -> InitAnswer:
        """InitProducerId with these KIP-939 fields, only to see what the coordinator answers (``kafka2pc doctor``):
        it fences the id like any fresh InitProducerId."""
        answer = self._run(transactional_id, Request(InitProducerId(
            60_000, enable_2pc=enable_2pc, keep_prepared=keep_prepared)))
        if isinstance(answer, NoAnswer):
            raise BrokerUnavailableError(f"InitProducerId of {transactional_id!r}: {answer.reason}") from answer.cause
        assert isinstance(answer, InitAnswer)
        return answer

    # -- ending ------------------------------------------------------------------------------------------------------

    def _committing(self, transactional_id: str, transaction: PreparedTxnState) -> Completion:
        transaction = self._recorded(transaction)
        return Completion(transactional_id, transaction, Goal.COMMIT,
                          end_version(transaction, True, self.transaction_version))

    def _aborting(self, transactional_id: str, transaction: PreparedTxnState) -> Completion:
        return Completion.aborting(transactional_id, self._recorded(transaction), self.transaction_version,
                                   writer_may_live=True)

    def commit(self, transactional_id: str, transaction: PreparedTxnState) -> Settled:
        """Commit exactly ``transaction`` (idempotent: an already committed one reports so). Raises
        :class:`~kafka2pc.errors.TransactionLostError` if it was aborted or never ran, and
        :class:`~kafka2pc.errors.TransactionOutcomeUnknownError` if its fate cannot be known."""
        return self._run(transactional_id, self._committing(transactional_id, transaction))

    def commit_all(self, transactions: Sequence[tuple[str, PreparedTxnState]]) -> Sequence[Settled | Exception]:
        """:meth:`commit` for many transactions at once (one round trip when all goes well); in order, each one's
        Settled or the error it ended with."""
        return self._run_all([(txn_id, self._committing(txn_id, state)) for txn_id, state in transactions])

    def abort_all(self, transactions: Sequence[tuple[str, PreparedTxnState]]) -> Sequence[Settled | Exception]:
        """:meth:`abort` for many transactions at once."""
        return self._run_all([(txn_id, self._aborting(txn_id, state)) for txn_id, state in transactions])

    def look_up_all(self, transactions: Sequence[tuple[str, PreparedTxnState]]) -> Sequence[Settled | Exception]:
        """What became of each transaction, ending nothing: a Settled whose outcome is COMMITTED or ABORTED, or None
        while it is still open; TransactionOutcomeUnknownError where the coordinator no longer says."""
        def looking(transactional_id: str, transaction: PreparedTxnState) -> Completion:
            recorded = self._recorded(transaction)
            return Completion(transactional_id, recorded, Goal.LOOK_UP,
                              recorded.transaction_version or self.transaction_version)

        return self._run_all([(txn_id, looking(txn_id, state)) for txn_id, state in transactions])

    def complete(self, transactional_id: str, transaction: PreparedTxnState) -> bool:
        """:meth:`commit`; True once committed."""
        return self.commit(transactional_id, transaction).outcome is TransactionOutcome.COMMITTED

    def abort(self, transactional_id: str, transaction: PreparedTxnState) -> Settled:
        """Abort exactly ``transaction``, conditional on its producer id and epoch: a later transaction of the id is
        never touched. The settled outcome says ABORTED (now or before, or it never ran) or COMMITTED (it had
        already committed: nothing was done). Protocol v1 (no epoch bump on abort) also fences the identity, after
        looking that the id is still at it (``settled.fenced`` says whether that worked)."""
        return self._run(transactional_id, self._aborting(transactional_id, transaction))

    def abort_ongoing(self, transactional_id: str, *, producer_id: int | None = None) -> ObservedTransaction | None:
        """Abort the transaction open on ``transactional_id`` now (only if its producer id is ``producer_id``,
        when given), conditional on the producer id and epoch DescribeTransactions reports for it; returns what
        was aborted, or None when nothing open matched or it ended meanwhile."""
        result = self.abort_all_ongoing([(transactional_id, producer_id)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def abort_all_ongoing(
            self, targets: Sequence[tuple[str, int | None]]) -> Sequence[ObservedTransaction | Exception | None]:
        """:meth:`abort_ongoing` of many ``(transactional_id, producer_id)`` at once: one round of
        DescribeTransactions, one of EndTxn (more only for what needs them); in order, each one's result or error."""
        looks = self.describe_all([txn_id for txn_id, _ in targets])
        results: list[Aborted] = []
        aborting: list[tuple[int, ObservedTransaction]] = []
        for index, ((txn_id, producer_id), observed) in enumerate(zip(targets, looks, strict=True)):
            results.append(None if not isinstance(observed, Exception) else observed)
            if isinstance(observed, Exception) or observed is None or observed.state != ONGOING:
                continue
            if producer_id is not None and observed.producer_id != producer_id:
                log.info("%r is now open under producer id %d, not the listed %d: left alone", txn_id,
                         observed.producer_id, producer_id)
                continue
            aborting.append((index, observed))
        # only described: which protocol each ran under is not known
        settled = self.abort_all([(targets[index][0], observed.identity.state()) for index, observed in aborting])
        for (index, observed), outcome in zip(aborting, settled, strict=True):
            results[index] = _aborted(targets[index][0], observed, outcome)
        return results


def _aborted(transactional_id: str, observed: ObservedTransaction,
             outcome: Settled | Exception) -> Aborted:
    """What :meth:`TransactionControl.abort_ongoing` reports of one abort's outcome."""
    target = observed.identity.state()
    if isinstance(outcome, TransactionOutcomeUnknownError):
        log.info("%s of %r ended before it could be aborted: %s", target, transactional_id, outcome.reason)
        return None
    if isinstance(outcome, Exception):
        return outcome
    if outcome.outcome is not TransactionOutcome.ABORTED:
        log.info("%s of %r committed before it could be aborted; left as it is", target, transactional_id)
        return None
    if outcome.fenced is False:
        log.warning("%s of %r aborted but not fenced (%s): a live writer of it could still start another "
                    "transaction at that epoch; abort again once it is stopped", target, transactional_id,
                    outcome.detail)
    return observed


def _as_described(transactional_id: str, answer: object) -> Described:
    """A DescribeTransactions answer, or the error a lost one (or a failure) stands for, raised."""
    if isinstance(answer, Exception):
        raise answer
    if isinstance(answer, NoAnswer):
        raise BrokerUnavailableError(f"DescribeTransactions of {transactional_id!r}: {answer.reason}") from answer.cause
    if not isinstance(answer, Described):
        raise TypeError(f"unexpected answer {answer!r}")
    return answer


def _observed_or_error(transactional_id: str, answer: object) -> ObservedTransaction | Exception | None:
    try:
        return _as_described(transactional_id, answer).observed
    except Exception as exc:
        return exc
