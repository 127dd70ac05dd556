"""How a producer registers its transactional id: Enable2Pc where the brokers accept it, a visible fallback where
they do not, and (keep_prepared_txn) a recovery that aborts nothing. A sans-IO machine.

The decision follows the cluster while a job runs, both ways. A fallback decided from ApiVersions older than
:data:`VERSIONS_MAX_AGE_S` has them read again first (a running client keeps the versions it learnt when it
connected: an upgraded broker would never be used). A producer that goes on from one transaction to the next
without an InitProducerId (a DualWriter; a Spark worker's cached producer) is replaced, once its decision is older
than :data:`DECISION_STANDS_S`, by one that initialises again (:func:`decision_stands`): a cluster that gains
two-phase commit is used, and one that turns it off is no longer given transactions that never time out."""

from __future__ import annotations

import enum

import attrs

from kafka2pc._core import codes
from kafka2pc._core.machine import Finished
from kafka2pc._core.messages import (
    ONGOING,
    Answer,
    ClusterFacts,
    Command,
    ConfigValue,
    Described,
    DescribeTransaction,
    FactsAnswer,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ProducerIdentity,
    ReadBrokerConfig,
    ReadClusterFacts,
)
from kafka2pc._core.setup import (
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    TransactionSetup,
    init_error,
)
from kafka2pc._core.versions import INIT_PRODUCER_ID_2PC_VERSION
from kafka2pc.errors import AuthorizationError, BrokerUnavailableError
from kafka2pc.prepared_state import PreparedTxnState

_TWO_PHASE_CONFIG = "transaction.two.phase.commit.enable"
_MAX_TIMEOUT_CONFIG = "transaction.max.timeout.ms"

#: a fallback for want of InitProducerId v6 is decided only from ApiVersions read within this many seconds; older
#: ones are read again first (at most once per this long per client, while the cluster lacks v6)
VERSIONS_MAX_AGE_S = 10.0
#: how long a producer's two-phase decision (Enable2Pc, or the fallback) stands while it goes on without an
#: InitProducerId: after that its next transaction is begun by a producer that initialises again
DECISION_STANDS_S = 30.0


def decision_stands(decided_at: float | None, now: float) -> bool:
    """Whether a producer whose two-phase decision was taken at ``decided_at`` (None: not known) may begin another
    transaction on it; False: replace it by one that initialises again, between transactions (the cluster may have
    gained two-phase commit, or turned it off, since)."""
    return decided_at is not None and now - decided_at < DECISION_STANDS_S


def versions_too_old(age_s: float | None) -> bool:
    """Whether ApiVersions ``age_s`` old (None: not known) must be read again before a fallback is decided on them."""
    return age_s is None or age_s > VERSIONS_MAX_AGE_S


class Phase(enum.Enum):
    """What the last command asked."""

    READ_FACTS = "the brokers' ApiVersions again: before a fallback for want of InitProducerId v6, or once v6 is gone"
    READ_MAX_TIMEOUT = "the broker's transaction.max.timeout.ms, for the fallback's timeout"
    INIT = "InitProducerId (with Enable2Pc where two-phase commit is in use)"
    KEEP = "InitProducerId with Enable2Pc and KeepPreparedTxn"
    DESCRIBE = "DescribeTransactions: the protocol-level keep-prepared recovery"
    READ_TWO_PHASE_CONFIG = "the broker's transaction.two.phase.commit.enable, after Enable2Pc was refused"
    PROBE_WRITE = "InitProducerId without Enable2Pc: is WRITE granted, without TWO_PHASE_COMMIT?"


@attrs.frozen
class Initialized:
    """What initialisation found: the producer's identity (None after a keep-prepared recovery, which sends no
    InitProducerId), the kept prepared transaction, and whether the broker itself kept it (KIP-939)."""

    setup: TransactionSetup
    identity: ProducerIdentity | None
    held: PreparedTxnState | None = None
    kept_by_broker: bool = False


class Initialization:
    """Drives ``init_transactions`` to :class:`Initialized`.

    ``fallback_reason`` is set when two-phase commit was asked for and is not available: the caller announces it;
    ``two_phase_turned_off`` when the broker said so by its config (``transaction.two.phase.commit.enable=false``),
    or stopped speaking InitProducerId v6 under a running client: prepared two-phase transactions outlive both.
    ``versions_age_s``: how old the ApiVersions behind ``init_producer_id_max_version`` are (None: not known).
    """

    def __init__(self, transactional_id: str, *, keep_prepared: bool, two_phase_wanted: bool,
                 init_producer_id_max_version: int, transaction_version: int, timeout_ms: int | None,
                 versions_age_s: float | None = 0.0):
        self.transactional_id = transactional_id
        self.keep_prepared = keep_prepared
        self.transaction_version = transaction_version
        self.configured_timeout_ms = timeout_ms
        self.timeout_ms = timeout_ms or DEFAULT_TRANSACTION_TIMEOUT_MS
        self.two_phase = two_phase_wanted
        self._two_phase_wanted = two_phase_wanted
        self.fallback_reason: str | None = None
        self.two_phase_turned_off = False
        self._can_2pc = init_producer_id_max_version >= INIT_PRODUCER_ID_2PC_VERSION
        self._init_max = init_producer_id_max_version
        self._versions_age_s = versions_age_s
        self._facts_read = False
        #: Enable2Pc could not be sent: the broker no longer speaks InitProducerId v6
        self._v6_gone = False
        self.phase = Phase.INIT

    @property
    def setup(self) -> TransactionSetup:
        """The setup as decided so far."""
        return TransactionSetup(self.transaction_version, self.two_phase, self.timeout_ms)

    def start(self, now: float | None = None) -> Command:
        """The first command: the one that decides between two-phase commit and the fallback."""
        if self.two_phase and not self._can_2pc:
            if versions_too_old(self._versions_age_s):  # the cluster may have gained v6 since they were read
                self.phase = Phase.READ_FACTS
                return ReadClusterFacts()
            if self._v6_gone:
                self.two_phase_turned_off = True
                return self._fall_back(f"the broker no longer advertises InitProducerId "
                                       f"v{INIT_PRODUCER_ID_2PC_VERSION} (now up to v{self._init_max}): "
                                       f"{_TWO_PHASE_CONFIG} or "
                                       "unstable.api.versions.enable was turned off, or the broker downgraded")
            return self._fall_back(f"the broker advertises InitProducerId up to v{self._init_max}; Enable2Pc needs "
                                   f"v{INIT_PRODUCER_ID_2PC_VERSION}")
        return self._main_request()

    def _after_facts(self, facts: ClusterFacts) -> Command:
        """Decide again on the facts read afresh (once: as old as they are, where a broker did not answer)."""
        self._init_max = facts.init_producer_id_max_version
        read = facts.versions_age_s is not None and not versions_too_old(facts.versions_age_s)
        # the coordinator's connection refused v6: only versions read afresh may say it is back
        self._can_2pc = self._init_max >= INIT_PRODUCER_ID_2PC_VERSION and (read or not self._v6_gone)
        self.transaction_version = facts.transaction_version
        self._versions_age_s, self._facts_read = 0.0, True
        return self.start()

    def _main_request(self) -> Command:
        if self.keep_prepared and self.two_phase:
            self.phase = Phase.KEEP
            return InitProducerId(self.timeout_ms, enable_2pc=True, keep_prepared=True)
        if self.keep_prepared:
            self.phase = Phase.DESCRIBE
            return DescribeTransaction()
        self.phase = Phase.INIT
        return self.setup.init()

    def _fall_back(self, reason: str) -> Command:
        self.two_phase = False
        self.fallback_reason = reason
        if self.configured_timeout_ms is None:
            self.phase = Phase.READ_MAX_TIMEOUT
            return ReadBrokerConfig(_MAX_TIMEOUT_CONFIG)
        return self._main_request()

    def on_answer(self, answer: Answer, now: float | None = None) -> Command | Finished[Initialized]:
        """The next command, or the result."""
        if isinstance(answer, NoAnswer):
            raise BrokerUnavailableError(f"initialising transactional id {self.transactional_id!r}: "
                                         f"{answer.reason}") from answer.cause
        phase = self.phase
        if phase is Phase.READ_FACTS and isinstance(answer, FactsAnswer):
            return self._after_facts(answer.facts)
        if phase is Phase.READ_MAX_TIMEOUT and isinstance(answer, ConfigValue):
            return self._after_max_timeout(answer.value)
        if phase is Phase.READ_TWO_PHASE_CONFIG and isinstance(answer, ConfigValue):
            return self._after_two_phase_config(answer.value)
        if phase is Phase.PROBE_WRITE and isinstance(answer, InitAnswer):
            if codes.kind(answer.error) is codes.Kind.DONE:
                raise AuthorizationError(
                    f"the principal may write with transactional id {self.transactional_id!r} but not use "
                    "two-phase commit: grant TWO_PHASE_COMMIT on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
            raise self._missing_both()
        if phase is Phase.DESCRIBE and isinstance(answer, Described):
            observed = answer.observed
            held = None
            if observed is not None and observed.state == ONGOING:
                held = observed.identity.state()  # which protocol it ran under is not known from here
            return Finished(Initialized(self.setup, None, held))
        if phase in (Phase.INIT, Phase.KEEP) and isinstance(answer, InitAnswer):
            return self._after_init(answer)
        raise TypeError(f"unexpected answer {answer!r} in phase {phase.name}")

    def _after_max_timeout(self, value: str | None) -> Command:
        if value is not None and value.strip().isdigit():
            self.timeout_ms = int(value)
        else:
            self.timeout_ms = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS
            self.fallback_reason = (f"{self.fallback_reason}; the broker's {_MAX_TIMEOUT_CONFIG} could not be read "
                                    "(DESCRIBE_CONFIGS on the cluster), so Kafka's default maximum is assumed: set "
                                    "transaction.timeout.ms")
        return self._main_request()

    def _after_init(self, answer: InitAnswer) -> Command | Finished[Initialized]:
        code = answer.error
        kind = codes.kind(code)
        if kind is codes.Kind.DONE and answer.identity is not None:
            if self.phase is Phase.KEEP and answer.ongoing is not None and answer.ongoing.producer_id >= 0:
                return Finished(Initialized(self.setup, answer.identity,
                                            answer.ongoing.state(self.transaction_version), kept_by_broker=True))
            return Finished(Initialized(self.setup, answer.identity))
        if self.phase is Phase.KEEP and kind is codes.Kind.UNSUPPORTED:
            # keepPreparedTxn is not implemented: resume at the protocol level, without any InitProducerId
            self.phase = Phase.DESCRIBE
            return DescribeTransaction()
        if kind is codes.Kind.UNSUPPORTED and self.two_phase and not self._facts_read:
            # the broker no longer speaks InitProducerId v6 (two-phase commit turned off, a downgrade) while the
            # client held the versions it had before: read them again, and decide again (once)
            self._v6_gone = True
            self.phase = Phase.READ_FACTS
            return ReadClusterFacts()
        if kind is codes.Kind.UNAUTHORIZED and self.two_phase:
            # the broker answers this both when 2PC is off and when an ACL is missing: its config tells which
            self.phase = Phase.READ_TWO_PHASE_CONFIG
            return ReadBrokerConfig(_TWO_PHASE_CONFIG)
        if kind is codes.Kind.UNAUTHORIZED and self._two_phase_wanted:
            raise self._missing_both()  # refused even without Enable2Pc: WRITE is missing too
        raise init_error(self.transactional_id, code, self.timeout_ms)

    def _after_two_phase_config(self, value: str | None) -> Command:
        if value == "true":
            if self.keep_prepared:  # an InitProducerId without Enable2Pc would abort the kept transaction
                raise AuthorizationError(f"the principal may not use transactional id {self.transactional_id!r} "
                                         "with two-phase commit: it needs WRITE and TWO_PHASE_COMMIT on it")
            self.phase = Phase.PROBE_WRITE
            return InitProducerId(self.timeout_ms)
        if value == "false":
            self.two_phase_turned_off = True
            return self._fall_back(f"the broker refused Enable2Pc: {_TWO_PHASE_CONFIG}=false")
        return self._fall_back("the broker refused Enable2Pc with TRANSACTIONAL_ID_AUTHORIZATION_FAILED and its "
                               f"configs cannot be read: either {_TWO_PHASE_CONFIG}=false or the principal lacks "
                               f"TWO_PHASE_COMMIT on {self.transactional_id!r}")

    def _missing_both(self) -> AuthorizationError:
        return AuthorizationError(f"the principal may not use transactional id {self.transactional_id!r}: grant "
                                  "WRITE and TWO_PHASE_COMMIT on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
