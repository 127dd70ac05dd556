"""TwoPhaseProducer: a transactional Kafka producer that votes (prepare) apart from committing (KIP-939).

The I/O edge around the sans-IO parts: :mod:`kafka2pc.txn_state` decides which calls are legal,
:mod:`kafka2pc.completion` decides how a prepared transaction is completed, :mod:`kafka2pc.accumulator` batches
records, :mod:`kafka2pc.records` encodes them. This module sends the protocol messages and interprets the answers.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import kafka.errors as kafka_errors
from kafka.partitioner.default import murmur2
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest

from kafka2pc import broker_errors as codes
from kafka2pc import metrics
from kafka2pc.accumulator import Batch, RecordAccumulator, TopicPartition
from kafka2pc.cluster_client import ClusterClient, error_name
from kafka2pc.completion import Action, ObservedTransaction
from kafka2pc.errors import (
    AuthorizationError,
    ConfigError,
    Kafka2pcError,
    KafkaProtocolError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionLostError,
    TransactionStateError,
)
from kafka2pc.prepared_state import PreparedTxnState
from kafka2pc.producer_config import ProducerConfig
from kafka2pc.protocol_versions import INIT_PRODUCER_ID_2PC_VERSION
from kafka2pc.records import Header, encode_batch
from kafka2pc.transaction_control import TransactionControl, init_producer_id
from kafka2pc.txn_state import Event, State, TransactionStateMachine

log = logging.getLogger(__name__)

_DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
_MAX_SEQUENCE = 2**31 - 1
_TWO_PHASE_SETTINGS = ("transaction.two.phase.commit.enable=true and unstable.api.versions.enable=true "
                       "(Apache Kafka >= 4.1)")


class TransactionOutcome(enum.Enum):
    """What :meth:`TwoPhaseProducer.complete_transaction` did with the transaction."""

    COMMITTED = "committed"
    ABORTED = "aborted"


def _as_bytes(name: str, value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{name} must be bytes or None, got {type(value).__name__}")


def _as_headers(headers: object) -> list[Header] | None:
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    result: list[Header] = []
    for item in items:  # type: ignore[attr-defined]
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"headers must be (str, bytes | None) pairs, got {item!r}")
        result.append((item[0], _as_bytes(f"header {item[0]!r}", item[1])))
    return result


class TwoPhaseProducer:
    """A transactional producer whose transactions can be prepared, then completed later, even by another process.

    ``two_phase_commit=True`` initialises the transactional id with KIP-939's Enable2Pc where the brokers accept it:
    the transaction then never times out on the broker. Where they do not, the producer falls back to a standard
    transaction with ``transaction.timeout.ms`` at the broker's maximum, logs one WARNING saying so and sets
    :attr:`two_phase_commit_active` to False.

    Not thread-safe: use one producer from one thread. Producers of one process may share connections by passing
    the same ``cluster`` (a :class:`~kafka2pc.cluster_client.ClusterClient` for the same cluster), which they then do
    not close.
    """

    def __init__(self, config: Mapping[str, object], *, two_phase_commit: bool = False,
                 cluster: ClusterClient | None = None):
        self._config = ProducerConfig.from_dict(config, two_phase_commit=two_phase_commit)
        self._owns_client = cluster is None
        self._client = cluster or ClusterClient(self._config.client,
                                                bootstrap_timeout_s=self._config.max_block_ms / 1000,
                                                client_id=f"kafka2pc-{self._config.transactional_id}")
        self._machine = TransactionStateMachine()
        self._accumulator = RecordAccumulator(self._config.batch_size)
        self._producer_id = -1
        self._epoch = -1
        self._tv2 = False
        self._use_2pc = False
        self._two_phase_active = False
        self._timeout_ms = self._config.transaction_timeout_ms or _DEFAULT_TRANSACTION_TIMEOUT_MS
        self._sequences: dict[TopicPartition, int] = {}
        self._added: set[TopicPartition] = set()
        self._leaders: dict[str, dict[int, int]] = {}
        self._round: tuple[Future[list[Any]], list[tuple[int, list[Batch]]]] | None = None
        self._ended_since_init = False
        self._txn_started = False
        self._kept: PreparedTxnState | None = None
        self._kept_by_broker = False
        self._sticky: dict[str, tuple[int, int]] = {}
        self._unsent_since: float | None = None
        self._control = TransactionControl(self._client, transaction_version=1,
                                           timeout_s=self._config.max_block_ms / 1000)

    # -- public properties -------------------------------------------------------------------------------------

    @property
    def transactional_id(self) -> str:
        """The transactional id this producer writes with."""
        return self._config.transactional_id

    @property
    def two_phase_commit_active(self) -> bool:
        """True when transactions use Enable2Pc (never time out on the broker); False before init_transactions,
        with ``two_phase_commit=False``, or after a fallback."""
        return self._two_phase_active

    @property
    def state(self) -> State:
        """The producer's transaction state."""
        return self._machine.state

    @property
    def producer_id_and_epoch(self) -> tuple[int, int]:
        """The producer id and epoch this producer currently writes with ((-1, -1) before it has one)."""
        return self._producer_id, self._epoch

    # -- initialisation ------------------------------------------------------------------------------------------

    def init_transactions(self, keep_prepared_txn: bool = False) -> PreparedTxnState | None:
        """Register the transactional id with its coordinator, fencing earlier producers of the same id.

        With ``keep_prepared_txn=False`` an ongoing transaction of an earlier producer is aborted. With
        ``keep_prepared_txn=True`` it is kept and its state returned (None when nothing is ongoing): pass what you
        stored to :meth:`complete_transaction` to commit it if it is the one you decided on, or abort it otherwise.
        Where the coordinator does not implement keepPreparedTxn, the ongoing transaction is found with
        DescribeTransactions and completed with EndTxn under its own producer id and epoch: no InitProducerId is
        sent until it is settled, so nothing aborts it.
        """
        self._machine.fire(Event.INIT)
        with self._initializing():
            self._learn_broker()
            if keep_prepared_txn:
                return self._init_keeping()
            self._init_producer_id()
            self._machine.fire(Event.INIT_DONE)
            return None

    @contextlib.contextmanager
    def _initializing(self) -> Iterator[None]:
        """While INITIALIZING: a fenced, unauthorized or misconfigured producer becomes FATAL; any other failure
        returns it to UNINITIALIZED, so init_transactions can be called again."""
        try:
            yield
        except (ProducerFencedError, AuthorizationError, ConfigError) as exc:
            self._machine.fire(Event.FATAL, exc)
            raise
        except Exception:
            if self._machine.state is State.INITIALIZING:
                self._machine.fire(Event.INIT_FAILED)
            raise

    def _learn_broker(self) -> None:
        client = self._client
        init_max = client.broker_max_version(InitProducerIdRequest)
        self._tv2 = (client.finalized_feature_level("transaction.version") >= 2
                     and client.broker_max_version(ProduceRequest) >= 12
                     and client.broker_max_version(EndTxnRequest) >= 5)
        self._control = TransactionControl(client, transaction_version=2 if self._tv2 else 1,
                                           timeout_s=self._config.max_block_ms / 1000)
        if not self._config.two_phase_commit:
            self._use_2pc = False
        elif init_max < INIT_PRODUCER_ID_2PC_VERSION:
            self._fall_back(f"the broker advertises InitProducerId up to v{init_max}; Enable2Pc needs "
                            f"v{INIT_PRODUCER_ID_2PC_VERSION}")
        else:
            self._use_2pc = True

    def _fall_back(self, reason: str) -> None:
        self._use_2pc = False
        self._two_phase_active = False
        metrics.TWO_PHASE_FALLBACKS.inc()
        if self._config.transaction_timeout_ms is None:
            configured = self._broker_config("transaction.max.timeout.ms")
            self._timeout_ms = int(configured) if configured else 900_000
            if configured is None:
                reason += ("; the broker's transaction.max.timeout.ms could not be read (DESCRIBE_CONFIGS on the "
                           "cluster), so Kafka's default maximum is assumed: set transaction.timeout.ms")
        log.warning(
            "kafka2pc: two-phase commit is NOT active for transactional id %r: %s. Falling back to standard "
            "transactions with transaction.timeout.ms=%d: the broker aborts a prepared transaction that is not "
            "completed within that time. To enable 2PC set %s on the brokers.",
            self.transactional_id, reason, self._timeout_ms, _TWO_PHASE_SETTINGS)

    def _send_init(self, *, producer_id: int = -1, epoch: int = -1, keep: bool = False) -> Any:
        txn_id = self.transactional_id
        try:
            return init_producer_id(self._client, txn_id, transaction_timeout_ms=self._timeout_ms,
                                    producer_id=producer_id, epoch=epoch, enable_2pc=self._use_2pc,
                                    keep_prepared=keep and self._use_2pc, timeout_s=self._config.max_block_ms / 1000)
        except AuthorizationError as exc:
            if not self._use_2pc:
                raise
            raise AuthorizationError(f"the principal may not use transactional id {txn_id!r}: grant WRITE and "
                                     "TWO_PHASE_COMMIT on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)") from exc

    def _broker_config(self, name: str) -> str | None:
        """A broker config value, or None when it cannot be read (unknown to the broker, or no DESCRIBE_CONFIGS)."""
        try:
            return self._client.broker_configs([name])[name]
        except kafka_errors.KafkaError as exc:
            log.debug("could not read broker config %s: %r", name, exc)
            return None

    def _two_phase_refused(self, *, can_probe_write: bool) -> None:
        """Enable2Pc was refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which the broker answers both when 2PC
        is off and when an ACL is missing. Fall back in the first case; raise naming the missing ACL in the second.

        ``can_probe_write``: an InitProducerId without Enable2Pc may be sent to tell a missing WRITE from a missing
        TWO_PHASE_COMMIT (not while recovering a kept transaction: it would abort it)."""
        setting = self._broker_config("transaction.two.phase.commit.enable")
        txn_id = self.transactional_id
        if setting == "true":
            if can_probe_write:
                self._use_2pc = False
                plain = self._send_init()
                self._use_2pc = True
                if plain.error_code == codes.NONE:
                    raise AuthorizationError(
                        f"the principal may write with transactional id {txn_id!r} but not use two-phase commit: "
                        "grant TWO_PHASE_COMMIT on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
                raise AuthorizationError(f"the principal may not use transactional id {txn_id!r}: grant WRITE and "
                                         "TWO_PHASE_COMMIT on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
            raise AuthorizationError(f"the principal may not use transactional id {txn_id!r} with two-phase "
                                     "commit: it needs WRITE and TWO_PHASE_COMMIT on it")
        if setting == "false":
            self._fall_back("the broker refused Enable2Pc: transaction.two.phase.commit.enable=false")
        else:
            self._fall_back("the broker refused Enable2Pc with TRANSACTIONAL_ID_AUTHORIZATION_FAILED and its "
                            "configs cannot be read: either transaction.two.phase.commit.enable=false or the "
                            f"principal lacks TWO_PHASE_COMMIT on {txn_id!r}")

    def _init_producer_id(self, *, bump: bool = False) -> None:
        """InitProducerId for this producer (a fresh one, or an epoch bump of the current producer id)."""
        producer_id, epoch = (self._producer_id, self._epoch) if bump else (-1, -1)
        response = self._send_init(producer_id=producer_id, epoch=epoch)
        if response.error_code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and self._use_2pc:
            self._two_phase_refused(can_probe_write=not bump)
            response = self._send_init(producer_id=producer_id, epoch=epoch)
        self._raise_for_init(response.error_code)
        self._two_phase_active = self._use_2pc
        self._set_producer(response.producer_id, response.producer_epoch)

    def _raise_for_init(self, code: int) -> None:
        if code == codes.NONE:
            return
        if code in (codes.PRODUCER_FENCED, codes.INVALID_PRODUCER_EPOCH):
            raise self._fenced(error_name(code))
        if code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise AuthorizationError(f"the principal may not use transactional id {self.transactional_id!r}: "
                                     "grant WRITE on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)")
        if code == codes.INVALID_TRANSACTION_TIMEOUT:
            raise ConfigError("transaction.timeout.ms",
                              f"{self._timeout_ms} exceeds the broker's transaction.max.timeout.ms")
        raise KafkaProtocolError("InitProducerId", error_name(code), code,
                                 f"transactional id {self.transactional_id!r}")

    def _fenced(self, detail: str) -> ProducerFencedError:
        return ProducerFencedError(f"transactional id {self.transactional_id!r} is owned by a newer producer "
                                   f"({detail})")

    def _set_producer(self, producer_id: int, epoch: int) -> None:
        self._producer_id, self._epoch = producer_id, epoch
        self._sequences.clear()
        self._ended_since_init = False

    def _init_keeping(self) -> PreparedTxnState | None:
        if self._use_2pc:
            response = self._send_init(keep=True)
            if response.error_code == codes.NONE:  # a coordinator that implements keepPreparedTxn (KIP-939)
                self._two_phase_active = True
                self._set_producer(response.producer_id, response.producer_epoch)
                if response.ongoing_txn_producer_id >= 0:
                    self._kept = PreparedTxnState(response.ongoing_txn_producer_id,
                                                  response.ongoing_txn_producer_epoch)
                    self._kept_by_broker = True
                    self._machine.fire(Event.INIT_KEPT)
                    return self._kept
                self._machine.fire(Event.INIT_DONE)
                return None
            if response.error_code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                self._two_phase_refused(can_probe_write=False)
            elif response.error_code == codes.UNSUPPORTED_VERSION:
                log.info("the coordinator does not implement keepPreparedTxn (UNSUPPORTED_VERSION); resuming %r at "
                         "the protocol level with DescribeTransactions and EndTxn", self.transactional_id)
            else:
                self._raise_for_init(response.error_code)
        # what this producer's own transactions will use once the recovered one is settled
        self._two_phase_active = self._use_2pc
        observed = self._control.describe_settled(self.transactional_id)
        if observed is not None and observed.state == "Ongoing":
            self._kept = observed.as_prepared_state
            self._kept_by_broker = False
            self._machine.fire(Event.INIT_KEPT)
            return self._kept
        self._machine.fire(Event.INIT_NOTHING_KEPT)
        return None

    # -- transactions ----------------------------------------------------------------------------------------------

    def begin_transaction(self) -> None:
        """Start a transaction. After a recovery with keep_prepared_txn=True this first fences earlier producers."""
        if self._machine.state is State.RECOVERED_IDLE:
            self._machine.fire(Event.REINIT)
            self._reinit()
        self._machine.check(Event.BEGIN)
        if not self._tv2 and self._ended_since_init:
            # Transaction protocol v1 keeps the epoch across transactions; two bumps give this transaction an epoch
            # that no coordinator-side abort of the previous one (which bumps once) can share (see completion.py).
            self._init_producer_id(bump=True)
            self._init_producer_id(bump=True)
        self._added.clear()
        self._sticky.clear()
        self._txn_started = False
        self._machine.fire(Event.BEGIN)

    def _reinit(self) -> None:
        with self._initializing():
            self._init_producer_id()
        self._machine.fire(Event.INIT_DONE)

    def produce(  # noqa: PLR0917 - positional order of confluent-kafka's Producer.produce
                self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
                headers: Sequence[Header] | Mapping[str, bytes | None] | None = None,
                timestamp: int | None = None) -> None:
        """Add one record to the current transaction (buffered; sent when a batch fills, or at flush/prepare)."""
        self._machine.check(Event.SEND)
        value, key = _as_bytes("value", value), _as_bytes("key", key)
        header_list = _as_headers(headers)
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int)):
            raise TypeError(f"timestamp must be int milliseconds or None, got {type(timestamp).__name__}")
        tp = (topic, self._choose_partition(topic, partition, key, len(value or b"")))
        self._accumulator.append(tp, key, value, header_list, timestamp if timestamp is not None else _now_ms())
        self._after_append()

    def produce_batch(self, topic: str, values: Sequence[bytes], keys: Sequence[bytes | None] | None = None,
                      partition: int | None = None) -> None:
        """Add many records at once: the fast path. Records get the current time and no headers; without a
        partition, keyed records go to the key's partition and unkeyed ones to one partition per call."""
        self._machine.check(Event.SEND)
        if isinstance(values, bytes | str) or not all(isinstance(v, bytes) for v in values):
            raise TypeError("values must be a sequence of bytes")
        if keys is not None:
            if len(keys) != len(values):
                raise ValueError(f"keys has {len(keys)} items but values has {len(values)}")
            if not all(k is None or isinstance(k, bytes) for k in keys):
                raise TypeError("keys must be a sequence of bytes or None")
        if not values:
            return
        now = _now_ms()
        if partition is not None or keys is None:
            chosen = self._choose_partition(topic, partition, None, sum(map(len, values)))
            self._accumulator.append_values((topic, chosen), values, keys, now, self._ship_full_batches)
        else:
            count = len(self._partitions(topic))
            groups: dict[int, tuple[list[bytes], list[bytes | None]]] = {}
            for key, value in zip(keys, values, strict=True):
                target = _key_partition(key, count) if key is not None else random.randrange(count)
                group = groups.setdefault(target, ([], []))
                group[0].append(value)
                group[1].append(key)
            for target, (group_values, group_keys) in groups.items():
                self._accumulator.append_values((topic, target), group_values, group_keys, now,
                                                self._ship_full_batches)
        self._after_append()

    def flush(self) -> None:
        """Send every buffered record of the current transaction and wait until the brokers have them."""
        if self._machine.state in (State.READY, State.PREPARED):
            return
        self._machine.check(Event.SEND)
        self._flush()

    def prepare_transaction(self) -> PreparedTxnState:
        """Flush the transaction and vote to commit: afterwards only complete/commit/abort are allowed.

        Store ``str(state)`` durably with your commit decision; the transaction can be completed by this producer
        or, after a crash, by a new one (see :meth:`init_transactions`).
        """
        self._machine.check(Event.PREPARE)
        self._flush()
        self._machine.fire(Event.PREPARE)
        return PreparedTxnState(self._producer_id, self._epoch)

    def commit_transaction(self) -> None:
        """Commit the current (or recovered, prepared) transaction; flushes first when not prepared."""
        if self._machine.state is State.RECOVERED_PREPARED:
            self._machine.fire(Event.COMMIT)
            self._end_kept(commit=True)
            return
        if self._machine.state is State.IN_TRANSACTION:
            self._machine.check(Event.COMMIT)
            self._flush()
        self._machine.fire(Event.COMMIT)
        self._end(commit=True)

    def abort_transaction(self) -> None:
        """Abort the current (or recovered) transaction; unsent records are dropped."""
        self._machine.check(Event.ABORT)
        self._accumulator.clear()
        self._drop_round()
        if self._machine.state is State.RECOVERED_PREPARED:
            self._machine.fire(Event.ABORT)
            self._end_kept(commit=False)
            return
        self._machine.fire(Event.ABORT)
        self._end(commit=False)

    def complete_transaction(self, state: PreparedTxnState | str) -> TransactionOutcome:
        """Commit the prepared transaction if ``state`` identifies it, otherwise abort it; returns which.

        Idempotent: for a transaction that already committed, ``state`` reports COMMITTED. If the broker already
        aborted the transaction ``state`` names (for example by timeout in fallback mode), a commit is impossible
        and :class:`TransactionLostError` is raised.
        """
        requested = PreparedTxnState.parse(state) if isinstance(state, str) else state
        if not isinstance(requested, PreparedTxnState):
            raise TypeError(f"state must be a PreparedTxnState or its string, got {type(state).__name__}")
        current = self._machine.state
        if current is State.PREPARED:
            mine = requested == PreparedTxnState(self._producer_id, self._epoch)
            self.commit_transaction() if mine else self.abort_transaction()
            return TransactionOutcome.COMMITTED if mine else TransactionOutcome.ABORTED
        if current is State.RECOVERED_PREPARED:
            kept = requested == self._kept
            self.commit_transaction() if kept else self.abort_transaction()
            return TransactionOutcome.COMMITTED if kept else TransactionOutcome.ABORTED
        self._machine.check(Event.LOOKUP)
        return self._look_up(requested)

    def _look_up(self, requested: PreparedTxnState) -> TransactionOutcome:
        action, observed = self._control.decide(self.transactional_id, requested)
        if action is Action.ALREADY_COMMITTED:
            return TransactionOutcome.COMMITTED
        if action is Action.ALREADY_ABORTED:
            metrics.TRANSACTIONS_ENDED.labels(outcome="lost").inc()
            raise TransactionLostError(self.transactional_id, requested.producer_id, requested.epoch,
                                       f"the broker reports it aborted ({observed})")
        if action in (Action.COMMIT_ONGOING, Action.ABORT_ONGOING):
            raise TransactionStateError(
                "complete_transaction", self._machine.state.value,
                f"transactional id {self.transactional_id!r} has an ongoing transaction ({observed}) that this "
                "producer did not recover; another producer may be using the id")
        if observed is not None and not requested.is_empty and observed.producer_id == requested.producer_id:
            log.warning("complete_transaction(%s): not the pending or last-ended transaction of %r (coordinator "
                        "reports %s); nothing to commit", requested, self.transactional_id, observed)
        return TransactionOutcome.ABORTED

    def _end(self, *, commit: bool) -> None:
        if not self._txn_started and not self._tv2:
            # v1: the coordinator never heard of a transaction that wrote nothing; ending it is local. The epoch
            # bumps before the next transaction still make its PreparedTxnState unique.
            self._finish_end(commit, None)
            return
        # v2: a transaction that wrote nothing cannot be committed (INVALID_TXN_STATE) but can be aborted, which
        # bumps the epoch, so the next transaction does not reuse this one's PreparedTxnState.
        mine = PreparedTxnState(self._producer_id, self._epoch)
        response = self._control.end(self.transactional_id, mine, commit=commit and self._txn_started)
        if response.error_code == codes.NONE:
            self._finish_end(commit, (response.producer_id, response.producer_epoch) if self._tv2 else None)
            return
        observed = self._settle_failed_end(mine, commit, response.error_code)
        self._finish_end(commit, (observed.producer_id, observed.epoch) if self._tv2 and observed else None)

    def _finish_end(self, commit: bool, bumped: tuple[int, int] | None) -> None:
        """The transaction ended as asked; under v2 the coordinator handed out ``bumped`` (producer id, epoch)."""
        metrics.TRANSACTIONS_ENDED.labels(outcome="committed" if commit else "aborted").inc()
        if bumped is not None and bumped[1] >= 0:
            self._set_producer(*bumped)
        self._ended_since_init = True
        self._machine.fire(Event.END_DONE)

    def _settle_failed_end(self, ended: PreparedTxnState, commit: bool, code: int) -> ObservedTransaction | None:
        """EndTxn was refused: find out from the coordinator whether the transaction ended anyway as asked (then
        return what the coordinator reports), or raise what happened instead."""
        if code not in (codes.PRODUCER_FENCED, codes.INVALID_PRODUCER_EPOCH, codes.INVALID_TXN_STATE):
            error: Kafka2pcError = KafkaProtocolError("EndTxn", error_name(code), code)
            if code == codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                error = AuthorizationError(f"the principal may not end transactions of {self.transactional_id!r}: "
                                           "grant WRITE on it")
            self._machine.fire(Event.FATAL, error)
            raise error
        action, observed = self._control.decide(self.transactional_id, ended)
        if action is (Action.ALREADY_COMMITTED if commit else Action.ALREADY_ABORTED):
            return observed
        lost: Kafka2pcError
        if action is Action.ALREADY_ABORTED:
            metrics.TRANSACTIONS_ENDED.labels(outcome="lost").inc()
            lost = TransactionLostError(self.transactional_id, ended.producer_id, ended.epoch,
                                        f"the broker already aborted it ({observed}; EndTxn said {error_name(code)})")
        else:
            lost = self._fenced(f"{error_name(code)}; coordinator reports {observed}")
        self._machine.fire(Event.FATAL, lost)
        raise lost

    def _end_kept(self, *, commit: bool) -> None:
        kept = self._kept
        assert kept is not None
        # A coordinator that kept the transaction (KIP-939) ends it under this producer's new id and epoch; in the
        # protocol-level resume the transaction is ended under its own.
        under = PreparedTxnState(self._producer_id, self._epoch) if self._kept_by_broker else kept
        response = self._control.end(self.transactional_id, under, commit=commit)
        if response.error_code != codes.NONE:
            self._settle_failed_end(kept, commit, response.error_code)
        self._kept = None
        if self._kept_by_broker:
            ok = response.error_code == codes.NONE and self._tv2
            self._finish_end(commit, (response.producer_id, response.producer_epoch) if ok else None)
            return
        metrics.TRANSACTIONS_ENDED.labels(outcome="committed" if commit else "aborted").inc()
        self._machine.fire(Event.REINIT)
        self._reinit()

    # -- data plane ------------------------------------------------------------------------------------------------

    def _partitions(self, topic: str) -> dict[int, int]:
        leaders = self._leaders.get(topic)
        if leaders is None:
            leaders = self._leaders[topic] = self._client.partition_leaders(topic)
        return leaders

    def _choose_partition(self, topic: str, partition: int | None, key: bytes | None, size: int) -> int:
        count = len(self._partitions(topic))
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < count:
                raise ValueError(f"partition {partition!r} does not exist: topic {topic!r} has {count} partitions")
            return partition
        if key is not None:
            return _key_partition(key, count)
        current, filled = self._sticky.get(topic, (random.randrange(count), 0))
        if filled >= self._config.batch_size:
            current, filled = random.randrange(count), 0
        self._sticky[topic] = (current, filled + size)
        return current

    def _after_append(self) -> None:
        self._machine.fire(Event.SEND)
        now = time.monotonic()
        if self._unsent_since is None:
            self._unsent_since = now
        lingered = now - self._unsent_since >= self._config.linger_ms / 1000
        if self._accumulator.full_batches() or lingered:
            self._pump(include_open=lingered)

    def _ship_full_batches(self) -> None:
        if self._unsent_since is None:
            self._unsent_since = time.monotonic()
        self._pump(include_open=False)

    def _pump(self, *, include_open: bool) -> None:
        """Start a send round if none is in flight; wait for the one in flight when too much is buffered."""
        if self._round is not None:
            future = self._round[0]
            if not future.done() and self._accumulator.buffered_bytes < 4 * self._config.batch_size:
                return
            self._collect(future.result(timeout=self._config.delivery_timeout_ms / 1000))
        self._start_round(include_open=include_open)

    def _start_round(self, *, include_open: bool) -> None:
        batches = self._accumulator.drain(include_open=include_open)
        if not batches:
            return
        self._unsent_since = None if self._accumulator.is_empty() else time.monotonic()
        self._txn_started = True
        if not self._tv2:
            self._add_partitions({(b.topic, b.partition) for b in batches} - self._added)
        by_node: dict[int, list[Batch]] = {}
        for batch in batches:
            leader = self._partitions(batch.topic).get(batch.partition, -1)
            if leader < 0:
                self._leaders.pop(batch.topic, None)
                leader = self._partitions(batch.topic).get(batch.partition, -1)
            self._frame(batch)
            by_node.setdefault(leader, []).append(batch)
        requests = []
        groups = []
        for node, node_batches in by_node.items():
            groups.append((node, node_batches))
            requests.append((self._produce_request(node_batches), node))
        self._round = (self._client.send_concurrently(requests), groups)

    def _frame(self, batch: Batch) -> None:
        if batch.base_sequence >= 0:
            return  # a retry: same bytes, same sequence
        tp = (batch.topic, batch.partition)
        sequence = self._sequences.get(tp, 0)
        batch.base_sequence = sequence
        self._sequences[tp] = (sequence + batch.count) % (_MAX_SEQUENCE + 1)
        batch.framed = encode_batch(batch.records, batch.count, base_timestamp=batch.base_timestamp,
                                    max_timestamp=batch.max_timestamp, producer_id=self._producer_id,
                                    producer_epoch=self._epoch, base_sequence=sequence,
                                    compression=self._config.compression)

    def _produce_request(self, batches: list[Batch]) -> Any:
        topics: dict[str, list[Any]] = {}
        for batch in batches:
            topics.setdefault(batch.topic, []).append(
                ProduceRequest.TopicProduceData.PartitionProduceData(index=batch.partition, records=batch.framed))
        return ProduceRequest(
            transactional_id=self.transactional_id, acks=-1,
            timeout_ms=int(self._config.client.options.get("request_timeout_ms", 30_000)),
            topic_data=[ProduceRequest.TopicProduceData(name=name, partition_data=parts)
                        for name, parts in topics.items()],
            max_version=12 if self._tv2 else 11)

    def _collect(self, answers: list[Any]) -> None:
        """Interpret a finished send round: done batches are dropped, retriable ones requeued, errors raised."""
        assert self._round is not None
        groups = self._round[1]
        self._round = None
        failure: Kafka2pcError | None = None
        fatal = False
        for (node, batches), answer in zip(groups, answers, strict=True):
            if isinstance(answer, Exception):
                log.debug("produce to node %s failed: %r; retrying", node, answer)
                self._retry(batches)
                continue
            results = {(t.name, p.index): p for t in answer.responses for p in t.partition_responses}
            for batch in batches:
                result = results.get((batch.topic, batch.partition))
                code = result.error_code if result is not None else codes.UNKNOWN_TOPIC_OR_PARTITION
                kind = codes.classify_produce_error(code)
                if kind is codes.ProduceErrorKind.DONE:
                    continue
                if kind is codes.ProduceErrorKind.RETRY:
                    self._retry([batch])
                elif kind is codes.ProduceErrorKind.FENCED:
                    failure = self._fenced(f"{error_name(code)} writing {batch.topic}-{batch.partition}")
                    fatal = True
                elif kind is codes.ProduceErrorKind.UNAUTHORIZED:
                    failure, fatal = AuthorizationError(
                        f"the principal may not write with transactional id {self.transactional_id!r}: grant WRITE "
                        "on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)"), True
                elif failure is None:
                    detail = getattr(result, "error_message", None) or ""
                    failure = TransactionAbortableError(
                        f"writing to {batch.topic}-{batch.partition} failed: {error_name(code)} {detail}".strip())
        if failure is not None:
            self._accumulator.clear()
            self._machine.fire(Event.FATAL if fatal else Event.ABORTABLE, failure)
            raise failure

    def _retry(self, batches: list[Batch]) -> None:
        for batch in reversed(batches):
            self._leaders.pop(batch.topic, None)
            self._accumulator.requeue_front(batch)

    def _drop_round(self) -> None:
        if self._round is not None:
            try:
                self._round[0].result(timeout=self._config.delivery_timeout_ms / 1000)
            except Exception as exc:  # the transaction is being aborted; its writes no longer matter
                log.debug("ignoring send failure during abort: %r", exc)
            self._round = None

    def _flush(self) -> None:
        deadline = time.monotonic() + self._config.delivery_timeout_ms / 1000
        backoff = self._config.retry_backoff_ms / 1000
        while self._round is not None or not self._accumulator.is_empty():
            if time.monotonic() > deadline:
                error = TransactionAbortableError(
                    f"records not acknowledged within delivery.timeout.ms={self._config.delivery_timeout_ms}")
                self._machine.fire(Event.ABORTABLE, error)
                raise error
            if self._round is not None:
                retried_before = self._accumulator.buffered_records
                self._collect(self._round[0].result(timeout=max(0.001, deadline - time.monotonic())))
                if self._accumulator.buffered_records > retried_before:
                    time.sleep(backoff)
            self._start_round(include_open=True)
        self._unsent_since = None

    def _add_partitions(self, partitions: set[TopicPartition]) -> None:
        """Transaction protocol v1: register partitions with the coordinator before writing to them."""
        if not partitions:
            return
        txn_id, producer_id, epoch = self.transactional_id, self._producer_id, self._epoch
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(partitions):
            topics.setdefault(topic, []).append(partition)

        def request() -> Any:
            return AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=producer_id,
                v3_and_below_producer_epoch=epoch, max_version=3,
                v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=p)
                                     for t, p in topics.items()])

        def worst(response: Any) -> int:
            found = [p.partition_error_code for t in response.results_by_topic_v3_and_below
                     for p in t.results_by_partition if p.partition_error_code != codes.NONE]
            retriable = [c for c in found if c in (kafka_errors.ConcurrentTransactionsError.errno,
                                                   kafka_errors.CoordinatorLoadInProgressError.errno,
                                                   kafka_errors.NotCoordinatorError.errno,
                                                   kafka_errors.CoordinatorNotAvailableError.errno)]
            chosen: int = retriable[0] if retriable else (found[0] if found else codes.NONE)
            return chosen

        response = self._client.send_to_transaction_coordinator(txn_id, request, error_code_of=worst,
                                                                timeout_s=self._config.max_block_ms / 1000)
        code = worst(response)
        if code == codes.NONE:
            self._added |= partitions
            return
        error: Kafka2pcError
        if code in (codes.PRODUCER_FENCED, codes.INVALID_PRODUCER_EPOCH):
            error = self._fenced(error_name(code))
            self._machine.fire(Event.FATAL, error)
        else:
            error = TransactionAbortableError(f"AddPartitionsToTxn failed: {error_name(code)}")
            self._machine.fire(Event.ABORTABLE, error)
        raise error

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release connections. An open, unprepared transaction is aborted; a prepared one is left for
        :meth:`complete_transaction` by a later producer."""
        state = self._machine.state
        if state is State.CLOSED:
            return
        if state in (State.IN_TRANSACTION, State.ABORTABLE_ERROR):
            log.warning("closing producer %r with an open transaction: aborting it", self.transactional_id)
            try:
                self.abort_transaction()
            except Kafka2pcError as exc:
                log.warning("could not abort the open transaction of %r: %s", self.transactional_id, exc)
        elif state in (State.PREPARED, State.RECOVERED_PREPARED):
            log.info("closing producer %r with a prepared transaction; it stays open until completed",
                     self.transactional_id)
        self._machine.fire(Event.CLOSE)
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> TwoPhaseProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _key_partition(key: bytes, count: int) -> int:
    """Kafka's default partitioner for keyed records: murmur2 of the key, made positive, modulo the partitions."""
    return (int(murmur2(key)) & 0x7FFFFFFF) % count


def _now_ms() -> int:
    return int(time.time() * 1000)
