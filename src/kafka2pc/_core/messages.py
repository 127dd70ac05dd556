"""What kafka2pc's sans-IO machines ask of a transaction coordinator, and what they are told back.

Plain values, no I/O: the wire layer's KafkaTransport turns a command into kafka-python protocol requests against
a real cluster, and the model-based tests answer them from a model of Kafka's coordinator. Error codes are Kafka's
(:mod:`~kafka2pc._core.codes`). Every command says whether sending it again after a lost answer is safe
(:attr:`resend_safe`); the machines decide whether to (:mod:`~kafka2pc._core.resend`).
"""

from __future__ import annotations

import attrs

from kafka2pc._core import codes
from kafka2pc.prepared_state import PreparedTxnState

ONGOING = "Ongoing"
EMPTY = "Empty"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
PREPARE_EPOCH_FENCE = "PrepareEpochFence"
DEAD = "Dead"
#: states in which the coordinator is still writing markers or fencing: look again shortly.
IN_FLUX = frozenset({PREPARE_COMMIT, PREPARE_ABORT, PREPARE_EPOCH_FENCE})
#: states in which a transaction is open (pins the LSO until it ends)
OPEN_STATES = (ONGOING, PREPARE_COMMIT, PREPARE_ABORT, PREPARE_EPOCH_FENCE)


@attrs.frozen
class ProducerIdentity:
    """A producer id and epoch: who writes, and (with the transactional id) which transaction."""

    producer_id: int
    epoch: int

    def state(self, transaction_version: int | None = None) -> PreparedTxnState:
        """The handle of the transaction run under this identity."""
        return PreparedTxnState(self.producer_id, self.epoch, transaction_version)

    @classmethod
    def of(cls, state: PreparedTxnState) -> ProducerIdentity:
        """The identity a prepared-transaction handle names."""
        return cls(state.producer_id, state.epoch)

    def __str__(self) -> str:
        return f"{self.producer_id}:{self.epoch}"


@attrs.frozen
class ObservedTransaction:
    """What DescribeTransactions reported for a transactional id."""

    state: str
    producer_id: int
    epoch: int

    @property
    def identity(self) -> ProducerIdentity:
        """The producer id and epoch the coordinator holds."""
        return ProducerIdentity(self.producer_id, self.epoch)

    def __str__(self) -> str:
        return f"{self.state} at {self.producer_id}:{self.epoch}"


@attrs.frozen
class TransactionDescription:
    """Everything DescribeTransactions reports of one transactional id."""

    transactional_id: str
    state: str
    producer_id: int
    epoch: int
    timeout_ms: int
    start_time_ms: int
    partitions: tuple[tuple[str, int], ...]

    @property
    def observed(self) -> ObservedTransaction:
        """Its state, producer id and epoch."""
        return ObservedTransaction(self.state, self.producer_id, self.epoch)


@attrs.frozen
class TransactionListing:
    """One transactional id as ListTransactions reports it."""

    transactional_id: str
    producer_id: int
    state: str


@attrs.frozen
class ClusterFacts:
    """What a producer needs to know of the cluster before it initialises."""

    init_producer_id_max_version: int
    #: 2 when the cluster finalized transaction.version >= 2 and the broker speaks Produce v12 and EndTxn v5
    transaction_version: int
    #: how long ago the brokers' ApiVersions behind these facts were read (None: not known, e.g. when the client
    #: connected); 0 where they are always current (a model)
    versions_age_s: float | None = 0.0
    #: the cluster's finalized transaction.version (1 or 2) whatever this client's versions can send: what a
    #: transaction someone else began may be under (None: the same as ``transaction_version``)
    finalized_transaction_version: int | None = None


# -- commands ------------------------------------------------------------------------------------------------------

@attrs.frozen
class InitProducerId:
    """InitProducerId. With ``expected`` it bumps (or rotates) that identity (KIP-360) and fails with
    PRODUCER_FENCED if the coordinator has moved on; without, it starts a new producer and fences every earlier one.

    Kafka checks only the producer id of ``expected`` when a transaction is Ongoing, and then aborts it: so an
    InitProducerId with ``expected`` is sent only right after DescribeTransactions showed the id at exactly that
    identity and in no transaction, and is never sent again after a lost answer or a busy coordinator (the machine
    looks again instead). ``after_s``: wait this long before sending."""

    transaction_timeout_ms: int
    expected: ProducerIdentity | None = None
    enable_2pc: bool = False
    keep_prepared: bool = False
    after_s: float = attrs.field(default=0.0, kw_only=True)

    @property
    def resend_safe(self) -> bool:
        """Whether sending it again, when it may have acted, is harmless."""
        return self.expected is None


@attrs.frozen
class EndTxn:
    """EndTxn for the transaction run under ``transaction``: conditional on exactly that producer id and epoch."""

    transaction: ProducerIdentity
    commit: bool
    transaction_version: int
    after_s: float = attrs.field(default=0.0, kw_only=True)
    #: sent because a look just saw the transaction ongoing at exactly this identity (a v5 abort from a bare
    #: "pid:epoch"): only a new look may send it again, never a blind resend
    guarded_by_look: bool = attrs.field(default=False, kw_only=True)

    @property
    def resend_safe(self) -> bool:
        """Kafka answers a retry of an end that succeeded with NONE; but an end a look vouched for is looked at
        again first (a commit at the same epoch could have landed in between, which a v5 abort would hide)."""
        return not self.guarded_by_look


@attrs.frozen
class AddPartitions:
    """AddPartitionsToTxn (transaction protocol v1 only)."""

    identity: ProducerIdentity
    partitions: frozenset[tuple[str, int]]
    after_s: float = attrs.field(default=0.0, kw_only=True)

    #: adding a partition twice is harmless
    resend_safe = True


@attrs.frozen
class DescribeTransaction:
    """DescribeTransactions for the transactional id, after waiting ``after_s`` seconds."""

    after_s: float = attrs.field(default=0.0, kw_only=True)

    resend_safe = True


@attrs.frozen
class ReadBrokerConfig:
    """The value of a broker config (None where it cannot be read)."""

    name: str
    after_s: float = attrs.field(default=0.0, kw_only=True)

    resend_safe = True


@attrs.frozen
class ReadClusterFacts:
    """The cluster's facts, every broker's ApiVersions read again first: a running client otherwise keeps the
    versions it learnt when it connected, and never sees a broker that gained InitProducerId v6 since. Answered
    with :class:`FactsAnswer` (the old facts, as old as they are, where a broker does not answer)."""

    after_s: float = attrs.field(default=0.0, kw_only=True)

    resend_safe = True


Command = InitProducerId | EndTxn | AddPartitions | DescribeTransaction | ReadBrokerConfig | ReadClusterFacts


# -- answers -------------------------------------------------------------------------------------------------------

@attrs.frozen
class InitAnswer:
    """InitProducerId's answer: the producer's new identity, and (KIP-939) the kept ongoing transaction."""

    error: int
    identity: ProducerIdentity | None = None
    ongoing: ProducerIdentity | None = None


@attrs.frozen
class EndAnswer:
    """EndTxn's answer; with EndTxn v5 (transaction protocol v2) the identity the producer continues with."""

    error: int
    next_identity: ProducerIdentity | None = None


@attrs.frozen
class AddAnswer:
    """AddPartitionsToTxn's answer: the most telling partition error (retriable ones first)."""

    error: int


@attrs.frozen
class Described:
    """DescribeTransactions' answer: ``observed`` is None when the coordinator does not know the transactional id
    (or ``error`` says why it could not answer); ``description`` has the rest of what it reported, where the
    transport has it."""

    observed: ObservedTransaction | None
    error: int = codes.NONE
    description: TransactionDescription | None = attrs.field(default=None, eq=False)


@attrs.frozen
class ConfigValue:
    """A broker config's value."""

    value: str | None
    error: int = codes.NONE


@attrs.frozen
class FactsAnswer:
    """ReadClusterFacts' answer."""

    facts: ClusterFacts
    error: int = codes.NONE


@attrs.frozen
class NoAnswer:
    """The request got no answer in time (connection lost, timed out): it may or may not have acted. ``sent``
    False: it certainly never reached a broker (its coordinator could not be found, no connection took it).
    ``cause``: the exception the edge saw, when there was one; a machine that raises on a NoAnswer chains it
    (``raise ... from answer.cause``)."""

    reason: str
    sent: bool = True
    cause: BaseException | None = attrs.field(default=None, eq=False, repr=False, kw_only=True)


Answer = InitAnswer | EndAnswer | AddAnswer | Described | ConfigValue | FactsAnswer | NoAnswer
