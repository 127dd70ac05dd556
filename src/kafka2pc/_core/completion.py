"""Drive one transaction to a goal — commit it, abort it, or learn its fate — with EndTxn and DescribeTransactions.
A sans-IO machine; what the coordinator's answers imply is :func:`~kafka2pc._core.judge.judge`'s to say."""

from __future__ import annotations

import enum

import attrs

from kafka2pc._core import codes
from kafka2pc._core.ending import end_error
from kafka2pc._core.judge import Fate, Judgement, TransactionOutcome, end_version, judge
from kafka2pc._core.looks import Looks
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import (
    COMPLETE_ABORT,
    IN_FLUX,
    ONGOING,
    PREPARE_ABORT,
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
from kafka2pc._core.retry import END_AGAIN, END_LOOKS, FENCE_SILENCES, Retry
from kafka2pc._core.setup import FENCE_TIMEOUT_MS
from kafka2pc.errors import (
    AuthorizationError,
    TransactionLostError,
    TransactionNotSettledError,
    TransactionOutcomeUnknownError,
    UnsupportedByBrokerError,
)
from kafka2pc.prepared_state import PreparedTxnState


class Goal(enum.Enum):
    """What a :class:`Completion` is for."""

    COMMIT = "commit exactly the requested transaction"
    ABORT = "abort exactly the requested transaction"
    LOOK_UP = "report the requested transaction's fate, ending nothing"


class Phase(enum.Enum):
    """What a :class:`Completion`'s last command asked."""

    LOOKING_FIRST = "an abort of a transaction of unknown protocol looks before its EndTxn"
    ENDING = "EndTxn"
    LOOKING = "DescribeTransactions: after an error, or to learn the fate"
    CHECKING_LOST_ABORT = "DescribeTransactions: did a v4 abort whose answer was lost land?"
    FENCE_LOOKING = "DescribeTransactions: is the id still at the aborted identity, for the fence?"
    FENCING = "the fence: InitProducerId bumping the aborted identity"


@attrs.frozen
class Settled:
    """What became of a :class:`Completion`'s transaction.

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
    """Drives one transaction of one transactional id to a :class:`Goal`, finishing with :class:`Settled`.

    COMMIT and ABORT first send the EndTxn itself, which Kafka makes exact and idempotent: conditional on the producer
    id and epoch, and answered with NONE when retried after it succeeded. Only an error or a lost answer costs a
    DescribeTransactions and a :func:`~kafka2pc._core.judge.judge`. With ``fence_after_abort`` (protocol v1, where an
    abort does not bump the epoch) a successful abort is followed by an InitProducerId bump of the same identity, so
    a zombie writer cannot reopen the transaction; it fails harmlessly if the id has moved on. ``looks`` bounds the
    DescribeTransactions while the coordinator writes markers.

    Raises :class:`~kafka2pc.errors.TransactionLostError` when a commit is impossible (aborted, or never started),
    :class:`~kafka2pc.errors.TransactionOutcomeUnknownError` when the fate cannot be known,
    :class:`~kafka2pc.errors.TransactionNotSettledError` when nothing settled it (the coordinator did not answer,
    kept it ongoing or in flux): the same goal may be retried; :class:`~kafka2pc.errors.AuthorizationError` and
    :class:`~kafka2pc.errors.UnsupportedByBrokerError` when EndTxn is refused for good. An error the edge raises
    instead of answering a commit's or an abort's command is raised as :func:`~kafka2pc._core.ending.end_error` says
    (:meth:`on_failure`), as a producer's end raises it. What a failure leaves a producer in is
    :func:`~kafka2pc._core.ending.failed_end`'s to say.
    """

    def __init__(self, transactional_id: str, requested: PreparedTxnState, goal: Goal, transaction_version: int, *,
                 fence_after_abort: bool = False, look_first: bool = False, looks: Retry = END_LOOKS):
        if requested.is_empty and goal is not Goal.LOOK_UP:
            raise ValueError("only a non-empty transaction can be committed or aborted")
        self.transactional_id = transactional_id
        self.requested = requested
        self.goal = goal
        self.transaction_version = transaction_version
        self.fence_after_abort = fence_after_abort
        #: abort a transaction ongoing at exactly its identity with EndTxn v5 (see :meth:`aborting`)
        self._v5_when_ongoing = look_first and goal is Goal.ABORT
        self._look_policy = looks
        self._looks = Looks(looks)
        #: EndTxn sent again after a look found the transaction still ongoing (the first one is not counted)
        self._ends_again = END_AGAIN.started()
        self._last_observed: ObservedTransaction | None = None
        #: requests of the fence that got no answer (each may have waited a full timeout)
        self._fence_silences = FENCE_SILENCES.started()
        self._sent_version = transaction_version
        self._last_answer = ""
        self.phase = Phase.LOOKING_FIRST if self._v5_when_ongoing else Phase.ENDING

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

    def start(self, now: float | None = None) -> Command:
        """The first command."""
        if self.goal is Goal.LOOK_UP or self.phase is Phase.LOOKING_FIRST:
            return self._describe(self.phase)
        return self._end()

    def on_failure(self, error: Exception) -> Exception:
        """The edge raised ``error`` instead of answering: for a commit or an abort, the error
        :func:`~kafka2pc._core.ending.end_error` makes of it (a KafkaProtocolError: not settled); a look-up's
        error as it is."""
        if self.goal is Goal.LOOK_UP:
            return error
        return end_error(self.transactional_id, self.requested, error)

    def _end(self, after_s: float = 0.0) -> EndTxn:
        observed = self._last_observed
        ongoing_now = observed is not None and observed.state == ONGOING and observed.identity == self._identity
        guarded = self._v5_when_ongoing and ongoing_now
        self._sent_version = 2 if guarded else self.transaction_version
        self.phase = Phase.ENDING
        return EndTxn(self._identity, self.goal is Goal.COMMIT, self._sent_version, after_s=after_s,
                      guarded_by_look=guarded)

    def _describe(self, phase: Phase = Phase.LOOKING) -> DescribeTransaction:
        look = self._looks.next()
        if look is None:
            raise self._not_settled(f"no settled answer after {self._looks.count} look-ups ({self._last_answer})")
        self.phase = phase
        return look

    def on_answer(self, answer: Answer, now: float | None = None) -> Command | Finished[Settled]:
        """The next command, or the settled result."""
        phase = self.phase
        if phase in (Phase.FENCE_LOOKING, Phase.FENCING):
            return self._fence_step(answer)
        if isinstance(answer, EndAnswer):
            return self._after_end(answer)
        if isinstance(answer, Described):
            self._last_observed = observed = answer.observed
            verdict = judge(self.requested, observed, self.requested.transaction_version)
            if phase is Phase.LOOKING_FIRST and verdict.fate is not Fate.IN_FLUX:
                return self._end()  # v5 if it is ongoing at exactly its identity; else the v4 path, as without a look
            if phase is Phase.CHECKING_LOST_ABORT and observed is not None and observed.identity == self._identity \
                    and observed.state in (PREPARE_ABORT, COMPLETE_ABORT):
                # the abort landed (or its writer aborted it; its markers may still be written): fence as after one
                return self._fence_step(answer)
            return self._after_look_up(verdict, Phase.LOOKING_FIRST if phase is Phase.LOOKING_FIRST
                                       else Phase.LOOKING)
        if isinstance(answer, NoAnswer) and phase is Phase.ENDING and self._fences_after_abort:
            # the v4 abort may have landed: look, rather than leave a live writer free to reopen the transaction
            self._last_answer = f"EndTxn: {answer.reason}"
            return self._describe(Phase.CHECKING_LOST_ABORT)
        if isinstance(answer, NoAnswer):
            raise self._not_settled(answer.reason) from answer.cause
        raise TypeError(f"unexpected answer {answer!r}")

    def _after_end(self, answer: EndAnswer) -> Command | Finished[Settled]:
        kind = codes.kind(answer.error)
        if kind is codes.Kind.DONE:
            if self._fences_after_abort:
                self._looks = Looks(self._look_policy)
                return self._describe(Phase.FENCE_LOOKING)
            outcome = TransactionOutcome.COMMITTED if self.goal is Goal.COMMIT else TransactionOutcome.ABORTED
            return Finished(Settled(outcome, Fate.COMMITTED if self.goal is Goal.COMMIT else Fate.ABORTED,
                                    "EndTxn accepted", ended_now=True, next_identity=answer.next_identity))
        name = codes.error_name(answer.error)
        self._last_answer = f"EndTxn answered {name}"
        if kind is codes.Kind.UNAUTHORIZED:
            raise AuthorizationError(f"the principal may not end transactions of {self.transactional_id!r}: grant "
                                     "WRITE on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
        if kind is codes.Kind.UNSUPPORTED:
            raise UnsupportedByBrokerError(f"the coordinator of {self.transactional_id!r} refused EndTxn of "
                                           f"transaction {self.requested} under transaction protocol "
                                           f"v{self._sent_version} ({name})")
        if kind in (codes.Kind.FENCED, codes.Kind.STALE, codes.Kind.UNKNOWN_ID) or not self._fences_after_abort:
            # not where the request assumed (perhaps a retry of an end that succeeded), or an error that says
            # nothing about the transaction: the coordinator answers, so look, and judge what it holds
            return self._describe()
        # an error that says nothing, after a v4 abort of a writer that may live: it may have landed, as after a
        # lost answer
        return self._describe(Phase.CHECKING_LOST_ABORT)

    def _fence_step(self, answer: Answer) -> Command | Finished[Settled]:
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
                    return self._describe(Phase.FENCE_LOOKING)
                if observed.state in (COMPLETE_ABORT, ONGOING):
                    self.phase = Phase.FENCING
                    return InitProducerId(FENCE_TIMEOUT_MS, expected=mine)
                return self._fenced(False, f"aborted; then the coordinator reported {observed}: a writer reopened "
                                           "the transaction at this epoch and ended it")
            return self._fenced(True, f"aborted; the id has moved on since ({observed}), which fences this epoch")
        if isinstance(answer, InitAnswer):
            kind = codes.kind(answer.error)
            if kind in (codes.Kind.DONE, codes.Kind.FENCED):
                return self._fenced(True, f"aborted and fenced ({codes.error_name(answer.error)})")
            if kind in (codes.Kind.COORDINATOR_BUSY, codes.Kind.TIMED_OUT):
                return self._describe(Phase.FENCE_LOOKING)  # it may have acted; look before anything else
            return self._fenced(False, f"aborted; the fencing InitProducerId answered {codes.error_name(answer.error)}")
        silence = self._fence_silences.next() if isinstance(answer, NoAnswer) else None
        if silence is not None and self._looks.left:
            # a look or a fence without an answer: look (again), then bump if the id is still at this identity
            self._fence_silences = silence
            return self._describe(Phase.FENCE_LOOKING)
        if isinstance(answer, NoAnswer):
            return self._fenced(False, f"aborted; the fence got no answer: {answer.reason}")
        raise TypeError(f"unexpected answer {answer!r}")

    def _fenced(self, fenced: bool, detail: str) -> Finished[Settled]:
        return Finished(Settled(TransactionOutcome.ABORTED, Fate.ABORTED, detail, ended_now=True, fenced=fenced))

    def _after_look_up(self, verdict: Judgement, in_flux_phase: Phase) -> Command | Finished[Settled]:
        fate = verdict.fate
        if fate is Fate.IN_FLUX:
            return self._describe(in_flux_phase)
        if fate is Fate.PENDING:
            if self.goal is Goal.LOOK_UP:
                return Finished(Settled(None, fate, verdict.reason, pending=self._identity))
            again = self._ends_again.next()
            if again is None:
                raise self._not_settled(f"still ongoing after {self._ends_again.tries + 1} EndTxn requests "
                                        f"({self._last_answer})")
            self._ends_again = again
            return self._end(again.delay_s)
        if fate is Fate.COMMITTED:
            if self.goal is Goal.ABORT:
                return Finished(Settled(TransactionOutcome.COMMITTED, fate, verdict.reason))
            return Finished(Settled(TransactionOutcome.COMMITTED, fate, verdict.reason,
                                    next_identity=self._next_identity(), pending=verdict.other_pending))
        if fate in (Fate.ABORTED, Fate.NEVER_STARTED):
            if self.goal is Goal.COMMIT:
                why = "the broker aborted it" if fate is Fate.ABORTED else fate.value
                raise TransactionLostError(self.transactional_id, self.requested.producer_id, self.requested.epoch,
                                           f"{why} ({verdict.reason})")
            next_identity = self._next_identity() if fate is Fate.ABORTED else None
            return Finished(Settled(TransactionOutcome.ABORTED, fate, f"{fate.value} ({verdict.reason})",
                                    next_identity=next_identity, pending=verdict.other_pending))
        raise self._unknown(verdict.reason, pending=verdict.other_pending)

    def _next_identity(self) -> ProducerIdentity | None:
        observed = self._last_observed
        return None if observed is None else observed.identity

    def _unknown(self, reason: str, pending: ProducerIdentity | None = None) -> TransactionOutcomeUnknownError:
        return TransactionOutcomeUnknownError(self.transactional_id, str(self.requested), reason,
                                              observed=None if self._last_observed is None
                                              else str(self._last_observed),
                                              other_pending=None if pending is None else str(pending))

    def _not_settled(self, reason: str) -> TransactionNotSettledError:
        """Nothing settled the goal: the same goal may be retried (the transaction may still be pending)."""
        return TransactionNotSettledError(self.transactional_id, str(self.requested), reason)
