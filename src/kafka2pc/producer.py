"""TwoPhaseProducer: a transactional Kafka producer that votes (prepare) apart from committing (KIP-939).

The public face of three units: the sans-IO core (:mod:`kafka2pc._core`) decides, the data plane
(:mod:`kafka2pc._data`) batches and sends records, and a transport (the wire's KafkaTransport on a real cluster)
carries the commands out. This module only connects them.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol, TypeVar

import attrs

from kafka2pc import metrics
from kafka2pc._core.driver import CoordinatorTransport, drive
from kafka2pc._core.initialization import DECISION_STANDS_S, VERSIONS_MAX_AGE_S, decision_stands
from kafka2pc._core.judge import TransactionOutcome
from kafka2pc._core.machine import Machine
from kafka2pc._core.messages import ClusterFacts, ObservedTransaction
from kafka2pc._core.producer_core import ProducerCore
from kafka2pc._core.retry import COORDINATOR_RETRY
from kafka2pc._core.setup import TWO_PHASE_SETTINGS
from kafka2pc._core.states import State, TopicPartition
from kafka2pc._data.produce import ProduceTransport
from kafka2pc._data.records import Header
from kafka2pc._data.sender import RecordSender, as_bytes, as_headers
from kafka2pc._wire.cluster_client import ClusterClient
from kafka2pc._wire.kafka_transport import KafkaTransport
from kafka2pc.config import ProducerConfig
from kafka2pc.errors import (
    AuthorizationError,
    FatalError,
    Kafka2pcError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionLostError,
)
from kafka2pc.prepared_state import PreparedTxnState

log = logging.getLogger(__name__)
R = TypeVar("R")
#: the clusters (a producer's client, else its transport) on which this process saw Enable2Pc accepted: only there is
#: a fallback reported as two-phase commit turned off (elsewhere it may never have been on)
_TWO_PHASE_SEEN: weakref.WeakSet[object] = weakref.WeakSet()

#: ``decision_stands``, ``DECISION_STANDS_S`` and ``VERSIONS_MAX_AGE_S`` are for kafka2pc's sink and dual writer,
#: which keep producers and what they learnt of the cluster between transactions (the core's rules, through this
#: facade); ``as_bytes`` and ``as_headers`` for the asyncio dual writer, which keeps records until its block ends
__all__ = ["DECISION_STANDS_S", "VERSIONS_MAX_AGE_S", "State", "TransactionOutcome", "Transport", "TwoPhaseProducer",
           "as_bytes", "as_headers", "decision_stands"]

#: data-plane failures after which the producer can only be closed (any other one only aborts the transaction)
_FATAL_WRITE_ERRORS = (ProducerFencedError, AuthorizationError)


class Transport(CoordinatorTransport, ProduceTransport, Protocol):
    """Everything a producer needs of a cluster (the wire's KafkaTransport; a coordinator model in tests)."""

    def cluster_facts(self) -> ClusterFacts:
        """The protocol versions and features that decide how transactions run."""
        ...


class TwoPhaseProducer:
    """A transactional producer whose transactions can be prepared, then completed later, even by another process.

    ``two_phase_commit=True`` initialises the transactional id with KIP-939's Enable2Pc where the brokers accept it:
    the transaction then never times out on the broker. Where they do not, the producer falls back to a standard
    transaction with ``transaction.timeout.ms`` at the broker's maximum, logs one WARNING saying so and sets
    :attr:`two_phase_commit_active` to False.

    Not thread-safe: use one producer from one thread. Producers of one process may share connections by passing
    the same ``cluster`` (a :class:`~kafka2pc.cluster.ClusterClient` for the same cluster), which they then do not
    close. A :class:`Transport` in its place (or as ``transport``) replaces the cluster altogether: tests run the
    producer against a coordinator model.
    Coordinator requests that may be repeated are sent again for up to ``max.block.ms``.
    """

    def __init__(self, config: Mapping[str, object], *, two_phase_commit: bool = False,
                 cluster: ClusterClient | Transport | None = None, transport: Transport | None = None):
        self._config = ProducerConfig.from_dict(config, two_phase_commit=two_phase_commit)
        if cluster is not None and not isinstance(cluster, ClusterClient):
            cluster, transport = None, cluster
        block_s = self._config.max_block_ms / 1000
        self._client: ClusterClient | None = None
        if transport is None:
            self._client = cluster or ClusterClient(self._config.client, bootstrap_timeout_s=block_s,
                                                    client_id=f"kafka2pc-{self._config.transactional_id}")
            transport = KafkaTransport(self._client, timeout_s=block_s)
        self._owns_client = cluster is None and self._client is not None
        self._transport: Transport = transport
        self._core = ProducerCore(self._config.transactional_id,
                                 retry=attrs.evolve(COORDINATOR_RETRY, timeout_s=block_s))
        self._sender = RecordSender(self._config, transport)
        self._said_plain_prepare = False

    # -- public properties -------------------------------------------------------------------------------------------

    @property
    def transactional_id(self) -> str:
        """The transactional id this producer writes with."""
        return self._config.transactional_id

    @property
    def two_phase_commit_active(self) -> bool:
        """True when transactions use Enable2Pc (never time out on the broker); False before init_transactions,
        with ``two_phase_commit=False``, or after a fallback."""
        setup = self._core.setup
        return bool(setup is not None and setup.two_phase)

    @property
    def state(self) -> State:
        """The producer's transaction state."""
        return self._core.name

    @property
    def producer_id_and_epoch(self) -> tuple[int, int]:
        """The producer id and epoch this producer currently writes with ((-1, -1) before it has one)."""
        identity = getattr(self._core.state, "identity", None)
        return (-1, -1) if identity is None else (identity.producer_id, identity.epoch)

    def __repr__(self) -> str:
        producer_id, epoch = self.producer_id_and_epoch
        return (f"<TwoPhaseProducer transactional.id={self.transactional_id!r} state={self.state.name} "
                f"producer={producer_id}:{epoch} two_phase_commit_active={self.two_phase_commit_active}>")

    # -- driving the core --------------------------------------------------------------------------------------------

    def _run(self, operation: Machine[R]) -> R:
        """Carry out one of the core's operations over the transport."""
        return drive(self._transport, self.transactional_id, operation)

    def _write_failed(self, error: Kafka2pcError) -> None:
        """A data-plane failure moves the core: fenced or unauthorized is fatal, anything else abortable."""
        if isinstance(error, _FATAL_WRITE_ERRORS):
            self._core.fatal(error)
        self._core.abortable(error)

    @contextlib.contextmanager
    def _sending(self) -> Iterator[None]:
        try:
            yield
        except (*_FATAL_WRITE_ERRORS, TransactionAbortableError) as exc:
            self._write_failed(exc)

    def _before_send(self, partitions: set[TopicPartition]) -> None:
        setup = self._core.setup
        if setup is not None and setup.transaction_version >= 2:
            self._core.note_sent()
        else:
            self._run(self._core.register(partitions))

    # -- initialisation ----------------------------------------------------------------------------------------------

    def init_transactions(self, keep_prepared_txn: bool = False) -> PreparedTxnState | None:
        """Register the transactional id with its coordinator, fencing earlier producers of the same id.

        With ``keep_prepared_txn=False`` an ongoing transaction of an earlier producer is aborted. With
        ``keep_prepared_txn=True`` it is kept and its state returned (None when nothing is ongoing): pass what you
        stored to :meth:`complete_transaction` to commit it if it is the one you decided on, or abort it otherwise.
        Where the coordinator does not implement keepPreparedTxn, the ongoing transaction is found with
        DescribeTransactions and completed with EndTxn under its own producer id and epoch: no InitProducerId is
        sent until it is settled, so nothing aborts it.
        """
        self._core.check_init()  # a refused call changes nothing, whatever reading the cluster would have raised
        try:
            facts = self._transport.cluster_facts()
        except FatalError as exc:  # e.g. a broker too old to say: the producer cannot go on (its state says so)
            self._core.fatal(exc)
        held = self._run(self._core.init(
            keep_prepared=keep_prepared_txn, two_phase_wanted=self._config.two_phase_commit,
            init_producer_id_max_version=facts.init_producer_id_max_version,
            transaction_version=facts.transaction_version, timeout_ms=self._config.transaction_timeout_ms,
            versions_age_s=facts.versions_age_s))
        reason = self._core.fallback_reason
        cluster = self._client if self._client is not None else self._transport
        if self._core.setup is not None and self._core.setup.two_phase:
            with contextlib.suppress(TypeError):  # a transport that cannot be weakly referenced: never reported so
                _TWO_PHASE_SEEN.add(cluster)
        if reason is not None:
            metrics.TWO_PHASE_FALLBACKS.labels(reason=metrics.fallback_reason(reason)).inc()
            setup = self._core.setup
            if self._core.two_phase_turned_off and cluster in _TWO_PHASE_SEEN:
                log.error(
                    "kafka2pc: two-phase commit is turned OFF on the broker for transactional id %r: %s. It falls "
                    "back to standard transactions (transaction.timeout.ms=%s). Transactions prepared while it was "
                    "on are NOT aborted by the broker: they stay open, never time out and hold back read_committed "
                    "consumers until they are completed (kafka2pc's recovery, `kafka2pc txns`); a producer "
                    "initialised with it goes on writing such transactions until it initialises again. See "
                    "docs/brokers.md.", self.transactional_id, reason, getattr(setup, "timeout_ms", "?"))
                return held
            log.warning(
                "kafka2pc: two-phase commit is NOT active for transactional id %r: %s. Falling back to standard "
                "transactions with transaction.timeout.ms=%s: the broker aborts a prepared transaction that is not "
                "completed within that time. To enable 2PC set %s on the brokers.",
                self.transactional_id, reason, getattr(setup, "timeout_ms", "?"), TWO_PHASE_SETTINGS)
        return held

    # -- transactions ------------------------------------------------------------------------------------------------

    def begin_transaction(self) -> None:
        """Start a transaction. After a recovery with keep_prepared_txn=True this first fences earlier producers."""
        self._run(self._core.begin())
        state = self._core.open_transaction("begin_transaction")
        self._sender.begin(state.identity, transaction_version=state.setup.transaction_version,
                           before_send=self._before_send)

    def produce(  # noqa: PLR0917 - positional order of confluent-kafka's Producer.produce
                self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
                headers: Sequence[Header] | Mapping[str, bytes | None] | None = None,
                timestamp: int | None = None) -> None:
        """Add one record to the current transaction (buffered; sent when a batch fills, or at flush/prepare).

        A record larger than ``max.request.size`` or its topic's ``max.message.bytes`` raises
        :class:`~kafka2pc.errors.RecordTooLargeError` and is not added; the transaction is unaffected."""
        self._core.open_transaction()
        if value.__class__ is not bytes or (key is not None and key.__class__ is not bytes):
            value, key = as_bytes("value", value), as_bytes("key", key)
        header_list = as_headers(headers) if headers is not None else None
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int)):
            raise TypeError(f"timestamp must be int milliseconds or None, got {type(timestamp).__name__}")
        try:  # not the _sending() context manager: this runs once per record
            self._sender.append(topic, value, key, partition, headers=header_list,
                                timestamp=timestamp if timestamp is not None else int(_time() * 1000))
        except (*_FATAL_WRITE_ERRORS, TransactionAbortableError) as exc:
            self._write_failed(exc)

    def produce_batch(self, topic: str, values: Sequence[bytes], keys: Sequence[bytes | None] | None = None,
                      partition: int | None = None) -> None:
        """Add many records at once: the fast path. Records get the current time and no headers; without a
        partition, keyed records go to the key's partition and unkeyed ones to one partition per call. All or none
        of the records are added."""
        self._core.open_transaction()
        if isinstance(values, bytes | str) or not all(isinstance(v, bytes) for v in values):
            raise TypeError("values must be a sequence of bytes")
        if keys is not None:
            if len(keys) != len(values):
                raise ValueError(f"keys has {len(keys)} items but values has {len(values)}")
            if not all(k is None or isinstance(k, bytes) for k in keys):
                raise TypeError("keys must be a sequence of bytes or None")
        if not values:
            return
        with self._sending():
            self._sender.append_batch(topic, values, keys, partition, timestamp=_now_ms())

    def flush(self) -> None:
        """Send every buffered record of the current transaction and wait until the brokers have it."""
        if self._core.name in (State.READY, State.PREPARED):
            return
        self._core.open_transaction("flush")
        with self._sending():
            self._sender.flush()

    def prepare_transaction(self) -> PreparedTxnState:
        """Flush the transaction and vote to commit: afterwards only complete/commit/abort are allowed.

        Store ``str(state)`` durably with your commit decision; the transaction can be completed by this producer
        or, after a crash, by a new one (see :meth:`init_transactions`). A transaction that wrote nothing prepares
        as the empty state ``""``: there is nothing on the broker to complete.
        """
        self._core.open_transaction("prepare_transaction")
        if not self._config.two_phase_commit and not self._said_plain_prepare:
            self._said_plain_prepare = True  # once: a plain producer that prepares is a choice, or a slip
            log.warning("kafka2pc: prepare_transaction on transactional id %r, a producer made without "
                        "two_phase_commit=True: this is a standard transaction, which the broker aborts if it is "
                        "not completed within transaction.timeout.ms=%s. Pass two_phase_commit=True for one that "
                        "outlives that (KIP-939).", self.transactional_id,
                        getattr(self._core.setup, "timeout_ms", None) or self._config.transaction_timeout_ms)
        started = time.monotonic()
        try:
            with self._sending():
                self._sender.flush()
            return self._core.prepare()
        finally:
            metrics.PREPARE_SECONDS.labels(path=metrics.producer_path()).observe(time.monotonic() - started)

    def commit_transaction(self) -> None:
        """Commit the current (or recovered, prepared) transaction; flushes first when not prepared. After
        :class:`~kafka2pc.errors.TransactionNotSettledError` (a BrokerUnavailableError: a timeout, or answers that
        settled nothing) the producer stays COMMITTING and this may be called again: it retries the same commit."""
        if self._core.name is State.IN_TRANSACTION:
            with self._sending():
                self._sender.flush()
        self._ended(self._core.end(commit=True))

    def abort_transaction(self) -> None:
        """Abort the current (or recovered) transaction; unsent records are dropped. After
        :class:`~kafka2pc.errors.TransactionNotSettledError` the producer stays ABORTING and this may be called
        again."""
        operation = self._core.end(commit=False)
        self._sender.discard()
        self._ended(operation)

    def complete_transaction(self, state: PreparedTxnState | str) -> TransactionOutcome:
        """Commit the prepared transaction if ``state`` names it; otherwise abort it. Returns what became of the
        transaction ``state`` names.

        * ``COMMITTED``: it is committed (by this call, or already before: completion is idempotent);
        * ``ABORTED``: ``state`` is empty or names a transaction that never ran; nothing of it is visible;
        * :class:`~kafka2pc.errors.TransactionLostError`: the broker aborted it (for example by timeout without
          2PC), so it can never commit;
        * :class:`~kafka2pc.errors.TransactionOutcomeUnknownError`: it is not pending and the coordinator no longer
          says how it ended (the id has run later transactions since): never a guess.

        * :class:`~kafka2pc.errors.TransactionLostError` and every other :class:`~kafka2pc.errors.FatalError` leave
          the producer FATAL_ERROR (close it), whichever transaction it was about.

        After :class:`~kafka2pc.errors.TransactionNotSettledError` (a BrokerUnavailableError: a timeout, or answers
        that settled nothing) it may be called again with the same state; it retries the same decision.
        """
        requested = PreparedTxnState.parse(state) if isinstance(state, str) else state
        if not isinstance(requested, PreparedTxnState):
            raise TypeError(f"state must be a PreparedTxnState or its string, got {type(state).__name__}")
        operation = self._core.complete(requested)
        self._sender.discard()
        return self._ended(operation)

    def continue_after_completion(self, observed: ObservedTransaction | None) -> bool:
        """After another process (a committer) ended the transaction this producer prepared, go on writing
        transactions on its id without an InitProducerId: transaction protocol v2 bumps the epoch at every end, and
        this producer takes the one its transaction's end gave the id.

        ``observed`` is the id as DescribeTransactions showed it after that end
        (:meth:`~kafka2pc.transaction_control.TransactionControl.describe`). Returns True when it shows exactly that
        end and nothing since (the producer is then READY); False otherwise — protocol v1, another producer took the
        id over, the end has not happened, or the epoch is near its limit — and the producer stays PREPARED: close it
        and take the id over with a new producer (:meth:`init_transactions` fences every earlier one)."""
        return self._core.continue_after_completion(observed)

    def _ended(self, operation: Machine[TransactionOutcome]) -> TransactionOutcome:
        started = time.monotonic()
        try:
            outcome = self._run(operation)
        except TransactionLostError:
            metrics.TRANSACTIONS_ENDED.labels(outcome="lost").inc()
            raise
        finally:
            metrics.COMPLETE_SECONDS.labels(path=metrics.producer_path()).observe(time.monotonic() - started)
        metrics.TRANSACTIONS_ENDED.labels(outcome=outcome.value).inc()
        return outcome

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release connections. An open, unprepared transaction is aborted; a prepared one is left for
        :meth:`complete_transaction` by a later producer."""
        state = self._core.name
        if state is State.CLOSED:
            return
        if state in (State.IN_TRANSACTION, State.ABORTABLE_ERROR):
            log.warning("closing producer %r with an open transaction: aborting it", self.transactional_id)
            try:
                self.abort_transaction()
            except Kafka2pcError as exc:
                log.warning("could not abort the open transaction of %r: %s", self.transactional_id, exc)
        elif state in (State.PREPARED, State.RECOVERED_PREPARED, State.COMMITTING, State.ABORTING):
            log.info("closing producer %r with a prepared transaction; it stays open until completed",
                     self.transactional_id)
        self._core.close()
        if self._owns_client and self._client is not None:
            self._client.close()

    def __enter__(self) -> TwoPhaseProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_time = time.time


def _now_ms() -> int:
    return int(_time() * 1000)
