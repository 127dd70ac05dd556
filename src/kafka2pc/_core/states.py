"""The states of a producer's control plane: frozen values, each carrying what the next move needs, and the public
:class:`State` each one shows as."""

from __future__ import annotations

import enum

import attrs

from kafka2pc._core.messages import ProducerIdentity
from kafka2pc._core.setup import TransactionSetup
from kafka2pc.prepared_state import PreparedTxnState

TopicPartition = tuple[str, int]


class State(enum.Enum):
    """Where a two-phase producer stands (the public view of its state)."""

    UNINITIALIZED = "UNINITIALIZED"
    #: init_transactions(keep_prepared_txn=True) found a prepared transaction of an earlier producer; only
    #: complete/commit/abort may follow.
    RECOVERED_PREPARED = "RECOVERED_PREPARED"
    #: the producer has no producer id of its own (after a keep-prepared recovery, or after settling the recovered
    #: transaction): its next begin_transaction() fences earlier producers first.
    RECOVERED_IDLE = "RECOVERED_IDLE"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    #: prepare_transaction flushed everything; the transaction waits for the decision.
    PREPARED = "PREPARED"
    #: an EndTxn was sent and its success is not known yet: only the same decision may be retried.
    COMMITTING = "COMMITTING"
    ABORTING = "ABORTING"
    #: a write failed; the transaction can only be aborted.
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    #: fenced, unauthorized or otherwise unusable; only close.
    FATAL_ERROR = "FATAL_ERROR"
    CLOSED = "CLOSED"


class Owner(enum.Enum):
    """Whose transaction is being ended."""

    OWN = "this producer's own transaction, under its own producer id and epoch"
    RESUMED = "an earlier producer's prepared transaction, ended under that transaction's producer id and epoch"
    KEPT_BY_BROKER = "an earlier producer's transaction kept by the broker (KIP-939), ended under this producer's"


@attrs.frozen
class Unowned:
    """No producer id of its own. ``setup`` is None before init_transactions."""

    setup: TransactionSetup | None


@attrs.frozen
class Ready:
    """Owns ``identity``; ``bumps_due`` InitProducerId bumps must precede the next transaction (protocol v1).
    ``bump_in_doubt``: a bump of ``identity`` was sent and its answer lost, so it may have landed."""

    setup: TransactionSetup
    identity: ProducerIdentity
    bumps_due: int = 0
    bump_in_doubt: bool = False


@attrs.frozen
class InTransaction:
    """A transaction is open under ``identity``. ``registered``: the coordinator may know it (a Produce request was
    sent under protocol v2, an AddPartitionsToTxn under v1); ``partitions`` were added to it (v1)."""

    setup: TransactionSetup
    identity: ProducerIdentity
    registered: bool = False
    partitions: frozenset[TopicPartition] = frozenset()


@attrs.frozen
class Prepared:
    """The open transaction is flushed and voted on."""

    setup: TransactionSetup
    identity: ProducerIdentity
    registered: bool

    @property
    def handle(self) -> PreparedTxnState:
        """Its PreparedTxnState: the empty state when the coordinator never heard of it."""
        if not self.registered:
            return PreparedTxnState.empty()
        return self.identity.state(self.setup.transaction_version)


@attrs.frozen
class Recovered:
    """init_transactions(keep_prepared_txn=True) found ``held``, an earlier producer's prepared transaction.
    ``identity`` is this producer's own when the broker kept it (KIP-939); None in the protocol-level resume."""

    setup: TransactionSetup
    held: PreparedTxnState
    owner: Owner
    identity: ProducerIdentity | None


@attrs.frozen
class Ending:
    """EndTxn for ``target`` (``commit`` or abort) is in progress and not known to have succeeded.

    ``identity`` is the producer's own (None for a resumed transaction); ``report`` is the transaction whose fate
    complete_transaction reports once this end has settled (when it is not ``target``)."""

    setup: TransactionSetup
    target: PreparedTxnState
    commit: bool
    owner: Owner
    identity: ProducerIdentity | None
    report: PreparedTxnState | None = None


@attrs.frozen
class WriteFailed:
    """A write of the open transaction failed with ``error``: it can only be aborted."""

    setup: TransactionSetup
    identity: ProducerIdentity
    registered: bool
    error: BaseException = attrs.field(eq=False)


@attrs.frozen
class Fatal:
    """Unusable: fenced, unauthorized, or its transaction was lost."""

    error: BaseException = attrs.field(eq=False)


@attrs.frozen
class Closed:
    """Closed."""


CoreState = Unowned | Ready | InTransaction | Prepared | Recovered | Ending | WriteFailed | Fatal | Closed


def state_name(state: CoreState) -> State:
    """The public :class:`State` of a core state."""
    if isinstance(state, Unowned):
        return State.UNINITIALIZED if state.setup is None else State.RECOVERED_IDLE
    if isinstance(state, Ending):
        return State.COMMITTING if state.commit else State.ABORTING
    return _NAMES[type(state)]


_NAMES: dict[type, State] = {
    Ready: State.READY, InTransaction: State.IN_TRANSACTION, Prepared: State.PREPARED,
    Recovered: State.RECOVERED_PREPARED, WriteFailed: State.ABORTABLE_ERROR, Fatal: State.FATAL_ERROR,
    Closed: State.CLOSED,
}
