"""What begin_transaction sends before a transaction opens: an InitProducerId for a producer without an id of its
own, protocol v1's epoch bumps, and a producer-id rotation before an epoch whose end would exhaust it. Pure; no I/O.
"""

from __future__ import annotations

from kafka2pc import broker_errors as codes
from kafka2pc.completion import MAX_TRANSACTION_EPOCH
from kafka2pc.coordinator_messages import InitAnswer, InitProducerId
from kafka2pc.errors import AuthorizationError, ConfigError, ProducerFencedError, TransactionLostError
from kafka2pc.init_plan import TransactionSetup, init_error
from kafka2pc.producer_states import InTransaction, Ready, Unowned

#: errors after which the producer can only be closed
FATAL = (ProducerFencedError, AuthorizationError, ConfigError, TransactionLostError)


def fresh_bumps(transaction_version: int) -> int:
    """Bumps due after a fresh InitProducerId. v1: it moved the epoch once past the id's last transaction; one more
    makes the two that keep "pid:epoch" unique (see completion.py). v2 bumps at every end by itself."""
    return 1 if transaction_version < 2 else 0


class Beginning:
    """Drives ``begin_transaction`` from ``state``: :meth:`start`, then :meth:`on_answer` until an
    :class:`~kafka2pc.producer_states.InTransaction` comes back. :attr:`state` is where the producer stands meanwhile
    (a failure leaves it there); a fatal error is raised for the caller to record."""

    def __init__(self, transactional_id: str, state: Ready | Unowned):
        assert state.setup is not None
        self.transactional_id = transactional_id
        self.setup: TransactionSetup = state.setup
        self.state = state
        self._fresh = isinstance(state, Unowned)

    def start(self) -> InitProducerId | InTransaction:
        """The first command, or the open transaction when none is needed."""
        if isinstance(self.state, Unowned):
            return self.setup.init()
        return self._bump_or_open(self.state)

    def _bump_or_open(self, ready: Ready) -> InitProducerId | InTransaction:
        # the bump of an exhausted epoch rotates the producer id: never run a transaction whose end would do that
        if ready.bumps_due > 0 or ready.identity.epoch > MAX_TRANSACTION_EPOCH:
            self._fresh = False
            return self.setup.init(expected=ready.identity)
        return InTransaction(self.setup, ready.identity)

    def on_answer(self, answer: InitAnswer) -> InitProducerId | InTransaction:
        """The next command, or the open transaction."""
        if answer.error != codes.NONE or answer.identity is None:
            error = init_error(self.transactional_id, answer.error, self.setup.timeout_ms)
            if isinstance(error, FATAL) or self._fresh:
                self.state = Unowned(self.setup)
                raise error
            # e.g. a retried bump that had exhausted the epoch (the coordinator answers UNKNOWN_SERVER_ERROR):
            # holding no transaction, the producer starts afresh, as a restarted one would
            self.state = Unowned(self.setup)
            self._fresh = True
            return self.setup.init()
        if self._fresh:
            bumps = fresh_bumps(self.setup.transaction_version)
        else:
            bumps = max(0, self.state.bumps_due - 1) if isinstance(self.state, Ready) else 0
        ready = Ready(self.setup, answer.identity, bumps)
        self.state = ready
        return self._bump_or_open(ready)
