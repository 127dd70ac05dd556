"""An executable model of Apache Kafka's transaction coordinator and partition leaders, for model-based tests.

The rules, and where in Kafka's source they come from (4.4 = apache trunk of 2026-08 in the coordinator files;
3.9 for the v1-only coordinator). T = core/.../coordinator/transaction/TransactionCoordinator.scala,
M = transaction-coordinator/.../TransactionMetadata.java, S = TransactionStateManager.scala. docs/model.md has them
rule by rule.

* InitProducerId (T handleInitProducerId / prepareInitProducerIdTransit, M prepareIncrementProducerEpoch,
  prepareProducerIdRotation, prepareFenceProducerEpoch): Enable2Pc with 2PC off ->
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED; KeepPreparedTxn -> UNSUPPORTED_VERSION; a timeout above the maximum (not
  checked with Enable2Pc) -> INVALID_TRANSACTION_TIMEOUT; an expected producer id other than the current one (or the
  previous one at an exhausted epoch) -> PRODUCER_FENCED. Empty/Complete*: rotate the producer id when the epoch is
  exhausted (>= 32766), else bump (expected epoch must be the current one, or the last one for a retry, which does not
  bump again). Ongoing: fence (+1) and abort the transaction, answer CONCURRENT_TRANSACTIONS; the client's retry then
  bumps again.
* EndTxn v<=4, transaction protocol v1 (T endTransactionWithTV1): producer id, then exact epoch, then by state:
  Ongoing -> ends at the same epoch; Complete* with the same result -> NONE; otherwise INVALID_TXN_STATE.
* EndTxn v5, transaction protocol v2 (T endTransaction, KIP-890): retryOnEpochBump / retryOnOverflow; Ongoing and
  Empty need the current epoch; an end bumps the epoch (rotating the producer id from an exhausted one); an abort is
  allowed on Empty and on Complete* at the current epoch (and bumps); a retry of the same result answers NONE.
* AddPartitionsToTxn (T handleAddPartitionsToTransaction, M prepareAddPartitions) and Produce v12's implicit add:
  producer id and exact epoch; Empty/Complete*/Ongoing -> Ongoing at the same epoch.
* Produce v11 with partition verification (KIP-890 part 1, on by default since 3.6): a partition not in the ongoing
  transaction of that producer id and epoch is refused (TRANSACTION_ABORTABLE).
* Partition leaders deduplicate by producer id, epoch and sequence (the last batch); a new epoch starts at 0.
* Timeout reaper (S timedOutTransactions, T abortTimedOutTransactions): Ongoing, not 2PC, past its timeout -> fence
  and abort (+1; v2 rotates from an exhausted epoch). Expiration (S shouldExpire): only Empty/Complete* expire.
* DescribeTransactions / ListTransactions report state, producer id and epoch (never the previous producer id).

Every request is applied atomically (markers are written at once): the Prepare* states are never observed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import attrs
from kafka.record.default_records import DefaultRecordBatch

from kafka2pc._core import codes
from kafka2pc._core.messages import (
    AddAnswer,
    AddPartitions,
    Answer,
    ClusterFacts,
    Command,
    ConfigValue,
    Described,
    DescribeTransaction,
    EndAnswer,
    EndTxn,
    InitAnswer,
    InitProducerId,
    NoAnswer,
    ObservedTransaction,
    ProducerIdentity,
    ReadBrokerConfig,
    TransactionDescription,
    TransactionListing,
)
from kafka2pc._data.produce import ProduceCall, ProduceReply

EXHAUSTED = 32766
MAX_EPOCH = 32767
TWO_PC_TIMEOUT = 2**31 - 1
TRANSACTION_ABORTABLE = 120
OUT_OF_ORDER_SEQUENCE = 45
UNKNOWN_SERVER_ERROR = -1
NOT_ENOUGH_REPLICAS = 19

EMPTY, ONGOING, COMMITTED, ABORTED = "Empty", "Ongoing", "CompleteCommit", "CompleteAbort"


@attrs.define(eq=False)
class Txn:
    """Ground truth of one transaction: who ran it, what it wrote, how it ended (None: still open)."""

    serial: int
    transactional_id: str
    producer_id: int
    epoch: int
    records: list[bytes] = attrs.Factory(list)
    fate: str | None = None

    @property
    def identity(self) -> ProducerIdentity:
        return ProducerIdentity(self.producer_id, self.epoch)


@attrs.define
class Meta:
    """The coordinator's metadata of one transactional id (M's fields that matter here)."""

    producer_id: int
    epoch: int = -1
    last_epoch: int = -1
    prev_producer_id: int = -1
    state: str = EMPTY
    partitions: set[tuple[str, int]] = attrs.Factory(set)
    two_phase: bool = False
    timeout_ms: int = 60_000
    txn: Txn | None = None


class CoordinatorModel:
    """One cluster's coordinator and partition leaders. ``transaction_version`` is the finalized protocol (1: 3.9,
    2: 4.x); ``two_phase_enabled`` is transaction.two.phase.commit.enable."""

    def __init__(self, *, transaction_version: int, two_phase_enabled: bool, max_timeout_ms: int = 900_000,
                 first_epoch: int = -1):
        self.transaction_version = transaction_version
        self.two_phase_enabled = two_phase_enabled
        self.max_timeout_ms = max_timeout_ms
        self.first_epoch = first_epoch
        self.ids: dict[str, Meta] = {}
        self.txns: list[Txn] = []
        self._producer_ids = itertools.count(1000)
        self._serials = itertools.count()
        #: (topic, partition, producer id) -> (epoch, next sequence, base of the last batch)
        self._sequences: dict[tuple[str, int, int], tuple[int, int, int]] = {}

    # -- helpers -----------------------------------------------------------------------------------------------------

    def _end(self, meta: Meta, fate: str) -> None:
        meta.prev_producer_id = meta.producer_id  # every transition records the producer id it started from (4.4)
        if meta.txn is not None:
            meta.txn.fate = fate
        meta.txn = None
        meta.partitions = set()
        meta.state = COMMITTED if fate == "committed" else ABORTED

    def _bump_at_end(self, meta: Meta) -> None:
        """Transaction protocol v2: the end of a transaction bumps the epoch, rotating an exhausted one."""
        meta.last_epoch = meta.epoch
        if meta.epoch >= EXHAUSTED:
            meta.prev_producer_id, meta.producer_id, meta.epoch = meta.producer_id, next(self._producer_ids), 0
        else:
            meta.prev_producer_id = meta.producer_id
            meta.epoch += 1

    def fence_and_abort(self, meta: Meta) -> None:
        """What InitProducerId on an Ongoing transaction, and the timeout reaper, do."""
        if self.transaction_version >= 2:
            self._bump_at_end(meta)
        else:
            meta.epoch = min(meta.epoch + 1, MAX_EPOCH)
            meta.last_epoch = -1
        self._end(meta, "aborted")

    def _open(self, meta: Meta, transactional_id: str) -> None:
        meta.prev_producer_id = meta.producer_id
        if meta.state != ONGOING:
            txn = Txn(next(self._serials), transactional_id, meta.producer_id, meta.epoch)
            self.txns.append(txn)
            meta.txn, meta.state, meta.partitions = txn, ONGOING, set()

    # -- requests ----------------------------------------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, command: InitProducerId) -> InitAnswer:
        if command.enable_2pc and not self.two_phase_enabled:
            return InitAnswer(codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if command.keep_prepared:
            return InitAnswer(codes.UNSUPPORTED_VERSION)
        if not command.enable_2pc and not 0 < command.transaction_timeout_ms <= self.max_timeout_ms:
            return InitAnswer(codes.INVALID_TRANSACTION_TIMEOUT)
        meta = self.ids.get(transactional_id)
        if meta is None:
            meta = self.ids[transactional_id] = Meta(next(self._producer_ids), epoch=self.first_epoch)
        expected = command.expected
        if expected is not None and not (
                meta.epoch == -1 or expected.producer_id == meta.producer_id
                or (expected.producer_id == meta.prev_producer_id and expected.epoch >= EXHAUSTED)):
            return InitAnswer(codes.PRODUCER_FENCED)
        if meta.state == ONGOING:
            self.fence_and_abort(meta)
            return InitAnswer(codes.CONCURRENT_TRANSACTIONS)
        timeout = TWO_PC_TIMEOUT if command.enable_2pc else command.transaction_timeout_ms
        if meta.epoch >= EXHAUSTED:
            if expected is not None and expected.epoch != meta.epoch:
                return InitAnswer(UNKNOWN_SERVER_ERROR)  # prepareIncrementProducerEpoch refuses an exhausted epoch
            old_epoch, meta.prev_producer_id = meta.epoch, meta.producer_id
            meta.producer_id, meta.epoch = next(self._producer_ids), 0
            meta.last_epoch = old_epoch if expected is not None else -1
        else:
            if expected is None:
                meta.epoch, meta.last_epoch = meta.epoch + 1, -1
            elif meta.epoch in (-1, expected.epoch):
                meta.epoch, meta.last_epoch = meta.epoch + 1, meta.epoch
            elif expected.epoch != meta.last_epoch:  # equal: a retry of a bump that succeeded, answered unchanged
                return InitAnswer(codes.PRODUCER_FENCED)
            meta.prev_producer_id = meta.producer_id
        meta.state, meta.partitions, meta.two_phase, meta.timeout_ms = EMPTY, set(), command.enable_2pc, timeout
        return InitAnswer(codes.NONE, ProducerIdentity(meta.producer_id, meta.epoch))

    def end_txn(self, transactional_id: str, command: EndTxn) -> EndAnswer:
        meta = self.ids.get(transactional_id)
        target = command.transaction
        if meta is None:
            return EndAnswer(codes.INVALID_PRODUCER_ID_MAPPING)
        fate = "committed" if command.commit else "aborted"
        same_result = COMMITTED if command.commit else ABORTED
        if command.transaction_version < 2:
            if target.producer_id != meta.producer_id:
                return EndAnswer(codes.INVALID_PRODUCER_ID_MAPPING)
            if target.epoch != meta.epoch:
                return EndAnswer(codes.PRODUCER_FENCED)
            if meta.state == ONGOING:
                self._end(meta, fate)
                return EndAnswer(codes.NONE)
            return EndAnswer(codes.NONE if meta.state == same_result else codes.INVALID_TXN_STATE)
        retry_overflow = meta.prev_producer_id == target.producer_id and target.epoch == EXHAUSTED and meta.epoch == 0
        retry_bump = meta.epoch == target.epoch + 1
        if target.producer_id != meta.producer_id and not retry_overflow:
            return EndAnswer(codes.INVALID_PRODUCER_ID_MAPPING)
        current = target.epoch == meta.epoch and target.producer_id == meta.producer_id
        retry = retry_bump or retry_overflow
        valid = current if meta.state in (ONGOING, EMPTY) else (retry or current)
        if not valid:
            return EndAnswer(codes.PRODUCER_FENCED)
        if meta.state == ONGOING or (meta.state != ONGOING and current and not command.commit):
            if meta.state == ONGOING:
                self._end(meta, fate)
            else:
                self._end(meta, "aborted")  # an abort of an empty transaction: nothing to mark, but it bumps
            self._bump_at_end(meta)
            return EndAnswer(codes.NONE, ProducerIdentity(meta.producer_id, meta.epoch))
        if retry and meta.state == same_result:
            return EndAnswer(codes.NONE, ProducerIdentity(meta.producer_id, meta.epoch))
        return EndAnswer(codes.INVALID_TXN_STATE)

    def add_partitions(self, transactional_id: str, identity: ProducerIdentity,
                       partitions: set[tuple[str, int]]) -> int:
        meta = self.ids.get(transactional_id)
        if meta is None or meta.producer_id != identity.producer_id:
            return codes.INVALID_PRODUCER_ID_MAPPING
        if meta.epoch != identity.epoch:
            return codes.PRODUCER_FENCED
        self._open(meta, transactional_id)
        meta.partitions |= partitions
        return codes.NONE

    def describe(self, transactional_id: str) -> ObservedTransaction | None:
        meta = self.ids.get(transactional_id)
        return None if meta is None else ObservedTransaction(meta.state, meta.producer_id, meta.epoch)

    def produce(self, transactional_id: str, topic: str, partition: int, data: bytes, *,
                version: int) -> tuple[int, str]:
        batch = DefaultRecordBatch(data)
        assert batch.validate_crc()
        pid, epoch, base = batch.producer_id, batch.producer_epoch, batch.base_sequence
        values = [record.value for record in batch]
        meta = self.ids.get(transactional_id)
        if meta is None or meta.producer_id != pid:
            return codes.INVALID_PRODUCER_ID_MAPPING, "unknown producer id"
        if epoch < meta.epoch:
            return codes.INVALID_PRODUCER_EPOCH, "old epoch"
        if version >= 12:
            code = self.add_partitions(transactional_id, ProducerIdentity(pid, epoch), {(topic, partition)})
            if code != codes.NONE:
                return (codes.INVALID_PRODUCER_EPOCH if code == codes.PRODUCER_FENCED else code), ""
        elif not (meta.state == ONGOING and meta.epoch == epoch and (topic, partition) in meta.partitions):
            return TRANSACTION_ABORTABLE, "partition not in the transaction"
        key = (topic, partition, pid)
        seen_epoch, next_sequence, last_base = self._sequences.get(key, (-1, 0, -1))
        if epoch != seen_epoch:
            if base != 0:
                return OUT_OF_ORDER_SEQUENCE, "a new epoch starts at sequence 0"
            next_sequence = 0
        elif base == last_base and base + len(values) == next_sequence:
            return codes.NONE, "duplicate"
        elif base != next_sequence:
            return OUT_OF_ORDER_SEQUENCE, f"expected {next_sequence}, got {base}"
        self._sequences[key] = (epoch, base + len(values), base)
        assert meta.txn is not None
        meta.txn.records.extend(values)
        return codes.NONE, ""

    # -- coordinator events ------------------------------------------------------------------------------------------

    def time_out(self, transactional_id: str) -> bool:
        """The reaper aborts the id's transaction if it is ongoing and not 2PC; whether it did."""
        meta = self.ids.get(transactional_id)
        if meta is None or meta.state != ONGOING or meta.two_phase:
            return False
        self.fence_and_abort(meta)
        return True

    def expire(self, transactional_id: str) -> bool:
        """transactional.id.expiration.ms passed; only idle ids expire."""
        meta = self.ids.get(transactional_id)
        if meta is None or meta.state == ONGOING:
            return False
        del self.ids[transactional_id]
        return True

    def committed_records(self) -> list[bytes]:
        """What a read_committed consumer sees (by transaction, in commit-independent order)."""
        return [record for txn in self.txns if txn.fate == "committed" for record in txn.records]

    def open_transactions(self) -> list[Txn]:
        """Transactions pinning the LSO."""
        return [meta.txn for meta in self.ids.values() if meta.state == ONGOING and meta.txn is not None]


@attrs.define
class Faults:
    """What goes wrong on the way: each list is consumed front first. ``lost_answers``: the coordinator acted but
    the answer is lost for good (NoAnswer once the resend budget is spent); ``retried_answers``: the answer of a
    command that may be sent again is lost once, and the machine sends it again (what a lost response followed by a
    retry does); ``dropped_requests``: the request never arrived (for good); ``lost_produce``: a Produce response is
    lost after the leader wrote."""

    lost_answers: list[bool] = attrs.Factory(list)
    #: the request never reached the coordinator (NoAnswer, nothing done)
    dropped_requests: list[bool] = attrs.Factory(list)
    #: a DescribeTransactions got no answer
    failed_describes: list[bool] = attrs.Factory(list)
    retried_answers: list[bool] = attrs.Factory(list)
    lost_produce: list[bool] = attrs.Factory(list)
    #: an EndTxn answered with an error that says nothing about it: "acted" (it ended the transaction, then the
    #: answer was UNKNOWN_SERVER_ERROR) or "refused" (NOT_ENOUGH_REPLICAS, nothing done)
    end_errors: list[str] = attrs.Factory(list)

    @staticmethod
    def take(queue: list[bool]) -> bool:
        return queue.pop(0) if queue else False


#: how long a fault that ends in NoAnswer takes on the model's clock: longer than any resend budget, so the machine
#: gets the NoAnswer (the real transport's give-up after max.block.ms); a retried answer takes no time
GIVE_UP_S = 3600.0


class ModelTransport:
    """kafka2pc's transport interface, answered by a :class:`CoordinatorModel` (a producer's ``transport=``, and
    TransactionControl's). It keeps a virtual clock: a command's ``after_s`` moves it, and so does a fault that
    loses a request or its answer for good (:data:`GIVE_UP_S`)."""

    def __init__(self, model: CoordinatorModel, faults: Faults | None = None, *, topics: dict[str, int] | None = None):
        self.model = model
        self.faults = faults or Faults()
        self.topics = topics or {"t": 2}
        self.sent: list[Command] = []
        self.clock = 0.0
        #: how many concurrent rounds (execute_all) were sent
        self.rounds = 0

    def now(self) -> float:
        return self.clock

    def cluster_facts(self) -> ClusterFacts:
        return ClusterFacts(6 if self.model.two_phase_enabled else 5, self.model.transaction_version)

    def _apply(self, transactional_id: str, command: Command) -> Answer:
        model = self.model
        if isinstance(command, InitProducerId):
            return model.init_producer_id(transactional_id, command)
        if isinstance(command, EndTxn):
            return model.end_txn(transactional_id, command)
        if isinstance(command, AddPartitions):
            return AddAnswer(model.add_partitions(transactional_id, command.identity, set(command.partitions)))
        if isinstance(command, DescribeTransaction):
            return Described(model.describe(transactional_id), description=self._description(transactional_id))
        if isinstance(command, ReadBrokerConfig):
            values = {"transaction.two.phase.commit.enable": str(model.two_phase_enabled).lower(),
                      "transaction.max.timeout.ms": str(model.max_timeout_ms)}
            return ConfigValue(values.get(command.name))
        raise TypeError(command)

    def _lost(self, reason: str, *, sent: bool = True) -> NoAnswer:
        self.clock += GIVE_UP_S
        return NoAnswer(reason, sent=sent)

    def execute(self, transactional_id: str, command: Command) -> Answer:
        self.sent.append(command)
        self.clock += command.after_s
        if isinstance(command, DescribeTransaction) and Faults.take(self.faults.failed_describes):
            return self._lost("the DescribeTransactions answer was lost (model)")
        if isinstance(command, DescribeTransaction | ReadBrokerConfig):
            return self._apply(transactional_id, command)
        if Faults.take(self.faults.dropped_requests):
            return self._lost("the request was lost (model)")
        if isinstance(command, EndTxn) and self.faults.end_errors:
            acted = self.faults.end_errors.pop(0) == "acted"
            if acted:
                self._apply(transactional_id, command)
            return EndAnswer(UNKNOWN_SERVER_ERROR if acted else NOT_ENOUGH_REPLICAS)
        answer = self._apply(transactional_id, command)
        if command.resend_safe and Faults.take(self.faults.retried_answers):
            return NoAnswer("the answer was lost; the machine sends it again (model)")
        if Faults.take(self.faults.lost_answers):
            return self._lost("the answer was lost (model)")
        return answer

    def execute_all(self, commands: Sequence[tuple[str, Command]]) -> list[Answer]:
        self.rounds += 1
        return [self.execute(transactional_id, command) for transactional_id, command in commands]

    # -- data plane --------------------------------------------------------------------------------------------------

    def partition_leaders(self, topic: str) -> dict[int, int]:
        return dict.fromkeys(range(self.topics[topic]), 1)

    def max_message_bytes(self, topic: str) -> int | None:
        return None

    def send_produce(self, calls: Sequence[ProduceCall]) -> Future[list[ProduceReply | Exception]]:
        replies: list[ProduceReply | Exception] = []
        for call in calls:
            reply: ProduceReply = {}
            for batch in call.batches:
                reply[(batch.topic, batch.partition)] = self.model.produce(
                    call.transactional_id, batch.topic, batch.partition, batch.data, version=call.max_version)
            lost = Faults.take(self.faults.lost_produce)
            replies.append(ConnectionError("the Produce response was lost (model)") if lost else reply)
        future: Future[list[ProduceReply | Exception]] = Future()
        future.set_result(replies)
        return future

    # -- TransactionControl ------------------------------------------------------------------------------------------

    def _description(self, transactional_id: str) -> TransactionDescription | None:
        meta = self.model.ids.get(transactional_id)
        if meta is None:
            return None
        return TransactionDescription(transactional_id, meta.state, meta.producer_id, meta.epoch, meta.timeout_ms, 0,
                                      tuple(sorted(meta.partitions)))

    def list_transactions(self, *, states: Sequence[str] = (), pattern: str | None = None,
                          running_longer_than_ms: int | None = None) -> list[TransactionListing]:
        return [TransactionListing(txn_id, meta.producer_id, meta.state) for txn_id, meta in sorted(
            self.model.ids.items()) if not states or meta.state in states]


def describe_answers(answers: Any) -> str:
    """For failure messages."""
    return repr(answers)
