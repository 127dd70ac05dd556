"""How a producer registers its transactional id: Enable2Pc where the brokers accept it, a visible fallback where
they do not, and (keep_prepared_txn) a recovery that aborts nothing. Pure; no I/O."""

from __future__ import annotations

import attrs

from kafka2pc import broker_errors as codes
from kafka2pc.coordinator_messages import (
    ONGOING,
    Answer,
    Command,
    ConfigValue,
    Described,
    DescribeTransaction,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ProducerIdentity,
    ReadBrokerConfig,
)
from kafka2pc.errors import (
    AuthorizationError,
    BrokerUnavailableError,
    ConfigError,
    KafkaProtocolError,
    ProducerFencedError,
)
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.protocol_versions import INIT_PRODUCER_ID_2PC_VERSION

DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
#: Kafka's default transaction.max.timeout.ms, assumed in fallback mode when the broker's cannot be read.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000
TWO_PHASE_SETTINGS = ("transaction.two.phase.commit.enable=true and unstable.api.versions.enable=true "
                      "(Apache Kafka >= 4.1)")
_TWO_PHASE_CONFIG = "transaction.two.phase.commit.enable"
_MAX_TIMEOUT_CONFIG = "transaction.max.timeout.ms"


@attrs.frozen
class TransactionSetup:
    """How this producer's transactions run: the transaction protocol (1 or 2), whether Enable2Pc is in use, and the
    transaction.timeout.ms sent with InitProducerId."""

    transaction_version: int
    two_phase: bool
    timeout_ms: int

    def init(self, expected: ProducerIdentity | None = None) -> InitProducerId:
        """InitProducerId for this setup: a fresh producer, or a bump of ``expected`` (sent once: see
        :class:`~kafka2pc.coordinator_messages.InitProducerId`)."""
        return InitProducerId(self.timeout_ms, expected=expected, enable_2pc=self.two_phase,
                              once=expected is not None)


@attrs.frozen
class Initialized:
    """What initialisation found: the producer's identity (None after a keep-prepared recovery, which sends no
    InitProducerId), the kept prepared transaction, and whether the broker itself kept it (KIP-939)."""

    setup: TransactionSetup
    identity: ProducerIdentity | None
    held: PreparedTxnState | None = None
    kept_by_broker: bool = False


def fenced(transactional_id: str, detail: str) -> ProducerFencedError:
    """The error of a producer whose transactional id is owned by a newer producer."""
    return ProducerFencedError(f"transactional id {transactional_id!r} is owned by a newer producer ({detail})")


def init_error(transactional_id: str, code: int, timeout_ms: int) -> Exception:
    """The error an InitProducerId failure becomes."""
    if code in (codes.PRODUCER_FENCED, codes.INVALID_PRODUCER_EPOCH):
        return fenced(transactional_id, codes.error_name(code))
    if code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return AuthorizationError(f"the principal may not use transactional id {transactional_id!r}: grant WRITE "
                                  "on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
    if code == codes.INVALID_TRANSACTION_TIMEOUT:
        return ConfigError("transaction.timeout.ms", f"{timeout_ms} exceeds the broker's transaction.max.timeout.ms")
    return KafkaProtocolError("InitProducerId", codes.error_name(code), code, f"transactional id {transactional_id!r}")


class Initialization:
    """Drives ``init_transactions``: :meth:`start`, then :meth:`on_answer` until it returns :class:`Initialized`.

    ``fallback_reason`` is set when two-phase commit was asked for and is not available: the caller announces it.
    """

    def __init__(self, transactional_id: str, *, keep_prepared: bool, two_phase_wanted: bool,
                 init_producer_id_max_version: int, transaction_version: int, timeout_ms: int | None):
        self.transactional_id = transactional_id
        self.keep_prepared = keep_prepared
        self.transaction_version = transaction_version
        self.configured_timeout_ms = timeout_ms
        self.timeout_ms = timeout_ms or DEFAULT_TRANSACTION_TIMEOUT_MS
        self.two_phase = two_phase_wanted
        self._two_phase_wanted = two_phase_wanted
        self.fallback_reason: str | None = None
        self._can_2pc = init_producer_id_max_version >= INIT_PRODUCER_ID_2PC_VERSION
        self._init_max = init_producer_id_max_version
        self._step = ""

    @property
    def setup(self) -> TransactionSetup:
        """The setup as decided so far."""
        return TransactionSetup(self.transaction_version, self.two_phase, self.timeout_ms)

    def start(self) -> Command:
        """The first command."""
        if self.two_phase and not self._can_2pc:
            return self._fall_back(f"the broker advertises InitProducerId up to v{self._init_max}; Enable2Pc needs "
                                   f"v{INIT_PRODUCER_ID_2PC_VERSION}")
        return self._main_request()

    def _main_request(self) -> Command:
        if self.keep_prepared and self.two_phase:
            self._step = "keep"
            return InitProducerId(self.timeout_ms, enable_2pc=True, keep_prepared=True)
        if self.keep_prepared:
            self._step = "describe"
            return DescribeTransaction()
        self._step = "init"
        return self.setup.init()

    def _fall_back(self, reason: str) -> Command:
        self.two_phase = False
        self.fallback_reason = reason
        if self.configured_timeout_ms is None:
            self._step = "max-timeout"
            return ReadBrokerConfig(_MAX_TIMEOUT_CONFIG)
        return self._main_request()

    def on_answer(self, answer: Answer) -> Command | Initialized:
        """The next command, or the result."""
        if isinstance(answer, NoAnswer):
            raise BrokerUnavailableError(f"initialising transactional id {self.transactional_id!r}: {answer.reason}")
        step = self._step
        if step == "max-timeout" and isinstance(answer, ConfigValue):
            return self._after_max_timeout(answer.value)
        if step == "two-phase-config" and isinstance(answer, ConfigValue):
            return self._after_two_phase_config(answer.value)
        if step == "probe-write" and isinstance(answer, InitAnswer):
            if answer.error == codes.NONE:
                raise AuthorizationError(
                    f"the principal may write with transactional id {self.transactional_id!r} but not use "
                    "two-phase commit: grant TWO_PHASE_COMMIT on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
            raise self._missing_both()
        if step == "describe" and isinstance(answer, Described):
            observed = answer.observed
            held = None
            if observed is not None and observed.state == ONGOING:
                held = observed.identity.state()  # which protocol it ran under is not known from here
            return Initialized(self.setup, None, held)
        if step in ("init", "keep") and isinstance(answer, InitAnswer):
            return self._after_init(answer)
        raise TypeError(f"unexpected answer {answer!r} in step {step!r}")

    def _after_max_timeout(self, value: str | None) -> Command:
        if value is not None and value.strip().isdigit():
            self.timeout_ms = int(value)
        else:
            self.timeout_ms = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS
            self.fallback_reason = (f"{self.fallback_reason}; the broker's {_MAX_TIMEOUT_CONFIG} could not be read "
                                    "(DESCRIBE_CONFIGS on the cluster), so Kafka's default maximum is assumed: set "
                                    "transaction.timeout.ms")
        return self._main_request()

    def _after_init(self, answer: InitAnswer) -> Command | Initialized:
        code = answer.error
        if code == codes.NONE and answer.identity is not None:
            if self._step == "keep" and answer.ongoing is not None and answer.ongoing.producer_id >= 0:
                return Initialized(self.setup, answer.identity, answer.ongoing.state(self.transaction_version),
                                   kept_by_broker=True)
            return Initialized(self.setup, answer.identity)
        if self._step == "keep" and code == codes.UNSUPPORTED_VERSION:
            # keepPreparedTxn is not implemented: resume at the protocol level, without any InitProducerId
            self._step = "describe"
            return DescribeTransaction()
        if code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and self.two_phase:
            # the broker answers this both when 2PC is off and when an ACL is missing: its config tells which
            self._step = "two-phase-config"
            return ReadBrokerConfig(_TWO_PHASE_CONFIG)
        if code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and self._two_phase_wanted:
            raise self._missing_both()  # refused even without Enable2Pc: WRITE is missing too
        raise init_error(self.transactional_id, code, self.timeout_ms)

    def _after_two_phase_config(self, value: str | None) -> Command:
        if value == "true":
            if self.keep_prepared:  # an InitProducerId without Enable2Pc would abort the kept transaction
                raise AuthorizationError(f"the principal may not use transactional id {self.transactional_id!r} "
                                         "with two-phase commit: it needs WRITE and TWO_PHASE_COMMIT on it")
            self._step = "probe-write"
            return InitProducerId(self.timeout_ms)
        if value == "false":
            return self._fall_back(f"the broker refused Enable2Pc: {_TWO_PHASE_CONFIG}=false")
        return self._fall_back("the broker refused Enable2Pc with TRANSACTIONAL_ID_AUTHORIZATION_FAILED and its "
                               f"configs cannot be read: either {_TWO_PHASE_CONFIG}=false or the principal lacks "
                               f"TWO_PHASE_COMMIT on {self.transactional_id!r}")

    def _missing_both(self) -> AuthorizationError:
        return AuthorizationError(f"the principal may not use transactional id {self.transactional_id!r}: grant "
                                  "WRITE and TWO_PHASE_COMMIT on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
