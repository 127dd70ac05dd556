"""The one interpreter of how a transaction ends: judge what the coordinator reports, and drive a transaction to a
goal (commit it, abort it, or learn its fate) with EndTxn and DescribeTransactions. Pure; no I/O.

A transaction is identified by its producer id and epoch. kafka2pc keeps that identity unique per transaction:

* transaction protocol v2 (KIP-890, Kafka 4.x): the coordinator bumps the epoch when a transaction ends, so the
  transaction run at epoch *e* ends as ``CompleteCommit``/``CompleteAbort`` at *e + 1* (timeouts and fencing
  included; measured on Apache Kafka 4.4.0, see docs/producer.md). kafka2pc never runs a transaction at an epoch
  whose end would exhaust the epoch and rotate the producer id (:data:`MAX_TRANSACTION_EPOCH`).
* transaction protocol v1 (Kafka 3.x): the coordinator keeps the epoch across transactions, so every kafka2pc
  producer leaves at least two epochs between the end of one transaction and the next (its first one included, after
  a fresh InitProducerId). Transaction *e* then ends as ``CompleteCommit(e)``, ``CompleteAbort(e)`` (aborted by
  EndTxn) or ``CompleteAbort(e + 1)`` (aborted by the coordinator on timeout or fencing), and none of those can
  belong to another transaction.

The two protocols read one coordinator state differently only at the transaction's own epoch: ``Complete*`` at *e*
is a v1 end of it, but under v2 the end of the transaction before it (it never started). :func:`judge` therefore
uses the protocol the handle recorded, and without one (a handle parsed from KIP-939's bare string) it concludes
only where both readings agree: exact across a cluster upgrade from ``transaction.version`` 1 to 2.

Every verdict is a fact the coordinator's state implies under those rules; where it implies nothing, the verdict is
:attr:`Fate.UNKNOWN` and callers raise :class:`~kafka2pc.errors.TransactionOutcomeUnknownError` rather than guess.
"""

from __future__ import annotations

import enum

import attrs

from kafka2pc import broker_errors as codes
from kafka2pc.coordinator_messages import (
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    EMPTY,
    IN_FLUX,
    ONGOING,
    Answer,
    Command,
    Described,
    DescribeTransaction,
    EndAnswer,
    EndTxn,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ObservedTransaction,
    ProducerIdentity,
)
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    KafkaProtocolError,
    TransactionLostError,
    TransactionOutcomeUnknownError,
)
from kafka2pc.prepared_state import MAX_EPOCH, PreparedTxnState

#: The highest epoch kafka2pc runs a transaction at: ending it (v2), or a coordinator abort of it (v1), moves the
#: epoch to at most 32766 without exhausting it, so the producer id never rotates under a prepared transaction.
MAX_TRANSACTION_EPOCH = MAX_EPOCH - 2
#: InitProducerId's timeout when it only fences (v1, after a conditional abort): any broker maximum allows it.
FENCE_TIMEOUT_MS = 1000
#: Look-ups while the coordinator is still writing markers: backoff of the n-th look-up, capped.
_LOOK_AGAIN_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
#: requests of a fence left unanswered before the abort is reported as not fenced (each may take a timeout)
_FENCE_SILENCES = 4
_RETRY_AFTER_ERROR = frozenset({codes.INVALID_TXN_STATE, codes.PRODUCER_FENCED, codes.INVALID_PRODUCER_EPOCH,
                                codes.INVALID_PRODUCER_ID_MAPPING})


class TransactionOutcome(enum.Enum):
    """How a transaction ended."""

    COMMITTED = "committed"
    ABORTED = "aborted"


class Fate(enum.Enum):
    """What the coordinator's state implies about one transaction."""

    PENDING = "ongoing: it can still be committed or aborted"
    COMMITTED = "committed"
    ABORTED = "aborted"
    NEVER_STARTED = "the coordinator never ran a transaction at that producer id and epoch"
    UNKNOWN = "not ongoing, and the coordinator's state no longer says how it ended"
    IN_FLUX = "the coordinator is still ending or fencing a transaction"


@attrs.frozen
class Judgement:
    """A :class:`Fate`, why, and whether another transaction is ongoing on the transactional id."""

    fate: Fate
    reason: str
    other_pending: ProducerIdentity | None = None


def judge(requested: PreparedTxnState, observed: ObservedTransaction | None,
          transaction_version: int | None = None) -> Judgement:
    """What ``observed`` (DescribeTransactions; None: the id is unknown) implies about ``requested``, a transaction
    run under ``transaction_version`` (None: not known)."""
    if observed is not None and observed.state in IN_FLUX:
        return Judgement(Fate.IN_FLUX, f"coordinator reports {observed}")
    other = observed.identity if observed is not None and observed.state == ONGOING else None
    if requested.is_empty:
        return Judgement(Fate.NEVER_STARTED, "no transaction was requested", other)
    if observed is None:
        return Judgement(Fate.UNKNOWN, "the coordinator has no record of the transactional id (it expired after "
                                       "transactional.id.expiration.ms, or was never used on this cluster)")
    seen = f"coordinator reports {observed}"
    if observed.producer_id != requested.producer_id:
        return Judgement(Fate.UNKNOWN, f"{seen}: the id has another producer id since", other)
    lag = observed.epoch - requested.epoch
    if observed.state == ONGOING:
        if lag == 0:
            return Judgement(Fate.PENDING, seen)
        if lag < 0:
            return Judgement(Fate.NEVER_STARTED, f"{seen}, an earlier epoch", other)
        return Judgement(Fate.UNKNOWN, f"{seen}: a later transaction has started since", other)
    if observed.state not in (COMPLETE_COMMIT, COMPLETE_ABORT, EMPTY):
        return Judgement(Fate.UNKNOWN, seen)
    ended = {COMPLETE_COMMIT: Fate.COMMITTED, COMPLETE_ABORT: Fate.ABORTED}.get(observed.state)
    if ended is not None and lag == 1 and (ended is Fate.ABORTED or transaction_version != 1):
        return Judgement(ended, seen)  # v2's end (both); v1's coordinator abort; never a v1 commit: see above
    if ended is not None and lag == 0:
        if transaction_version == 1:
            return Judgement(ended, seen)  # v1 keeps the epoch at the end
        if transaction_version is None:
            return Judgement(Fate.UNKNOWN, f"{seen}: under transaction protocol v1 that is its end, under v2 the "
                                           "end of the one before it; the handle does not say which it ran under")
        return Judgement(Fate.NEVER_STARTED, seen)  # v2: the previous transaction ended at e; R never registered
    # a transaction at e, once registered, never leaves Empty(e) behind: the id never got past it
    if lag < 0 or (lag == 0 and observed.state == EMPTY):
        return Judgement(Fate.NEVER_STARTED, seen)
    return Judgement(Fate.UNKNOWN, f"{seen}: the id has moved on since")


def end_version(requested: PreparedTxnState, commit: bool, cluster_version: int) -> int:
    """The transaction protocol to end ``requested`` with (EndTxn v5 for 2, v4 for 1).

    Its recorded protocol when there is one. Otherwise (a bare ``"pid:epoch"``, a transaction only described):
    a commit may use the cluster's — both versions commit only an ongoing transaction and refuse a finished one —
    but an abort uses v4: a v5 abort of a v1 transaction that already committed at the current epoch is accepted
    as an abort of an empty transaction (it bumps the epoch), hiding the commit. A v4 abort never bumps, so its
    caller fences afterwards (``fence_after_abort``), and on a v2 cluster it is sent only after a look found the
    transaction no longer ongoing (:meth:`Completion.aborting`)."""
    if requested.transaction_version is not None:
        return requested.transaction_version
    return cluster_version if commit else 1


class Goal(enum.Enum):
    """What a :class:`Completion` is for."""

    COMMIT = "commit exactly the requested transaction"
    ABORT = "abort exactly the requested transaction"
    LOOK_UP = "report the requested transaction's fate, ending nothing"


@attrs.frozen
class Settled:
    """The end of a :class:`Completion`.

    ``outcome`` is None only for :attr:`Goal.LOOK_UP` when the transaction (or another one) is still ongoing.
    ``next_identity`` is the identity the coordinator holds right after this transaction ended by this completion
    (what a transaction protocol v2 producer continues with), when known.
    """

    outcome: TransactionOutcome | None
    fate: Fate
    detail: str
    ended_now: bool = False
    next_identity: ProducerIdentity | None = None
    pending: ProducerIdentity | None = None
    #: protocol v1 abort with ``fence_after_abort``: whether the identity is known to be fenced now
    fenced: bool | None = None


class Completion:
    """Drives one transaction of one transactional id to a :class:`Goal`: call :meth:`start`, send the command it
    returns, pass the answer to :meth:`on_answer`, and repeat until it returns :class:`Settled`.

    COMMIT and ABORT first send the EndTxn itself, which Kafka makes exact and idempotent: conditional on the producer
    id and epoch, and answered with NONE when retried after it succeeded. Only an error or a lost answer costs a
    DescribeTransactions and a :func:`judge`. With ``fence_after_abort`` (protocol v1, where an abort does not bump the
    epoch) a successful abort is followed by an InitProducerId bump of the same identity, so a zombie writer cannot
    reopen the transaction; it fails harmlessly if the id has moved on.

    Raises :class:`~kafka2pc.errors.TransactionLostError` when a commit is impossible (aborted, or never started),
    :class:`~kafka2pc.errors.TransactionOutcomeUnknownError` when the fate cannot be known, and
    :class:`~kafka2pc.errors.AuthorizationError`/:class:`~kafka2pc.errors.KafkaProtocolError` on other errors.
    """

    def __init__(self, transactional_id: str, requested: PreparedTxnState, goal: Goal, transaction_version: int, *,
                 fence_after_abort: bool = False, look_first: bool = False, max_look_ups: int = 40):
        if requested.is_empty and goal is not Goal.LOOK_UP:
            raise ValueError("only a non-empty transaction can be committed or aborted")
        self.transactional_id = transactional_id
        self.requested = requested
        self.goal = goal
        self.transaction_version = transaction_version
        self.fence_after_abort = fence_after_abort
        #: abort a transaction ongoing at exactly its identity with EndTxn v5 (see :meth:`aborting`)
        self._v5_when_ongoing = look_first and goal is Goal.ABORT
        self._first_look = self._v5_when_ongoing
        self._look_ups_left = max_look_ups
        self._look_ups = 0
        self._ends_left = 3
        self._last_observed: ObservedTransaction | None = None
        self._fencing = False
        self._abort_unanswered = False
        self._fence_silences = 0  # requests of the fence that got no answer (each may have waited a full timeout)
        self._awaiting = ""  # what the last command was: "end", "look" or "fence"
        self._sent_version = transaction_version
        self._last_answer = ""

    @classmethod
    def aborting(cls, transactional_id: str, requested: PreparedTxnState, cluster_version: int, *,
                 writer_may_live: bool) -> Completion:
        """The abort of ``requested`` on a cluster running transaction protocol ``cluster_version``.
        ``writer_may_live``: another process may still write ``requested`` (a resumed or listed transaction).

        Such a writer must never reopen the transaction at its epoch once it is aborted (it would go on writing, and
        could commit, a transaction missing what it wrote before). An abort that bumps the epoch (EndTxn v5) fences
        it at once; a v4 abort is followed by a fence. Where the protocol the transaction ran under is not known and
        the cluster runs v2, it looks first: a transaction ongoing at exactly its producer id and epoch is aborted
        with v5 — only a finished one could be a v1 commit a v5 abort would hide — and anything else takes the v4
        path."""
        version = end_version(requested, False, cluster_version)
        look_first = requested.transaction_version is None and cluster_version >= 2
        return cls(transactional_id, requested, Goal.ABORT, version, look_first=look_first,
                   fence_after_abort=writer_may_live and version < 2)

    @property
    def _identity(self) -> ProducerIdentity:
        return ProducerIdentity.of(self.requested)

    @property
    def _fences_after_abort(self) -> bool:
        """Whether the abort just sent needs a fence: a v4 one (it does not bump) of a writer that may live."""
        return self.goal is Goal.ABORT and self.fence_after_abort and self._sent_version < 2

    def _end(self) -> EndTxn:
        self._ends_left -= 1
        observed = self._last_observed
        ongoing_now = observed is not None and observed.state == ONGOING and observed.identity == self._identity
        self._sent_version = 2 if self._v5_when_ongoing and ongoing_now else self.transaction_version
        self._first_look = False
        self._awaiting = "end"
        return EndTxn(self._identity, self.goal is Goal.COMMIT, self._sent_version)

    def start(self) -> Command:
        """The first command."""
        if self.goal is Goal.LOOK_UP or self._first_look:
            return self._describe()
        return self._end()

    def _describe(self) -> DescribeTransaction:
        if self._look_ups_left <= 0:
            raise self._unknown(f"no settled answer after {self._look_ups} look-ups ({self._last_answer})",
                                still_pending=True)
        self._look_ups_left -= 1
        delay = _LOOK_AGAIN_S[min(self._look_ups, len(_LOOK_AGAIN_S) - 1)] if self._look_ups else 0.0
        self._look_ups += 1
        self._awaiting = "look"
        return DescribeTransaction(after_s=delay)

    def on_answer(self, answer: Answer) -> Command | Settled:
        """The next command, or the settled result."""
        if self._fencing:
            return self._fence_step(answer)
        if isinstance(answer, EndAnswer):
            return self._after_end(answer)
        if isinstance(answer, Described):
            self._last_observed = observed = answer.observed
            verdict = judge(self.requested, observed, self.requested.transaction_version)
            if self._first_look and verdict.fate is not Fate.IN_FLUX:
                return self._end()  # v5 if it is ongoing at exactly its identity; else the v4 path, as without a look
            if self._abort_unanswered:
                self._abort_unanswered = False
                if observed is not None and observed.identity == self._identity and observed.state == COMPLETE_ABORT:
                    self._fencing = True  # the abort landed (or its writer aborted it): fence as after an answer
                    return self._fence_step(answer)
            return self._after_look_up(verdict)
        if isinstance(answer, NoAnswer) and self._awaiting == "end" and self._fences_after_abort:
            # the v4 abort may have landed: look, rather than leave a live writer free to reopen the transaction
            self._abort_unanswered = True
            return self._describe()
        if isinstance(answer, NoAnswer):
            raise BrokerUnavailableError(f"transaction {self.requested} of {self.transactional_id!r}: "
                                         f"{answer.reason}; whether it ended is not known yet: retry")
        raise TypeError(f"unexpected answer {answer!r}")

    def _after_end(self, answer: EndAnswer) -> Command | Settled:
        if answer.error == codes.NONE:
            if self._fences_after_abort:
                self._fencing = True
                self._look_ups = 0
                return self._describe()
            if self.goal is Goal.COMMIT:
                return Settled(TransactionOutcome.COMMITTED, Fate.COMMITTED, "EndTxn accepted", ended_now=True,
                               next_identity=answer.next_identity)
            return Settled(TransactionOutcome.ABORTED, Fate.ABORTED, "EndTxn accepted", ended_now=True,
                           next_identity=answer.next_identity)
        self._last_answer = f"EndTxn answered {codes.error_name(answer.error)}"
        if answer.error == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise AuthorizationError(f"the principal may not end transactions of {self.transactional_id!r}: grant "
                                     "WRITE on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
        if answer.error not in _RETRY_AFTER_ERROR:
            raise KafkaProtocolError("EndTxn", codes.error_name(answer.error), answer.error,
                                     f"transaction {self.requested} of {self.transactional_id!r}")
        return self._describe()

    def _fence_step(self, answer: Answer) -> Command | Settled:
        """v1, after the abort: bump the aborted identity, so a zombie writer cannot reopen a transaction at it —
        but only after looking: the bump is sent while the id is still at exactly that identity (aborted, or
        reopened by the zombie at that same epoch, which the bump then aborts too), and again only after a look
        shows an unanswered one did not land; never onto a newer transaction (Kafka would abort that, checking only
        the producer id)."""
        mine = self._identity
        if isinstance(answer, Described):
            self._last_observed = observed = answer.observed
            if observed is not None and observed.identity == mine:
                if observed.state in IN_FLUX:
                    return self._describe()
                if observed.state in (COMPLETE_ABORT, ONGOING):
                    self._awaiting = "fence"
                    return InitProducerId(FENCE_TIMEOUT_MS, expected=mine, once=True)
                return self._fenced(False, f"aborted; then the coordinator reported {observed}: a writer reopened "
                                           "the transaction at this epoch and ended it")
            return self._fenced(True, f"aborted; the id has moved on since ({observed}), which fences this epoch")
        if isinstance(answer, InitAnswer):
            if answer.error in (codes.NONE, codes.PRODUCER_FENCED, codes.INVALID_PRODUCER_EPOCH):
                return self._fenced(True, f"aborted and fenced ({codes.error_name(answer.error)})")
            if answer.error in codes.COORDINATOR_RETRIABLE:
                return self._describe()  # busy or moved: it may have acted; look before anything else
            return self._fenced(False, f"aborted; the fencing InitProducerId answered {codes.error_name(answer.error)}")
        if isinstance(answer, NoAnswer) and self._fence_silences < _FENCE_SILENCES and self._look_ups_left > 0:
            # a look or a fence without an answer: look (again), then bump if the id is still at this identity
            self._fence_silences += 1
            return self._describe()
        if isinstance(answer, NoAnswer):
            return self._fenced(False, f"aborted; the fence got no answer: {answer.reason}")
        raise TypeError(f"unexpected answer {answer!r}")

    def _fenced(self, fenced: bool, detail: str) -> Settled:
        return Settled(TransactionOutcome.ABORTED, Fate.ABORTED, detail, ended_now=True, fenced=fenced)

    def _after_look_up(self, verdict: Judgement) -> Command | Settled:
        fate = verdict.fate
        if fate is Fate.IN_FLUX:
            return self._describe()
        if fate is Fate.PENDING:
            if self.goal is Goal.LOOK_UP:
                return Settled(None, fate, verdict.reason, pending=self._identity)
            if self._ends_left <= 0:
                raise self._unknown(f"still ongoing after repeated EndTxn ({self._last_answer})", still_pending=True)
            return self._end()
        if fate is Fate.COMMITTED:
            if self.goal is Goal.ABORT:
                return Settled(TransactionOutcome.COMMITTED, fate, verdict.reason)
            return Settled(TransactionOutcome.COMMITTED, fate, verdict.reason, next_identity=self._next_identity(),
                           pending=verdict.other_pending)
        if fate in (Fate.ABORTED, Fate.NEVER_STARTED):
            if self.goal is Goal.COMMIT:
                why = "the broker aborted it" if fate is Fate.ABORTED else fate.value
                raise TransactionLostError(self.transactional_id, self.requested.producer_id, self.requested.epoch,
                                           f"{why} ({verdict.reason})")
            next_identity = self._next_identity() if fate is Fate.ABORTED else None
            return Settled(TransactionOutcome.ABORTED, fate, f"{fate.value} ({verdict.reason})",
                           next_identity=next_identity, pending=verdict.other_pending)
        raise self._unknown(verdict.reason, pending=verdict.other_pending)

    def _next_identity(self) -> ProducerIdentity | None:
        observed = self._last_observed
        return None if observed is None else observed.identity

    def _unknown(self, reason: str, pending: ProducerIdentity | None = None, *,
                 still_pending: bool = False) -> TransactionOutcomeUnknownError:
        return TransactionOutcomeUnknownError(self.transactional_id, str(self.requested), reason,
                                              observed=None if self._last_observed is None
                                              else str(self._last_observed),
                                              other_pending=None if pending is None else str(pending),
                                              still_pending=still_pending)
