"""How a producer's transactions run once it is initialised, and the errors an InitProducerId answer becomes."""

from __future__ import annotations

import attrs

from kafka2pc._core import codes
from kafka2pc._core.messages import InitProducerId, ProducerIdentity
from kafka2pc.errors import AuthorizationError, ConfigError, KafkaProtocolError, ProducerFencedError

DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
#: Kafka's default transaction.max.timeout.ms, assumed in fallback mode when the broker's cannot be read.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000
#: InitProducerId's timeout when it only fences (no transaction follows): any broker maximum allows it.
FENCE_TIMEOUT_MS = 1000
TWO_PHASE_SETTINGS = ("transaction.two.phase.commit.enable=true and unstable.api.versions.enable=true "
                      "(Apache Kafka >= 4.1)")


@attrs.frozen
class TransactionSetup:
    """How this producer's transactions run: the transaction protocol (1 or 2), whether Enable2Pc is in use, and the
    transaction.timeout.ms sent with InitProducerId."""

    transaction_version: int
    two_phase: bool
    timeout_ms: int

    def init(self, expected: ProducerIdentity | None = None) -> InitProducerId:
        """InitProducerId for this setup: a fresh producer, or a bump of ``expected`` (never sent again blindly:
        see :class:`~kafka2pc._core.messages.InitProducerId`)."""
        return InitProducerId(self.timeout_ms, expected=expected, enable_2pc=self.two_phase)


def fenced(transactional_id: str, detail: str) -> ProducerFencedError:
    """The error of a producer whose transactional id is owned by a newer producer."""
    return ProducerFencedError(f"transactional id {transactional_id!r} is owned by a newer producer ({detail})")


def init_error(transactional_id: str, code: int, timeout_ms: int) -> Exception:
    """The error an InitProducerId failure becomes."""
    kind = codes.kind(code)
    if kind is codes.Kind.FENCED:
        return fenced(transactional_id, codes.error_name(code))
    if kind is codes.Kind.UNAUTHORIZED:
        return AuthorizationError(f"the principal may not use transactional id {transactional_id!r}: grant WRITE "
                                  "on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
    if kind is codes.Kind.TIMEOUT_REFUSED:
        return ConfigError("transaction.timeout.ms", f"{timeout_ms} exceeds the broker's transaction.max.timeout.ms")
    return KafkaProtocolError("InitProducerId", codes.error_name(code), code, f"transactional id {transactional_id!r}")
